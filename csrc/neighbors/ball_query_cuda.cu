// Ball query on CUDA: one thread per query scans the reference points in index order through
// shared-memory tiles and keeps the first K whose squared distance is below radius^2. A group of 4
// points is tested by its smallest distance (most groups hold none); a group with a point inside is
// noted in a per-thread queue and written out at the end of the tile, by all lanes at once, rather
// than stalling the warp on each lane's find. A block stops after the first tile by which every one
// of its queries has K. Small batches split the reference cloud
// across blocks: each split keeps its own first K and a merge concatenates the splits in order up
// to K, which is the first K in index order again.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <limits>

#include "common/cuda_utils.cuh"
#include "common/point_tile.cuh"
#include "grid/grid.h"
#include "neighbors/neighbors.h"
#include "neighbors/search_cuda.cuh"

namespace pointops {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 256;                            // reference points per tile (D = 2, 3)
constexpr int kGroup = 4;                             // points tested by their minimum first
constexpr int kMaxTileBytes = 32 * 1024;              // the any-D tile
constexpr int64_t kMaxPartialBytes = int64_t(1) << 28;  // the splits' lists, at most

template <typename acc_t>
struct BallArgs {
  const acc_t* p1;          // (B, N, dim), contiguous
  const acc_t* p2;          // (B, M, dim)
  const int64_t* lengths1;  // (B,) or nullptr
  const int64_t* lengths2;
  int64_t B, N, M, dim, K;
  acc_t r2;                 // squared_radius(radius)
  int64_t chunks, split_len, splits;  // SearchPlan
  int tile_points;
  acc_t* dists;             // (B, N, K): written by the search when splits == 1, else by the merge
  int64_t* idx;
  acc_t* part_dist;         // (splits, B * N, K)
  int32_t* part_idx;
  int32_t* part_count;      // (splits, B * N): entries each split found
};

template <typename acc_t, int D>
__global__ void __launch_bounds__(kThreads) ball_query_kernel(BallArgs<acc_t> a) {
  using Point = SharedPoint<acc_t, (D > 0 ? D : 1)>;
  __shared__ uint8_t queue[kTile / kGroup * kThreads];  // groups with a point inside, per thread and tile
  __shared__ Point fixed_tile[D > 0 ? kTile : 1];
  extern __shared__ __align__(16) unsigned char any_dim_tile_bytes[];
  acc_t* any_dim_tile = reinterpret_cast<acc_t*>(any_dim_tile_bytes);
  const int tile_points = D > 0 ? kTile : a.tile_points;

  const int64_t b = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks, split = blockIdx.y;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
  const int64_t i = chunk * kThreads + threadIdx.x;
  const bool valid = i < n_valid;
  const int64_t m_begin = split * a.split_len, m_end = min(m_begin + a.split_len, m_valid);
  const acc_t* query = a.p1 + (b * a.N + (valid ? i : 0)) * a.dim;
  const acc_t* refs = a.p2 + b * a.M * a.dim;
  const int64_t row = b * a.N + i;
  acc_t* out_dist = a.splits == 1 ? a.dists + row * a.K : a.part_dist + (split * a.B * a.N + row) * a.K;

  acc_t q[D > 0 ? D : 1];
#pragma unroll
  for (int c = 0; c < (D > 0 ? D : 1); ++c) q[c] = D > 0 && valid ? query[c] : acc_t(0);
  auto distance_to = [&](int t) -> acc_t {
    if constexpr (D > 0) {
      const Point p = fixed_tile[t];
      return point_distance<D, Metric::kSquaredL2>(q, p.c);
    } else {
      return point_distance_dynamic<Metric::kSquaredL2>(query, any_dim_tile + t * a.dim, a.dim);
    }
  };
  auto emit = [&](int64_t slot, acc_t d, int64_t j) {
    out_dist[slot] = d;
    if (a.splits == 1) {
      a.idx[row * a.K + slot] = j;
    } else {
      a.part_idx[(split * a.B * a.N + row) * a.K + slot] = static_cast<int32_t>(j);
    }
  };

  int64_t found = 0;
  if (chunk * kThreads < n_valid && m_begin < m_end) {  // block-uniform
    for (int64_t tile_begin = m_begin; tile_begin < m_end; tile_begin += tile_points) {
      __syncthreads();  // the previous tile is no longer read
      // Past the split: +inf is never within the radius.
      if constexpr (D > 0) {
        for (int t = threadIdx.x; t < kTile; t += kThreads) {
          const int64_t j = tile_begin + t;
          Point p;
#pragma unroll
          for (int c = 0; c < padded_dim<D>(); ++c) {
            p.c[c] = c >= D ? acc_t(0) : (j < m_end ? refs[j * D + c] : std::numeric_limits<acc_t>::infinity());
          }
          fixed_tile[t] = p;
        }
      } else {
        for (int64_t e = threadIdx.x; e < static_cast<int64_t>(tile_points) * a.dim; e += kThreads) {
          const int64_t j = tile_begin + e / a.dim;
          any_dim_tile[e] = j < m_end ? refs[tile_begin * a.dim + e] : std::numeric_limits<acc_t>::infinity();
        }
      }
      __syncthreads();
      int queued = 0;
      if (valid && found < a.K) {
        for (int g = 0; g < tile_points / kGroup; ++g) {
          const acc_t m = ::fmin(::fmin(distance_to(g * kGroup), distance_to(g * kGroup + 1)),
                                 ::fmin(distance_to(g * kGroup + 2), distance_to(g * kGroup + 3)));  // drops NaN
          if (m < a.r2) queue[queued++ * kThreads + threadIdx.x] = static_cast<uint8_t>(g);
        }
      }
      for (int e = 0; e < queued && found < a.K; ++e) {
        const int g = queue[e * kThreads + threadIdx.x];
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const acc_t d = distance_to(g * kGroup + u);
          if (d < a.r2 && found < a.K) emit(found++, d, tile_begin + g * kGroup + u);
        }
      }
      if (__syncthreads_and(!valid || found >= a.K)) break;
    }
  }

