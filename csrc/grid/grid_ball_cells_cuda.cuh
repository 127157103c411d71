// Ball query over the grid, one block per 32 consecutive sorted queries, the queries of one cell
// sharing one candidate list (grid_search_cuda.cu launches it for K <= kBallWarpMaxK).
//
// Why: with one warp per query (grid_ball_warp_cuda.cuh) every query paid for its own set-up (its
// reach box in double, up to 27 hash lookups), for finding each candidate's run (a shuffle search
// per batch of 32) and for ranking its hits by index at the end; under ncu that was ~1,400 of its
// ~2,140 warp instructions (benchmarks/RESULTS.md). The queries are sorted by cell, and the ~16
// queries of a cell (cells of edge >= r) look at the same candidates. So a block takes 32 sorted
// queries: each lane computes one query's cell and reach box, lanes with the same cell form a
// group, and per group one warp
//   1. looks up the cells of the union of the group's reach boxes (<= kStageMaxCells),
//   2. copies the indices of their candidates (<= kStageCapacity) into shared memory and sorts them
//      (a bitonic sort in registers: the whole warp, once per group),
//   3. gathers the candidates' coordinates in that index order from the (B, M, D) references;
// then the block's warps take the group's queries in turn, each scanning the list in index order,
// 32 candidates at a time, writing the points inside the ball straight to their slots and stopping
// at the K-th: brute force's own loop and early exit, over the candidates only.
// (A first version gave each warp 32 queries of its own: a quarter of the warps, each four times
// as long, ran 0.46 ms against the warp-per-query search's 0.47 on the issue's case: too few warps
// to hide the latency, 1.3 waves.)
//
// Exactness (grid.h's contract): every cell that can hold a point within the radius of a query lies
// in that query's reach box (grid_cuda.cuh), hence in the union; every reference of those cells is
// staged, the rest cannot be inside the ball. Distances come from the same point_distance on the
// same values (the references in the compute type), and the candidates are visited in index order,
// so the first K points inside are brute force's K slots, in its order.
//
// A group whose box has more than kStageMaxCells cells or whose cells hold more than
// kStageCapacity points (a radius wide for the density, crowded cells), and every query that is
// padded, non-finite or searches an empty cloud, goes to the warp-per-query search of
// grid_ball_warp_cuda.cuh (with its index windows and its brute-force fallback), the block's warps
// taking its queries in turn; their buffers alias the group's unused staging area.
#pragma once

#include <cstdint>
#include <limits>

#include "grid/grid_ball_warp_cuda.cuh"

