// Strided tensor kernels (map / zip / reduce / matmul): what the CPU and CUDA launchers share.
//
// Design (review here first):
//
// * Schemas (csrc/pointops.cpp). Functional ops plus separate out ops that mutate `out` and return
//   nothing:
//     strided_map(Tensor x, str fn) -> Tensor
//     strided_map_out(Tensor x, str fn, Tensor(a!) out) -> ()
//     strided_zip(Tensor a, Tensor b, str fn) -> Tensor
//     strided_zip_out(Tensor a, Tensor b, str fn, Tensor(a!) out) -> ()
//     strided_reduce(Tensor x, int[1]? dim=None, str fn="sum", bool keepdim=False) -> Tensor
//     strided_matmul(Tensor a, Tensor b) -> Tensor
//   A mutating op returning `()` is what torch.compile's auto_functionalize handles in every torch
//   version we support (2.11 and 2.13; returning an alias `Tensor(a!)` is accepted only for ops named
//   like aten out= ops, and only in recent versions), and what opcheck checks cleanly. The Python
//   wrappers (pointops/strided.py) return `out` themselves. Autograd is registered on the functional
//   ops only; out= with inputs that require grad is refused, as torch refuses it.
// * fn names are parsed once into the enums below; an unknown name lists the known ones.
// * dtypes: float16, bfloat16, float32, float64. zip's a and b must have the same dtype (no type
//   promotion: a mismatch is refused with a message naming both); out must have the result's dtype
//   and device. Half types compute in float32 (at::opmath_type) and round once.
// * Layouts: every kernel walks tensors through StridedLayout: the common shape with one stride
//   array per operand (0 on broadcast dims), size-1 dims dropped, dims ordered by the first
//   operand's strides (the output's: writes are the innermost loop), and adjacent dims merged where
//   every operand allows it. At most kMaxDims dims after merging; beyond that the launchers copy the
//   inputs to contiguous tensors (and write through a contiguous temporary), which always merges to
//   one dim: a slower path that still gives the right answer. Offsets are int64 everywhere.
// * out= overlap: out may not have internal overlap (a zero stride on a dim of size > 1, or strides
//   that make two indices meet); it may be exactly an input (in place) but not partially overlap one.
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

