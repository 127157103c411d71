// k nearest neighbours on CUDA: the register-list kernels (2 <= K <= 64).
//
// Each thread owns one query and keeps its best KP candidates (K rounded up to 8, 16, 32 or 64) in
// registers, sorted by (distance, index), starting from the first KP points it scans sorted by a
// network. Reference points stream through shared memory in tiles. A group of 4 points whose
// smallest distance reaches the current KP-th best is noted in a per-thread queue (a byte in shared
// memory) and the queue is drained at the end of the tile, by every lane of the warp at once:
// inserting each candidate as it is found would serialise the warp on whichever lane found one.
// Draining recomputes the group's distances (bitwise the same: same operations, same order) and
// inserts each one that still precedes the KP-th best with a branch-free shift over the list
// (compile-time indices keep it in registers).
//
// Two scan orders, with the same answers (the lists are ordered by (distance, index), whatever the
// order the candidates arrive in):
//  - index order: small batches split the reference cloud across blocks, and a merge kernel
//    combines the split lists (deterministic, no atomics);
//  - spatial order (D = 2, 3, large clouds; spatial_order_cuda.cuh): a block's queries are
//    neighbours on a Morton curve, it scans the sorted reference tiles outward from its place on the
//    curve; a warp skips each box of 64 points that is provably farther than all of its queries'
//    KP-th best, the block skips a tile that no warp needs. Most insertions happen in the first
//    tile, and most tiles are never loaded.
#pragma once

#include <limits>
#include <type_traits>

#include "common/cuda_utils.cuh"
#include "common/point_tile.cuh"
#include "neighbors/knn_cuda.cuh"
#include "neighbors/search_cuda.cuh"
#include "neighbors/spatial_order_cuda.cuh"

