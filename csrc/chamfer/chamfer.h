// Nearest neighbour / Chamfer: what the CPU and CUDA launchers share.
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/Optional.h>

#include <cmath>
#include <tuple>
#include <type_traits>

namespace pointops {

// The argument names a pair of batched clouds goes by in an op's schema, for error messages.
struct CloudPairNames {
  const char* x;
  const char* y;
  const char* x_lengths;
  const char* y_lengths;
};

// Validates a query cloud x (B, N, D), a reference cloud y (B, M, D) and their optional (B,) lengths
// (int64 or int32, values in [0, size]; checking the values costs one device-to-host copy on CUDA).
// Returns the lengths as contiguous int64 tensors (undefined when absent).
std::tuple<at::Tensor, at::Tensor> check_cloud_pair(const at::Tensor& x, const at::Tensor& y,
                                                    const c10::optional<at::Tensor>& x_lengths,
                                                    const c10::optional<at::Tensor>& y_lengths,
                                                    const CloudPairNames& names);

// Validates (x, y, lengths) for nearest_neighbor / chamfer. Returns the lengths as int64 tensors
// (undefined when absent). Checking length values needs their contents, which costs one
// device-to-host copy on CUDA; that is the price of never reading past a cloud.
std::tuple<at::Tensor, at::Tensor> check_nearest_neighbor_inputs(
    const at::Tensor& x, const at::Tensor& y, const c10::optional<at::Tensor>& x_lengths,
    const c10::optional<at::Tensor>& y_lengths);

void check_nearest_neighbor_backward_inputs(const at::Tensor& grad_dist, const at::Tensor& x,
                                            const at::Tensor& y, const at::Tensor& idx);

// For the deterministic reference-cloud gradient: the (query, neighbour) pairs matched to each
// reference point, grouped by reference point and in increasing pair order. idx is (B, N) or
// (B, N, K); `order` (B*N*K,) holds flat pair indices (b*N + i)*K + k sorted by (b*M + idx);
// `offsets` (B*M+1,) delimits each reference point's run. Pairs with idx outside [0, M) sort to the
// end and belong to no run.
std::tuple<at::Tensor, at::Tensor> matched_queries_by_reference(const at::Tensor& idx, int64_t M);

// Calls the _nearest_neighbor_backward op through the dispatcher (so its own autograd, the double
// backward, applies): the gradient of dist = d(x, y[idx]) for idx (B, N) or (B, N, K).
std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_op(const at::Tensor& grad_dist, const at::Tensor& x,
                                                                const at::Tensor& y, const at::Tensor& idx,
                                                                int64_t norm);

// Makes the backward of dist = d(x, y[idx]) (idx (B, N) or (B, N, K), indices fixed) dist's grad_fn:
// the reverse mode of nearest_neighbor, knn_points and ball_query, for an Autograd kernel that
// computed dist below autograd and found x or y requiring grad (csrc/chamfer/chamfer_autograd.cpp).
void record_distances_backward(const at::Tensor& x, const at::Tensor& y, int64_t norm, at::Tensor& dist,
                               const at::Tensor& idx);

// The two metrics of the search and the loss. The enum values are the `norm` argument of the ops.
enum class Metric : int { kL1 = 1, kSquaredL2 = 2 };

// Validates `norm` (the schema's int) and names the metric.
Metric metric_from_norm(int64_t norm);

// acc + diff^2 as one correctly rounded fused multiply-add on both devices (explicitly, so the
// compiler's contraction choices cannot make two evaluations differ): CPU and CUDA distances agree
// bit for bit. The CPU loops that call it are compiled for AVX2 + FMA where the CPU has it
// (common/cpu_dispatch.h); elsewhere std::fma is libm's software fma, exact but slower.
template <typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t add_square(acc_t diff, acc_t acc) {
#ifdef __CUDA_ARCH__
  return ::fma(diff, diff, acc);
#else
  return std::fma(diff, diff, acc);
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

// point_distance with D known at compile time (D > 0) or at run time (D == 0: `dim`). Both apply
// the same operations in the same order, so they agree bit for bit.
template <int D, Metric metric, typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t point_distance_any(const acc_t* q, const acc_t* r, int64_t dim) {
  if constexpr (D > 0) {
    return point_distance<D, metric>(q, r);
  } else {
    return point_distance_dynamic<metric>(q, r, dim);
  }
}

// Calls fn(std::integral_constant<int, D>{}) with D = 2 or 3 for those dimensions (compiled
// specially), D = 0 (any dimension, known at run time) otherwise.
template <typename Fn>
void dispatch_dim(int64_t dim, Fn&& fn) {
  if (dim == 2) {
    fn(std::integral_constant<int, 2>{});
  } else if (dim == 3) {
    fn(std::integral_constant<int, 3>{});
  } else {
    fn(std::integral_constant<int, 0>{});
  }
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
// overflowed to inf), so the distance is undefined: NaN, never a made-up number. knn_points asks
// for 0 instead (`zero`, PyTorch3D's padding): its index, -1, already says there is no neighbour.
template <typename acc_t>
C10_HOST_DEVICE C10_ALWAYS_INLINE acc_t unmatched_distance(int64_t valid_refs, bool zero = false) {
  return zero ? acc_t(0) : (valid_refs == 0 ? acc_t(INFINITY) : acc_t(NAN));
}

// The nearest-neighbour search of one direction, for the ops built on it (knn_points with K = 1):
// dist (B, N), idx (B, N) for checked inputs (lengths int64 or undefined). zero_unmatched: queries
// without a neighbour get distance 0 instead of +inf / NaN. probe_grid (CUDA; algorithm="auto"
// where grid_pays_cuda says the sizes favour the grid): the grid searches the clouds its probe
// (knn_grid_cuda's probe_choice) finds cheaper than brute force, brute force the rest, in one pass
// of launches without a host sync; bit for bit either search.
std::tuple<at::Tensor, at::Tensor> nearest_neighbor_direction_cpu(const at::Tensor& x, const at::Tensor& y,
                                                                  const at::Tensor& x_lengths,
                                                                  const at::Tensor& y_lengths, Metric metric,
                                                                  bool zero_unmatched);
std::tuple<at::Tensor, at::Tensor> nearest_neighbor_direction_cuda(const at::Tensor& x, const at::Tensor& y,
                                                                   const at::Tensor& x_lengths,
                                                                   const at::Tensor& y_lengths, Metric metric,
                                                                   bool zero_unmatched, bool probe_grid = false);

}  // namespace pointops