namespace pointops {
namespace grid_cuda {

constexpr int kStageCapacity = 512;  // candidates one group stages and sorts (16 keys per lane)
constexpr int kStageMaxCells = 64;   // cells of a group's union box: two lookups per lane

// Warps per block, each with a staging area: ~8.5 KB for float, ~14.5 KB for double.
template <typename acc_t>
constexpr int ball_cell_warps() {
  return sizeof(acc_t) == 8 ? 2 : 4;
}

#if defined(__CUDACC__)

// One group's staging area; while its group takes the per-query search, the same bytes hold the
// per-query search's buffer for each warp of the block (32 R <= kBallWarpBuffer slots).
constexpr int kBallWarpBuffer = 32 * 5;  // R <= 5: K <= kBallWarpMaxK

template <typename acc_t, int D, int W>
union BallStage {
  struct {
    acc_t c[D][kStageCapacity];         // the staged candidates' coordinates, in index order
    int32_t idx[kStageCapacity];        // their indices: in cell order, then sorted
    int32_t run_start[kStageMaxCells];  // where each cell's run starts in the sorted references
    int32_t run_end[kStageMaxCells];    // where it ends in the staged list (inclusive prefix sum)
  } list;
  struct {
    int32_t idx[W][kBallWarpBuffer];
    acc_t dist[W][kBallWarpBuffer];
  } buffers;
};

// Sorts idx[0, 32 R) ascending in place (a bitonic network over the warp's registers, element
// lane * R + r in keys[r]). Not inlined: one copy per R serves every kernel of the file.
template <int R>
__device__ __noinline__ void warp_sort_indices(int32_t* idx) {
  const int lane = threadIdx.x % 32;
  int32_t keys[R];
#pragma unroll
  for (int r = 0; r < R; ++r) keys[r] = idx[r * 32 + lane];  // any input order will do
  __syncwarp();
#pragma unroll
  for (int k = 2; k <= 32 * R; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= R) {  // the partner lives in lane ^ (j / R), same slot
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int e = lane * R + r;
          const int32_t other = __shfl_xor_sync(kFullMask, keys[r], j / R);
          keys[r] = ((e & k) == 0) == ((e & j) == 0) ? min(keys[r], other) : max(keys[r], other);
        }
      } else {  // the partner is slot r ^ j of this lane
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if ((r & j) == 0) {
            const bool ascending = ((lane * R + r) & k) == 0;
            const int32_t x = keys[r], y = keys[r | j];
            keys[r] = ascending ? min(x, y) : max(x, y);
            keys[r | j] = ascending ? max(x, y) : min(x, y);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) idx[lane * R + r] = keys[r];
  __syncwarp();
}

template <typename T>
__device__ __forceinline__ T warp_min(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Stages the candidates of the group whose union box is [lo, hi] (cloud b): returns their number,
// or -1 when the box or its points do not fit (the group then takes the per-query search).
template <typename acc_t, int D, typename List>
__device__ int stage_group(const SearchArgs<acc_t, D>& a, int64_t b, const int32_t (&lo)[3], const int32_t (&hi)[3],
                           List& s) {
  const int lane = threadIdx.x % 32;
  const int64_t nx = hi[0] - lo[0] + 1, ny = hi[1] - lo[1] + 1, nz = hi[2] - lo[2] + 1;
  const int64_t n_cells = nx * ny * nz;
  if (n_cells > kStageMaxCells) return -1;
  const GridParams& g = a.grids[b];
  int32_t total = 0;
#pragma unroll
  for (int half = 0; half < kStageMaxCells / 32; ++half) {
    const int64_t c = half * 32 + lane;
    int32_t start = 0, len = 0;
    if (c < n_cells) {
      const int32_t k[3] = {static_cast<int32_t>(lo[0] + c % nx), static_cast<int32_t>(lo[1] + (c / nx) % ny),
                            static_cast<int32_t>(lo[2] + c / (nx * ny))};
      int32_t end;
      find_cell(a.table, a.mask, cell_key<D>(g, b, k, a.log2_cells), &start, &end);
      len = end - start;
    }
    int32_t incl = len;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t v = __shfl_up_sync(kFullMask, incl, o);
      if (lane >= o) incl += v;
    }
    s.run_start[c] = start;
    s.run_end[c] = total + incl;
    total += __shfl_sync(kFullMask, incl, 31);
  }
  __syncwarp();
  if (total > kStageCapacity) return -1;
  // Candidate j belongs to the first cell whose run ends after j.
  for (int32_t j = lane; j < total; j += 32) {
    int cell = 0;
#pragma unroll
    for (int step = kStageMaxCells / 2; step > 0; step >>= 1) {
      if (s.run_end[cell + step - 1] <= j) cell += step;
    }
    const int32_t before = cell > 0 ? s.run_end[cell - 1] : 0;
    s.idx[j] = a.points[s.run_start[cell] + (j - before)].idx;
  }
  for (int32_t j = total + lane; j < kStageCapacity; j += 32) s.idx[j] = std::numeric_limits<int32_t>::max();
  __syncwarp();
  if (total <= 128) {
    warp_sort_indices<4>(s.idx);
  } else {
    warp_sort_indices<16>(s.idx);
  }
  const acc_t* refs = a.refs + b * a.M * D;
#pragma unroll 4
  for (int32_t j = lane; j < total; j += 32) {
    const int64_t i = s.idx[j];
#pragma unroll
    for (int c = 0; c < D; ++c) s.c[c][j] = refs[i * D + c];
  }
  __syncwarp();
  return total;
}

// The queries at sorted positions [t0, t0 + 32) (t0 = 32 blockIdx.x), one per lane, searched by the
// block's W warps. Every warp computes the lanes' cells and groups (the same values: no exchange
// needed); then, in rounds of up to W groups, warp w stages group w of the round into stage[w], and
// after a barrier the round's queries are dealt out to the warps in turn, each scanning its
// group's list (or taking the per-query search when the group was not staged). R: the per-query
// search's buffer.
template <typename acc_t, int D, int R>
__global__ void __launch_bounds__(32 * ball_cell_warps<acc_t>(), 6) ball_grid_cells_kernel(const SearchArgs<acc_t, D> a) {
  constexpr int W = ball_cell_warps<acc_t>();
  static_assert(32 * R <= kBallWarpBuffer, "the per-query search's buffer must fit the staging area");
  __shared__ BallStage<acc_t, D, W> stage[W];
  __shared__ int stage_count[W];  // the candidates staged per slot, -1: the per-query search
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * 32;
  const int64_t t = t0 + lane;
  const bool active = t < a.B * a.N;
  const int K = static_cast<int>(a.K);
  int64_t e = 0, b = 0;
  acc_t q[D];
#pragma unroll
  for (int c = 0; c < D; ++c) q[c] = acc_t(0);
  // The lane's cell (kEmptyKey: the per-query search) and reach box.
  unsigned long long key = kEmptyKey;
  int32_t lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
  if (active) {
    e = sorted_query(a, t);
    b = e / a.N;
    const int64_t i = e - b * a.N;
    const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
    const GridParams& g = a.grids[b];
    if (i < n_valid) {
#pragma unroll
      for (int c = 0; c < D; ++c) q[c] = a.queries[e * D + c];
      if (finite_point<acc_t, D>(q) && g.count > 0) {
        int32_t k[3];
        point_cell<acc_t, D>(g, q, k);
        key = cell_key<D>(g, b, k, a.log2_cells);
        reach_box<acc_t, D>(g, q, reach_of<acc_t, Metric::kSquaredL2>(a.r2), lo, hi);
      }
    }
  }
  const unsigned active_lanes = __ballot_sync(kFullMask, active);
  const unsigned same_key = __match_any_sync(kFullMask, key);
  unsigned pending = active_lanes;
  while (pending) {  // the same in every warp of the block
    unsigned round = 0;
    int my_slot = 0;
    for (int slot = 0; slot < W && pending; ++slot) {
      const int leader = __ffs(pending) - 1;
      const unsigned group = __shfl_sync(kFullMask, same_key, leader) & active_lanes;
      pending &= ~group;
      round |= group;
      if ((group >> lane) & 1u) my_slot = slot;
      if (warp == slot) {
        int n = -1;
        if (__shfl_sync(kFullMask, key, leader) != kEmptyKey) {
          const bool mine = (group >> lane) & 1u;
          int32_t box_lo[3], box_hi[3];
#pragma unroll
          for (int c = 0; c < 3; ++c) {
            box_lo[c] = warp_min(mine ? lo[c] : std::numeric_limits<int32_t>::max());
            box_hi[c] = warp_max(mine ? hi[c] : std::numeric_limits<int32_t>::min());
          }
          n = stage_group<acc_t, D>(a, __shfl_sync(kFullMask, b, leader), box_lo, box_hi, stage[slot].list);
        }
        if (lane == 0) stage_count[slot] = n;
      }
    }
    __syncthreads();
    int turn = 0;
    for (unsigned m = round; m; m &= m - 1, ++turn) {
      const int member = __ffs(m) - 1;
      const int slot = __shfl_sync(kFullMask, my_slot, member);
      if (turn % W != warp) continue;
      const int n = stage_count[slot];
      if (n < 0) {
        ball_search_query_warp<acc_t, D, R>(a, t0 + member, stage[slot].buffers.idx[warp],
                                            stage[slot].buffers.dist[warp]);
        __syncwarp();
        continue;
      }
      const auto& list = stage[slot].list;
      acc_t qm[D];
#pragma unroll
      for (int c = 0; c < D; ++c) qm[c] = __shfl_sync(kFullMask, q[c], member);
      const int64_t row = __shfl_sync(kFullMask, e, member) * a.K;
      int found = 0;
      for (int j0 = 0; j0 < n && found < K; j0 += 32) {
        const int j = j0 + lane;
        bool hit = false;
        acc_t d = acc_t(0);
        if (j < n) {
          acc_t p[D];
#pragma unroll
          for (int c = 0; c < D; ++c) p[c] = list.c[c][j];
          d = point_distance<D, Metric::kSquaredL2>(qm, p);
          hit = d < a.r2;
        }
        const unsigned hits = __ballot_sync(kFullMask, hit);
        const int slot_k = found + __popc(hits & ((1u << lane) - 1u));
        if (hit && slot_k < K) {
          a.dists[row + slot_k] = d;
          a.idx[row + slot_k] = list.idx[j];
        }
        found = min(K, found + __popc(hits));
      }
      for (int k = found + lane; k < K; k += 32) {
        a.dists[row + k] = acc_t(0);
        a.idx[row + k] = -1;
      }
    }
    __syncthreads();  // every warp is done with the staging areas before the next round
  }
}

#endif  // __CUDACC__

}  // namespace grid_cuda
}  // namespace pointops
