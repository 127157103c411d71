// knn_points on CUDA: the launcher. K = 1 is the nearest-neighbour kernel itself (chamfer_cuda.cu);
// 2 <= K <= 64 keeps each query's candidates in registers (knn_cuda_lists.cuh); K > 64, or points
// too wide for a shared-memory tile, computes whole rows of distances, a chunk of queries at a
// time, and selects the K smallest (float32: topk of (distance, index) keys; float64: a stable
// sort): slower, but exact and with the same tie rule.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <limits>
#include <type_traits>

#include "common/cuda_utils.cuh"
#include "grid/grid.h"
#include "neighbors/knn_cuda.cuh"
#include "neighbors/neighbors.h"
#include "neighbors/spatial_order_cuda.cuh"

namespace pointops {
namespace knn_cuda {
namespace {

constexpr int64_t kSortChunkElements = int64_t(1) << 25;  // distances per chunk of the sort path
// The sort path: distances of rows [row_begin, row_begin + rows) of the flattened (B * N) queries to
// every reference point, +inf where there is no candidate (padding, NaN, +inf). -0 (an L1 distance
// of signed zero differences) is stored as +0, which compares equal: the radix sort would order
// the two. float32 rows are written as int64 keys, the distance's bits above the index: the bits
// of a float >= +0 order as the float does, so the keys order by (distance, index) and are unique.
template <typename acc_t, Metric metric, typename out_t>
__global__ void knn_distance_rows_kernel(KnnArgs<acc_t> a, int64_t row_begin, int64_t rows, out_t* out) {
  const int64_t total = rows * a.M;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = row_begin + e / a.M, j = e % a.M;
    const int64_t b = row / a.N, i = row % a.N;
    const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
    const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
    acc_t d = std::numeric_limits<acc_t>::infinity();
    if (i < n_valid && j < m_valid) {
      d = point_distance_dynamic<metric>(a.p1 + row * a.dim, a.p2 + (b * a.M + j) * a.dim, a.dim);
      d = d < std::numeric_limits<acc_t>::infinity() ? d + acc_t(0) : std::numeric_limits<acc_t>::infinity();
    }
    if constexpr (std::is_same_v<out_t, int64_t>) {
      out[e] = (static_cast<int64_t>(__float_as_uint(d)) << 32) | j;
    } else {
      out[e] = d;
    }
  }
}

constexpr uint32_t kInfinityBits = 0x7F800000u;  // +inf as float32 bits

template <typename acc_t>
void knn_sort_path(KnnArgs<acc_t>& a, Metric metric, const at::Tensor& dists, const at::Tensor& idx) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t queries = a.B * a.N, L = std::min(a.K, a.M);
  dists.zero_();
  idx.fill_(-1);
  if (L == 0) return;
  // float32: one int64 key per pair and topk (a selection, not a sort of whole rows); float64
  // distances do not fit a key beside the index, so their rows are sorted stably.
  constexpr bool kKeys = std::is_same_v<acc_t, float>;
  using row_t = std::conditional_t<kKeys, int64_t, acc_t>;
  const int64_t rows_per_chunk = std::max<int64_t>(1, kSortChunkElements / a.M);
  auto rows_buffer = at::empty({std::min(rows_per_chunk, queries), a.M}, dists.options().dtype(c10::CppTypeToScalarType<row_t>::value));
  auto flat_dists = dists.view({queries, a.K}), flat_idx = idx.view({queries, a.K});
  for (int64_t row_begin = 0; row_begin < queries; row_begin += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, queries - row_begin);
    auto chunk = rows_buffer.narrow(0, 0, rows);
    row_t* chunk_data = chunk.template data_ptr<row_t>();
    dispatch_metric(metric, [&](auto metric_tag) {
      knn_distance_rows_kernel<acc_t, decltype(metric_tag)::value, row_t>
          <<<grid_for(rows * a.M, 256), 256, 0, stream>>>(a, row_begin, rows, chunk_data);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    at::Tensor values, order, none;
    if constexpr (kKeys) {
      const auto top = std::get<0>(at::topk(chunk, L, /*dim=*/1, /*largest=*/false, /*sorted=*/true));
      const auto bits = top.bitwise_right_shift(32);
      none = bits == static_cast<int64_t>(kInfinityBits);
      values = bits.to(at::kInt).view(at::kFloat);
      order = top.bitwise_and(int64_t(0xFFFFFFFF));
    } else {
      // Stable: equal distances keep increasing index order (the tie rule of the other paths).
      std::tie(values, order) = at::sort(chunk, /*stable=*/true, /*dim=*/1, /*descending=*/false);
      values = values.narrow(1, 0, L);
      order = order.narrow(1, 0, L);
      none = values == std::numeric_limits<acc_t>::infinity();
    }
    flat_dists.narrow(0, row_begin, rows).narrow(1, 0, L).copy_(values.masked_fill(none, 0));
    flat_idx.narrow(0, row_begin, rows).narrow(1, 0, L).copy_(order.masked_fill(none, -1));
  }
}

// The register-list search for the list length that holds K (2 <= K <= max_register_k<acc_t>()).
template <typename acc_t>
void run_register_lists_for(KnnArgs<acc_t>& a, Metric metric, const at::Tensor& dists) {
  if (a.K <= 8) {
    run_register_lists<acc_t, 8>(a, metric, dists);
  } else if (a.K <= 16) {
    run_register_lists<acc_t, 16>(a, metric, dists);
  } else if constexpr (max_register_k<acc_t>() > 16) {
    if (a.K <= 32) {
      run_register_lists<acc_t, 32>(a, metric, dists);
    } else {
      run_register_lists<acc_t, 64>(a, metric, dists);
    }
  }
}

// The brute-force search for K >= 2 neighbours into dists / idx ((B, N, K) in the compute type: float32
// for half types, float64 for float64). skip_clouds ((B,) uint8 on the device, or undefined): the
// clouds marked 1 are neither searched nor written (the grid wrote them).
void knn_brute_cuda(const at::Tensor& q, const at::Tensor& r, const at::Tensor& len1, const at::Tensor& len2,
                    int64_t K, Metric metric, const at::Tensor& dists, const at::Tensor& idx,
                    const at::Tensor& skip_clouds) {
  const int64_t B = q.size(0), N = q.size(1), M = r.size(1), dim = q.size(2);
  if (B * N == 0) return;
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "knn_points_cuda", [&] {
    using acc_t = scalar_t;
    KnnArgs<acc_t> a{};
    a.p1 = q.data_ptr<acc_t>();
    a.p2 = r.data_ptr<acc_t>();
    a.lengths1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
    a.lengths2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
    a.B = B, a.N = N, a.M = M, a.dim = dim, a.K = K;
    a.dists = dists.data_ptr<acc_t>();
    a.idx = idx.data_ptr<int64_t>();
    a.skip_clouds = skip_clouds.defined() ? skip_clouds.const_data_ptr<uint8_t>() : nullptr;
    const int64_t any_dim_tile = (kMaxTileBytes / static_cast<int64_t>(dim * sizeof(acc_t))) / kGroup * kGroup;
    a.tile_points = static_cast<int>(std::min<int64_t>(kTile, any_dim_tile));
    const bool registers = K <= max_register_k<acc_t>() && (dim <= 3 || a.tile_points >= kGroup);
    if (!registers) {
      // The sort path fills every row first: never behind the grid (whose K and D take registers).
      TORCH_INTERNAL_ASSERT(a.skip_clouds == nullptr, "knn_points: no row-sort search beside the grid");
      knn_sort_path<acc_t>(a, metric, dists, idx);
      return;
    }
    SpatialOrder order;  // kept alive until the search is queued
    if (has_spatial_search<acc_t>(K) && use_spatial_order(B, N, M, dim)) {
      order = spatial_order_cuda(q, r, len1, len2, kBoxPoints);
      a.p2 = order.refs.data_ptr<acc_t>();
      a.query_perm = order.query_perm.data_ptr<int64_t>();
      a.query_keys = order.query_keys.data_ptr<int32_t>();
      a.ref_keys = order.ref_keys.data_ptr<int32_t>();
      a.ref_index = order.ref_index.data_ptr<int32_t>();
      a.box_bounds = order.box_bounds.data_ptr<acc_t>();
      a.boxes = order.box_bounds.size(1);
    }
    run_register_lists_for<acc_t>(a, metric, dists);
  });
}

std::tuple<at::Tensor, at::Tensor> knn_points_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                   const c10::optional<at::Tensor>& lengths1,
                                                   const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                   int64_t norm, c10::string_view algorithm) {
  const auto [len1, len2] = check_knn_inputs(p1, p2, lengths1, lengths2, K, norm);
  const Metric metric = metric_from_norm(norm);
  const c10::cuda::CUDAGuard guard(p1.device());
  // Half types compute in float32: converted once (exactly), searched, rounded once at the end.
  const auto compute_type = p1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (choose_grid(algorithm, p1.size(0), p1.size(1), p2.size(1), p1.size(2), K, &grid_pays_cuda)) {
    if (!grid_may_decline(algorithm)) return knn_grid_cuda(p1, p2, len1, len2, K, metric, /*zero_unmatched=*/true);
    if (K == 1) {  // the far-query probe (nearest_neighbor's "auto")
      auto [dist, idx] = nearest_neighbor_direction_cuda(p1, p2, len1, len2, metric, /*zero_unmatched=*/true,
                                                         /*probe_grid=*/true);
      return {dist.unsqueeze(2), idx.unsqueeze(2)};
    }
    // The same probe for lists: the grid searches the clouds it marks, brute force the others into
    // the same outputs (no merge, no host sync). Brute force's lists must hold K in registers (its
    // row-sort path fills whole outputs): grid_pays_cuda's K <= 16 fits both compute types.
    const int64_t register_k = compute_type == at::kDouble ? max_register_k<double>() : max_register_k<float>();
    TORCH_INTERNAL_ASSERT(K <= register_k, "knn_points: auto's grid took K = ", K, ", more than brute force's ",
                          register_k, "-entry register lists");
    // Converted once for both searches (the grid's own conversion of these is then a no-op).
    const auto q = p1.to(compute_type).contiguous(), r = p2.to(compute_type).contiguous();
    at::Tensor choice;
    auto [dists, idx] = knn_grid_cuda(q, r, len1, len2, K, metric, /*zero_unmatched=*/true, &choice);
    if (choice.defined()) knn_brute_cuda(q, r, len1, len2, K, metric, dists, idx, choice);
    return {dists.to(p1.scalar_type()), idx};
  }
  if (K == 1) {  // the nearest-neighbour search itself: knn_points(K=1) is nearest_neighbor bit for bit
    auto [dist, idx] = nearest_neighbor_direction_cuda(p1, p2, len1, len2, metric, /*zero_unmatched=*/true);
    return {dist.unsqueeze(2), idx.unsqueeze(2)};
  }
  const int64_t B = p1.size(0), N = p1.size(1);
  const auto q = p1.to(compute_type).contiguous(), r = p2.to(compute_type).contiguous();
  auto dists = at::empty({B, N, K}, q.options());
  auto idx = at::empty({B, N, K}, q.options().dtype(at::kLong));
  knn_brute_cuda(q, r, len1, len2, K, metric, dists, idx, at::Tensor());
  return {dists.to(p1.scalar_type()), idx};
}

}  // namespace
}  // namespace knn_cuda

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("knn_points", &knn_cuda::knn_points_cuda); }

}  // namespace pointops
