// Exact neighbour searches over a uniform spatial grid of the reference cloud: what the
// CPU (grid_search_cpu.cpp) and CUDA (grid_search_cuda.cu) implementations and the op launchers
// (chamfer_{cpu,cuda}, neighbors' knn_points / ball_query) share.
//
// Contract: for the same inputs on the same device, the grid path returns bit for bit what the
// brute-force path returns, distances and indices. That holds because
//   - every candidate distance is chamfer.h's point_distance (same operations, same order), so a
//     pair's distance does not depend on which path computed it;
//   - candidates are ranked by (distance, index) lexicographically (ties: the smaller index), which
//     is the order the brute-force scans produce by visiting references in increasing index;
//   - NaN and +inf distances never enter a list (as in brute force), so references with a
//     non-finite coordinate can be left out of the grid altogether, and a query with a non-finite
//     coordinate finds nothing (brute force: every distance is NaN or +inf);
//   - a cell is skipped only when a conservative lower bound on the distance of any point in it is
//     provably larger than the current K-th best distance (see provably_farther in
//     neighbors/spatial_order_cuda.cuh: bound * (1 - margin) > threshold), so a point that would
//     tie or win is never skipped.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "chamfer/chamfer.h"

namespace pointops {

// The `algorithm` argument of nearest_neighbor, chamfer, _chamfer_distance, knn_points, ball_query.
enum class SearchAlgorithm { kAuto, kBrute, kGrid };

// "auto" | "brute" | "grid"; anything else: TORCH_CHECK naming the argument and the value.
SearchAlgorithm parse_search_algorithm(c10::string_view name);

// The grid handles D = 2 and 3. algorithm="grid" with another D is refused (TORCH_CHECK: "algorithm='grid'
// needs points of dimension 2 or 3, got D = ..."); "auto" never picks it there.
bool grid_supports_dim(int64_t dim);

// Whether "auto" takes the grid for a search of B clouds, N queries and M references each, D
// dimensions, K neighbours (K = 1 for nearest_neighbor/chamfer). Decided from sizes only (no host
// sync); documented in README and measured in benchmarks/RESULTS.md. Where the caller lets it
// decline ("auto"), the grid then probes the data: on the CPU knn_grid_cpu hands the whole call back,
// on CUDA a device-side choice per cloud (knn_grid_cuda's probe_choice, below).
bool grid_pays_cpu(int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K);
bool grid_pays_cuda(int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K);
// The same for ball_query on CUDA (its own measured rule; the CPU ball query stays brute force).
bool ball_grid_pays_cuda(int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K);

// The searches. Inputs are checked by the caller (the op's check_* function): p1 (B, N, D) queries,
// p2 (B, M, D) references, same floating dtype and device, D = 2 or 3; lengths1 / lengths2 (B,)
// int64 contiguous or undefined. Half types compute in float32 (at::opmath_type), as brute force.
//
// knn: dists (B, N, K) and idx (B, N, K) int64, the min(K, valid refs) best by (distance, index),
// exactly as knn_points' brute-force path; slots without a neighbour hold idx -1 and distance 0.
// With K = 1 and zero_unmatched = false the (B, N, 1) result is nearest_neighbor's: a valid query
// without a neighbour gets unmatched_distance(m_valid) (+inf for an empty cloud, NaN otherwise),
// padded queries distance 0 and idx -1.
// knn_grid_cpu with `declined` (the launchers' "auto"): after building the grids it may find, from a
// probe of the data (far queries), that brute force costs less; it then searches nothing, sets
// *declined and returns undefined tensors, and the caller runs brute force.
std::tuple<at::Tensor, at::Tensor> knn_grid_cpu(const at::Tensor& p1, const at::Tensor& p2,
                                                const at::Tensor& lengths1, const at::Tensor& lengths2, int64_t K,
                                                Metric metric, bool zero_unmatched, bool* declined = nullptr);
// knn_grid_cuda with `probe_choice` (the launchers' "auto"): after building the grids a probe
// kernel estimates, from a sample of each cloud's queries, what the grid search would cost against
// brute force (far queries visit many empty cells) and writes a (B,) uint8 choice on the device, 1
// where the grid pays; the grid then searches only those clouds. Returns dists in the compute type
// (float32 for half types) and sets *probe_choice; the caller's brute-force pass searches the
// clouds marked 0 and takes the others' results from these (no host sync).
std::tuple<at::Tensor, at::Tensor> knn_grid_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                 const at::Tensor& lengths1, const at::Tensor& lengths2, int64_t K,
                                                 Metric metric, bool zero_unmatched,
                                                 at::Tensor* probe_choice = nullptr);

// ball_query: the first K references in index order with squared distance < squared_radius(radius)
// (neighbors.h), dists (B, N, K) / idx (B, N, K), unused slots 0 / -1: ball_query's brute-force
// result bit for bit.
std::tuple<at::Tensor, at::Tensor> ball_query_grid_cpu(const at::Tensor& p1, const at::Tensor& p2,
                                                       const at::Tensor& lengths1, const at::Tensor& lengths2,
                                                       int64_t K, double radius);
std::tuple<at::Tensor, at::Tensor> ball_query_grid_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                        const at::Tensor& lengths1, const at::Tensor& lengths2,
                                                        int64_t K, double radius);

// What the launchers call after their input checks: parses `algorithm`, refuses "grid" for a D
// the grid has no kernels for, and says whether to search with the grid: "grid", or "auto" where
// pays(B, N, M, dim, K) (grid_pays_cpu / grid_pays_cuda) says the build is worth it.
inline bool choose_grid(c10::string_view algorithm, int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K,
                        bool (*pays)(int64_t, int64_t, int64_t, int64_t, int64_t)) {
  const SearchAlgorithm choice = parse_search_algorithm(algorithm);
  if (choice == SearchAlgorithm::kGrid) {
    TORCH_CHECK(grid_supports_dim(dim), "algorithm='grid' needs points of dimension 2 or 3, got D = ", dim);
    return true;
  }
  return choice == SearchAlgorithm::kAuto && grid_supports_dim(dim) && pays(B, N, M, dim, K);
}

// Whether the grid, once chosen, may hand the call back to brute force after probing the data
// (knn_grid_cpu's `declined`): "auto" only; "grid" is the caller's explicit choice.
inline bool grid_may_decline(c10::string_view algorithm) {
  return parse_search_algorithm(algorithm) == SearchAlgorithm::kAuto;
}

}  // namespace pointops
