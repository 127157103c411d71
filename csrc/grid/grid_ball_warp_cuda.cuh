// Ball query over the grid with one warp per query (grid_search_cuda.cu launches it for K <= 128,
// directly or, behind grid_ball_tile_cuda.cuh's shared lists, for the queries of its work list;
// larger K keep the one-thread-per-query passes of grid_cuda.cuh's ball_search_query).
//
// Why a warp: a ball of radius r around a query touches up to 27 cells of edge >= r, holding some
// hundreds of candidates, of which the K with the smallest indices inside the ball are wanted. One
// thread per query keeping a sorted 64-slot register list spent most of its time in insertions
// (243 registers, 2 blocks per SM). Here the 32 lanes look up 32 cells at once, a warp scan lays
// the cells' runs end to end, and the lanes stride over the candidates together; those inside the
// ball are appended to a per-warp buffer in shared memory (ballot + popc). When the buffer cannot
// take another 32, it is cut to its K smallest indices (each entry's rank is the number of smaller
// indices: indices are distinct, every reference lies in one cell); the K-th smallest then bounds
// every later candidate (a larger index cannot enter). At the end the ranks place the K smallest
// straight into the output row in index order.
//
// Exactness (grid.h's contract): the set of references with point_distance(q, p) < r2 inside the
// cells that are not provably farther than r2 (the same skip test as ball_search_query) is exactly
// the set brute force tests positive, each distance computed by the same function; the first K of
// that set in index order are brute force's K slots.
//
// Early exit: brute force stops at the K-th point inside the ball; a query whose cells hold many
// more candidates than it needs (a radius wide for the density) visits them in windows of
// reference indices instead: each cell's run is in index order, so the lanes binary-search where
// each run crosses the window's end, scan that slice, and stop once the buffer holds K hits (none
// of the later candidates can be among the K smallest). The first window is sized to hold about 8 K
// candidates, ~1.2-2.8 K hits; each next one doubles. (Only for queries whose cells fit one batch of
// 32 lanes, the normal case with cells of edge r; otherwise all candidates are scanned.)
//
// Fallback per query, decided from the looked-up run lengths: when the cells within the radius hold
// more than a quarter of the cloud's references (a radius comparable to the cloud, or everything
// in a few cells), the grid saves nothing; the warp then scans the references in index order, 32
// at a time, and stops at the K-th point inside, which is brute force's own early exit.
#pragma once

#include <cstdint>
#include <limits>

#include "common/cuda_utils.cuh"
#include "grid/grid_cuda.cuh"