namespace pointops {
namespace knn_cuda {

// (d, j) comes before (e, f): by distance, then by index. An empty slot is (+inf, -1): every finite
// distance comes before it, +inf and NaN never do. In index order a candidate's index is larger
// than every listed one, so the distance alone decides (kSpatial = false: fewer instructions).
template <bool kSpatial, typename acc_t>
__device__ __forceinline__ bool precedes(acc_t d, int32_t j, acc_t e, int32_t f) {
  return kSpatial ? (d < e || (d == e && j < f)) : d < e;
}

// Inserts (d, j) into a list sorted by (distance, index), given that it precedes the last entry,
// which drops out.
template <bool kSpatial, int KP, typename acc_t>
__device__ __forceinline__ void insert_sorted(acc_t (&dist)[KP], int32_t (&idx)[KP], acc_t d, int32_t j) {
#pragma unroll
  for (int k = KP - 1; k > 0; --k) {
    const bool shift = precedes<kSpatial>(d, j, dist[k - 1], idx[k - 1]);
    const bool place = !shift && precedes<kSpatial>(d, j, dist[k], idx[k]);
    dist[k] = shift ? dist[k - 1] : (place ? d : dist[k]);
    idx[k] = shift ? idx[k - 1] : (place ? j : idx[k]);
  }
  if (precedes<kSpatial>(d, j, dist[0], idx[0])) {
    dist[0] = d;
    idx[0] = j;
  }
}

// Sorts the list by (distance, index) with a bitonic network: a fixed sequence of compare-exchanges
// whose indices are compile-time constants, so the list stays in registers and every lane of the
// warp does the same work.
template <int KP, typename acc_t>
__device__ __forceinline__ void sort_list(acc_t (&dist)[KP], int32_t (&idx)[KP]) {
#pragma unroll
  for (int size = 2; size <= KP; size <<= 1) {
#pragma unroll
    for (int stride = size / 2; stride > 0; stride >>= 1) {
#pragma unroll
      for (int i = 0; i < KP; ++i) {
        const int partner = i ^ stride;
        if (partner > i) {
          const bool ascending = (i & size) == 0;
          const bool greater = dist[i] > dist[partner] || (dist[i] == dist[partner] && idx[i] > idx[partner]);
          const bool swap = greater == ascending;
          const acc_t d = dist[i];
          const int32_t j = idx[i];
          dist[i] = swap ? dist[partner] : d;
          idx[i] = swap ? idx[partner] : j;
          dist[partner] = swap ? d : dist[partner];
          idx[partner] = swap ? j : idx[partner];
        }
      }
    }
  }
}

// One query's K slots of the output: the list's entries, then (0, -1) where there is none.
template <int KP, typename acc_t>
__device__ __forceinline__ void write_row(const KnnArgs<acc_t>& a, int64_t row, const acc_t (&dist)[KP],
                                          const int32_t (&idx)[KP]) {
#pragma unroll
  for (int k = 0; k < KP; ++k) {
    if (k < a.K) {
      a.dists[row * a.K + k] = idx[k] >= 0 ? dist[k] : acc_t(0);
      a.idx[row * a.K + k] = idx[k];
    }
  }
}

// The first sorted reference position whose key is >= key, among the cloud's m_valid valid points.
__device__ inline int64_t lower_bound_key(const int32_t* keys, int64_t count, int32_t key) {
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (keys[mid] < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename acc_t, int D, Metric metric, int KP, bool kSpatial>
__global__ void __launch_bounds__(kThreads) knn_search_kernel(KnnArgs<acc_t> a) {
  static_assert(!kSpatial || D > 0, "the spatial order is for D = 2, 3");
  using Point = SharedPoint<acc_t, (D > 0 ? D : 1)>;
  __shared__ uint8_t queue[kMaxGroups * kThreads];
  __shared__ Point fixed_tile[D > 0 ? kTile : 1];         // D = 2, 3: one (padded) point per load
  __shared__ int32_t tile_index[D > 0 ? kTile : 1];       // spatial order: the reference indices of the tile
  __shared__ int64_t origin_tile;                         // spatial order: where the block starts
  extern __shared__ __align__(16) unsigned char any_dim_tile_bytes[];  // D == 0: tile_points x dim
  acc_t* any_dim_tile = reinterpret_cast<acc_t*>(any_dim_tile_bytes);
  const int tile_points = D > 0 ? kTile : a.tile_points;
  const int groups = tile_points / kGroup;
  constexpr bool spatial = kSpatial;

  const int64_t b = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks, split = blockIdx.y;
  if (a.skip_clouds != nullptr && a.skip_clouds[b] != 0) return;  // the whole block: before any barrier
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
  const int64_t s = chunk * kThreads + threadIdx.x;                        // position in search order
  const int64_t i = spatial && s < a.N ? a.query_perm[b * a.N + s] : s;    // the query
  const bool valid = s < n_valid;
  const int64_t m_begin = split * a.split_len, m_end = min(m_begin + a.split_len, m_valid);
  const acc_t* query = a.p1 + (b * a.N + (valid ? i : 0)) * a.dim;
  const acc_t* refs = a.p2 + b * a.M * a.dim;

  acc_t q[D > 0 ? D : 1];
  bool finite = valid;
#pragma unroll
  for (int c = 0; c < (D > 0 ? D : 1); ++c) {
    q[c] = D > 0 && valid ? query[c] : acc_t(0);
    finite = finite && isfinite(q[c]);
  }
  auto distance_to = [&](int t) -> acc_t {  // to point t of the tile
    if constexpr (D > 0) {
      const Point p = fixed_tile[t];
      return point_distance<D, metric>(q, p.c);
    } else {
      return point_distance_dynamic<metric>(query, any_dim_tile + t * a.dim, a.dim);
    }
  };

  acc_t best[KP];
  int32_t best_idx[KP];
#pragma unroll
  for (int k = 0; k < KP; ++k) {
    best[k] = std::numeric_limits<acc_t>::infinity();
    best_idx[k] = -1;
  }

  // Block-uniform: no valid query in this block, or nothing to search in this split.
  if (chunk * kThreads < n_valid && m_begin < m_end) {
    const int64_t tile_count = ceil_div<int64_t>(m_end - m_begin, tile_points);
    int64_t origin = 0;
    if (spatial) {
      if (threadIdx.x == 0) {
        const int64_t middle = min(chunk * kThreads + kThreads / 2, n_valid - 1);
        const int64_t at = lower_bound_key(a.ref_keys + b * a.M, m_valid, a.query_keys[b * a.N + middle]);
        origin_tile = min(at / tile_points, tile_count - 1);
      }
      __syncthreads();
      origin = origin_tile;
    }
    int first_group = -1;  // -1: the list is not started yet
    int64_t tile_begin = 0;
    auto reference_index = [&](int t) -> int32_t {  // of point t of the tile
      return spatial ? tile_index[t] : static_cast<int32_t>(tile_begin + t);
    };
    // Index order: the split's tiles in turn. Spatial order: origin, origin + 1, origin - 1, ...
    for (int64_t step = 0; step < (spatial ? 2 * tile_count : tile_count); ++step) {
      int64_t t = step;
      unsigned warp_far = 0;  // spatial order: the boxes of the tile this warp skips
      if (spatial) {
        const int64_t offset = (step + 1) / 2;
        t = step & 1 ? origin + offset : origin - offset;
        if (t < 0 || t >= tile_count) continue;  // block-uniform
        if (first_group == 0) {
          // Bit x: no candidate for this query in box x of the tile (a box past the cloud has none).
          unsigned far = 0;
#pragma unroll
          for (int x = 0; x < kBoxesPerTile; ++x) {
            const int64_t box_index = t * kBoxesPerTile + x;
            bool none = true;
            if (finite && box_index < a.boxes) {
              const acc_t* box = a.box_bounds + (b * a.boxes + box_index) * 2 * D;
              acc_t bound = acc_t(0);
#pragma unroll
              for (int c = 0; c < (D > 0 ? D : 1); ++c) {
                const acc_t gap = ::fmax(::fmax(box[c] - q[c], q[c] - box[D + c]), acc_t(0));
                bound = c == 0 ? coordinate_term<metric>(gap) : add_coordinate_term<metric>(gap, bound);
              }
              none = provably_farther(bound, best[KP - 1]);
            }
            far |= static_cast<unsigned>(none) << x;
          }
          constexpr unsigned kAllFar = (1u << kBoxesPerTile) - 1;
          if (__syncthreads_and(far == kAllFar)) continue;  // no query of the block needs the tile
          // The boxes no query of the warp needs (warp-uniform, so skipping them costs no divergence).
#pragma unroll
          for (int x = 0; x < kBoxesPerTile; ++x) {
            warp_far |= static_cast<unsigned>(__all_sync(0xffffffffu, (far >> x) & 1u)) << x;
          }
        }
      }
      tile_begin = m_begin + t * tile_points;
      __syncthreads();  // the previous tile is no longer read
      // Past the split: +inf is never below any candidate, so it is never listed.
      if constexpr (D > 0) {
        for (int u = threadIdx.x; u < kTile; u += kThreads) {
          const int64_t j = tile_begin + u;
          Point p;
#pragma unroll
          for (int c = 0; c < padded_dim<D>(); ++c) {
            p.c[c] = c >= D ? acc_t(0) : (j < m_end ? refs[j * D + c] : std::numeric_limits<acc_t>::infinity());
          }
          fixed_tile[u] = p;
          if (spatial) tile_index[u] = j < m_end ? a.ref_index[b * a.M + j] : -1;
        }
      } else {
        for (int64_t e = threadIdx.x; e < static_cast<int64_t>(tile_points) * a.dim; e += kThreads) {
          const int64_t j = tile_begin + e / a.dim;
          any_dim_tile[e] = j < m_end ? refs[tile_begin * a.dim + e] : std::numeric_limits<acc_t>::infinity();
        }
      }
      __syncthreads();
      if (first_group < 0) {
        // The list starts as the first points scanned, sorted by a network: inserting them one by
        // one would cost every lane KP insertions, more than the rest of the scan's insertions.
        const int warm = min(KP, tile_points);
#pragma unroll
        for (int k = 0; k < KP; ++k) {
          const acc_t d = k < warm && valid ? distance_to(k) : std::numeric_limits<acc_t>::infinity();
          const bool listed = d < std::numeric_limits<acc_t>::infinity();  // NaN and +inf never are
          best[k] = listed ? d : std::numeric_limits<acc_t>::infinity();
          best_idx[k] = listed ? reference_index(k) : -1;
        }
        sort_list<KP>(best, best_idx);
        first_group = warm / kGroup;
      }
      int queued = 0;
      for (int g = first_group; g < groups; ++g) {
        if (spatial && ((warp_far >> (g * kGroup / kBoxPoints)) & 1u)) continue;
        acc_t m = distance_to(g * kGroup);
#pragma unroll
        for (int u = 1; u < kGroup; ++u) m = ::fmin(m, distance_to(g * kGroup + u));  // fmin drops NaN
        // In index order an equal distance comes later, so it never precedes; in spatial order it
        // may (a smaller index), so equality is queued too and decided by the index.
        const bool reaches = spatial ? m <= best[KP - 1] : m < best[KP - 1];
        if (valid && reaches) queue[queued++ * kThreads + threadIdx.x] = static_cast<uint8_t>(g);
      }
      first_group = 0;
      for (int e = 0; e < queued; ++e) {
        const int g = queue[e * kThreads + threadIdx.x];
        acc_t d[kGroup];
        int32_t j[kGroup];
        unsigned pending = 0;
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          d[u] = distance_to(g * kGroup + u);
          j[u] = reference_index(g * kGroup + u);
          pending |= static_cast<unsigned>(precedes<kSpatial>(d[u], j[u], best[KP - 1], best_idx[KP - 1])) << u;
        }
        // One insertion per step for every lane that has a candidate left, rather than one per
        // group member whenever any lane's member qualifies.
        while (pending != 0) {
          const int u = __ffs(pending) - 1;
          pending &= pending - 1;
          const acc_t du = u == 0 ? d[0] : (u == 1 ? d[1] : (u == 2 ? d[2] : d[3]));
          const int32_t ju = u == 0 ? j[0] : (u == 1 ? j[1] : (u == 2 ? j[2] : j[3]));
          if (precedes<kSpatial>(du, ju, best[KP - 1], best_idx[KP - 1])) insert_sorted<kSpatial, KP>(best, best_idx, du, ju);
        }
      }
    }
  }

  if (a.splits == 1) {
    if (s < a.N) write_row<KP>(a, b * a.N + i, best, best_idx);  // padded queries too: no neighbour
  } else if (valid) {
    const int64_t queries = a.B * a.N, row = b * a.N + i;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      a.part_dist[(split * KP + k) * queries + row] = best[k];
      a.part_idx[(split * KP + k) * queries + row] = best_idx[k];
    }
  }
}

// The splits' lists merged by (distance, index): ties keep the smaller index.
template <typename acc_t, int KP>
__global__ void knn_merge_kernel(KnnArgs<acc_t> a) {
  const int64_t queries = a.B * a.N;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < queries;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = row / a.N, i = row % a.N;
    if (a.skip_clouds != nullptr && a.skip_clouds[b] != 0) continue;
    const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
    acc_t best[KP];
    int32_t best_idx[KP];
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      best[k] = std::numeric_limits<acc_t>::infinity();
      best_idx[k] = -1;
    }
    if (i < n_valid) {
      for (int64_t s = 0; s < a.splits; ++s) {
#pragma unroll
        for (int k = 0; k < KP; ++k) {
          const int32_t j = a.part_idx[(s * KP + k) * queries + row];
          const acc_t d = a.part_dist[(s * KP + k) * queries + row];
          if (j < 0 || !precedes<true>(d, j, best[KP - 1], best_idx[KP - 1])) break;  // sorted: nothing later enters
          insert_sorted<true, KP>(best, best_idx, d, j);
        }
      }
    }
    write_row<KP>(a, row, best, best_idx);
  }
}