  if (a.splits == 1) {
    if (i < a.N) {  // padded queries too: no neighbour
      for (int64_t k = found; k < a.K; ++k) {
        a.dists[row * a.K + k] = acc_t(0);
        a.idx[row * a.K + k] = -1;
      }
    }
  } else if (valid) {
    a.part_count[split * a.B * a.N + row] = static_cast<int32_t>(found);
  }
}

// The splits' lists concatenated in split order up to K, then empty slots.
template <typename acc_t>
__global__ void ball_query_merge_kernel(BallArgs<acc_t> a) {
  const int64_t queries = a.B * a.N;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < queries;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = row / a.N, i = row % a.N;
    const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
    int64_t total = 0;
    if (i < n_valid) {
      for (int64_t s = 0; s < a.splits && total < a.K; ++s) {
        const int64_t count = a.part_count[s * queries + row];
        const int64_t base = (s * queries + row) * a.K;
        for (int64_t e = 0; e < count && total < a.K; ++e, ++total) {
          a.dists[row * a.K + total] = a.part_dist[base + e];
          a.idx[row * a.K + total] = a.part_idx[base + e];
        }
      }
    }
    for (; total < a.K; ++total) {
      a.dists[row * a.K + total] = acc_t(0);
      a.idx[row * a.K + total] = -1;
    }
  }
}

