// Ball query over the grid for clouds of at most kTileMaxRefs references: one warp per 32
// consecutive sorted queries, the queries of one cell sharing one candidate list that is put in
// index order by a bitmap of the cloud's reference indices (grid_search_cuda.cu launches it for
// float32 compute, K <= kBallWarpMaxK and at least kTileMinQueries queries; larger clouds, fewer
// queries and float64 keep grid_ball_warp_cuda.cuh's warp per query: the templates take double, but
// that instantiation has not run on a GPU, so it is not compiled).
//
// Why: the warp per query spends most of its ~2,100 warp instructions per query on its own set-up
// (reach box, up to 27 hash lookups), on finding each candidate's run, and on ranking its hits by
// index (benchmarks/RESULTS.md, spatial grid section). The queries are sorted by cell, and the ~16
// queries of a cell of edge r look at the same ~27 cells. Sharing one list per cell but ordering it
// with a bitonic sort of up to 512 indices per list gains nothing (same section): the sort costs
// about what sharing saves. Here the list is ordered without sorting: every candidate sets the bit
// of its reference index in a bitmap of the cloud (at most 32768 bits, 4 KB), and the set bits read
// back in order are the candidates in index order. Per group the warp
//   1. takes the union of its queries' reach boxes (<= kTileMaxCells cells: two lookups per lane),
//   2. clears the bitmap, and each lane sets the bits of its cell's run,
//   3. reads the bitmap back (a popcount per lane, one warp scan) into the list of indices,
//   4. gathers the candidates' coordinates into the bitmap's place (the list's coordinates),
//   5. scans the list for each query of the group in index order, 32 at a time, noting the points
//      inside the ball in slot order and stopping at the K-th: brute force's own loop and early
//      exit, over the candidates only; then writes the query's row.
//
// Exactness (grid.h's contract): every cell that can hold a point within the radius of a query lies
// in that query's reach box (grid_cuda.cuh), hence in the union; every reference of those cells is
// listed, the rest cannot be inside the ball. Distances come from the same point_distance on the
// same values (the references in the compute type, read from the (B, M, D) array), and the list is
// visited in index order, so the first K points inside are brute force's K slots, in its order.
//
// A group of fewer than kTileMinGroup queries, or whose box has more than kTileMaxCells cells or
// whose cells hold more than kTileCapacity points (a radius wide for the density, crowded cells),
// is appended to a work list, which ball_grid_warp_list_kernel then searches with the warp per
// query (its index windows and its brute-force fallback), spread over all SMs rather than queued in
// the warp that found it. Queries that are padding, not finite, or search an empty cloud get empty
// rows here.
#pragma once

#include <cstdint>
#include <limits>

#include "grid/grid_ball_warp_cuda.cuh"