namespace pointops {
namespace grid_cuda {

constexpr int kBallWarpThreads = 128;  // 4 queries per block
constexpr int kBallWarps = kBallWarpThreads / 32;
constexpr int64_t kBallWarpMaxK = 128;
// The first index window of the early-exit visit holds about kWindowCandidates K of the query's
// candidates: a ball fills ~15% (3-D) to ~35% (2-D) of its 3^D box of cells of edge r, so ~1.2-2.8 K
// hits are expected in it.
constexpr int64_t kWindowCandidates = 8;

#if defined(__CUDACC__)

// Slots [from, K) of an output row: no neighbour (distance 0, index -1), as brute force writes them.
template <typename acc_t>
__device__ __forceinline__ void fill_empty_slots(acc_t* out_dist, int64_t* out_idx, int from, int K) {
  for (int k = from + static_cast<int>(threadIdx.x % 32); k < K; k += 32) {
    out_dist[k] = acc_t(0);
    out_idx[k] = -1;
  }
}

// Brute force's loop over candidates in index order, 32 at a time (one per lane): those inside the
// ball (point_distance < r2) take the next of the row's first K slots, and the loop ends at the
// K-th. Used by the warp per query's fallback (the whole cloud) and by the shared lists
// (grid_ball_tile_cuda.cuh). load(j, p) reads candidate j's coordinates into p; a candidate past the
// end must read as NaN, which is never inside, so that the loop needs no bounds test.
// take(slot, j, d) receives each hit that gets a slot (slot < K). Returns the number of slots taken.
template <typename acc_t, int D, typename J, typename Load, typename Take>
__device__ __forceinline__ int scan_in_index_order(const acc_t (&q)[D], acc_t r2, J count, int K, Load load,
                                                   Take take) {
  const int lane = threadIdx.x % 32;
  const unsigned below = (1u << lane) - 1u;
  int found = 0;
  for (J j0 = 0; j0 < count; j0 += 32) {
    const J j = j0 + lane;
    acc_t p[D];
    load(j, p);
    const acc_t d = point_distance<D, Metric::kSquaredL2>(q, p);
    const bool hit = d < r2;
    const unsigned hits = __ballot_sync(kFullMask, hit);
    if (hit) {
      const int slot = found + __popc(hits & below);
      if (slot < K) take(slot, j, d);
    }
    found += __popc(hits);
    if (found >= K) return K;
  }
  return found;
}

// Cuts the warp's buffer (count entries, distinct indices) to its min(count, K) smallest indices,
// sorted, at the front; returns the new count and sets `limit` to the K-th smallest when there are
// K. R entries per lane at most (count <= 32 R).
template <typename acc_t, int R>
__device__ __forceinline__ int keep_smallest(int32_t* idx, acc_t* dist, int count, int K, int32_t& limit) {
  const int lane = threadIdx.x % 32;
  int32_t mine[R];
  acc_t mine_d[R];
  int rank[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int x = lane + 32 * r;
    mine[r] = x < count ? idx[x] : std::numeric_limits<int32_t>::max();
    mine_d[r] = x < count ? dist[x] : acc_t(0);
    rank[r] = 0;
  }
  for (int y = 0; y < count; ++y) {
    const int32_t v = idx[y];  // the same address in every lane: a broadcast
#pragma unroll
    for (int r = 0; r < R; ++r) rank[r] += v < mine[r];
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (lane + 32 * r < count && rank[r] < K) {
      idx[rank[r]] = mine[r];
      dist[rank[r]] = mine_d[r];
    }
  }
  __syncwarp();
  if (count >= K) {
    limit = idx[K - 1];
    count = K;
  }
  return count;
}

// The query at sorted position t, searched by the calling warp. buffer_idx / buffer_dist: this
// warp's 32 R slots. R >= K / 32 + 1, so that a cut buffer (<= K) takes another 32.
template <typename acc_t, int D, int R>
__device__ void ball_search_query_warp(const SearchArgs<acc_t, D>& a, int64_t t, int32_t* buffer_idx,
                                       acc_t* buffer_dist) {
  constexpr int kCapacity = 32 * R;
  const int lane = threadIdx.x % 32;
  const int64_t e = sorted_query(a, t), b = e / a.N, i = e - b * a.N;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  acc_t* out_dist = a.dists + e * a.K;
  int64_t* out_idx = a.idx + e * a.K;
  const int K = static_cast<int>(a.K);
  int found = 0;
  acc_t q[D];
#pragma unroll
  for (int c = 0; c < D; ++c) q[c] = i < n_valid ? a.queries[e * D + c] : acc_t(0);
  const GridParams& g = a.grids[b];
  if (i < n_valid && finite_point<acc_t, D>(q) && g.count > 0) {
    int32_t lo[3], hi[3];
    reach_box<acc_t, D>(g, q, reach_of<acc_t, Metric::kSquaredL2>(a.r2), lo, hi);
    const int64_t nx = hi[0] - lo[0] + 1, ny = hi[1] - lo[1] + 1, nz = hi[2] - lo[2] + 1;
    const int64_t n_cells = nx * ny * nz;
    const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;

    // Lane `lane` of batch `base` looks up cell base + lane: its run [start, start + len).
    auto look_up = [&](int64_t base, int32_t& start, int32_t& len) {
      const int64_t c = base + lane;
      start = 0;
      len = 0;
      if (c < n_cells) {
        const int32_t k[3] = {static_cast<int32_t>(lo[0] + c % nx), static_cast<int32_t>(lo[1] + (c / nx) % ny),
                              static_cast<int32_t>(lo[2] + c / (nx * ny))};
        if (!prunable(cell_bound<acc_t, D, Metric::kSquaredL2>(g, q, k), a.r2)) {
          int32_t end;
          find_cell(a.table, a.mask, cell_key<D>(g, b, k, a.log2_cells), &start, &end);
          len = end - start;
        }
      }
    };
    int32_t start, len;
    look_up(0, start, len);
    int64_t candidates = warp_sum<int64_t>(len);
    for (int64_t base = 32; base < n_cells; base += 32) {
      int32_t s2, l2;
      look_up(base, s2, l2);
      candidates += warp_sum<int64_t>(l2);
    }

    if (4 * candidates > m_valid) {
      // Brute force's scan in index order, with its early exit at the K-th point inside.
      const acc_t* refs = a.refs + b * a.M * D;
      found = scan_in_index_order<acc_t, D>(
          q, a.r2, m_valid, K,
          [&](int64_t j, acc_t(&p)[D]) {
#pragma unroll
            for (int c = 0; c < D; ++c) p[c] = j < m_valid ? refs[j * D + c] : std::numeric_limits<acc_t>::quiet_NaN();
          },
          [&](int slot, int64_t j, acc_t d) {
            out_dist[slot] = d;
            out_idx[slot] = j;
          });
    } else {
      int count = 0;
      int32_t limit = std::numeric_limits<int32_t>::max();
      // Runs [start, start + len) of the lanes' cells: their candidates, laid end to end by a warp
      // scan, are tested 32 at a time; hits are appended to the buffer.
      auto scan_runs = [&](int32_t start, int32_t len) {
        const int32_t incl = warp_inclusive_sum(len);
        const int32_t total = __shfl_sync(kFullMask, incl, 31);
        const int32_t excl = incl - len;
        for (int32_t j0 = 0; j0 < total; j0 += 32) {
          const int32_t j = j0 + lane;
          // The lane whose run holds candidate j: the number of lanes whose runs end at or before j.
          int owner = 0;
#pragma unroll
          for (int step = 16; step > 0; step >>= 1) {
            if (__shfl_sync(kFullMask, incl, owner + step - 1) <= j) owner += step;
          }
          const int32_t run_start = __shfl_sync(kFullMask, start, owner);
          const int32_t run_excl = __shfl_sync(kFullMask, excl, owner);
          bool hit = false;
          int32_t p_idx = 0;
          acc_t d = acc_t(0);
          if (j < total) {
            const GridPoint<acc_t, D> p = a.points[run_start + (j - run_excl)];
            if (p.idx < limit) {
              d = point_distance<D, Metric::kSquaredL2>(q, p.c);
              hit = d < a.r2;
              p_idx = p.idx;
            }
          }
          const unsigned mask = __ballot_sync(kFullMask, hit);
          if (mask == 0) continue;
          if (count + __popc(mask) > kCapacity) {
            count = keep_smallest<acc_t, R>(buffer_idx, buffer_dist, count, K, limit);
          }
          if (hit) {
            const int slot = count + __popc(mask & ((1u << lane) - 1u));
            buffer_idx[slot] = p_idx;
            buffer_dist[slot] = d;
          }
          count += __popc(mask);
          __syncwarp();
        }
      };
      // Expected hits per candidate: at least the ball's share of the 3^D box of cells of edge r.
      // A window of kWindowCandidates K expected candidates should hold ~K hits, often more.
      const int64_t window = n_cells <= 32 && candidates > 0
                                 ? ceil_div<int64_t>(m_valid * kWindowCandidates * K, candidates)
                                 : m_valid;
      if (window >= m_valid) {
        for (int64_t base = 0; base < n_cells; base += 32) {
          if (base > 0) look_up(base, start, len);  // the first batch's runs are still in registers
          scan_runs(start, len);
        }
      } else {
        // One batch of cells (each lane one run), visited in windows of reference indices [0, w),
        // then [w, 2 w), [2 w, 4 w), ...: every run is in index order (the stable sort), so once the
        // buffer holds K hits below the window's end, no later candidate can be among the K
        // smallest. Brute force's early exit, restricted to the cells within the radius.
        int32_t pos = start;
        const int32_t run_end = start + len;
        for (int64_t w_end = window;; w_end = std::min<int64_t>(m_valid, 2 * w_end)) {
          int32_t cut = run_end;  // the first position of the run at or above w_end
          if (w_end < m_valid) {
            int32_t lo_pos = pos;
            while (lo_pos < cut) {
              const int32_t mid = lo_pos + (cut - lo_pos) / 2;
              if (a.points[mid].idx < w_end) {
                lo_pos = mid + 1;
              } else {
                cut = mid;
              }
            }
          }
          scan_runs(pos, cut - pos);
          pos = cut;
          if (count >= K || w_end >= m_valid) break;
        }
      }
      // Rank every entry; the K smallest go to their slots in index order.
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int x = lane + 32 * r;
        if (x < count) {
          const int32_t v = buffer_idx[x];
          int rank = 0;
          for (int y = 0; y < count; ++y) rank += buffer_idx[y] < v;
          if (rank < K) {
            out_dist[rank] = buffer_dist[x];
            out_idx[rank] = v;
          }
        }
      }
      found = min(count, K);
    }
  }
  fill_empty_slots(out_dist, out_idx, found, K);
}

template <typename acc_t, int D, int R>
__global__ void __launch_bounds__(kBallWarpThreads) ball_grid_warp_kernel(const SearchArgs<acc_t, D> a) {
  __shared__ int32_t buffer_idx[kBallWarps][32 * R];
  __shared__ acc_t buffer_dist[kBallWarps][32 * R];
  const int warp = threadIdx.x / 32;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kBallWarps) + warp;
  if (t < a.B * a.N) ball_search_query_warp<acc_t, D, R>(a, t, buffer_idx[warp], buffer_dist[warp]);
}

#endif  // __CUDACC__

}  // namespace grid_cuda
}  // namespace pointops
