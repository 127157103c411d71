// The op entry points of the strided family, shared by the CPU and CUDA backends: each takes a
// backend's kernel launcher as a template argument (like particle_sum_entry). The entries check
// the arguments, allocate the results, handle the empty and > kMaxDims cases; the launchers only
// ever see non-empty problems whose layouts fit in kMaxDims dims.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "strided/strided.h"

namespace pointops {
namespace strided {

// A reduction as the kernels walk it: the outputs (operand 0 the result, 1 the input) and, inside
// each output, the reduced elements (input strides), each merged on its own.
struct ReducePlan {
  StridedLayout<2> kept;
  StridedLayout<1> reduced;
};
// false when either layout has more than kMaxDims dims
bool plan_reduce(const at::Tensor& x, at::IntArrayRef dims, const at::Tensor& res, ReducePlan& P);

// "outer": a kept dim is the input's innermost (its stride is below the reduced dims' innermost
// stride) and wide enough to vectorise / coalesce across outputs; else "inner".
inline bool reduce_is_outer(const ReducePlan& P) {
  const int inner = P.kept.ndim - 1;
  return P.reduced.numel() > 1 && P.kept.sizes[inner] >= 8 &&
         P.kept.strides[1][inner] < P.reduced.strides[0][P.reduced.ndim - 1];
}

// One matrix product of a batch: rows / columns strides of A (n x k), B (k x m), C (n x m).
struct MatmulCall {
  int64_t n, k, m;
  int64_t as0, as1, bs0, bs1, cs0, cs1;
};

// L: the merged layout of out and its inputs (layout_of), computed once per call by the entry.
using MapInto = void (*)(const at::Tensor& out, const at::Tensor& x, const StridedLayout<2>& L, MapFn fn);
using ZipInto = void (*)(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L,
                         ZipFn fn);
using ReduceInto = void (*)(const at::Tensor& res, const at::Tensor& x, const ReducePlan& plan, ReduceFn fn);
// c, a, b: the (expanded) operands; batch: the merged batch layout (operands c, a, b).
using MatmulInto = void (*)(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b,
                            const StridedLayout<3>& batch, const MatmulCall& call);

template <MapInto Impl>
void map_into(const at::Tensor& out, const at::Tensor& x, MapFn fn) {
  if (out.numel() == 0) return;
  StridedLayout<2> L;
  if (!layout_of<2>(out, {&x}, L)) {  // contiguous operands always merge to one dim
    at::Tensor tmp = at::empty(out.sizes(), out.options());
    const at::Tensor xc = x.expand(out.sizes()).contiguous();
    TORCH_INTERNAL_ASSERT(layout_of<2>(tmp, {&xc}, L));
    Impl(tmp, xc, L, fn);
    out.copy_(tmp);
    return;
  }
  Impl(out, x, L, fn);
}

template <ZipInto Impl>
void zip_into(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ZipFn fn) {
  if (out.numel() == 0) return;
  StridedLayout<3> L;
  if (!layout_of<3>(out, {&a, &b}, L)) {
    at::Tensor tmp = at::empty(out.sizes(), out.options());
    const at::Tensor ac = a.expand(out.sizes()).contiguous(), bc = b.expand(out.sizes()).contiguous();
    TORCH_INTERNAL_ASSERT(layout_of<3>(tmp, {&ac, &bc}, L));
    Impl(tmp, ac, bc, L, fn);
    out.copy_(tmp);
    return;
  }
  Impl(out, a, b, L, fn);
}

template <MapInto Impl>
at::Tensor map_entry(const at::Tensor& x, c10::string_view fn) {
  const MapFn f = parse_map_fn(fn);
  check_strided_dtype(x, "x");
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Preserve);
  map_into<Impl>(out, x, f);
  return out;
}

template <MapInto Impl>
void map_out_entry(const at::Tensor& x, c10::string_view fn, const at::Tensor& out) {
  const MapFn f = parse_map_fn(fn);
  check_strided_dtype(x, "x");
  check_out(out, x.sizes(), x.scalar_type(), x, {&x}, "map");
  map_into<Impl>(out, x, f);
}

template <ZipInto Impl>
at::Tensor zip_entry(const at::Tensor& a, const at::Tensor& b, c10::string_view fn) {
  const ZipFn f = parse_zip_fn(fn);
  const auto shape = check_zip_inputs(a, b, "zip");
  at::Tensor out = at::empty(shape, a.options());
  zip_into<Impl>(out, a, b, f);
  return out;
}

template <ZipInto Impl>
void zip_out_entry(const at::Tensor& a, const at::Tensor& b, c10::string_view fn, const at::Tensor& out) {
  const ZipFn f = parse_zip_fn(fn);
  const auto shape = check_zip_inputs(a, b, "zip");
  check_out(out, shape, a.scalar_type(), a, {&a, &b}, "zip");
  zip_into<Impl>(out, a, b, f);
}

template <ReduceInto Impl>
at::Tensor reduce_entry(const at::Tensor& x_in, at::OptionalIntArrayRef dim, c10::string_view fn_name, bool keepdim) {
  const ReduceFn fn = parse_reduce_fn(fn_name);
  check_strided_dtype(x_in, "x");
  const DimList dims = reduced_dims(x_in, dim);
  int64_t count = 1;
  for (int64_t d : dims) count *= x_in.size(d);
  if (fn == ReduceFn::Max || fn == ReduceFn::Min) {
    TORCH_CHECK(count > 0, "reduce: fn='", std::string(fn_name), "' over zero elements has no identity: x has shape ",
                x_in.sizes(), " and the reduced dims ", at::IntArrayRef(dims), " have zero size (as torch.amax / amin)");
  }
  // allocated in the returned shape (keepdim's size-1 dims included), written through a view without them
  at::Tensor result = at::empty(reduce_output_shape(x_in, dims, keepdim), x_in.options());
  at::Tensor res = keepdim ? result.view(reduce_output_shape(x_in, dims, false)) : result;
  if (res.numel() == 0) return result;
  if (count == 0) return result.fill_(fn == ReduceFn::Prod ? 1 : 0);  // the empty sum / product
  at::Tensor x = x_in;
  ReducePlan P;
  if (!plan_reduce(x, dims, res, P)) {
    x = x_in.contiguous();  // more than kMaxDims dims: contiguous merges to few dims
    TORCH_INTERNAL_ASSERT(plan_reduce(x, dims, res, P));
  }
  Impl(res, x, P, fn);
  return result;
}

// The batch strides of t (..., rows, cols) broadcast to `batch`: what t.expand(batch + [rows, cols])
// would have, without making the view (host time: matmul is called with tiny operands too).
inline StrideVector broadcast_batch_strides(const at::Tensor& t, at::IntArrayRef batch) {
  const size_t tb = static_cast<size_t>(t.dim() - 2);
  return broadcast_strides_small(t.sizes().slice(0, tb), t.strides().slice(0, tb), batch);
}

template <MatmulInto Impl>
at::Tensor matmul_entry(const at::Tensor& a_in, const at::Tensor& b_in) {
  const std::vector<int64_t> shape = check_matmul_inputs(a_in, b_in);
  at::Tensor c = at::empty(shape, a_in.options());
  const int64_t nb = static_cast<int64_t>(shape.size()) - 2;
  const int64_t n = a_in.size(-2), k = a_in.size(-1), m = b_in.size(-1);
  if (c.numel() == 0) return c;
  if (k == 0) return c.zero_();
  const at::IntArrayRef batch(shape.data(), static_cast<size_t>(nb));
  at::Tensor a = a_in, b = b_in;  // the kernels read data pointers only; strides come from the layout
  StrideVector a_batch = broadcast_batch_strides(a, batch), b_batch = broadcast_batch_strides(b, batch);
  StridedLayout<3> L;
  if (!make_layout<3>(batch, {c.strides().data(), a_batch.data(), b_batch.data()}, L)) {
    // more than kMaxDims batch dims after merging: contiguous operands merge to one
    auto expanded = [&](const at::Tensor& t, int64_t rows, int64_t cols) {
      std::vector<int64_t> sizes(batch.begin(), batch.end());
      sizes.insert(sizes.end(), {rows, cols});
      return t.expand(sizes).contiguous();
    };
    a = expanded(a_in, n, k);
    b = expanded(b_in, k, m);
    a_batch = broadcast_batch_strides(a, batch);
    b_batch = broadcast_batch_strides(b, batch);
    TORCH_INTERNAL_ASSERT(make_layout<3>(batch, {c.strides().data(), a_batch.data(), b_batch.data()}, L));
  }
  const MatmulCall call{n, k, m, a.stride(-2), a.stride(-1), b.stride(-2), b.stride(-1), c.stride(-2), c.stride(-1)};
  Impl(c, a, b, L, call);
  return c;
}

}  // namespace strided
}  // namespace pointops
