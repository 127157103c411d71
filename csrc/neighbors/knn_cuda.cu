// k nearest neighbours on CUDA.
//
// K = 1 is the nearest-neighbour kernel itself (chamfer_cuda.cu). For 2 <= K <= 64 each thread owns
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
// K > 64 (or points too wide for a shared-memory tile) computes whole rows of distances and sorts
// them stably, a chunk of queries at a time: slower, but exact and with the same tie rule.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <limits>

#include "common/cuda_utils.cuh"
#include "common/point_tile.cuh"
#include "neighbors/neighbors.h"
#include "neighbors/search_cuda.cuh"

namespace pointops {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 256;                      // reference points per shared-memory tile (D = 2, 3)
constexpr int kGroup = 4;                       // reference points per queue entry
constexpr int kMaxGroups = kTile / kGroup;      // queue entries per thread and tile: a byte each
constexpr int kMaxTileBytes = 32 * 1024;        // the any-D tile
constexpr int64_t kSortChunkElements = int64_t(1) << 25;  // distances per chunk of the sort path

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
};

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

// The sort path: distances of rows [row_begin, row_begin + rows) of the flattened (B * N) queries to
// every reference point, +inf where there is no candidate (padding, NaN, +inf). -0 (an L1 distance
// of signed zero differences) is stored as +0, which compares equal: the radix sort would order
// the two.
template <typename acc_t, Metric metric>
__global__ void knn_distance_rows_kernel(KnnArgs<acc_t> a, int64_t row_begin, int64_t rows, acc_t* out) {
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
    out[e] = d;
  }
}

template <typename acc_t>
void knn_sort_path(KnnArgs<acc_t>& a, Metric metric, const at::Tensor& dists, const at::Tensor& idx) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t queries = a.B * a.N, L = std::min(a.K, a.M);
  dists.zero_();
  idx.fill_(-1);
  if (L == 0) return;
  const int64_t rows_per_chunk = std::max<int64_t>(1, kSortChunkElements / a.M);
  auto rows_buffer = at::empty({std::min(rows_per_chunk, queries), a.M}, dists.options());
  auto flat_dists = dists.view({queries, a.K}), flat_idx = idx.view({queries, a.K});
  for (int64_t row_begin = 0; row_begin < queries; row_begin += rows_per_chunk) {
    const int64_t rows = std::min(rows_per_chunk, queries - row_begin);
    auto chunk = rows_buffer.narrow(0, 0, rows);
    acc_t* chunk_data = chunk.template data_ptr<acc_t>();
    dispatch_metric(metric, [&](auto metric_tag) {
      knn_distance_rows_kernel<acc_t, decltype(metric_tag)::value>
          <<<grid_for(rows * a.M, 256), 256, 0, stream>>>(a, row_begin, rows, chunk_data);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    // Stable: equal distances keep increasing index order (the tie rule of the other paths).
    auto [values, order] = at::sort(chunk, /*stable=*/true, /*dim=*/1, /*descending=*/false);
    values = values.narrow(1, 0, L);
    order = order.narrow(1, 0, L);
    const auto none = values == std::numeric_limits<acc_t>::infinity();
    flat_dists.narrow(0, row_begin, rows).narrow(1, 0, L).copy_(values.masked_fill(none, 0));
    flat_idx.narrow(0, row_begin, rows).narrow(1, 0, L).copy_(order.masked_fill(none, -1));
  }
}

template <typename acc_t, int D, Metric metric, int KP>
void knn_register_path(KnnArgs<acc_t>& a, const at::Tensor& dists) {
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

// Calls fn(std::integral_constant<int, KP>{}) for the list length that holds K (2 <= K <= 64).
template <typename Fn>
void dispatch_list_length(int64_t K, Fn&& fn) {
  if (K <= 8) {
    fn(std::integral_constant<int, 8>{});
  } else if (K <= 16) {
    fn(std::integral_constant<int, 16>{});
  } else if (K <= 32) {
    fn(std::integral_constant<int, 32>{});
  } else {
    fn(std::integral_constant<int, 64>{});
  }
}

std::tuple<at::Tensor, at::Tensor> knn_points_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                   const c10::optional<at::Tensor>& lengths1,
                                                   const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                   int64_t norm) {
  const auto [len1, len2] = check_knn_inputs(p1, p2, lengths1, lengths2, K, norm);
  const Metric metric = metric_from_norm(norm);
  const c10::cuda::CUDAGuard guard(p1.device());
  if (K == 1) {  // the nearest-neighbour search itself: knn_points(K=1) is nearest_neighbor bit for bit
    auto [dist, idx] = nearest_neighbor_direction_cuda(p1, p2, len1, len2, metric, /*zero_unmatched=*/true);
    return {dist.unsqueeze(2), idx.unsqueeze(2)};
  }
  const int64_t B = p1.size(0), N = p1.size(1), M = p2.size(1), dim = p1.size(2);
  // Half types compute in float32: converted once (exactly), searched, rounded once at the end.
  const auto compute_type = p1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto q = p1.to(compute_type).contiguous(), r = p2.to(compute_type).contiguous();
  auto dists = at::empty({B, N, K}, q.options());
  auto idx = at::empty({B, N, K}, q.options().dtype(at::kLong));
  if (B * N > 0) {
    AT_DISPATCH_FLOATING_TYPES(compute_type, "knn_points_cuda", [&] {
      using acc_t = scalar_t;
      KnnArgs<acc_t> a{};
      a.p1 = q.data_ptr<acc_t>();
      a.p2 = r.data_ptr<acc_t>();
      a.lengths1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
      a.lengths2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
      a.B = B, a.N = N, a.M = M, a.dim = dim, a.K = K;
      a.dists = dists.data_ptr<acc_t>();
      a.idx = idx.data_ptr<int64_t>();
      const int64_t any_dim_tile = (kMaxTileBytes / static_cast<int64_t>(dim * sizeof(acc_t))) / kGroup * kGroup;
      a.tile_points = static_cast<int>(std::min<int64_t>(kTile, any_dim_tile));
      const bool registers = K <= kMaxRegisterK && (dim <= 3 || a.tile_points >= kGroup);
      if (!registers) {
        knn_sort_path<acc_t>(a, metric, dists, idx);
        return;
      }
      dispatch_metric(metric, [&](auto metric_tag) {
        dispatch_dim(dim, [&](auto dim_tag) {
          dispatch_list_length(K, [&](auto list_tag) {
            knn_register_path<acc_t, decltype(dim_tag)::value, decltype(metric_tag)::value, decltype(list_tag)::value>(
                a, dists);
          });
        });
      });
    });
  }
  return {dists.to(p1.scalar_type()), idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("knn_points", &knn_points_cuda); }

}  // namespace pointops
