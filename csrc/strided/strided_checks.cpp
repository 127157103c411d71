// Input validation for the strided family, shared by the CPU and CUDA launchers (the fake kernels
// in pointops/strided.py mirror the shape and dtype checks). Messages name the argument, what it
// got and what was expected.
#include "strided/strided_entries.h"

#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <numeric>

namespace pointops {
namespace strided {
namespace {

template <typename Enum, size_t N>
Enum parse(c10::string_view name, const char* (&names)[N], const char* what) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<Enum>(i);
  std::string known;
  for (size_t i = 0; i < N; ++i) known += (i ? ", '" : "'") + std::string(names[i]) + "'";
  TORCH_CHECK(false, what, " fn must be one of ", known, "; got '", std::string(name), "'");
}

// In enum order.
const char* kMapNames[] = {"id", "neg", "exp", "log", "sigmoid", "relu", "inv", "tanh"};
const char* kZipNames[] = {"add", "sub", "mul", "div", "max", "min", "pow",
                           "lt", "eq", "is_close", "relu_back", "log_back", "inv_back"};
const char* kReduceNames[] = {"sum", "prod", "max", "min"};

}  // namespace

MapFn parse_map_fn(c10::string_view name) { return parse<MapFn>(name, kMapNames, "map:"); }
ZipFn parse_zip_fn(c10::string_view name) { return parse<ZipFn>(name, kZipNames, "zip:"); }
ReduceFn parse_reduce_fn(c10::string_view name) { return parse<ReduceFn>(name, kReduceNames, "reduce:"); }

void check_strided_dtype(const at::Tensor& t, const char* name) {
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              name, " must be float16, bfloat16, float32 or float64, got ", dtype, " (shape ", t.sizes(), ")");
}

std::vector<int64_t> check_zip_inputs(const at::Tensor& a, const at::Tensor& b, const char* op) {
  check_strided_dtype(a, "a");
  check_strided_dtype(b, "b");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": b must have the same dtype as a (", a.scalar_type(),
              "), got ", b.scalar_type(), "; convert one of them (no type promotion here)");
  TORCH_CHECK(a.device() == b.device(), op, ": b must be on the same device as a (", a.device(), "), got ",
              b.device());
  try {
    auto shape = at::infer_size_dimvector(a.sizes(), b.sizes());
    return std::vector<int64_t>(shape.begin(), shape.end());
  } catch (const c10::Error&) {
    TORCH_CHECK(false, op, ": the shapes of a ", a.sizes(), " and b ", b.sizes(), " do not broadcast");
  }
}

bool may_overlap_internally(const at::Tensor& t) {
  // Sufficient test for no overlap: with the dims of size > 1 sorted by stride, each stride
  // exceeds the furthest offset reachable with the smaller ones. A zero stride always fails it.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t extent = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= extent) return true;
    extent += stride * (size - 1);
  }
  return false;
}

void check_out(const at::Tensor& out, at::IntArrayRef shape, at::ScalarType dtype, const at::Tensor& like,
               std::initializer_list<const at::Tensor*> inputs, const char* op) {
  TORCH_CHECK(out.sizes() == shape, op, ": out must have the result's shape ", shape, ", got ", out.sizes());
  TORCH_CHECK(out.scalar_type() == dtype, op, ": out must have the result's dtype ", dtype, ", got ",
              out.scalar_type());
  TORCH_CHECK(out.device() == like.device(), op, ": out must be on the inputs' device (", like.device(), "), got ",
              out.device());
  if (out.numel() == 0) return;
  TORCH_CHECK(!may_overlap_internally(out), op, ": out (shape ", out.sizes(), ", strides ", out.strides(),
              ") has elements that share memory (an expanded tensor?); pass a tensor whose elements are distinct");
  for (const at::Tensor* in : inputs) {
    // Exactly the same elements (in place) is fine element by element; any other sharing is not.
    TORCH_CHECK(at::get_overlap_status(out, *in) != at::MemOverlapStatus::Partial, op,
                ": out partially overlaps an input (shape ", in->sizes(), ", strides ", in->strides(),
                "); out may be an input itself (in place) but not another view of its memory");
  }
}