template <typename acc_t, int D, Metric metric, int KP, bool kSpatial>
void launch_search(KnnArgs<acc_t>& a, const at::Tensor& dists) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto kernel = knn_search_kernel<acc_t, D, metric, KP, kSpatial>;
  const size_t dynamic_bytes = D > 0 ? 0 : static_cast<size_t>(a.tile_points) * a.dim * sizeof(acc_t);
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, dynamic_bytes));
  // The spatial order never splits: a split would restart every list far from its queries.
  const int64_t max_splits = kSpatial ? 1 : 16;
  const SearchPlan plan =
      plan_search(a.B, a.N, a.M, kThreads, D > 0 ? kTile : a.tile_points, blocks_per_sm, max_splits);
  a.chunks = plan.chunks;
  a.split_len = plan.split_len;
  a.splits = plan.splits;
  at::Tensor part_dist, part_idx;
  if (a.splits > 1) {
    part_dist = at::empty({a.splits, KP, a.B * a.N}, dists.options());
    part_idx = at::empty({a.splits, KP, a.B * a.N}, dists.options().dtype(at::kInt));
    a.part_dist = part_dist.data_ptr<acc_t>();
    a.part_idx = part_idx.data_ptr<int32_t>();
  }
  kernel<<<plan.grid, kThreads, dynamic_bytes, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (a.splits > 1) {
    knn_merge_kernel<acc_t, KP><<<grid_for(a.B * a.N, kThreads), kThreads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// The spatial searches (float32 lists of 32 and 64, D = 2, 3: has_spatial_search) are compiled in
// their own files, knn_cuda_spatial{32,64}.cu, in parallel with the index-order ones.
#define POINTOPS_KNN_SPATIAL_SEARCHES(EXTERN, KP)                                                                \
  EXTERN template void launch_search<float, 2, Metric::kL1, KP, true>(KnnArgs<float>&, const at::Tensor&);        \
  EXTERN template void launch_search<float, 2, Metric::kSquaredL2, KP, true>(KnnArgs<float>&, const at::Tensor&); \
  EXTERN template void launch_search<float, 3, Metric::kL1, KP, true>(KnnArgs<float>&, const at::Tensor&);        \
  EXTERN template void launch_search<float, 3, Metric::kSquaredL2, KP, true>(KnnArgs<float>&, const at::Tensor&);

template <typename acc_t, int D, Metric metric, int KP>
void launch_register_lists(KnnArgs<acc_t>& a, const at::Tensor& dists) {
  if constexpr (D > 0 && KP >= kSpatialMinListLength && std::is_same_v<acc_t, float>) {
    if (a.query_perm != nullptr) {
      launch_search<acc_t, D, metric, KP, true>(a, dists);
      return;
    }
  }
  TORCH_INTERNAL_ASSERT(a.query_perm == nullptr, "knn_points: no spatial search for lists of ", KP);
  launch_search<acc_t, D, metric, KP, false>(a, dists);
}

template <typename acc_t, int KP>
void run_register_lists(KnnArgs<acc_t>& a, Metric metric, const at::Tensor& dists) {
  dispatch_metric(metric, [&](auto metric_tag) {
    dispatch_dim(a.dim, [&](auto dim_tag) {
      launch_register_lists<acc_t, decltype(dim_tag)::value, decltype(metric_tag)::value, KP>(a, dists);
    });
  });
}

// Explicit instantiations, one file per list length (float64 up to max_register_k<double>()).
#define POINTOPS_KNN_LIST_LENGTH_FLOAT(KP) \
  template void run_register_lists<float, KP>(KnnArgs<float>&, Metric, const at::Tensor&);
#define POINTOPS_KNN_LIST_LENGTH_DOUBLE(KP) \
  template void run_register_lists<double, KP>(KnnArgs<double>&, Metric, const at::Tensor&);

}  // namespace knn_cuda
}  // namespace pointops
