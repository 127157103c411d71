// vmap batching rules of the strided ops (common/vmap.h). The elementwise ops run on the batched
// value as it is (any layout: the kernels read strides); zip and matmul first give their batched
// operands the vmapped dimension in front and pad their ranks so torch's broadcasting lines the
// samples up; reduce shifts its dims past the vmapped one. One call for every sample.
#include <torch/library.h>

#include "common/vmap.h"
#include "strided/strided.h"

namespace pointops {
namespace strided {
namespace {

c10::OperatorHandle handle(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

// t's shape without the vmapped dimension.
std::vector<int64_t> logical_shape(const BatchFold& f, const at::Tensor& t) {
  auto [value, bdim] = f.unwrap(t);
  std::vector<int64_t> shape = value.sizes().vec();
  if (bdim >= 0) shape.erase(shape.begin() + bdim);
  return shape;
}

// A batched operand as (V, 1, ..., 1, *logical) with `rank` dims after V (the 1s pad it to the
// rank of the broadcast); an unbatched one as it is (broadcasting prepends its missing dims).
at::Tensor padded_front(const BatchFold& f, const at::Tensor& t, int64_t rank) {
  if (!f.batched(t)) return t;
  const at::Tensor front = f.front(t);
  std::vector<int64_t> shape{front.size(0)};
  shape.insert(shape.end(), rank - (front.dim() - 1), 1);
  shape.insert(shape.end(), front.sizes().begin() + 1, front.sizes().end());
  return front.view(shape);
}

at::Tensor map_batched(const at::Tensor& x, c10::string_view fn) {
  static const auto op = handle("pointops::strided_map").typed<at::Tensor(const at::Tensor&, c10::string_view)>();
  const BatchFold f({&x});
  if (!f.any_batched()) return op.call(x, fn);
  auto [value, bdim] = f.unwrap(x);
  return f.batched_at(op.call(value, fn), bdim);
}

at::Tensor zip_batched(const at::Tensor& a, const at::Tensor& b, c10::string_view fn) {
  static const auto op =
      handle("pointops::strided_zip").typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  const BatchFold f({&a, &b});
  if (!f.any_batched()) return op.call(a, b, fn);
  const int64_t rank = std::max(logical_shape(f, a).size(), logical_shape(f, b).size());
  return f.batched_front(op.call(padded_front(f, a, rank), padded_front(f, b, rank), fn));
}

at::Tensor matmul_batched(const at::Tensor& a, const at::Tensor& b) {
  static const auto op =
      handle("pointops::strided_matmul").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  const BatchFold f({&a, &b});
  if (!f.any_batched()) return op.call(a, b);
  const auto a_shape = logical_shape(f, a), b_shape = logical_shape(f, b);
  TORCH_CHECK(a_shape.size() >= 2 && b_shape.size() >= 2, "matmul: a and b need at least 2 dims (each vmapped "
              "sample), got a of shape ", at::IntArrayRef(a_shape), " and b of shape ", at::IntArrayRef(b_shape));
  const int64_t rank = std::max(a_shape.size(), b_shape.size());
  return f.batched_front(op.call(padded_front(f, a, rank), padded_front(f, b, rank)));
}

at::Tensor reduce_batched(const at::Tensor& x, at::OptionalIntArrayRef dim, c10::string_view fn, bool keepdim) {
  static const auto op = handle("pointops::strided_reduce")
                             .typed<at::Tensor(const at::Tensor&, at::OptionalIntArrayRef, c10::string_view, bool)>();
  const BatchFold f({&x});
  if (!f.any_batched()) return op.call(x, dim, fn, keepdim);
  const at::Tensor front = f.front(x);
  // The dims each sample reduces, checked and normalised as the op does, on a tensor of its shape.
  const at::Tensor sample = at::empty(logical_shape(f, x), front.options().device(at::kMeta));
  const DimList dims = reduced_dims(sample, dim);
  parse_reduce_fn(fn);
  if (dims.empty()) return f.batched_front(front.clone());  // a 0-dim sample: the identity
  std::vector<int64_t> shifted;
  for (int64_t d : dims) shifted.push_back(d + 1);
  return f.batched_front(op.call(front, shifted, fn, keepdim));
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("strided_map", &map_batched);
  m.impl("strided_zip", &zip_batched);
  m.impl("strided_reduce", &reduce_batched);
  m.impl("strided_matmul", &matmul_batched);
}

}  // namespace strided
}  // namespace pointops
