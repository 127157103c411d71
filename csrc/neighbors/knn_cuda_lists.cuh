// k nearest neighbours on CUDA: the register-list kernels (2 <= K <= 64).
//
// Each thread owns
// one query and keeps its best KP candidates (K rounded up to 8, 16, 32 or 64) in registers, sorted
// by (distance, index), starting from the split's first KP points sorted by a network. Reference
// points stream through shared memory in tiles. A group of 4
// points whose smallest distance beats the current KP-th best is noted in a per-thread queue (a
// byte in shared memory) and the queue is drained at the end of the tile, by every lane of the warp
// at once: inserting each candidate as it is found would serialise the warp on whichever lane found
// one. Draining recomputes the group's distances (bitwise the same: same operations, same order)
// and inserts each one that is still below the KP-th best with a branch-free shift over the list
// (compile-time indices keep it in registers). Candidates arrive in increasing index order and an
// equal distance goes after the ones already listed, so ties keep the smaller index.
// Small batches split the reference cloud across blocks; a merge kernel combines the split lists in
// split order (ties -> smallest index, no atomics: deterministic).
#pragma once

#include <limits>

#include "common/cuda_utils.cuh"
#include "common/point_tile.cuh"
#include "neighbors/knn_cuda.cuh"
#include "neighbors/search_cuda.cuh"

namespace pointops {
namespace knn_cuda {

// Inserts (d, j) into a list sorted by (distance, index), given d < dist[KP - 1]: it goes after
// the entries with distance <= d, the last entry drops out.
template <int KP, typename acc_t>
__device__ __forceinline__ void insert_sorted(acc_t (&dist)[KP], int32_t (&idx)[KP], acc_t d, int32_t j) {
#pragma unroll
  for (int k = KP - 1; k > 0; --k) {
    const bool shift = d < dist[k - 1];
    const bool place = !shift && d < dist[k];
    dist[k] = shift ? dist[k - 1] : (place ? d : dist[k]);
    idx[k] = shift ? idx[k - 1] : (place ? j : idx[k]);
  }
  if (d < dist[0]) {
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

template <typename acc_t, int D, Metric metric, int KP>
__global__ void __launch_bounds__(kThreads) knn_search_kernel(KnnArgs<acc_t> a) {
  using Point = SharedPoint<acc_t, (D > 0 ? D : 1)>;
  __shared__ uint8_t queue[kMaxGroups * kThreads];
  __shared__ Point fixed_tile[D > 0 ? kTile : 1];         // D = 2, 3: one (padded) point per load
  extern __shared__ __align__(16) unsigned char any_dim_tile_bytes[];  // D == 0: tile_points x dim
  acc_t* any_dim_tile = reinterpret_cast<acc_t*>(any_dim_tile_bytes);
  const int tile_points = D > 0 ? kTile : a.tile_points;
  const int groups = tile_points / kGroup;

  const int64_t b = blockIdx.x / a.chunks, chunk = blockIdx.x % a.chunks, split = blockIdx.y;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
  const int64_t i = chunk * kThreads + threadIdx.x;
  const bool valid = i < n_valid;
  const int64_t m_begin = split * a.split_len, m_end = min(m_begin + a.split_len, m_valid);
  const acc_t* query = a.p1 + (b * a.N + (valid ? i : 0)) * a.dim;
  const acc_t* refs = a.p2 + b * a.M * a.dim;

  acc_t q[D > 0 ? D : 1];
#pragma unroll
  for (int c = 0; c < (D > 0 ? D : 1); ++c) q[c] = D > 0 && valid ? query[c] : acc_t(0);
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
    int first_group = -1;  // -1: the list is not started yet
    for (int64_t tile_begin = m_begin; tile_begin < m_end; tile_begin += tile_points) {
      __syncthreads();  // the previous tile is no longer read
      // Past the split: +inf is never below any candidate, so it is never listed.
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
      if (first_group < 0) {
        // The list starts as the first points of the split, sorted by a network: inserting them one
        // by one would cost every lane KP insertions, more than the rest of the scan's insertions.
        const int warm = min(KP, tile_points);
#pragma unroll
        for (int k = 0; k < KP; ++k) {
          const acc_t d = k < warm && valid ? distance_to(k) : std::numeric_limits<acc_t>::infinity();
          const bool listed = d < std::numeric_limits<acc_t>::infinity();  // NaN and +inf never are
          best[k] = listed ? d : std::numeric_limits<acc_t>::infinity();
          best_idx[k] = listed ? static_cast<int32_t>(tile_begin + k) : -1;
        }
        sort_list<KP>(best, best_idx);
        first_group = warm / kGroup;
      }
      int queued = 0;
      for (int g = first_group; g < groups; ++g) {
        acc_t m = distance_to(g * kGroup);
#pragma unroll
        for (int u = 1; u < kGroup; ++u) m = ::fmin(m, distance_to(g * kGroup + u));  // fmin drops NaN
        if (valid && m < best[KP - 1]) queue[queued++ * kThreads + threadIdx.x] = static_cast<uint8_t>(g);
      }
      first_group = 0;
      for (int e = 0; e < queued; ++e) {
        const int g = queue[e * kThreads + threadIdx.x];
        acc_t d[kGroup];
        unsigned pending = 0;
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          d[u] = distance_to(g * kGroup + u);
          pending |= static_cast<unsigned>(d[u] < best[KP - 1]) << u;
        }
        // One insertion per step for every lane that has a candidate left (in index order), rather
        // than one per group member whenever any lane's member qualifies.
        while (pending != 0) {
          const int u = __ffs(pending) - 1;
          pending &= pending - 1;
          const acc_t du = u == 0 ? d[0] : (u == 1 ? d[1] : (u == 2 ? d[2] : d[3]));
          if (du < best[KP - 1]) insert_sorted<KP>(best, best_idx, du, static_cast<int32_t>(tile_begin + g * kGroup + u));
        }
      }
    }
  }

  if (a.splits == 1) {
    if (i < a.N) write_row<KP>(a, b * a.N + i, best, best_idx);  // padded queries too: no neighbour
  } else if (valid) {
    const int64_t queries = a.B * a.N, row = b * a.N + i;
#pragma unroll
    for (int k = 0; k < KP; ++k) {
      a.part_dist[(split * KP + k) * queries + row] = best[k];
      a.part_idx[(split * KP + k) * queries + row] = best_idx[k];
    }
  }
}

// The splits' lists merged in split order: a later split's entry enters only when strictly below
// the KP-th best, so ties keep the earlier split (the smaller index).
template <typename acc_t, int KP>
__global__ void knn_merge_kernel(KnnArgs<acc_t> a) {
  const int64_t queries = a.B * a.N;
  for (int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; row < queries;
       row += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = row / a.N, i = row % a.N;
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
          if (j < 0 || !(d < best[KP - 1])) break;  // the split's list is sorted: nothing later enters
          insert_sorted<KP>(best, best_idx, d, j);
        }
      }
    }
    write_row<KP>(a, row, best, best_idx);
  }
}

template <typename acc_t, int D, Metric metric, int KP>
void launch_register_lists(KnnArgs<acc_t>& a, const at::Tensor& dists) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto kernel = knn_search_kernel<acc_t, D, metric, KP>;
  const size_t dynamic_bytes = D > 0 ? 0 : static_cast<size_t>(a.tile_points) * a.dim * sizeof(acc_t);
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, dynamic_bytes));
  const SearchPlan plan = plan_search(a.B, a.N, a.M, kThreads, D > 0 ? kTile : a.tile_points, blocks_per_sm, 16);
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
