// Ball query on CUDA: one thread per query scans the reference points in index order through
// shared-memory tiles and keeps the first K whose squared distance is below radius^2. A group of 4
// points is tested by its smallest distance (most groups hold none); a group with a point inside is
// noted in a per-thread queue and written out at the end of the tile, by all lanes at once, rather
// than stalling the warp on each lane's find. A block stops after the first tile by which every one
// of its queries has K. Small batches split the reference cloud
// across blocks: each split keeps its own first K and a merge concatenates the splits in order up
// to K, which is the first K in index order again.
//
// Large float32 clouds in 2-D and 3-D (K <= 64) run in spatial order instead (ball_query_spatial_*
// below): the clouds are sorted along a Morton curve, each warp of neighbouring queries skips
// every box of 64 sorted points that lies provably outside all of its balls, and each thread keeps
// the smallest indices found inside its ball (so the first K in index order, as above).

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <limits>

#include "common/cuda_utils.cuh"
#include "common/point_tile.cuh"
#include "neighbors/neighbors.h"
#include "neighbors/search_cuda.cuh"
#include "neighbors/spatial_order_cuda.cuh"

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

// ---- spatial order (float32 compute, D = 2, 3, K <= 64; spatial_order_cuda.cuh)

constexpr int kBoxPoints = 64;                 // sorted reference points per bounding box
constexpr int kBoxesPerTile = kTile / kBoxPoints;
constexpr int64_t kMaxSpatialK = 64;
constexpr int32_t kNoIndex = std::numeric_limits<int32_t>::max();  // an empty slot of a list

struct BallSpatialOrder {
  const float* sorted_refs;   // (B, M, D)
  const int64_t* query_perm;  // (B, N)
  const int32_t* ref_index;   // (B, M)
  const float* box_bounds;    // (B, boxes, 2, D)
  int64_t boxes;
};

// Inserts index j into an ascending list, given j < idx[KP - 1] (the last entry drops out).
template <int KP>
__device__ __forceinline__ void insert_index(int32_t (&idx)[KP], int32_t j) {
#pragma unroll
  for (int k = KP - 1; k > 0; --k) {
    const bool shift = j < idx[k - 1];
    const bool place = !shift && j < idx[k];
    idx[k] = shift ? idx[k - 1] : (place ? j : idx[k]);
  }
  if (j < idx[0]) idx[0] = j;
}

// Each thread keeps the KP smallest reference indices inside its ball (any scan order gives the
// same list) and writes the first K with their distances, recomputed from the original points by
// the same operations (bitwise the values the index-order kernel and the CPU compute).
template <int D, int KP>
__global__ void __launch_bounds__(kThreads) ball_query_spatial_kernel(BallArgs<float> a, BallSpatialOrder o) {
  using Point = SharedPoint<float, D>;
  __shared__ uint8_t queue[kTile / kGroup * kThreads];
  __shared__ Point tile[kTile];
  __shared__ int32_t tile_index[kTile];

  const int64_t b = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
  const int64_t s = chunk * kThreads + threadIdx.x;                 // position in sorted order
  const int64_t i = s < a.N ? o.query_perm[b * a.N + s] : s;        // the query
  const bool valid = s < n_valid;                                   // valid queries sort first
  float q[D];
  bool finite = valid;
#pragma unroll
  for (int c = 0; c < D; ++c) {
    q[c] = valid ? a.p1[(b * a.N + i) * D + c] : 0.0f;
    finite = finite && isfinite(q[c]);
  }
  int32_t list[KP];
#pragma unroll
  for (int k = 0; k < KP; ++k) list[k] = kNoIndex;
  const float* refs = o.sorted_refs + b * a.M * D;

  if (chunk * kThreads < n_valid && m_valid > 0) {  // block-uniform
    const int64_t tile_count = ceil_div<int64_t>(m_valid, kTile);
    for (int64_t t = 0; t < tile_count; ++t) {
      // Bit x: box x of the tile lies provably outside this query's ball (a box past the cloud,
      // or a query that matches nothing, counts as outside).
      unsigned far = 0;
#pragma unroll
      for (int x = 0; x < kBoxesPerTile; ++x) {
        const int64_t box_index = t * kBoxesPerTile + x;
        bool outside = true;
        if (finite && box_index < o.boxes) {
          const float* box = o.box_bounds + (b * o.boxes + box_index) * 2 * D;
          float bound = 0.0f;
#pragma unroll
          for (int c = 0; c < D; ++c) {
            const float gap = ::fmaxf(::fmaxf(box[c] - q[c], q[c] - box[D + c]), 0.0f);
            bound = c == 0 ? coordinate_term<Metric::kSquaredL2>(gap)
                           : add_coordinate_term<Metric::kSquaredL2>(gap, bound);
          }
          outside = provably_farther(bound, a.r2);
        }
        far |= static_cast<unsigned>(outside) << x;
      }
      // Also the barrier after the previous tile's reads.
      if (__syncthreads_and(far == (1u << kBoxesPerTile) - 1)) continue;
      unsigned warp_far = 0;  // the boxes no query of the warp needs (warp-uniform)
#pragma unroll
      for (int x = 0; x < kBoxesPerTile; ++x) {
        warp_far |= static_cast<unsigned>(__all_sync(0xffffffffu, (far >> x) & 1u)) << x;
      }
      const int64_t tile_begin = t * kTile;
      for (int u = threadIdx.x; u < kTile; u += kThreads) {
        const int64_t j = tile_begin + u;
        Point p;
#pragma unroll
        for (int c = 0; c < padded_dim<D>(); ++c) {
          p.c[c] = c >= D ? 0.0f : (j < m_valid ? refs[j * D + c] : std::numeric_limits<float>::infinity());
        }
        tile[u] = p;
        tile_index[u] = j < m_valid ? o.ref_index[b * a.M + j] : kNoIndex;
      }
      __syncthreads();
      int queued = 0;
      for (int g = 0; g < kTile / kGroup; ++g) {
        if ((warp_far >> (g * kGroup / kBoxPoints)) & 1u) continue;
        float m = point_distance<D, Metric::kSquaredL2>(q, tile[g * kGroup].c);
#pragma unroll
        for (int u = 1; u < kGroup; ++u) m = ::fminf(m, point_distance<D, Metric::kSquaredL2>(q, tile[g * kGroup + u].c));
        if (valid && m < a.r2) queue[queued++ * kThreads + threadIdx.x] = static_cast<uint8_t>(g);
      }
      for (int e = 0; e < queued; ++e) {
        const int g = queue[e * kThreads + threadIdx.x];
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const float d = point_distance<D, Metric::kSquaredL2>(q, tile[g * kGroup + u].c);
          const int32_t j = tile_index[g * kGroup + u];
          if (d < a.r2 && j < list[KP - 1]) insert_index<KP>(list, j);
        }
      }
    }
  }

  if (s < a.N) {  // padded queries too: no neighbour
    const int64_t row = b * a.N + i;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      if (k >= a.K) break;
      const int32_t j = list[k];
      float d = 0.0f;
      if (j != kNoIndex) d = point_distance<D, Metric::kSquaredL2>(q, a.p2 + (b * a.M + j) * D);
      a.dists[row * a.K + k] = d;
      a.idx[row * a.K + k] = j != kNoIndex ? j : -1;
    }
  }
}