std::vector<int64_t> broadcast_strides(const at::Tensor& t, at::IntArrayRef shape) {
  const int64_t nd = static_cast<int64_t>(shape.size()), lead = nd - t.dim();
  std::vector<int64_t> s(nd, 0);
  for (int64_t d = 0; d < t.dim(); ++d) s[lead + d] = t.size(d) == 1 ? 0 : t.stride(d);
  return s;
}

DimList reduced_dims(const at::Tensor& x, at::OptionalIntArrayRef dim) {
  const int64_t nd = x.dim();
  DimList dims;
  if (!dim.has_value() || dim->empty()) {  // None, and () as in torch.sum: every dim
    dims.resize(nd);
    std::iota(dims.begin(), dims.end(), 0);
    return dims;
  }
  const int64_t range = std::max<int64_t>(nd, 1);  // a 0-dim tensor takes dim 0 or -1, as in torch
  for (int64_t d : *dim) {
    TORCH_CHECK(d >= -range && d < range, "reduce: dim ", d, " is out of range for x of shape ", x.sizes(),
                " (expected in [", -range, ", ", range - 1, "])");
    const int64_t w = d < 0 ? d + range : d;
    TORCH_CHECK(std::find(dims.begin(), dims.end(), w) == dims.end(), "reduce: dim ", w,
                " appears more than once in dim=", *dim);
    dims.push_back(w);
  }
  if (nd == 0) dims.clear();  // nothing to reduce over
  std::sort(dims.begin(), dims.end());
  return dims;
}

DimList reduce_output_shape(const at::Tensor& x, at::IntArrayRef dims, bool keepdim) {
  DimList shape;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) shape.push_back(x.size(d));
    else if (keepdim) shape.push_back(1);
  }
  return shape;
}

std::vector<int64_t> check_matmul_inputs(const at::Tensor& a, const at::Tensor& b) {
  check_strided_dtype(a, "a");
  check_strided_dtype(b, "b");
  TORCH_CHECK(a.dim() >= 2, "matmul: a must have at least 2 dims (..., n, k), got shape ", a.sizes());
  TORCH_CHECK(b.dim() >= 2, "matmul: b must have at least 2 dims (..., k, m), got shape ", b.sizes());
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "matmul: b must have the same dtype as a (", a.scalar_type(),
              "), got ", b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "matmul: b must be on the same device as a (", a.device(), "), got ",
              b.device());
  TORCH_CHECK(a.size(-1) == b.size(-2), "matmul: the inner sizes differ: a has shape ", a.sizes(), " (k = ",
              a.size(-1), ") and b has shape ", b.sizes(), " (k = ", b.size(-2), ")");
  const auto batch_a = a.sizes().slice(0, a.dim() - 2), batch_b = b.sizes().slice(0, b.dim() - 2);
  std::vector<int64_t> shape;
  try {
    auto batch = at::infer_size_dimvector(batch_a, batch_b);
    shape.assign(batch.begin(), batch.end());
  } catch (const c10::Error&) {
    TORCH_CHECK(false, "matmul: the batch dims of a (shape ", a.sizes(), ") and b (shape ", b.sizes(),
                ") do not broadcast");
  }
  shape.push_back(a.size(-2));
  shape.push_back(b.size(-1));
  return shape;
}

bool plan_reduce(const at::Tensor& x, at::IntArrayRef dims, const at::Tensor& res, ReducePlan& P) {
  DimList kept_sizes, kept_x, reduced_sizes, reduced_x;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    (reduced ? reduced_sizes : kept_sizes).push_back(x.size(d));
    (reduced ? reduced_x : kept_x).push_back(x.stride(d));
  }
  return make_layout<2>(kept_sizes, {res.strides().data(), kept_x.data()}, P.kept) &&
         make_layout<1>(reduced_sizes, {reduced_x.data()}, P.reduced);
}

}  // namespace strided
}  // namespace pointops
