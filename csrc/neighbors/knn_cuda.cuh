// knn_points on CUDA: what the launcher (knn_cuda.cu) and the register-list kernels share. The
// kernels are instantiated in one file per list length (knn_cuda_list{8,16,32,64}.cu) so that the
// heavily unrolled variants compile in parallel.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>

#include "neighbors/neighbors.h"

namespace pointops {
namespace knn_cuda {

constexpr int kThreads = 128;
constexpr int kTile = 256;                      // reference points per shared-memory tile (D = 2, 3)
constexpr int kGroup = 4;                       // reference points per queue entry
constexpr int kMaxGroups = kTile / kGroup;      // queue entries per thread and tile: a byte each
constexpr int kMaxTileBytes = 32 * 1024;        // the any-D tile
// Spatial order: each tile of kTile sorted reference points has kTile / kBoxPoints bounding boxes,
// and a warp skips the boxes that are provably farther than all of its queries' KP-th best (a warp
// of 32 Morton neighbours is more compact than the block: it skips more).
constexpr int kBoxPoints = 64;
constexpr int kBoxesPerTile = kTile / kBoxPoints;

template <typename acc_t>
struct KnnArgs {
  const acc_t* p1;           // (B, N, dim), contiguous
  const acc_t* p2;           // (B, M, dim)
  const int64_t* lengths1;   // (B,) or nullptr
  const int64_t* lengths2;
  int64_t B, N, M, dim, K;
  int64_t chunks, split_len, splits;  // SearchPlan
  int tile_points;           // points per tile (a multiple of kGroup)
  acc_t* dists;              // (B, N, K): written by the search when splits == 1, else by the merge
  int64_t* idx;
  acc_t* part_dist;          // (splits, KP, B * N) candidate lists of the splits
  int32_t* part_idx;
  // The spatial order (spatial_order_cuda.cuh; all nullptr: index order). p2 then holds the sorted
  // reference points; the queries are searched in sorted order, read through query_perm.
  const int64_t* query_perm;   // (B, N)
  const int32_t* query_keys;   // (B, N)
  const int32_t* ref_keys;     // (B, M)
  const int32_t* ref_index;    // (B, M)
  const acc_t* box_bounds;     // (B, boxes, 2, dim): kBoxPoints sorted points each
  int64_t boxes;
  // (B,) or nullptr: clouds marked 1 are neither searched nor written (their rows come from the
  // grid: "auto" after the grid's far-query probe, knn_points_cuda).
  const uint8_t* skip_clouds;
};

// The spatial order (knn_cuda_lists.cuh) is used for lists of this length and longer (K > 16),
// float32 only: measured on an H100 (8 x 8192^2, unit cube), it takes K = 32 from 2.4 to 1.1 ms and
// K = 64 from 6.3 to 2.2 ms, but K = 8 and 16 run faster in index order (0.55 and 0.71 ms against
// 0.66 and 0.91), where the sort and the first tile's insertions cost more than the skipped tiles save.
constexpr int kSpatialMinListLength = 32;

// Whether knn_points runs a K-search on compute type acc_t in spatial order when the sizes call for it.
template <typename acc_t>
constexpr bool has_spatial_search(int64_t K) {
  return std::is_same_v<acc_t, float> && K > kSpatialMinListLength / 2;
}

// The largest K searched with register lists: float64 lists of 32 or 64 would spill (and compile
// slowly); float64 is the accuracy path, and a larger K sorts rows instead.
template <typename acc_t>
constexpr int64_t max_register_k() {
  return sizeof(acc_t) == 8 ? 16 : kMaxRegisterK;
}

// The register-list search for lists of KP candidates (2 <= K <= KP), with the merge of the
// reference splits: writes a.dists / a.idx. Defined in knn_cuda_lists.cuh, instantiated per KP.
template <typename acc_t, int KP>
void run_register_lists(KnnArgs<acc_t>& a, Metric metric, const at::Tensor& dists);

}  // namespace knn_cuda
}  // namespace pointops
