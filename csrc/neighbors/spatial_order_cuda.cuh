// A spatial order for the brute-force neighbour searches (knn_cuda.cu): both clouds of a batched
// pair sorted along a Morton (Z-order) curve over their common bounding box, and the bounding box
// of every run ("box") of a fixed number of sorted reference points. A block of consecutive sorted queries is then a compact
// region: it scans the reference tiles outward from its own place on the curve, so that its lists
// fill with near points first, and skips every box that is provably farther than all of its
// queries' current K-th distances. The answers do not depend on the order (lists are kept by
// (distance, index)), only the time does.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>

#include "common/switches.h"

namespace pointops {

struct SpatialOrder {
  at::Tensor query_perm;   // (B, N) int64: sorted position -> query index; the valid queries come first
  at::Tensor query_keys;   // (B, N) int32, ascending
  at::Tensor refs;         // (B, M, D): the reference points in sorted order
  at::Tensor ref_index;    // (B, M) int32: sorted position -> reference index; the valid points come first
  at::Tensor ref_keys;     // (B, M) int32, ascending
  at::Tensor box_bounds;   // (B, boxes, 2, D): lo and hi corners of the finite points of each run of
                           // box_points sorted points (lo = +inf, hi = -inf when it has none)
};

// queries (B, N, D) and refs (B, M, D): contiguous float or double, D = 2 or 3; lengths (B,) int64
// or undefined. Points past a cloud's length and points with a non-finite coordinate get the
// largest key; the sort is stable, so the first lengths[b] sorted positions are the cloud's valid
// points (finite ones first).
SpatialOrder spatial_order_cuda(const at::Tensor& queries, const at::Tensor& refs, const at::Tensor& lengths1,
                                const at::Tensor& lengths2, int64_t box_points);

// The spatial order costs a few launches and two segmented sorts (tens of microseconds): it pays
// once a cloud has this many reference points and the batch this many queries.
constexpr int64_t kSpatialMinRefs = 2048;
constexpr int64_t kSpatialMinQueries = 2048;

// Whether a search that has a spatial variant runs in spatial order: POINTOPS_SPATIAL_ORDER=0 / 1
// forces index / spatial order (D = 2, 3), for tests and benchmarks; unset, the sizes decide.
inline bool use_spatial_order(int64_t B, int64_t N, int64_t M, int64_t dim) {
  if ((dim != 2 && dim != 3) || M == 0) return false;
  if (const auto forced = switch_flag("POINTOPS_SPATIAL_ORDER")) return *forced;
  return M >= kSpatialMinRefs && B * N >= kSpatialMinQueries;
}

// Whether a box can be skipped: the lower bound `bound` on the distance from a query to any point of
// the box, computed with rounding, is larger than `threshold` by more than the rounding of
// either value can explain (16 units in the last place, on both sides), so every point of the box
// has a computed distance strictly above the threshold.
template <typename acc_t>
__host__ __device__ inline bool provably_farther(acc_t bound, acc_t threshold) {
  constexpr acc_t kMargin = sizeof(acc_t) == 8 ? acc_t(4e-15) : acc_t(1e-6);
  return bound * (acc_t(1) - kMargin) > threshold;
}

}  // namespace pointops