namespace pointops {
namespace strided {

constexpr int kMaxDims = 8;

enum class MapFn { Id, Neg, Exp, Log, Sigmoid, Relu, Inv, Tanh };
enum class ZipFn { Add, Sub, Mul, Div, Max, Min, Pow, Lt, Eq, IsClose, ReluBack, LogBack, InvBack };
enum class ReduceFn { Sum, Prod, Max, Min };

MapFn parse_map_fn(c10::string_view name);
ZipFn parse_zip_fn(c10::string_view name);
ReduceFn parse_reduce_fn(c10::string_view name);

// The per-element functions, in the compute type T (float for the half types), equal to torch's.
template <MapFn F, typename T>
C10_HOST_DEVICE inline T map_value(T x) {
  if constexpr (F == MapFn::Id) return x;
  if constexpr (F == MapFn::Neg) return -x;
  if constexpr (F == MapFn::Exp) return std::exp(x);
  if constexpr (F == MapFn::Log) return std::log(x);
  if constexpr (F == MapFn::Sigmoid) return T(1) / (T(1) + std::exp(-x));
  if constexpr (F == MapFn::Relu) return x < T(0) ? T(0) : x;  // NaN stays NaN, as torch.relu
  if constexpr (F == MapFn::Inv) return T(1) / x;
  if constexpr (F == MapFn::Tanh) return std::tanh(x);
}

template <ZipFn F, typename T>
C10_HOST_DEVICE inline T zip_value(T a, T b) {
  if constexpr (F == ZipFn::Add) return a + b;
  if constexpr (F == ZipFn::Sub) return a - b;
  if constexpr (F == ZipFn::Mul) return a * b;
  if constexpr (F == ZipFn::Div) return a / b;
  // torch.maximum / minimum: NaN if either is NaN
  if constexpr (F == ZipFn::Max) return (a != a) ? a : ((b != b) ? b : (a > b ? a : b));
  if constexpr (F == ZipFn::Min) return (a != a) ? a : ((b != b) ? b : (a < b ? a : b));
  if constexpr (F == ZipFn::Pow) return std::pow(a, b);
  if constexpr (F == ZipFn::Lt) return a < b ? T(1) : T(0);
  if constexpr (F == ZipFn::Eq) return a == b ? T(1) : T(0);
  if constexpr (F == ZipFn::IsClose) return std::abs(a - b) < T(1e-2) ? T(1) : T(0);
  if constexpr (F == ZipFn::ReluBack) return a > T(0) ? b : T(0);
  if constexpr (F == ZipFn::LogBack) return b / a;
  if constexpr (F == ZipFn::InvBack) return -b / (a * a);
}

// A walk over `numel` elements of NOps operands that share a shape: sizes[d] and, per operand,
// strides[op][d] in elements (0 where broadcast). Dim ndim - 1 is the innermost (fastest) one.
// ndim >= 1 always (a 0-dim or all-size-1 shape is one dim of size 1).
template <int NOps>
struct StridedLayout {
  int ndim = 1;
  std::array<int64_t, kMaxDims> sizes{};
  std::array<std::array<int64_t, kMaxDims>, NOps> strides{};
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= sizes[d];
    return n;
  }
};

// Builds the merged layout of operands with the common shape `sizes` and per-operand `strides`
// (each the length of sizes). Returns false when more than kMaxDims dims remain after merging.
// No heap allocation for up to 16 dims: it runs on every call, and a small call's host time counts.
template <int NOps>
bool make_layout(at::IntArrayRef sizes, const std::array<const int64_t*, NOps>& strides, StridedLayout<NOps>& out) {
  // the dims of size > 1, outermost first: by decreasing stride of operand 0 (the output's, so
  // that writes are the innermost loop), ties by the other operands' strides in order (a stable
  // sort keeps the tensor's own order otherwise)
  c10::SmallVector<int, 16> dims;
  for (int d = 0; d < static_cast<int>(sizes.size()); ++d)
    if (sizes[d] != 1) dims.push_back(d);
  std::stable_sort(dims.begin(), dims.end(), [&](int x, int y) {
    for (int op = 0; op < NOps; ++op)
      if (strides[op][x] != strides[op][y]) return strides[op][x] > strides[op][y];
    return false;
  });
  // merge an outer dim into the inner one when every operand steps through both as one dim
  c10::SmallVector<int64_t, 16> merged_sizes;
  c10::SmallVector<std::array<int64_t, NOps>, 16> merged_strides;
  for (int d : dims) {
    if (!merged_sizes.empty()) {
      bool mergeable = true;
      for (int op = 0; op < NOps; ++op)
        mergeable = mergeable && merged_strides.back()[op] == strides[op][d] * sizes[d];
      if (mergeable) {
        merged_sizes.back() *= sizes[d];
        for (int op = 0; op < NOps; ++op) merged_strides.back()[op] = strides[op][d];
        continue;
      }
    }
    merged_sizes.push_back(sizes[d]);
    std::array<int64_t, NOps> s{};
    for (int op = 0; op < NOps; ++op) s[op] = strides[op][d];
    merged_strides.push_back(s);
  }
  if (merged_sizes.empty()) {  // 0-dim or all sizes 1: one element
    merged_sizes.push_back(1);
    merged_strides.push_back(std::array<int64_t, NOps>{});
  }
  if (merged_sizes.size() > static_cast<size_t>(kMaxDims)) return false;
  out.ndim = static_cast<int>(merged_sizes.size());
  for (int d = 0; d < out.ndim; ++d) {
    out.sizes[d] = merged_sizes[d];
    for (int op = 0; op < NOps; ++op) out.strides[op][d] = merged_strides[d][op];
  }
  return true;
}

// Strides of a tensor (sizes, strides) as seen from a broadcast to `shape` (0 on new or expanded
// dims), without allocating (and without making the expanded view).
using StrideVector = c10::SmallVector<int64_t, 16>;
inline StrideVector broadcast_strides_small(at::IntArrayRef sizes, at::IntArrayRef strides, at::IntArrayRef shape) {
  const int64_t nd = static_cast<int64_t>(shape.size()), dims = static_cast<int64_t>(sizes.size());
  const int64_t lead = nd - dims;
  StrideVector s(nd, 0);
  for (int64_t d = 0; d < dims; ++d) s[lead + d] = sizes[d] == 1 ? 0 : strides[d];
  return s;
}
inline StrideVector broadcast_strides_small(const at::Tensor& t, at::IntArrayRef shape) {
  return broadcast_strides_small(t.sizes(), t.strides(), shape);
}

// The layout of out and its inputs broadcast to out (operand 0 out, then the inputs in order).
template <int NOps>
bool layout_of(const at::Tensor& out, const std::array<const at::Tensor*, NOps - 1>& inputs, StridedLayout<NOps>& L) {
  std::array<StrideVector, NOps - 1> in_strides;
  std::array<const int64_t*, NOps> pointers;
  pointers[0] = out.strides().data();
  for (int k = 0; k < NOps - 1; ++k) {
    in_strides[k] = broadcast_strides_small(*inputs[k], out.sizes());
    pointers[k + 1] = in_strides[k].data();
  }
  return make_layout<NOps>(out.sizes(), pointers, L);
}

// Calls fn(offsets, n) for the consecutive runs of linear element indices [begin, end): offsets[op]
// is operand op's element offset of the run's first element, and the run's n elements follow along
// the innermost dim (strides[op][ndim - 1]).
template <int NOps, typename Fn>
inline void for_each_run(const StridedLayout<NOps>& L, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  const int inner = L.ndim - 1;
  std::array<int64_t, kMaxDims> index{};
  int64_t rest = begin;
  for (int d = inner; d >= 0; --d) {
    index[d] = rest % L.sizes[d];
    rest /= L.sizes[d];
  }
  std::array<int64_t, NOps> off{};
  for (int op = 0; op < NOps; ++op)
    for (int d = 0; d <= inner; ++d) off[op] += index[d] * L.strides[op][d];
  int64_t i = begin;
  while (i < end) {
    const int64_t n = std::min(L.sizes[inner] - index[inner], end - i);
    fn(off, n);
    i += n;
    if (i >= end) break;
    // step to the start of the next run: the inner index wraps, carry into the outer dims
    for (int op = 0; op < NOps; ++op) off[op] -= index[inner] * L.strides[op][inner];
    index[inner] = 0;
    for (int d = inner - 1; d >= 0; --d) {
      ++index[d];
      for (int op = 0; op < NOps; ++op) off[op] += L.strides[op][d];
      if (index[d] < L.sizes[d]) break;
      for (int op = 0; op < NOps; ++op) off[op] -= index[d] * L.strides[op][d];
      index[d] = 0;
    }
  }
}

// ---- checks (strided_checks.cpp), mirrored by the fake kernels in pointops/strided.py
void check_strided_dtype(const at::Tensor& t, const char* name);
// The broadcast shape of a and b, refusing mismatched dtype / device / shapes with their shapes.
std::vector<int64_t> check_zip_inputs(const at::Tensor& a, const at::Tensor& b, const char* op);
// out: right shape, dtype, device; no internal overlap; no partial overlap with any input.
void check_out(const at::Tensor& out, at::IntArrayRef shape, at::ScalarType dtype, const at::Tensor& like,
               std::initializer_list<const at::Tensor*> inputs, const char* op);
bool may_overlap_internally(const at::Tensor& t);
// The reduced dims (sorted, wrapped) of dim=None / a list; refuses out-of-range and repeated dims.
// Small vectors: these run on every reduce call, where a heap allocation is a measurable share.
using DimList = c10::SmallVector<int64_t, 16>;
DimList reduced_dims(const at::Tensor& x, at::OptionalIntArrayRef dim);
DimList reduce_output_shape(const at::Tensor& x, at::IntArrayRef dims, bool keepdim);
// matmul: a (..., n, k), b (..., k, m) -> (..., n, m) with the batch dims broadcast.
std::vector<int64_t> check_matmul_inputs(const at::Tensor& a, const at::Tensor& b);

// Strides of t as seen from a broadcast to `shape` (0 on new or expanded dims).
std::vector<int64_t> broadcast_strides(const at::Tensor& t, at::IntArrayRef shape);

}  // namespace strided
}  // namespace pointops