template <int D>
void ball_query_spatial_launch(BallArgs<float>& a, const at::Tensor& p1, const at::Tensor& p2, const at::Tensor& len1,
                               const at::Tensor& len2) {
  const SpatialOrder order = spatial_order_cuda(p1, p2, len1, len2, kBoxPoints);
  BallSpatialOrder o{order.refs.data_ptr<float>(), order.query_perm.data_ptr<int64_t>(),
                     order.ref_index.data_ptr<int32_t>(), order.box_bounds.data_ptr<float>(), order.box_bounds.size(1)};
  const SearchPlan plan = plan_search(a.B, a.N, a.M, kThreads, kTile, 1, /*max_splits=*/1);
  a.chunks = plan.chunks;
  a.splits = 1;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  auto launch = [&](auto kernel) {
    kernel<<<plan.grid, kThreads, 0, stream>>>(a, o);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (a.K <= 16) {
    launch(ball_query_spatial_kernel<D, 16>);
  } else if (a.K <= 32) {
    launch(ball_query_spatial_kernel<D, 32>);
  } else {
    launch(ball_query_spatial_kernel<D, 64>);
  }
}

// Runs the search in spatial order and returns true where there is a variant for it (float32
// compute, D = 2, 3, K <= 64) and use_spatial_order says so.
template <typename acc_t>
bool ball_query_in_spatial_order(BallArgs<acc_t>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&) {
  return false;
}

template <>
bool ball_query_in_spatial_order<float>(BallArgs<float>& a, const at::Tensor& p1, const at::Tensor& p2,
                                        const at::Tensor& len1, const at::Tensor& len2) {
  if (a.K > kMaxSpatialK || !use_spatial_order(a.B, a.N, a.M, a.dim)) return false;
  if (a.dim == 2) {
    ball_query_spatial_launch<2>(a, p1, p2, len1, len2);
  } else {
    ball_query_spatial_launch<3>(a, p1, p2, len1, len2);
  }
  return true;
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
                                                   double radius) {
  const auto [len1, len2] = check_ball_query_inputs(p1, p2, lengths1, lengths2, K, radius);
  const c10::cuda::CUDAGuard guard(p1.device());
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
      if (ball_query_in_spatial_order(a, q, r, len1, len2)) return;
      dispatch_dim(dim, [&](auto dim_tag) { ball_query_launch<acc_t, decltype(dim_tag)::value>(a, dists); });
    });
  }
  return {dists.to(p1.scalar_type()), idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("ball_query", &ball_query_cuda); }

}  // namespace pointops
