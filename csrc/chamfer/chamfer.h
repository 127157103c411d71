// Nearest neighbour / Chamfer: what the CPU and CUDA launchers share.
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/Optional.h>

#include <cmath>
#include <tuple>

namespace pointops {

// Validates (x, y, lengths) for nearest_neighbor / chamfer. Returns the lengths as int64 tensors
// (undefined when absent). Checking length values needs their contents, which costs one
// device-to-host copy on CUDA; that is the price of never reading past a cloud.
std::tuple<at::Tensor, at::Tensor> check_nearest_neighbor_inputs(
    const at::Tensor& x, const at::Tensor& y, const c10::optional<at::Tensor>& x_lengths,
    const c10::optional<at::Tensor>& y_lengths);

void check_nearest_neighbor_backward_inputs(const at::Tensor& grad_dist, const at::Tensor& x,
                                            const at::Tensor& y, const at::Tensor& idx);

// For the deterministic reference-cloud gradient: the queries matched to each reference point,
// grouped by reference point and in increasing query order. `order` (B*N,) holds flat query
// indices b*N+i sorted by (b*M + idx); `offsets` (B*M+1,) delimits each reference point's run.
// Queries with idx = -1 sort to the end and belong to no run.
std::tuple<at::Tensor, at::Tensor> matched_queries_by_reference(const at::Tensor& idx, int64_t M);

// acc + diff^2. The device fuses it into one FMA instruction (explicitly, so the compiler's
// contraction choices cannot make two evaluations differ); the host has no guaranteed FMA unit
// and computes it as a multiply then an add. CPU and CUDA distances may so differ in the last bit.
template <typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t add_square(acc_t diff, acc_t acc) {
#ifdef __CUDA_ARCH__
  return ::fma(diff, diff, acc);
#else
  return acc + diff * diff;
#endif
}

// Squared Euclidean distance in the exact (q - r)^2 form: |q|^2 + |r|^2 - 2 q.r cancels
// catastrophically for clouds far from the origin (LiDAR scale), this form does not (q - r is
// rounded once, relative to the difference itself). Same operation order on every call, so a
// distance recomputed on the same device is bitwise equal to the first evaluation.
template <int D, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t squared_distance(const acc_t* q, const acc_t* r) {
  acc_t diff = q[0] - r[0];
  acc_t d = diff * diff;
#pragma unroll
  for (int k = 1; k < D; ++k) d = add_square(q[k] - r[k], d);
  return d;
}

template <typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t squared_distance_dynamic(const acc_t* q, const acc_t* r,
                                                                  int64_t dim) {
  acc_t diff = q[0] - r[0];
  acc_t d = diff * diff;
  for (int64_t k = 1; k < dim; ++k) d = add_square(q[k] - r[k], d);
  return d;
}

// What a query whose search found no neighbour reports. Padded queries (beyond their length)
// report 0; an empty reference cloud is infinitely far; otherwise every distance was NaN (or
// overflowed to inf), so the distance is undefined: NaN, never a made-up number.
template <typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t unmatched_distance(int64_t valid_refs) {
  return valid_refs == 0 ? acc_t(INFINITY) : acc_t(NAN);
}

}  // namespace pointops
