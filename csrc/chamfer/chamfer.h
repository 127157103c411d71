// Nearest neighbour / Chamfer: what the CPU and CUDA launchers share.
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/Optional.h>

#include <cmath>
#include <tuple>
#include <type_traits>

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

// The two metrics of the search and the loss. The enum values are the `norm` argument of the ops.
enum class Metric : int { kL1 = 1, kSquaredL2 = 2 };

// Validates `norm` (the schema's int) and names the metric.
Metric metric_from_norm(int64_t norm);

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

// One coordinate's contribution: diff^2 (squared L2) or |diff| (L1).
template <Metric metric, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t coordinate_term(acc_t diff) {
  if constexpr (metric == Metric::kL1) {
    return diff < acc_t(0) ? -diff : diff;  // NaN stays NaN
  } else {
    return diff * diff;
  }
}

template <Metric metric, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t add_coordinate_term(acc_t diff, acc_t acc) {
  if constexpr (metric == Metric::kL1) {
    return acc + coordinate_term<metric>(diff);
  } else {
    return add_square(diff, acc);
  }
}

// The distance in the exact per-coordinate form: for squared L2, |q|^2 + |r|^2 - 2 q.r cancels
// catastrophically for clouds far from the origin (LiDAR scale), (q - r)^2 does not (q - r is
// rounded once, relative to the difference itself). Same operation order on every call, so a
// distance recomputed on the same device is bitwise equal to the first evaluation.
template <int D, Metric metric, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t point_distance(const acc_t* q, const acc_t* r) {
  acc_t d = coordinate_term<metric>(q[0] - r[0]);
#pragma unroll
  for (int k = 1; k < D; ++k) d = add_coordinate_term<metric>(q[k] - r[k], d);
  return d;
}

template <Metric metric, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t point_distance_dynamic(const acc_t* q, const acc_t* r, int64_t dim) {
  acc_t d = coordinate_term<metric>(q[0] - r[0]);
  for (int64_t k = 1; k < dim; ++k) d = add_coordinate_term<metric>(q[k] - r[k], d);
  return d;
}

// d distance / d q for one coordinate: 2 diff (squared L2) or sign(diff) (L1; 0 at diff = 0,
// where |.| has no derivative, as torch.sign; NaN stays NaN).
template <Metric metric, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t distance_derivative(acc_t diff) {
  if constexpr (metric == Metric::kL1) {
    return diff > acc_t(0) ? acc_t(1) : (diff < acc_t(0) ? acc_t(-1) : diff * acc_t(0));
  } else {
    return acc_t(2) * diff;
  }
}

// Calls fn(std::integral_constant<Metric, m>{}) for the metric of `norm`.
template <typename Fn>
void dispatch_metric(Metric metric, Fn&& fn) {
  if (metric == Metric::kL1) {
    fn(std::integral_constant<Metric, Metric::kL1>{});
  } else {
    fn(std::integral_constant<Metric, Metric::kSquaredL2>{});
  }
}

// What a query whose search found no neighbour reports. Padded queries (beyond their length)
// report 0; an empty reference cloud is infinitely far; otherwise every distance was NaN (or
// overflowed to inf), so the distance is undefined: NaN, never a made-up number.
template <typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t unmatched_distance(int64_t valid_refs) {
  return valid_refs == 0 ? acc_t(INFINITY) : acc_t(NAN);
}

}  // namespace pointops