namespace pointops {
namespace grid_cuda {

// A list of 480 float candidates in 3-D, with 16-bit indices, and one query's hit positions take
// 6,976 bytes per warp: 8 blocks of 4 warps (8 x 27,904 bytes plus 1 KB reserved per block, within an
// H100 SM's 228 KB) at <= 64 registers, so that the benchmarks' 8 x 16384 queries (4096 warps) run in
// one wave. Cells of edge r in a uniform cloud of 16384 points hold ~442 candidates per cell's union
// box.
constexpr int kTileCapacity = 480;                    // candidates one group lists
static_assert(kTileCapacity % 32 == 0, "stage_tile pads the list to a multiple of 32");
constexpr int kTileMaxCells = 64;                     // cells of a group's union box
constexpr int64_t kTileMaxRefs = 32768;               // references per cloud: the bitmap's bits
constexpr int kTileBitmapWords = kTileMaxRefs / 32;  // 1024 words, 4 KB
// Groups of fewer queries go to the work list: each group costs its warp a chain of dependent
// loads (lookups, runs, coordinates), which a few queries do not repay.
constexpr int kTileMinGroup = 4;
// Queries from which the lists are used: below, a warp per 32 queries leaves the GPU short of
// warps (RESULTS: 4096 queries ran 0.168 ms against 0.104 with a warp per query).
constexpr int64_t kTileMinQueries = 65536;

// Warps per block (the staging area is 6.8 KB per warp for float D = 3, 12.4 KB for double).
template <typename acc_t>
constexpr int ball_tile_warps() {
  return sizeof(acc_t) == 8 ? 2 : 4;
}

// Words of the bitmap per lane: a power of two, so that a word's lane and slot are shifts. Lane L
// owns the index range [32 W L, 32 W (L + 1)); its w-th word is stored at w * 32 + L, so the lanes'
// passes over their words hit 32 different banks.
inline int tile_log2_words_per_lane(int64_t M) {  // host: SearchArgs::ball_tile_log2_words
  const int64_t words = (M + 31) / 32;
  int log2 = 0;
  while ((int64_t{32} << log2) < words) ++log2;
  return log2;
}

#if defined(__CUDACC__)

template <typename acc_t, int D>
struct BallTileStage {
  union {
    uint32_t bitmap[kTileBitmapWords];  // steps 2-3: the group's candidates, as bits of their indices
    acc_t c[D][kTileCapacity];          // steps 4-5: their coordinates, in index order
  };
  uint16_t idx[kTileCapacity];  // the candidates' indices (< kTileMaxRefs), ascending
  uint16_t hits[kBallWarpMaxK];  // step 5: the list positions of one query's hits, in slot order
};

// Lists the candidates of the group whose union box is [lo, hi] (cloud b) in s, in index order:
// returns their number rounded up to a multiple of 32 (NaN coordinates after the last), or -1 when
// the box or its points do not fit.
template <typename acc_t, int D>
__device__ int stage_tile(const SearchArgs<acc_t, D>& a, int64_t b, const int32_t (&lo)[3], const int32_t (&hi)[3],
                          BallTileStage<acc_t, D>& s) {
  const int lane = threadIdx.x % 32;
  const int64_t nx = hi[0] - lo[0] + 1, ny = hi[1] - lo[1] + 1, nz = hi[2] - lo[2] + 1;
  const int64_t n_cells = nx * ny * nz;
  if (n_cells > kTileMaxCells) return -1;
  const GridParams& g = a.grids[b];
  int32_t start[kTileMaxCells / 32], len[kTileMaxCells / 32];
  int32_t total = 0;
#pragma unroll
  for (int half = 0; half < kTileMaxCells / 32; ++half) {
    const int64_t c = half * 32 + lane;
    start[half] = 0;
    len[half] = 0;
    if (c < n_cells) {
      const int32_t k[3] = {static_cast<int32_t>(lo[0] + c % nx), static_cast<int32_t>(lo[1] + (c / nx) % ny),
                            static_cast<int32_t>(lo[2] + c / (nx * ny))};
      int32_t end;
      find_cell(a.table, a.mask, cell_key<D>(g, b, k, a.log2_cells), &start[half], &end);
      len[half] = end - start[half];
    }
    total += warp_sum(len[half]);
  }
  if (total > kTileCapacity) return -1;

  const int log2_w = a.ball_tile_log2_words;
  const int words_per_lane = 1 << log2_w;
  for (int w = 0; w < words_per_lane; ++w) s.bitmap[w * 32 + lane] = 0u;
  __syncwarp();
#pragma unroll
  for (int half = 0; half < kTileMaxCells / 32; ++half) {
    const int32_t end = start[half] + len[half];
#pragma unroll 4
    for (int32_t p = start[half]; p < end; ++p) {
      const uint32_t i = static_cast<uint32_t>(a.points[p].idx);
      const uint32_t word = i >> 5;
      atomicOr(&s.bitmap[((word & (words_per_lane - 1)) << 5) | (word >> log2_w)], 1u << (i & 31u));
    }
  }
  __syncwarp();
  // Read back: this lane's indices follow those of the lanes below it.
  int32_t mine = 0;
  for (int w = 0; w < words_per_lane; ++w) mine += __popc(s.bitmap[w * 32 + lane]);
  int32_t pos = warp_inclusive_sum(mine) - mine;
  for (int w = 0; w < words_per_lane; ++w) {
    uint32_t bits = s.bitmap[w * 32 + lane];
    const int32_t base = ((lane << log2_w) + w) << 5;
    while (bits) {
      s.idx[pos++] = static_cast<uint16_t>(base + __ffs(bits) - 1);
      bits &= bits - 1;
    }
  }
  __syncwarp();  // the bitmap is read: its space takes the coordinates
  const acc_t* refs = a.refs + b * a.M * D;
#pragma unroll 4
  for (int32_t j = lane; j < total; j += 32) {
    const int64_t i = s.idx[j];
#pragma unroll
    for (int c = 0; c < D; ++c) s.c[c][j] = refs[i * D + c];
  }
  // NaN up to a multiple of 32 (kTileCapacity is one): never inside the ball, so the scan's last
  // 32 need no bounds test.
  const int32_t padded = (total + 31) & ~31;
  if (total + lane < padded) {
#pragma unroll
    for (int c = 0; c < D; ++c) s.c[c][total + lane] = std::numeric_limits<acc_t>::quiet_NaN();
  }
  __syncwarp();
  return padded;
}

// The queries at sorted positions [t0, t0 + 32), one per lane.
template <typename acc_t, int D>
__device__ void ball_search_tile(const SearchArgs<acc_t, D>& a, int64_t t0, BallTileStage<acc_t, D>& s) {
  // Few values stay live across the groups (32-bit positions: B (M + N) < 2^31, check_grid_sizes;
  // the reach box recomputed per group), so that the scan keeps its registers within the 64 that
  // 8 blocks per SM allow.
  const int lane = threadIdx.x % 32;
  const bool active = t0 + lane < a.B * a.N;
  const int K = static_cast<int>(a.K);
  int32_t e = 0, b = 0;
  acc_t q[D];
#pragma unroll
  for (int c = 0; c < D; ++c) q[c] = acc_t(0);
  // The lane's cell (kEmptyKey: an empty row).
  unsigned long long key = kEmptyKey;
  if (active) {
    e = static_cast<int32_t>(sorted_query(a, t0 + lane));
    b = static_cast<int32_t>(e / a.N);
    const int64_t i = e - b * a.N;
    const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
    const GridParams& g = a.grids[b];
    if (i < n_valid) {
#pragma unroll
      for (int c = 0; c < D; ++c) q[c] = a.queries[static_cast<int64_t>(e) * D + c];
      if (finite_point<acc_t, D>(q) && g.count > 0) {
        int32_t k[3];
        point_cell<acc_t, D>(g, q, k);
        key = cell_key<D>(g, b, k, a.log2_cells);
      }
    }
  }
  const unsigned active_lanes = __ballot_sync(kFullMask, active);
  const unsigned empty_rows = __ballot_sync(kFullMask, active && key == kEmptyKey);
  const unsigned same_key = __match_any_sync(kFullMask, key);
  for (unsigned m = empty_rows; m; m &= m - 1) {
    const int64_t row = static_cast<int64_t>(__shfl_sync(kFullMask, e, __ffs(m) - 1)) * a.K;
    fill_empty_slots(a.dists + row, a.idx + row, 0, K);
  }
  unsigned pending = active_lanes & ~empty_rows;
  while (pending) {
    const int leader = __ffs(pending) - 1;
    const unsigned group = __shfl_sync(kFullMask, same_key, leader) & pending;
    pending &= ~group;
    const bool mine = (group >> lane) & 1u;
    int n = -1;
    if (__popc(group) >= a.ball_min_group) {  // the same in every lane: the collectives below are safe
      // The union of the members' reach boxes.
      int32_t box_lo[3] = {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::max(),
                           std::numeric_limits<int32_t>::max()};
      int32_t box_hi[3] = {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::min(),
                           std::numeric_limits<int32_t>::min()};
      if (mine) reach_box<acc_t, D>(a.grids[b], q, reach_of<acc_t, Metric::kSquaredL2>(a.r2), box_lo, box_hi);
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        box_lo[c] = warp_min(box_lo[c]);
        box_hi[c] = warp_max(box_hi[c]);
      }
      n = stage_tile<acc_t, D>(a, __shfl_sync(kFullMask, b, leader), box_lo, box_hi, s);
    }
    if (n < 0) {  // to the work list of the warp per query
      uint32_t base = 0;
      if (lane == leader) base = atomicAdd(a.ball_list_count, static_cast<uint32_t>(__popc(group))) + 1u;
      base = __shfl_sync(kFullMask, base, leader);  // the counter holds count - 1 (cleared to all-ones)
      if (mine) a.ball_list[base + __popc(group & ((1u << lane) - 1u))] = static_cast<int32_t>(t0 + lane);
      continue;
    }
    for (unsigned m = group; m; m &= m - 1) {
      const int member = __ffs(m) - 1;
      acc_t qm[D];
#pragma unroll
      for (int c = 0; c < D; ++c) qm[c] = __shfl_sync(kFullMask, q[c], member);
      const auto load = [&](int j, acc_t(&p)[D]) {
#pragma unroll
        for (int c = 0; c < D; ++c) p[c] = s.c[c][j];
      };
      // The hits' list positions go to shared memory (a few instructions in the scan's divergent
      // branch); the row is then written 32 slots at a time, each distance recomputed by the same
      // point_distance on the same values (bitwise the scan's).
      const int found = scan_in_index_order<acc_t, D>(qm, a.r2, n, K, load, [&](int slot, int j, acc_t) {
        s.hits[slot] = static_cast<uint16_t>(j);
      });
      __syncwarp();
      const int64_t row = static_cast<int64_t>(__shfl_sync(kFullMask, e, member)) * a.K;
      for (int k = lane; k < found; k += 32) {
        const int j = s.hits[k];
        acc_t p[D];
        load(j, p);
        a.dists[row + k] = point_distance<D, Metric::kSquaredL2>(qm, p);
        a.idx[row + k] = static_cast<int64_t>(s.idx[j]);
      }
      fill_empty_slots(a.dists + row, a.idx + row, found, K);
      __syncwarp();  // the hits are read before the next member's scan writes them
    }
    __syncwarp();  // every lane is done with the list before the next group clears the bitmap
  }
}

template <typename acc_t, int D>
__global__ void __launch_bounds__(32 * ball_tile_warps<acc_t>(), 8 / (sizeof(acc_t) / 4))
    ball_grid_tile_kernel(const SearchArgs<acc_t, D> a) {
  constexpr int kWarps = ball_tile_warps<acc_t>();
  __shared__ BallTileStage<acc_t, D> stage[kWarps];
  const int warp = threadIdx.x / 32;
  const int64_t t0 = (blockIdx.x * static_cast<int64_t>(kWarps) + warp) * 32;
  if (t0 < a.B * a.N) ball_search_tile<acc_t, D>(a, t0, stage[warp]);
}

// The work list's queries (sorted positions), one warp each, the warps (one wave: the launcher sizes
// the grid to the resident blocks) striding over the list.
template <typename acc_t, int D, int R>
__global__ void __launch_bounds__(kBallWarpThreads) ball_grid_warp_list_kernel(const SearchArgs<acc_t, D> a) {
  __shared__ int32_t buffer_idx[kBallWarps][32 * R];
  __shared__ acc_t buffer_dist[kBallWarps][32 * R];
  const int warp = threadIdx.x / 32;
  const int64_t count = static_cast<uint32_t>(*a.ball_list_count + 1u);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kBallWarps;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kBallWarps) + warp; w < count; w += stride) {
    ball_search_query_warp<acc_t, D, R>(a, a.ball_list[w], buffer_idx[warp], buffer_dist[warp]);
    __syncwarp();
  }
}

#endif  // __CUDACC__

}  // namespace grid_cuda
}  // namespace pointops