template <typename acc_t, int D>
void ball_query_launch(BallArgs<acc_t>& a, const at::Tensor& dists) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto kernel = ball_query_kernel<acc_t, D>;
  const size_t dynamic_bytes = D > 0 ? 0 : static_cast<size_t>(a.tile_points) * a.dim * sizeof(acc_t);
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, dynamic_bytes));
  const int64_t split_bytes = a.B * a.N * a.K * static_cast<int64_t>(sizeof(acc_t) + 2 * sizeof(int32_t));
  const int64_t max_splits = std::max<int64_t>(1, kMaxPartialBytes / std::max<int64_t>(split_bytes, 1));
  const SearchPlan plan =
      plan_search(a.B, a.N, a.M, kThreads, D > 0 ? kTile : a.tile_points, blocks_per_sm, std::min<int64_t>(max_splits, 16));
  a.chunks = plan.chunks;
  a.split_len = plan.split_len;
  a.splits = plan.splits;
  at::Tensor part_dist, part_idx, part_count;
  if (a.splits > 1) {
    part_dist = at::empty({a.splits, a.B * a.N, a.K}, dists.options());
    part_idx = at::empty({a.splits, a.B * a.N, a.K}, dists.options().dtype(at::kInt));
    part_count = at::empty({a.splits, a.B * a.N}, dists.options().dtype(at::kInt));
    a.part_dist = part_dist.data_ptr<acc_t>();
    a.part_idx = part_idx.data_ptr<int32_t>();
    a.part_count = part_count.data_ptr<int32_t>();
  }
  kernel<<<plan.grid, kThreads, dynamic_bytes, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (a.splits > 1) {
    ball_query_merge_kernel<acc_t><<<grid_for(a.B * a.N, kThreads), kThreads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

std::tuple<at::Tensor, at::Tensor> ball_query_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                   const c10::optional<at::Tensor>& lengths1,
                                                   const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                   double radius, c10::string_view algorithm) {
  const auto [len1, len2] = check_ball_query_inputs(p1, p2, lengths1, lengths2, K, radius);
  const c10::cuda::CUDAGuard guard(p1.device());
  // "auto": the grid where ball_grid_pays_cuda's measured rule says (grid_search_cuda.cu); exact either way.
  if (choose_grid(algorithm, p1.size(0), p1.size(1), p2.size(1), p1.size(2), K, &ball_grid_pays_cuda)) {
    return ball_query_grid_cuda(p1, p2, len1, len2, K, radius);
  }
  const int64_t B = p1.size(0), N = p1.size(1), M = p2.size(1), dim = p1.size(2);
  // Half types compute in float32: converted once (exactly), searched, rounded once at the end.
  const auto compute_type = p1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto q = p1.to(compute_type).contiguous(), r = p2.to(compute_type).contiguous();
  auto dists = at::empty({B, N, K}, q.options());
  auto idx = at::empty({B, N, K}, q.options().dtype(at::kLong));
  if (B * N > 0) {
    AT_DISPATCH_FLOATING_TYPES(compute_type, "ball_query_cuda", [&] {
      using acc_t = scalar_t;
      BallArgs<acc_t> a{};
      a.p1 = q.data_ptr<acc_t>();
      a.p2 = r.data_ptr<acc_t>();
      a.lengths1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
      a.lengths2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
      a.B = B, a.N = N, a.M = M, a.dim = dim, a.K = K;
      a.r2 = squared_radius<acc_t>(radius);
      a.dists = dists.data_ptr<acc_t>();
      a.idx = idx.data_ptr<int64_t>();
      const int64_t any_dim_tile = (kMaxTileBytes / static_cast<int64_t>(dim * sizeof(acc_t))) / kGroup * kGroup;
      TORCH_CHECK(dim <= 3 || any_dim_tile >= kGroup, "ball_query: points of ", dim,
                  " coordinates are too wide for the CUDA kernel (at most ", kMaxTileBytes / (kGroup * sizeof(acc_t)),
                  ")");
      a.tile_points = static_cast<int>(std::min<int64_t>(kTile, any_dim_tile));
      dispatch_dim(dim, [&](auto dim_tag) { ball_query_launch<acc_t, decltype(dim_tag)::value>(a, dists); });
    });
  }
  return {dists.to(p1.scalar_type()), idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("ball_query", &ball_query_cuda); }

}  // namespace pointops
