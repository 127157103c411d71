// Exact neighbour searches over a uniform spatial grid on CUDA: knn_grid_cuda (knn_points;
// nearest_neighbor / chamfer with K = 1) and ball_query_grid_cuda. The contract is grid.h's: bit for
// bit the brute-force result (same point_distance, (distance, index) order, NaN / +inf never listed).
//
// Build (per call, one grid per cloud of the reference batch; every launch on the current stream,
// no host sync: all grid parameters live in device memory):
//   memset   one 0xFF memset of the cleared scratch: encoded bounds, counters, the hash table
//   bounds   grid_bounds_kernel: min / max of the finite valid references of each cloud (block
//            reduction + integer atomics on an order-preserving encoding of the doubles), their
//            count; the last block of each cloud (threadfence-reduction pattern) turns them into
//            that cloud's GridParams (cell size, cells per axis, key layout; make_grid_params)
//   keys     grid_keys_kernel: one 64-bit key per reference and per query, (cloud bit | batch |
//            cell), invalid / non-finite points last in their half, values = their flat index
//   sort     cub::DeviceRadixSort::SortPairs over the used key bits (stable): the references of
//            each cell are contiguous and in index order; the queries are in cell order
//            (the ball query's shared lists, clouds of <= 16384 points and queries, 2 B <= the
//            SM count, blocks that can opt in to ~68 KB of shared memory (not compute capability
//            7.5): keys and sort in one launch, grid_keys_block_sort_kernel, a block per cloud and
//            half; 1 enqueued operation instead of 11; use_block_sort)
//   cells    grid_cells_kernel: the sorted reference coordinates gathered with their original index
//            into one contiguous (B*M) array, and at each run start the cell's key -> [start, end)
//            inserted into an open-addressing hash table (fmix64, atomicCAS, bounded linear probing,
//            capacity a power of two >= 2 B M: never more than half full)
// Search: one thread (ball query: one warp) per query, queries in sorted (cell) order, so that
// neighbouring queries visit the same cells (divergence, L1 hits).
//   knn      visit the query's cell (clamped into the grid), then Chebyshev rings r = 1, 2, ...;
//            keep the K best (distance, index) in registers (K = 1 alone; else lists of 8..64,
//            knn_cuda_lists.cuh's insertion). Once the K-th best is known, the cells that can still
//            hold a candidate lie in a box around the query (reach_box: every cell outside it is
//            provably farther); the rings are cut to that box and the search stops once they
//            cover it (or the grid). A cell is skipped when its box is provably farther; a run is
//            left early once the K-th best is 0 (the rest can only tie with larger indices).
//            K > 64: passes of 64, each taking the best candidates after the last one written.
//   ball     K <= 128, float32 compute, clouds of <= 32768 references, >= 65536 queries: one warp
//            per 32 sorted queries (grid_ball_tile_cuda.cuh): the queries of a cell share one
//            candidate list, the runs of their cells put in index order through a bitmap of the
//            cloud's indices, which each scans in index order up to its K-th point inside (brute
//            force's loop over the candidates only, scan_in_index_order, noting the hits' positions
//            in shared memory, then writing the row); groups of < 4 queries, over 64 cells or over
//            480 candidates go to a work list for:
//            K <= 128: one warp per query (grid_ball_warp_cuda.cuh): the lanes look up the cells
//            within the radius together, stride over their runs, append the points inside to a
//            per-warp buffer and keep the K smallest indices; a query whose cells hold more than a
//            quarter of the cloud scans it in index order instead (brute force's early exit).
//            K > 128: one thread per query, the K smallest indices with d < r2 in a register list
//            ordered by index, passes of 64 (each takes the next 64 indices above the last one
//            written); a run is left as soon as its index passes the list's last.
//   crowding (knn, off by default) before the keys: the cell size shrinks for clouds whose points
//            crowd into few cells (grid_crowding_count_kernel).
//
// Why a cell can be skipped without changing any result: grid_cuda.cuh.
//
// Memory (bytes): 16 x capacity (table, capacity = pow2 >= 2 B M) + 24 x B (M + N) (keys and
// values, double-buffered; 12 x B (M + N) and no sort storage behind the per-cloud block sort) +
// sizeof(GridPoint) x B M (16 for float D = 2, 3; 32 for double) + the sort's temporary storage +
// small per-cloud arrays (+ 4 x B N: the ball query's work list).
// 1M x 1M float D = 3: ~100 MB.
//
// Debugging: POINTOPS_GRID_POINTS_PER_CELL overrides the cell-size rule's points per cell (knn),
// POINTOPS_GRID_BALL_CELL the ball query's smallest cell edge in radii, POINTOPS_GRID_BALL_TILES its
// shared lists (0: off; n > 0: on at any size, for groups of >= n queries), POINTOPS_GRID_BLOCK_SORT=0
// the device-wide sort behind them instead of the per-cloud block sort, POINTOPS_GRID_BALL_DEBUG=1
// prints how many queries the lists left to their work list (a host sync), POINTOPS_GRID_CROWDING the
// crowding refinement's target (0: off); POINTOPS_GRID_NEAREST_MIN_REFS / _MIN_PAIRS the K = 1
// thresholds of grid_pays_cuda; POINTOPS_GRID_PROBE_SCALE / _CHAIN / _LIST_FACTOR / _DEBUG the
// far-query probe's (grid_probe_kernel);
// scripts/grid_cuda_check.py compares algorithm="grid" with "brute" bit for bit and times it.
// grid_cuda.cuh's functions compile for the host too, so they can be checked on the CPU against brute
// force (the harness that does so is kept in the repository's history).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <vector>

#include "chamfer/chamfer.h"
#include "common/cuda_utils.cuh"
#include "common/hash_table.h"
#include "common/switches.h"
#include "grid/grid.h"
#include "grid/grid_ball_tile_cuda.cuh"
#include "grid/grid_ball_warp_cuda.cuh"
#include "grid/grid_cuda.cuh"
#include "neighbors/neighbors.h"

namespace pointops {
namespace grid_cuda {
namespace {

constexpr int kBuildThreads = 256;
constexpr int kSearchThreads = 128;
constexpr int64_t kBoundsPointsPerBlock = 4096;  // the bounds kernel's share of a cloud per block
constexpr int64_t kBoundsMaxBlocks = 1024;       // per cloud
// Points per cell of the cell-size rule: ~2 for K = 1 (a query's cell and its first ring then hold
// ~54 points in 3-D), ~K for K > 1 (its 27 cells hold the K nearest of most queries). Ball query:
// the density rule with ~2 points per cell, and cells of at least the radius.
constexpr double kPointsPerCellNN = 2.0;
constexpr double kPointsPerCellPerNeighbour = 1.0;

// ---------------------------------------------------------------------------------------------
// Build kernels

// doubles as uint64 whose unsigned order is the doubles' order (for integer atomicMin).
__device__ __forceinline__ unsigned long long order_encode(double x) {
  const unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(x));
  return (u >> 63) ? ~u : (u | (1ull << 63));
}
__device__ __forceinline__ double order_decode(unsigned long long e) {
  const unsigned long long u = (e >> 63) ? (e & ~(1ull << 63)) : ~e;
  return __longlong_as_double(static_cast<long long>(u));
}

// Scratch cleared to all-ones: per cloud 2 D encoded bounds (lo, then ~hi: both by atomicMin),
// the finite count (holds count - 1, mod 2^32) and the finished-blocks counter (likewise).
struct BoundsScratch {
  unsigned long long* bounds;  // (B, 2, D)
  uint32_t* counts;            // (B,)
  uint32_t* done;              // (B,)
};

// blocks_per_cloud blocks per cloud: min / max of the finite valid references of their share and
// their count, combined across blocks with atomics; the cloud's last block to finish builds its
// GridParams (the threadfence-reduction pattern: one launch, no host round trip).
template <typename acc_t, int D>
__global__ void __launch_bounds__(kBuildThreads)
grid_bounds_kernel(const acc_t* __restrict__ refs, const int64_t* __restrict__ lengths2, int64_t M,
                   int64_t blocks_per_cloud, BoundsScratch s, BuildConfig cfg, GridParams* __restrict__ grids) {
  constexpr int kWarps = kBuildThreads / 32;
  __shared__ double shared_lo[kWarps][D], shared_hi[kWarps][D];
  __shared__ uint32_t shared_n[kWarps];
  const int64_t b = blockIdx.x / blocks_per_cloud, part = blockIdx.x % blocks_per_cloud;
  const int64_t m_valid = lengths2 ? lengths2[b] : M;
  double lo[D], hi[D];
#pragma unroll
  for (int a = 0; a < D; ++a) {
    lo[a] = INFINITY;
    hi[a] = -INFINITY;
  }
  uint32_t n = 0;
  for (int64_t j = part * kBuildThreads + threadIdx.x; j < m_valid; j += blocks_per_cloud * kBuildThreads) {
    const acc_t* p = refs + (b * M + j) * D;
    if (!finite_point<acc_t, D>(p)) continue;
    ++n;
#pragma unroll
    for (int a = 0; a < D; ++a) {
      lo[a] = ::fmin(lo[a], static_cast<double>(p[a]));
      hi[a] = ::fmax(hi[a], static_cast<double>(p[a]));
    }
  }
  n = warp_sum(n);
#pragma unroll
  for (int a = 0; a < D; ++a) {
    lo[a] = warp_min(lo[a]);
    hi[a] = warp_max(hi[a]);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    shared_n[warp] = n;
#pragma unroll
    for (int a = 0; a < D; ++a) {
      shared_lo[warp][a] = lo[a];
      shared_hi[warp][a] = hi[a];
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kWarps; ++w) {
    n += shared_n[w];
#pragma unroll
    for (int a = 0; a < D; ++a) {
      lo[a] = ::fmin(lo[a], shared_lo[w][a]);
      hi[a] = ::fmax(hi[a], shared_hi[w][a]);
    }
  }
  unsigned long long* bounds = s.bounds + b * 2 * D;
  if (n > 0) {
#pragma unroll
    for (int a = 0; a < D; ++a) {
      atomicMin(bounds + a, order_encode(lo[a]));
      atomicMin(bounds + D + a, ~order_encode(hi[a]));
    }
    atomicAdd(s.counts + b, n);
  }
  __threadfence();
  // The counters start at all-ones: the first block to finish reads 0xFFFFFFFF, i.e. "0 before me".
  const uint32_t finished_before = atomicAdd(s.done + b, 1u) + 1u;
  if (finished_before != static_cast<uint32_t>(blocks_per_cloud - 1)) return;
  __threadfence();  // every other block's atomics are visible to the last one
  const int64_t count = static_cast<int64_t>(atomicAdd(s.counts + b, 0u) + 1u);
  double cloud_lo[D], cloud_hi[D];
#pragma unroll
  for (int a = 0; a < D; ++a) {
    cloud_lo[a] = order_decode(atomicAdd(bounds + a, 0ull));
    cloud_hi[a] = order_decode(~atomicAdd(bounds + D + a, 0ull));
  }
  grids[b] = make_grid_params<D>(cloud_lo, cloud_hi, count, cfg);
}

// ---------------------------------------------------------------------------------------------
// The crowding refinement (knn)
//
// The density rule sizes cells by the bounding box: right for a volume-filling cloud, far too large
// for a LiDAR scan, whose points lie on surfaces and crowd near the sensor (KITTI: the mean run a
// point sits in is ~540 points at the rule's 1.25 m, against ~3 for a uniform cloud; nearly every
// distance a query computes is wasted). So, before the keys are made, a sample of each cloud's
// references (every stride-th in index order, <= kCrowdingSamples over all clouds) is counted into
// the cells of kCrowdingLevels finer sizes h0 2^(-l/2) (one hash table of (cloud, level, cell) ->
// count), and each cloud takes the largest size whose crowding -- the mean over points of the
// number of references in the point's cell, estimated from the sample -- is at most
// crowding_target. A uniform cloud keeps h0 (its crowding is ~points_per_cell + 1). Only the cell
// size changes: the search is exact for any grid.
//
// Crowding estimate: with a fraction f of the points sampled, E[sum_c n_s,c^2] = f^2 sum_c n_c^2 +
// f (1 - f) sum_c n_c, hence crowding = sum_c n_c^2 / n ~ (S2 - (1 - f) S1) / (f S1), S1 the
// sampled points, S2 the sum of their cells' squared sample counts.
constexpr int kCrowdingLevels = 6;           // cell sizes h0, h0 / sqrt(2), ..., h0 / 2^2.5 (0.18 h0)
constexpr int64_t kCrowdingSamples = 32768;  // sampled references, all clouds together
constexpr int64_t kCrowdingMinSamples = 256; // per cloud, at least
// In units of points_per_cell (POINTOPS_GRID_CROWDING; 0 turns it off), K = 1 only. Measured on the
// H100 (benchmarks/RESULTS.md, `grid_cuda_check.py tune`, every result bitwise equal to brute force):
// nuScenes chamfer 4.0x -> 14.7x brute force at 96 (12.1x at 192, 9.1x at 48), KITTI 3.0x -> 4.8x at
// 96 (6.0x at 48, 2.9x at 24), uniform 1M x 1M 1.51 -> 1.62 ms (the sample pass). K > 1 keeps the
// density rule: on the scans K = 16 got no faster or much slower at most targets (nuScenes 14.4 ms
// at 0, 75.9 at 24, 14.1 at 96).
constexpr double kCrowdingTarget = 96.0;
constexpr int kCrowdingKeyBits = 4;          // extra key bits: up to 16x the cells (finer levels are capped)

struct alignas(16) CrowdSlot {
  unsigned long long key;  // kEmptyKey: free
  uint32_t count;          // count - 1 (cleared to all-ones)
  uint32_t pad;
};

// Cleared to all-ones with the rest of the scratch: table keys empty, counters holding "value - 1".
struct CrowdingScratch {
  CrowdSlot* table;
  uint64_t mask;
  unsigned long long* sums;     // (B, kCrowdingLevels): S2 - 1
  unsigned long long* sampled;  // (B,): S1 - 1
  int64_t per_cloud;            // samples per cloud, at most; a multiple of 32
};

// Each sampled reference adds 1 to its cell's count at every level; S2 grows by (c + 1)^2 - c^2 =
// 2 c + 1 when a cell's count goes from c to c + 1, so the sums need no second pass over the table.
// per_cloud is a multiple of 32, so a warp's samples belong to one cloud and the sums are added
// once per warp (same-address atomics from every sample serialise).
template <typename acc_t, int D>
__global__ void __launch_bounds__(kBuildThreads)
grid_crowding_count_kernel(const acc_t* __restrict__ refs, const int64_t* __restrict__ lengths2, int64_t B, int64_t M,
                           const GridParams* __restrict__ grids, CrowdingScratch s) {
  const int lane = threadIdx.x % 32;
  const int64_t total = B * s.per_cloud;  // a multiple of 32, as is the stride of this loop
  for (int64_t f = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; f - lane < total;
       f += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = f / s.per_cloud, k = f - b * s.per_cloud;  // the same b in the whole warp
    const int64_t m_valid = lengths2 ? lengths2[b] : M;
    const int64_t stride = m_valid > s.per_cloud ? (m_valid + s.per_cloud - 1) / s.per_cloud : 1;
    const int64_t j = k * stride;
    const acc_t* p = refs + (b * M + j) * D;
    const bool sampled = j < m_valid && finite_point<acc_t, D>(p);
    const unsigned in_warp = __ballot_sync(0xffffffffu, sampled);
    if (in_warp == 0) continue;
    const GridParams& g = grids[b];
#pragma unroll
    for (int level = 0; level < kCrowdingLevels; ++level) {
      unsigned long long growth = 0;
      if (sampled) {
        const double refine = ::exp2(0.5 * level);
        uint64_t key = fmix64(static_cast<uint64_t>(b * kCrowdingLevels + level));
#pragma unroll
        for (int a = 0; a < D; ++a) {
          // Finite: |p - lo| <= the extent, inv_h <= kMaxCellsPerAxis / extent.
          const double u = ::floor((static_cast<double>(p[a]) - g.lo[a]) * g.inv_h[a] * refine);
          key = fmix64(key ^ static_cast<uint64_t>(static_cast<int64_t>(u)));
        }
        if (key == kEmptyKey) key = 0;  // a collision of two cells only blurs the estimate
        uint64_t h = key & s.mask;
        for (uint64_t probe = 0; probe <= s.mask; ++probe) {  // at most half full: a slot is found
          const unsigned long long prev =
              atomicCAS(&s.table[h].key, kEmptyKey, static_cast<unsigned long long>(key));
          if (prev == kEmptyKey || prev == key) {
            const uint32_t before = atomicAdd(&s.table[h].count, 1u) + 1u;  // the cell's count before
            growth = 2ull * before + 1ull;
            break;
          }
          h = (h + 1) & s.mask;
        }
      }
      growth = warp_sum(growth);
      if (lane == 0) atomicAdd(s.sums + b * kCrowdingLevels + level, growth);
    }
    if (lane == 0) atomicAdd(s.sampled + b, static_cast<unsigned long long>(__popc(in_warp)));
  }
}

// One thread per cloud: the level whose estimated crowding is at most `target`, and that cloud's
// GridParams remade with it.
template <int D>
__global__ void grid_crowding_choose_kernel(int64_t B, BoundsScratch bounds, CrowdingScratch s, BuildConfig cfg,
                                            double target, GridParams* __restrict__ grids) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= B) return;
  const int64_t count = grids[b].count;
  const double sampled = static_cast<double>(s.sampled[b] + 1ull);
  if (count <= 0 || sampled < 1) return;
  const double f = ::fmin(1.0, sampled / static_cast<double>(count));
  int chosen = kCrowdingLevels - 1;
  for (int level = 0; level < kCrowdingLevels; ++level) {
    const double sum2 = static_cast<double>(s.sums[b * kCrowdingLevels + level] + 1ull);
    if ((sum2 - (1.0 - f) * sampled) / (f * sampled) <= target) {
      chosen = level;
      break;
    }
  }
  if (chosen == 0) return;
  double lo[D], hi[D];
#pragma unroll
  for (int a = 0; a < D; ++a) {
    lo[a] = order_decode(bounds.bounds[b * 2 * D + a]);
    hi[a] = order_decode(~bounds.bounds[b * 2 * D + D + a]);
  }
  cfg.h_scale = ::exp2(-0.5 * chosen);
  grids[b] = make_grid_params<D>(lo, hi, count, cfg);
}

// Sort keys: references [0, B M) then queries [B M, B (M + N)), each with point_sort_key; the
// queries' keys also carry bit query_bit, so that they sort after every reference. Values: the
// flat index.
template <typename acc_t, int D>
__global__ void grid_keys_kernel(const acc_t* __restrict__ queries, const acc_t* __restrict__ refs,
                                 const int64_t* __restrict__ lengths1, const int64_t* __restrict__ lengths2,
                                 int64_t B, int64_t N, int64_t M, const GridParams* __restrict__ grids,
                                 int log2_cells, int query_bit, uint64_t* __restrict__ keys,
                                 int32_t* __restrict__ values) {
  const int64_t refs_total = B * M, total = B * (M + N);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool is_ref = e < refs_total;
    const int64_t f = is_ref ? e : e - refs_total;
    const int64_t size = is_ref ? M : N;
    const int64_t b = f / size, i = f - b * size;
    const int64_t* lengths = is_ref ? lengths2 : lengths1;
    const acc_t* p = (is_ref ? refs : queries) + f * D;
    const uint64_t key =
        point_sort_key<acc_t, D>(p, b, i, lengths ? lengths[b] : size, B, grids[b], log2_cells);
    keys[e] = is_ref ? key : (key | (1ull << query_bit));
    values[e] = static_cast<int32_t>(e);
  }
}

// The keys and the sort in one launch, for clouds of at most kBlockSortItems references and as many
// queries (the ball query's shared lists; the benchmarks' 8 x 16384 case): one block per cloud and half
// (references, queries), the half's cell keys sorted in shared memory by cub's BlockRadixSort. The
// device-wide sort costs 10 enqueued operations (5 kernels, 5 memsets) and its host dispatch per
// call; this costs one. The output is what grid_keys_kernel + SortPairs give, except that each
// cloud's padded / non-finite points end its own segment instead of its half: the keys of cloud b's
// references fill [b M, b M + M) in (cell, index) order, its queries' [B M + b N, B M + b N + N), and
// the values are the flat indices. grid_cells_kernel skips the invalid keys wherever they are, and a
// cell's run stays contiguous (its key holds the cloud), so the grid is the same.
//
// A key is (cell << 14) | index in 32 bits, but only the cell bits are sorted: the keys enter the
// sort in index order (the blocked arrangement) and the sort is stable, which orders a cell's points
// by index with 3 passes of 6 bits instead of 8 of 4 over the whole key. They leave striped, for
// coalesced stores. The configurations, the sort alone timed in a bench (16 x 16384 keys, H100; the
// bench is kept in the repository's history): 512 x 32 keys 6-bit cell bits 21 us, 4-bit 23 us, all
// 32 bits 29 us; 1024 x 16 keys 27-37 us.
// The keys are computed in a rolled loop over striped indices (a warp reads consecutive points) into
// shared memory, and read back blocked. Computed straight into 32 registers instead, the unrolled
// loads spilled the grid's parameters (ncu: 57% of the stall samples before the sort). The whole
// launch takes ~40 us for 8 x 16384 points and queries on an H100 (16 blocks; 43 us computed into
// registers), against ~21 us for the sort alone in the bench: the rest is not yet accounted for.
constexpr int kBlockSortThreads = 512;
constexpr int kBlockSortPerThread = 32;
constexpr int kBlockSortRadixBits = 6;
constexpr int kBlockSortIndexBits = 14;
constexpr int64_t kBlockSortItems = kBlockSortThreads * kBlockSortPerThread;  // 16384 = 2^14
static_assert(kBlockSortItems == int64_t{1} << kBlockSortIndexBits, "a segment's indices fill the index bits");
// Cells of such a cloud: log2_cells_for(16384) = 17 bits, one more value for the invalid points, and
// the point's index: (cell << 14) | index fits 32 bits.
constexpr int kBlockSortMaxCellBits = 32 - 1 - kBlockSortIndexBits;
using BlockCellSort = cub::BlockRadixSort<uint32_t, kBlockSortThreads, kBlockSortPerThread, cub::NullType,
                                          kBlockSortRadixBits>;
union BlockSortStorage {
  typename BlockCellSort::TempStorage sort;
  // key i at [i + i / 32]: a warp's striped writes are contiguous, and its blocked reads (thread t,
  // item k at 33 t + k) fall in 32 different banks
  uint32_t keys[kBlockSortItems + kBlockSortItems / 32];
};

template <typename acc_t, int D>
__global__ void __launch_bounds__(kBlockSortThreads, 1)
grid_keys_block_sort_kernel(const acc_t* __restrict__ queries, const acc_t* __restrict__ refs,
                            const int64_t* __restrict__ lengths1, const int64_t* __restrict__ lengths2, int64_t B,
                            int64_t N, int64_t M, const GridParams* __restrict__ grids, int log2_cells, int query_bit,
                            uint64_t* __restrict__ keys, int32_t* __restrict__ values) {
  extern __shared__ __align__(16) unsigned char block_sort_shared[];
  auto& storage = *reinterpret_cast<BlockSortStorage*>(block_sort_shared);
  const int64_t b = blockIdx.x / 2;
  const bool is_query = blockIdx.x % 2 == 1;
  const int64_t size = is_query ? N : M;
  const int64_t first = is_query ? B * M + b * N : b * M;  // the segment's first flat index
  const int64_t* lengths = is_query ? lengths1 : lengths2;
  const int64_t valid = lengths ? lengths[b] : size;
  const acc_t* points = (is_query ? queries : refs) + b * size * D;
  const GridParams g = grids[b];  // in registers: the loop below reads it for every point
  // (cell within the cloud << 14) | index; invalid points take the cell 2^log2_cells (after every
  // cell), the slots past the segment all ones (after those: their sorted bits, all ones, exceed the
  // invalid cell's, log2_cells_for giving >= 6).
  const uint64_t cloud_key = static_cast<uint64_t>(b) << log2_cells;
  const uint64_t invalid = static_cast<uint64_t>(B) << log2_cells;
  const uint32_t invalid_cell = 1u << log2_cells;
#pragma unroll 4
  for (int i = threadIdx.x; i < kBlockSortItems; i += kBlockSortThreads) {
    uint32_t key = ~0u;
    if (i < size) {
      const uint64_t full = point_sort_key<acc_t, D>(points + static_cast<int64_t>(i) * D, b, i, valid, B, g, log2_cells);
      const uint32_t cell = full >= invalid ? invalid_cell : static_cast<uint32_t>(full - cloud_key);
      key = (cell << kBlockSortIndexBits) | static_cast<uint32_t>(i);
    }
    storage.keys[i + i / 32] = key;
  }
  __syncthreads();
  uint32_t key[kBlockSortPerThread];
#pragma unroll
  for (int k = 0; k < kBlockSortPerThread; ++k) {
    const int i = static_cast<int>(threadIdx.x) * kBlockSortPerThread + k;
    key[k] = storage.keys[i + i / 32];
  }
  __syncthreads();  // the sort reuses the shared memory
  BlockCellSort(storage.sort).SortBlockedToStriped(key, kBlockSortIndexBits, kBlockSortIndexBits + log2_cells + 1);
#pragma unroll
  for (int k = 0; k < kBlockSortPerThread; ++k) {
    const int64_t slot = static_cast<int64_t>(k) * kBlockSortThreads + threadIdx.x;
    if (slot < size) {  // the first `size` slots hold the segment's points (the padding sorts last)
      const uint32_t cell = key[k] >> kBlockSortIndexBits;
      const int64_t i = key[k] & ((1u << kBlockSortIndexBits) - 1u);
      const uint64_t full = cell >= invalid_cell ? invalid : cloud_key | cell;
      keys[first + slot] = is_query ? (full | (1ull << query_bit)) : full;
      values[first + slot] = static_cast<int32_t>(first + i);
    }
  }
}

__device__ __forceinline__ void insert_cell(CellSlot* table, uint64_t mask, uint64_t key, int32_t start,
                                            int32_t end) {
  uint64_t h = fmix64(key) & mask;
  // Each key is inserted once (one run per cell) into a table at most half full: a free slot is
  // always found; the bound only makes "never loops forever" true by construction.
  for (uint64_t probe = 0; probe <= mask; ++probe) {
    if (atomicCAS(&table[h].key, kEmptyKey, static_cast<unsigned long long>(key)) == kEmptyKey) {
      table[h].start = start;
      table[h].end = end;
      return;
    }
    h = (h + 1) & mask;
  }
}

// The sorted references gathered with their indices, and each cell's run into the hash table.
template <typename acc_t, int D>
__global__ void grid_cells_kernel(const acc_t* __restrict__ refs, int64_t B, int64_t M,
                                  const uint64_t* __restrict__ keys, const int32_t* __restrict__ values,
                                  int log2_cells, CellSlot* __restrict__ table, uint64_t mask,
                                  GridPoint<acc_t, D>* __restrict__ points) {
  const int64_t total = B * M;
  const uint64_t invalid = static_cast<uint64_t>(B) << log2_cells;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; s < total;
       s += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t key = keys[s];
    if (key >= invalid) continue;  // padded / non-finite: sorted after every valid reference, never read
    const int64_t v = values[s];
    const int64_t b = v / M;
    GridPoint<acc_t, D> p;
#pragma unroll
    for (int a = 0; a < D; ++a) p.c[a] = refs[v * D + a];
    p.idx = static_cast<int32_t>(v - b * M);
    points[s] = p;
    if (s > 0 && keys[s - 1] == key) continue;
    // The run's end: the first position after s with another key. Galloping, then a binary
    // search: O(log run) loads, and a run can be a whole cloud. Invariant: [s, lo) hold the key;
    // hi is total or holds another key.
    int64_t lo = s + 1, hi = total;
    for (int64_t step = 1; s + step < total; step *= 2) {
      if (keys[s + step] != key) {
        hi = s + step;
        break;
      }
      lo = s + step + 1;
    }
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] == key) lo = mid + 1; else hi = mid;
    }
    insert_cell(table, mask, key, static_cast<int32_t>(s), static_cast<int32_t>(lo));
  }
}

// One thread per query, in sorted (cell) order.
template <typename acc_t, int D, Metric metric, int KP>
__global__ void __launch_bounds__(kSearchThreads) knn_grid_kernel(const SearchArgs<acc_t, D> a) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= a.B * a.N) return;
  if (a.use_grid != nullptr && a.use_grid[sorted_query(a, t) / a.N] == 0) return;  // brute force's cloud
  knn_search_query<acc_t, D, metric, KP>(a, t);
}

// ---------------------------------------------------------------------------------------------
// The far-query probe ("auto": nearest_neighbor / chamfer, and knn_points' lists)
//
// The grid's cost per query grows with its nearest distance d over the cell size h: a query finds
// nothing until its rings reach distance d, and looks up every cell on the way, ~(2 d / h + 1)^D
// of them (clamped to the grid), so a query far from the reference cloud (a blob of queries
// inside a sphere of references; a generator's output early in training) costs more than brute
// force's scan of the whole cloud. The sizes-only rule cannot see this. The probe: one warp per
// sampled query (kProbeSamples per cloud, strided in index order) bounds d from above by the
// nearest of (a) the points of the query's cell and its neighbours (3^D cells, one lane each, at
// most kProbeRunPoints per cell) and (b) kProbeRefSamples references strided in index order, then
// estimates the search as lookups of the cells of the reach box of that distance plus the points
// they hold (the cloud's density) plus a fixed cost per query, in units of one brute-force pair.
// Two bounds on the grid's time: the work (the estimates summed, scaled to the cloud's valid
// queries) against brute force's n_valid x m_valid pairs, and the latency of the slowest query (its
// lookups are a serial chain of dependent loads, and with few queries the GPU has nothing else to
// run meanwhile) against the brute-force launch of the whole call (B N M pairs). The cloud's last
// probe warp (the threadfence-reduction pattern) writes use_grid[b]: 1 when both bounds favour the
// grid. The sums are integers, so the choice is deterministic; every result is exact either way.
constexpr int kProbeSamples = 128;
constexpr int kProbeRefSamples = 1024;
constexpr int kProbeRunPoints = 64;
constexpr int kProbeThreads = 256;
constexpr int kProbeWarps = kProbeThreads / 32;
// Costs in brute-force pairs (3.5e12 pairs/s): the grid's 1M x 1M uniform search (~50 lookups, ~80
// points per query) and a blob of queries in a sphere of references (~10^4 lookups per query) both
// run at ~40 pairs per lookup (H100 timings, benchmarks/RESULTS.md).
constexpr double kProbeCostPerQuery = 300.0;
constexpr double kProbeCostPerLookup = 40.0;
constexpr double kProbeCostPerPoint = 10.0;
// The latency bound: the probe's slowest sampled query (its reach box's cells) times this, against
// the brute-force launch's pairs. Fitted on two H200s (`grid_cuda_check.py probe`, PROBE_CHAINS
// 0,1e6,4e6,1.6e7; benchmarks/RESULTS.md): queries 0.1 off a surface (a tail of queries a few cells
// from everything) took the grid at 4e6 and ran 0.32x / 0.66x brute force at 65536 / 262144 points;
// 1.6e7 hands them to brute force (1.37x / 1.89x: the near direction keeps the grid) and keeps every
// near case on the grid. ~4.6 us per lookup of the sampled maximum, which stands for the cloud's
// (larger) true maximum. POINTOPS_GRID_PROBE_CHAIN overrides it (debugging).
constexpr double kProbeCostPerChainedLookup = 1.6e7;
// knn_points with K > 1 (lists): the probe is K = 1's, whose bound on the nearest distance stands
// for the K-th one (far queries, the case it is for, have all K neighbours at about that distance).
// A list's grid search costs more per lookup and per point than K = 1's (larger cells, insertions
// into a sorted list of K), more than brute force's list costs over its K = 1 pair: the grid's
// estimate is multiplied by this factor. Calibrated on the H100 (grid_cuda_check.py probe-lists,
// benchmarks/RESULTS.md). POINTOPS_GRID_PROBE_LIST_FACTOR overrides it (debugging, the sweep).
constexpr double kProbeListFactor = 4.0;

// Cleared to all-ones with the build's scratch: both hold "value - 1".
struct ProbeScratch {
  unsigned long long* cost;       // (B,) the probe queries' estimates, summed
  unsigned long long* not_cells;  // (B,) ~(the most cells one probe query looks up): atomicMin
  uint32_t* done;                 // (B,) probe warps finished
};

struct ProbeCosts {
  double per_query, per_lookup, per_point;
  double per_chained_lookup;  // the latency bound's cost of one lookup in the slowest query's chain
  // the estimate is multiplied by this before the comparison: POINTOPS_GRID_PROBE_SCALE, times
  // kProbeListFactor for K > 1
  double scale;
};

template <typename acc_t, int D, Metric metric>
__global__ void __launch_bounds__(kProbeThreads)
grid_probe_kernel(const SearchArgs<acc_t, D> a, ProbeScratch s, ProbeCosts costs, uint8_t* __restrict__ use_grid) {
  constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();
  const int lane = threadIdx.x % 32;
  const int64_t w = blockIdx.x * static_cast<int64_t>(kProbeWarps) + threadIdx.x / 32;
  if (w >= a.B * kProbeSamples) return;  // whole warps
  const int64_t b = w / kProbeSamples, k = w % kProbeSamples;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
  const int64_t samples = n_valid < kProbeSamples ? n_valid : kProbeSamples;
  const GridParams& g = a.grids[b];
  double cost = 0, chain = 0;
  if (k < samples && g.count > 0) {
    const int64_t i = k * n_valid / samples;
    acc_t q[D];
#pragma unroll
    for (int c = 0; c < D; ++c) q[c] = a.queries[(b * a.N + i) * D + c];
    if (finite_point<acc_t, D>(q)) {
      acc_t best = kInf;
      int32_t c[3];
      point_cell<acc_t, D>(g, q, c);
      constexpr int kLocal = D == 3 ? 27 : 9;
      const int32_t k3[3] = {c[0] + lane % 3 - 1, c[1] + (lane / 3) % 3 - 1, D == 3 ? c[2] + lane / 9 - 1 : 0};
      bool inside = lane < kLocal;
#pragma unroll
      for (int d = 0; d < D; ++d) inside = inside && k3[d] >= 0 && k3[d] < g.dims[d];
      if (inside) {
        int32_t start, end;
        find_cell(a.table, a.mask, cell_key<D>(g, b, k3, a.log2_cells), &start, &end);
        const int32_t stop = end - start > kProbeRunPoints ? start + kProbeRunPoints : end;
        for (int32_t p = start; p < stop; ++p) {
          const acc_t d = point_distance<D, metric>(q, a.points[p].c);
          if (d < best) best = d;
        }
      }
      const int64_t stride = m_valid > kProbeRefSamples ? m_valid / kProbeRefSamples : 1;
      for (int64_t j = lane; j < kProbeRefSamples && j * stride < m_valid; j += 32) {
        const acc_t d = point_distance<D, metric>(q, a.refs + (b * a.M + j * stride) * D);
        if (d < best) best = d;  // NaN (a non-finite reference) never is
      }
      best = warp_min(best);  // no NaN: best starts at +inf and only takes smaller distances
      int32_t lo[3], hi[3];
      reach_box<acc_t, D>(g, q, reach_of<acc_t, metric>(best), lo, hi);  // +inf: the whole grid
      double cells = 1, grid_cells = 1;
#pragma unroll
      for (int d = 0; d < D; ++d) {
        cells *= static_cast<double>(hi[d] - lo[d] + 1);
        grid_cells *= static_cast<double>(g.dims[d]);
      }
      cost = costs.per_query + costs.per_lookup * cells + costs.per_point * g.count * (cells / grid_cells);
      chain = cells;
    }
  }
  if (lane != 0) return;
  if (cost > 0) atomicAdd(s.cost + b, static_cast<unsigned long long>(::fmin(cost, 1e15)));
  if (chain > 0) atomicMin(s.not_cells + b, ~static_cast<unsigned long long>(::fmin(chain, 1e15)));
  __threadfence();
  // The counters start at all-ones: the first warp to finish reads 0xFFFFFFFF, i.e. "0 before me".
  const uint32_t finished_before = atomicAdd(s.done + b, 1u) + 1u;
  if (finished_before != static_cast<uint32_t>(kProbeSamples - 1)) return;
  __threadfence();  // every other warp's sum is visible to the last one
  const double sum = static_cast<double>(atomicAdd(s.cost + b, 0ull) + 1ull);
  const double grid_cost = samples > 0 ? sum * (static_cast<double>(n_valid) / static_cast<double>(samples)) : 0.0;
  const double brute_cost = static_cast<double>(n_valid) * static_cast<double>(m_valid);
  const double slowest = static_cast<double>(~atomicAdd(s.not_cells + b, 0ull)) * costs.per_chained_lookup;
  const double brute_launch = static_cast<double>(a.B) * static_cast<double>(a.N) * static_cast<double>(a.M);
  use_grid[b] = grid_cost * costs.scale <= brute_cost && slowest * costs.scale <= brute_launch ? 1 : 0;
}

template <typename acc_t, int D, int KP>
__global__ void __launch_bounds__(kSearchThreads) ball_grid_kernel(const SearchArgs<acc_t, D> a) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t < a.B * a.N) ball_search_query<acc_t, D, KP>(a, t);
}

// ---------------------------------------------------------------------------------------------
// Host side

inline int64_t align_bytes(int64_t bytes) { return (bytes + 255) / 256 * 256; }

inline int bit_width(uint64_t v) {
  int bits = 0;
  for (; v != 0; v >>= 1) ++bits;
  return bits;
}

// The key space of one cloud: 8 cells per reference point (the density rule asks for <= 1/2 cell
// per point for K = 1; bricks pad at most 4x per flat axis), at least 64 (one brick).
inline int log2_cells_for(int64_t M) {
  const uint64_t cells = static_cast<uint64_t>(std::max<int64_t>(8 * M, 64));
  return bit_width(cells - 1);  // ceil(log2(cells))
}

// The temporary storage of build_grid's radix sort. cub's size query runs its host-side dispatch on
// every call; the size depends only on the item count, the key bits and the device, so the last
// answer is kept (per thread: a training loop repeats one shape).
size_t radix_sort_bytes(int64_t total, int end_bit, cudaStream_t stream) {
  struct Query {
    int64_t total = -1;
    int end_bit = -1;
    int device = -1;
    size_t bytes = 0;
  };
  thread_local Query last;
  const int device = c10::cuda::current_device();
  if (last.total != total || last.end_bit != end_bit || last.device != device) {
    size_t bytes = 0;
    cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, values, static_cast<int>(total), 0, end_bit,
                                                   stream));
    last = Query{total, end_bit, device, bytes};
  }
  return last.bytes;
}

// Whether grid_keys_block_sort_kernel<acc_t, D> can run on the current device, its dynamic shared
// memory limit raised there (once per device, the same value every time, so concurrent callers
// cannot undo each other). It needs ~68 KB a block: compute capability 7.0 and 8.0+ opt in to more,
// 7.5 (Turing) to 64 KB only, where the device-wide sort stays.
template <typename acc_t, int D>
bool block_sort_ready() {
  constexpr int kMaxDevices = 64;
  enum : int { kUnknown = 0, kReady = 1, kUnavailable = 2 };
  static std::atomic<int> state[kMaxDevices];  // static storage: kUnknown
  const int device = c10::cuda::current_device();
  if (device < 0 || device >= kMaxDevices) return false;
  int known = state[device].load(std::memory_order_acquire);  // pairs with the store below
  if (known == kUnknown) {
    int optin_bytes = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin_bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const bool fits = sizeof(BlockSortStorage) <= static_cast<size_t>(optin_bytes);
    if (fits) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(grid_keys_block_sort_kernel<acc_t, D>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(sizeof(BlockSortStorage))));
    }
    known = fits ? kReady : kUnavailable;
    state[device].store(known, std::memory_order_release);  // after the attribute is raised
  }
  return known == kReady;
}

// Where the per-cloud block sort replaces grid_keys_kernel + the device-wide sort: clouds and query
// sets that fit one block, and at most one wave of blocks (one per SM): a block always sorts 16,384
// slots (~40 us on an H100), so many small clouds (512 of 128 points: 8 waves) cost less sorted
// device-wide; and a device whose blocks can hold the kernel's shared memory.
template <typename acc_t, int D>
bool use_block_sort(int64_t B, int64_t N, int64_t M, int log2_cells) {
  return B > 0 && std::max(M, N) <= kBlockSortItems && log2_cells <= kBlockSortMaxCellBits &&
         2 * B <= multiprocessor_count() && block_sort_ready<acc_t, D>();
}

// The grid of the reference clouds r (B, M, D) and the cell order of the queries q (B, N, D).
template <typename acc_t, int D>
struct GridBuild {
  at::Tensor buffer;  // owns everything below
  GridParams* grids;
  CellSlot* table;
  uint64_t mask;
  GridPoint<acc_t, D>* points;
  const int32_t* order;
  int log2_cells;
  ProbeScratch probe;  // cleared; null pointers unless asked for
  uint32_t* ball_list_count = nullptr;  // cleared (holds count - 1); null unless asked for
  int32_t* ball_list = nullptr;         // (B N); null unless asked for
  bool block_sorted = false;            // keys sorted by grid_keys_block_sort_kernel
};

// crowding_target > 0: the crowding refinement (knn), in points (see grid_crowding_count_kernel).
// probe: room for grid_probe_kernel's counters in the cleared scratch. ball_list: room for the
// ball query's work list (grid_ball_tile_cuda.cuh), its counter in the cleared scratch.
// block_sort: the keys sorted per cloud and half in one launch (grid_keys_block_sort_kernel) where
// the clouds fit it, instead of grid_keys_kernel and the device-wide radix sort.
template <typename acc_t, int D>
GridBuild<acc_t, D> build_grid(const at::Tensor& q, const at::Tensor& r, const at::Tensor& len1,
                               const at::Tensor& len2, BuildConfig cfg, double crowding_target = 0,
                               bool probe = false, bool ball_list = false, bool block_sort = false) {
  const int64_t B = q.size(0), N = q.size(1), M = r.size(1);
  const int64_t total = B * (M + N);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const bool crowding = crowding_target > 0 && B * M > 0;
  GridBuild<acc_t, D> build;
  build.log2_cells = cfg.log2_cells = log2_cells_for(M) + (crowding ? kCrowdingKeyBits : 0);
  const int query_bit = bit_width(static_cast<uint64_t>(B)) + cfg.log2_cells;
  TORCH_CHECK(query_bit + 1 <= 63, "algorithm='grid': ", B, " clouds of ", M,
              " reference points need more than 64-bit cell keys");
  const int end_bit = query_bit + 1;
  const int64_t capacity = table_capacity(std::max<int64_t>(B * M, 1));
  build.mask = static_cast<uint64_t>(capacity - 1);
  const int64_t blocks_per_cloud =
      std::min(kBoundsMaxBlocks, std::max<int64_t>(1, ceil_div<int64_t>(M, kBoundsPointsPerBlock)));
  TORCH_CHECK(B * blocks_per_cloud <= std::numeric_limits<int32_t>::max(), "algorithm='grid': too many clouds (",
              B, ")");

  block_sort = block_sort && !crowding && use_block_sort<acc_t, D>(B, N, M, cfg.log2_cells);
  build.block_sorted = block_sort;
  size_t sort_bytes = block_sort ? 0 : radix_sort_bytes(total, end_bit, stream);  // SortPairs takes it by reference
  int64_t offset = 0;
  const auto carve = [&offset](int64_t bytes) {
    const int64_t at = offset;
    offset += align_bytes(bytes);
    return at;
  };
  // Cleared to all-ones (one memset): bounds, counters, the table.
  const int64_t off_bounds = carve(B * 2 * D * 8);
  const int64_t off_counts = carve(B * 4);
  const int64_t off_done = carve(B * 4);
  const int64_t off_table = carve(capacity * static_cast<int64_t>(sizeof(CellSlot)));
  const int64_t crowd_per_cloud =
      crowding ? ceil_div<int64_t>(std::min(M, std::max(kCrowdingMinSamples, kCrowdingSamples / B)), 32) * 32 : 0;
  const int64_t crowd_capacity = crowding ? table_capacity(B * crowd_per_cloud * kCrowdingLevels) : 0;
  const int64_t off_crowd_table = carve(crowd_capacity * static_cast<int64_t>(sizeof(CrowdSlot)));
  const int64_t off_crowd_sums = carve(crowding ? B * kCrowdingLevels * 8 : 0);
  const int64_t off_crowd_sampled = carve(crowding ? B * 8 : 0);
  const int64_t off_probe_cost = carve(probe ? B * 8 : 0);
  const int64_t off_probe_cells = carve(probe ? B * 8 : 0);
  const int64_t off_probe_done = carve(probe ? B * 4 : 0);
  const int64_t off_ball_count = carve(ball_list ? 4 : 0);
  const int64_t cleared = offset;
  const int64_t off_grids = carve(B * static_cast<int64_t>(sizeof(GridParams)));
  const int64_t off_keys0 = carve(total * 8), off_keys1 = carve(block_sort ? 0 : total * 8);
  const int64_t off_values0 = carve(total * 4), off_values1 = carve(block_sort ? 0 : total * 4);
  const int64_t off_temp = carve(static_cast<int64_t>(sort_bytes));
  const int64_t off_points = carve(B * M * static_cast<int64_t>(sizeof(GridPoint<acc_t, D>)));
  const int64_t off_ball_list = carve(ball_list ? B * N * 4 : 0);
  build.buffer = at::empty({offset}, q.options().dtype(at::kByte));
  char* base = static_cast<char*>(build.buffer.mutable_data_ptr());
  BoundsScratch scratch{reinterpret_cast<unsigned long long*>(base + off_bounds),
                        reinterpret_cast<uint32_t*>(base + off_counts), reinterpret_cast<uint32_t*>(base + off_done)};
  build.table = reinterpret_cast<CellSlot*>(base + off_table);
  build.grids = reinterpret_cast<GridParams*>(base + off_grids);
  build.points = reinterpret_cast<GridPoint<acc_t, D>*>(base + off_points);
  build.probe = probe ? ProbeScratch{reinterpret_cast<unsigned long long*>(base + off_probe_cost),
                                     reinterpret_cast<unsigned long long*>(base + off_probe_cells),
                                     reinterpret_cast<uint32_t*>(base + off_probe_done)}
                      : ProbeScratch{nullptr, nullptr, nullptr};
  if (ball_list) {
    build.ball_list_count = reinterpret_cast<uint32_t*>(base + off_ball_count);
    build.ball_list = reinterpret_cast<int32_t*>(base + off_ball_list);
  }
  cub::DoubleBuffer<uint64_t> keys(reinterpret_cast<uint64_t*>(base + off_keys0),
                                   reinterpret_cast<uint64_t*>(base + off_keys1));
  cub::DoubleBuffer<int32_t> values(reinterpret_cast<int32_t*>(base + off_values0),
                                    reinterpret_cast<int32_t*>(base + off_values1));

  const int64_t* lengths1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
  const int64_t* lengths2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
  const acc_t* qp = q.data_ptr<acc_t>();
  const acc_t* rp = r.data_ptr<acc_t>();

  C10_CUDA_CHECK(cudaMemsetAsync(base, 0xFF, static_cast<size_t>(cleared), stream));
  grid_bounds_kernel<acc_t, D><<<static_cast<unsigned>(B * blocks_per_cloud), kBuildThreads, 0, stream>>>(
      rp, lengths2, M, blocks_per_cloud, scratch, cfg, build.grids);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (crowding) {
    CrowdingScratch crowd{reinterpret_cast<CrowdSlot*>(base + off_crowd_table), static_cast<uint64_t>(crowd_capacity - 1),
                          reinterpret_cast<unsigned long long*>(base + off_crowd_sums),
                          reinterpret_cast<unsigned long long*>(base + off_crowd_sampled), crowd_per_cloud};
    grid_crowding_count_kernel<acc_t, D><<<grid_for(B * crowd_per_cloud, kBuildThreads), kBuildThreads, 0, stream>>>(
        rp, lengths2, B, M, build.grids, crowd);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    grid_crowding_choose_kernel<D><<<static_cast<unsigned>(ceil_div<int64_t>(B, kBuildThreads)), kBuildThreads, 0,
                                     stream>>>(B, scratch, crowd, cfg, crowding_target, build.grids);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (block_sort) {  // sorted in place: Current() is the first buffer (the second has no room)
    grid_keys_block_sort_kernel<acc_t, D><<<static_cast<unsigned>(2 * B), kBlockSortThreads, sizeof(BlockSortStorage),
                                            stream>>>(qp, rp, lengths1, lengths2, B, N, M, build.grids,
                                                      cfg.log2_cells, query_bit, keys.Current(), values.Current());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    grid_keys_kernel<acc_t, D><<<grid_for(total, kBuildThreads), kBuildThreads, 0, stream>>>(
        qp, rp, lengths1, lengths2, B, N, M, build.grids, cfg.log2_cells, query_bit, keys.Current(), values.Current());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // Stable: a cell's references stay in index order (the ball query relies on it). The double
    // buffers' selectors are flipped on the host, so Current() names the sorted arrays on return.
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + off_temp, sort_bytes, keys, values,
                                                   static_cast<int>(total), 0, end_bit, stream));
  }
  if (B * M > 0) {
    grid_cells_kernel<acc_t, D><<<grid_for(B * M, kBuildThreads), kBuildThreads, 0, stream>>>(
        rp, B, M, keys.Current(), values.Current(), cfg.log2_cells, build.table, build.mask, build.points);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  build.order = values.Current();
  return build;
}

// What every grid search checks beyond the op's own checks.
void check_grid_sizes(const char* op, const at::Tensor& p1, const at::Tensor& p2) {
  const int64_t B = p1.size(0), N = p1.size(1), M = p2.size(1), dim = p1.size(2);
  TORCH_CHECK(dim == 2 || dim == 3, "algorithm='grid' needs points of dimension 2 or 3, got D = ", dim);
  TORCH_CHECK(B * (M + N) < std::numeric_limits<int32_t>::max(), op,
              ": algorithm='grid' on CUDA handles fewer than 2^31 points in all (p1 and p2 together), got ", B,
              " x (", N, " + ", M, ")");
}

// What both launchers set up after the op's own checks: the grid's size checks, the inputs in the
// compute type (half types search in float32: converted once, exactly, and the distances rounded
// once at the end) and the (B, N, K) outputs.
struct GridCall {
  at::ScalarType compute_type;
  at::Tensor q, r, dists, idx;
};

GridCall prepare_grid_call(const char* op, const at::Tensor& p1, const at::Tensor& p2, int64_t K) {
  check_grid_sizes(op, p1, p2);
  TORCH_CHECK(K >= 1, op, ": K must be >= 1, got ", K);
  GridCall c;
  c.compute_type = p1.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  c.q = p1.to(c.compute_type).contiguous();
  c.r = p2.to(c.compute_type).contiguous();
  c.dists = at::empty({p1.size(0), p1.size(1), K}, c.q.options());
  c.idx = at::empty({p1.size(0), p1.size(1), K}, c.q.options().dtype(at::kLong));
  return c;
}

template <typename acc_t, int D>
SearchArgs<acc_t, D> make_search_args(const at::Tensor& q, const at::Tensor& r, const at::Tensor& len1,
                                      const at::Tensor& len2, int64_t K, const GridBuild<acc_t, D>& build,
                                      const at::Tensor& dists, const at::Tensor& idx) {
  SearchArgs<acc_t, D> a{};
  a.queries = q.data_ptr<acc_t>();
  a.refs = r.data_ptr<acc_t>();
  a.lengths1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
  a.lengths2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
  a.B = q.size(0);
  a.N = q.size(1);
  a.M = r.size(1);
  a.K = K;
  a.grids = build.grids;
  a.table = build.table;
  a.mask = build.mask;
  a.points = build.points;
  a.order = build.order;
  a.log2_cells = build.log2_cells;
  a.ball_list_count = build.ball_list_count;
  a.ball_list = build.ball_list;
  a.dists = dists.data_ptr<acc_t>();
  a.idx = idx.data_ptr<int64_t>();
  return a;
}

template <typename Kernel, typename Args>
void launch_search(Kernel kernel, const Args& a) {
  const int64_t blocks = ceil_div<int64_t>(a.B * a.N, kSearchThreads);  // B N < 2^31: check_grid_sizes
  kernel<<<static_cast<unsigned>(blocks), kSearchThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename acc_t, int D, Metric metric>
void launch_knn(const SearchArgs<acc_t, D>& a) {
  if (a.K == 1) {
    launch_search(knn_grid_kernel<acc_t, D, metric, 1>, a);
  } else if (a.K <= 8) {
    launch_search(knn_grid_kernel<acc_t, D, metric, 8>, a);
  } else if (a.K <= 16) {
    launch_search(knn_grid_kernel<acc_t, D, metric, 16>, a);
  } else if (a.K <= 32) {
    launch_search(knn_grid_kernel<acc_t, D, metric, 32>, a);
  } else {
    launch_search(knn_grid_kernel<acc_t, D, metric, 64>, a);  // K > 64: passes of 64
  }
}

// grid_probe_kernel: kProbeSamples warps per cloud. POINTOPS_GRID_PROBE_SCALE (debugging) multiplies
// the grid's estimate (0: every cloud takes the grid); POINTOPS_GRID_PROBE_DEBUG=1 prints each
// cloud's estimate and choice (a host sync per call).
template <typename acc_t, int D, Metric metric>
void launch_probe(const SearchArgs<acc_t, D>& a, const ProbeScratch& scratch) {
  const ProbeCosts costs{kProbeCostPerQuery, kProbeCostPerLookup, kProbeCostPerPoint,
                         switch_number("POINTOPS_GRID_PROBE_CHAIN", kProbeCostPerChainedLookup, true),
                         switch_number("POINTOPS_GRID_PROBE_SCALE", 1.0, true) *
                             (a.K > 1 ? switch_number("POINTOPS_GRID_PROBE_LIST_FACTOR", kProbeListFactor, false) : 1.0)};
  const int64_t blocks = ceil_div<int64_t>(a.B * kProbeSamples, kProbeWarps);
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "algorithm='auto': too many clouds (", a.B, ")");
  const auto stream = c10::cuda::getCurrentCUDAStream();
  grid_probe_kernel<acc_t, D, metric><<<static_cast<unsigned>(blocks), kProbeThreads, 0, stream>>>(
      a, scratch, costs, const_cast<uint8_t*>(a.use_grid));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (switch_number("POINTOPS_GRID_PROBE_DEBUG", 0.0, false) > 0) {
    std::vector<unsigned long long> cost(static_cast<size_t>(a.B)), not_cells(static_cast<size_t>(a.B));
    std::vector<uint8_t> choice(static_cast<size_t>(a.B));
    C10_CUDA_CHECK(cudaMemcpyAsync(cost.data(), scratch.cost, a.B * 8, cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaMemcpyAsync(not_cells.data(), scratch.not_cells, a.B * 8, cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaMemcpyAsync(choice.data(), a.use_grid, a.B, cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int64_t b = 0; b < a.B && b < 4; ++b) {
      std::fprintf(stderr, "grid probe: cloud %lld of %lld: estimate %.4g pair units per sampled query, "
                   "brute force %lld per query, slowest query %llu cells, brute launch %.4g, estimate x %.3g, "
                   "choice %s\n",
                   static_cast<long long>(b), static_cast<long long>(a.B),
                   static_cast<double>(cost[b] + 1ull) / kProbeSamples, static_cast<long long>(a.M), ~not_cells[b],
                   static_cast<double>(a.B) * a.N * a.M, costs.scale, choice[b] ? "grid" : "brute");
    }
  }
}

template <typename Kernel, typename Args>
void launch_ball_warps(Kernel kernel, const Args& a) {
  const int64_t blocks = ceil_div<int64_t>(a.B * a.N, kBallWarps);
  kernel<<<static_cast<unsigned>(blocks), kBallWarpThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Clouds of <= kTileMaxRefs references (a.ball_list set): a warp per 32 sorted queries, one list per
// cell (grid_ball_tile_cuda.cuh), then the groups that did not fit, a warp per query from the work
// list in one wave of blocks striding over it (the list's length is on the device).
template <typename acc_t, int D, int R>
void launch_ball_tiles(const SearchArgs<acc_t, D>& a) {
  constexpr int warps = ball_tile_warps<acc_t>();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = ceil_div<int64_t>(a.B * a.N, 32 * warps);
  ball_grid_tile_kernel<acc_t, D><<<static_cast<unsigned>(blocks), 32 * warps, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const auto list_kernel = ball_grid_warp_list_kernel<acc_t, D, R>;
  const int64_t wave = static_cast<int64_t>(multiprocessor_count()) *
                       resident_blocks(reinterpret_cast<const void*>(list_kernel), kBallWarpThreads, 0);
  const int64_t list_blocks = std::min<int64_t>(ceil_div<int64_t>(a.B * a.N, kBallWarps), wave);
  list_kernel<<<static_cast<unsigned>(list_blocks), kBallWarpThreads, 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A warp per query with a buffer of 32 R >= K + 32 slots (grid_ball_warp_cuda.cuh), behind the
// shared lists when build_grid made their work list (a.ball_list). The lists are compiled for float
// only: their float64 instantiation has not run on a GPU, so build_grid gets no work list for it.
template <typename acc_t, int D, int R>
void launch_ball_warp_search(const SearchArgs<acc_t, D>& a) {
  if constexpr (std::is_same_v<acc_t, float>) {
    if (a.ball_list != nullptr) {
      launch_ball_tiles<acc_t, D, R>(a);
      return;
    }
  }
  launch_ball_warps(ball_grid_warp_kernel<acc_t, D, R>, a);
}

// POINTOPS_GRID_BALL_DEBUG=1 (debugging, tests; a host sync per call): how many queries the shared
// lists left to their work list, and which sort ordered the keys.
template <typename acc_t, int D>
void print_ball_routes(const SearchArgs<acc_t, D>& a, bool block_sorted) {
  uint32_t count_minus_one = 0;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemcpyAsync(&count_minus_one, a.ball_list_count, 4, cudaMemcpyDeviceToHost, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::fprintf(stderr, "grid ball: %lld queries, %u to the work list, %s sort\n", static_cast<long long>(a.B * a.N),
               count_minus_one + 1u, block_sorted ? "block" : "device-wide");
}

// K <= 128: a warp per query (behind the shared lists); larger K: a thread per query, passes of 64.
template <typename acc_t, int D>
void launch_ball(const SearchArgs<acc_t, D>& a) {
  if (a.K <= 32) {
    launch_ball_warp_search<acc_t, D, 2>(a);
  } else if (a.K <= 64) {
    launch_ball_warp_search<acc_t, D, 3>(a);
  } else if (a.K <= 96) {
    launch_ball_warp_search<acc_t, D, 4>(a);
  } else if (a.K <= kBallWarpMaxK) {
    launch_ball_warp_search<acc_t, D, 5>(a);
  } else {
    launch_search(ball_grid_kernel<acc_t, D, 64>, a);  // passes of 64
  }
}

// Sizes from which "auto" takes the grid on CUDA. The brute-force kernels run at ~3.5e12 pairs/s on
// an H100; the grid costs a fixed ~10 launches (memset, bounds, keys, ~4 of the radix sort, cells,
// search) plus a few hundred ns of GPU time per thousand points. Measured on the H100
// (scripts/grid_cuda_check.py time, benchmarks/RESULTS.md), grid vs brute force:
//   knn_points 8 x 8192^2 (5.4e8 pairs): K = 8 0.214 vs 0.507 ms, K = 16 0.331 vs 0.618, K = 32
//   0.811 vs 1.400, K = 64 2.255 vs 2.226 (no gain: the 64-slot list insertions dominate);
//   K = 1, chamfer 1M x 1M: 1.50 vs 574 ms, knn K = 16 1M x 1M: 3.04 vs 427 ms.
// So lists of 2..16 take the grid from 5e8 pairs (earlier rule: 2..32; see below); K = 1, whose
// brute-force kernel is the fastest and whose small-size crossover was not measured, from 1e9;
// K > 16 stays with brute force (the
// grid still searches it exactly when asked: passes of up to 64). Small reference clouds fit brute
// force's shared-memory tiles and a few queries never amortise sorting M references. The rule sees
// sizes only: a cloud packed into a few tight clusters makes the grid a slower brute force
// (measured 1.2x brute force: 256k x 256k in 4 clusters, 44.0 vs 36.2 ms).
//
// K = 1 (nearest_neighbor, chamfer, chamfer_distance) also needs reference clouds of >= 64Ki points:
// its queries are often another cloud that may lie far from the references (a generator's output
// early in training), and a query far from every reference visits ~(d / h)^3 mostly empty cells.
// Measured on the H100 (grid vs brute force, chamfer both directions, examples/ddp_chamfer.py's
// spheres and tori; grid_cuda_check.py probe and time cover this comparison): against queries 0.01
// off the surfaces the grid is 3.4-3.7x brute force at 64-128 x 8192^2, but with queries 0.1 off it
// is 0.58-0.65x there (0.09-0.11x at 8 x 8192^2, 4 x 16384^2), and against a blob at the origin
// 0.04-0.16x; the DDP example's training step took 13.3 ms with the grid against 5.3 ms with brute
// force. From 64Ki points the near cases gain 7.8-77x (surface 0.01, uniform) while the far ones
// lose (0.34x / 0.08x at 65536, 0.88x / 0.26x at 262144): the rule
// cannot see the data. So "auto" also probes each cloud on the device once the sizes pass
// (grid_probe_kernel) and hands far clouds to brute force: at 65536 / 262144 points the blob runs
// 0.91x / 0.99x brute force, queries 0.1 off the surfaces 1.37x / 1.89x (two H200s). At 64 x 8192
// the blob would still run 0.73x (the build and probe cost a fixed ~0.3 ms), so the thresholds stay.
//
// Lists (2 <= K <= 16), H100, grid_cuda_check.py probe-lists (uniform, surfaces 0.01 and
// 0.1 off, a blob, half blobs; 64 x 8192^2 to 1 x 262144^2): the grid alone ran 0.14-0.42x brute
// force on far queries; with the probe (kProbeListFactor 4) every case is 0.83-56x. K = 32 stays with
// brute force: its spatial order makes it as fast as the grid near the references (grid 0.85-1.55x
// on surfaces and uniform clouds up to 65536 points, 2.55x at 262144) and the probe lets a far case
// through (queries 0.1 off a surface, 262144 points: 0.34x).
constexpr int64_t kGridMinRefs = 8192;
constexpr int64_t kGridMinRefsNearest = 65536;
constexpr int64_t kGridMinQueries = 4096;
constexpr double kGridMinPairsNearest = 1.0e9;
constexpr double kGridMinPairsLists = 5.0e8;
constexpr int64_t kGridMaxAutoK = 16;

// ball_query ("auto"): D = 3, K <= kBallWarpMaxK (the warp kernel; the thread passes for larger K
// measured 0.2x brute force), reference clouds of >= 16Ki points and >= 64Ki queries in all. Measured
// on the H100 (grid_cuda_check.py tune, uniform unit cube, K = 16 and 64, r = 0.02 ... 1.0): every
// such case 1.05-55x brute force (8 x 16384^2, 1 x 65536^2, 1 x 262144^2); smaller clouds lose to
// the build (0.46-0.83x at 1 x 4096^2 and, K = 16, at 8 x 4096^2 and 32 x 2048^2). D = 2 and
// clustered clouds were not measured for ball_query: brute force there.
constexpr int64_t kBallGridMinRefs = 16384;
constexpr int64_t kBallGridMinQueries = 65536;

}  // namespace
}  // namespace grid_cuda

bool grid_pays_cuda(int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K) {
  using namespace grid_cuda;
  if (dim != 2 && dim != 3) return false;
  if (K < 1 || K > kGridMaxAutoK) return false;
  if (M < kGridMinRefs || B * N < kGridMinQueries) return false;
  if (B * (M + N) >= std::numeric_limits<int32_t>::max()) return false;
  if (K == 1 && M < switch_number("POINTOPS_GRID_NEAREST_MIN_REFS", kGridMinRefsNearest, false)) return false;
  const double pairs = static_cast<double>(B) * static_cast<double>(N) * static_cast<double>(M);
  return pairs >= (K == 1 ? switch_number("POINTOPS_GRID_NEAREST_MIN_PAIRS", kGridMinPairsNearest, false)
                          : kGridMinPairsLists);
}

bool ball_grid_pays_cuda(int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K) {
  using namespace grid_cuda;
  if (dim != 3 || K < 1 || K > kBallWarpMaxK) return false;
  if (B * (M + N) >= std::numeric_limits<int32_t>::max()) return false;
  return M >= kBallGridMinRefs && B * N >= kBallGridMinQueries;
}

std::tuple<at::Tensor, at::Tensor> knn_grid_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                 const at::Tensor& lengths1, const at::Tensor& lengths2, int64_t K,
                                                 Metric metric, bool zero_unmatched, at::Tensor* probe_choice) {
  using namespace grid_cuda;
  const c10::cuda::CUDAGuard guard(p1.device());
  const GridCall call = prepare_grid_call("knn_points", p1, p2, K);
  const at::Tensor &q = call.q, &r = call.r, &dists = call.dists, &idx = call.idx;
  const at::ScalarType compute_type = call.compute_type;
  const int64_t B = p1.size(0), N = p1.size(1), dim = p1.size(2);
  const bool probe = probe_choice != nullptr;
  if (B * N == 0) return {probe ? dists : dists.to(p1.scalar_type()), idx};  // *probe_choice stays undefined
  if (probe) *probe_choice = at::empty({B}, q.options().dtype(at::kByte));  // every entry written by the probe
  BuildConfig cfg{};
  cfg.points_per_cell = switch_number("POINTOPS_GRID_POINTS_PER_CELL",
                                     K == 1 ? kPointsPerCellNN : kPointsPerCellPerNeighbour * static_cast<double>(K),
                                     false);
  cfg.min_cell = 0;
  // K > 1: no refinement (measured no faster on the scans), unless POINTOPS_GRID_CROWDING asks.
  const double crowding_target =
      switch_number("POINTOPS_GRID_CROWDING", K == 1 ? kCrowdingTarget : 0.0, true) * cfg.points_per_cell;
  AT_DISPATCH_FLOATING_TYPES(compute_type, "knn_grid_cuda", [&] {
    using acc_t = scalar_t;
    dispatch_dim(dim, [&](auto dim_tag) {
      constexpr int D = decltype(dim_tag)::value;
      if constexpr (D == 2 || D == 3) {
        const auto build = build_grid<acc_t, D>(q, r, lengths1, lengths2, cfg, crowding_target, probe);
        auto a = make_search_args<acc_t, D>(q, r, lengths1, lengths2, K, build, dists, idx);
        a.zero_unmatched = zero_unmatched;
        dispatch_metric(metric, [&](auto metric_tag) {
          constexpr Metric m = decltype(metric_tag)::value;
          if (probe) {
            a.use_grid = probe_choice->mutable_data_ptr<uint8_t>();
            launch_probe<acc_t, D, m>(a, build.probe);
          }
          launch_knn<acc_t, D, m>(a);
        });
      }
    });
  });
  return {probe ? dists : dists.to(p1.scalar_type()), idx};
}

std::tuple<at::Tensor, at::Tensor> ball_query_grid_cuda(const at::Tensor& p1, const at::Tensor& p2,
                                                        const at::Tensor& lengths1, const at::Tensor& lengths2,
                                                        int64_t K, double radius) {
  using namespace grid_cuda;
  const c10::cuda::CUDAGuard guard(p1.device());
  const GridCall call = prepare_grid_call("ball_query", p1, p2, K);
  const at::Tensor &q = call.q, &r = call.r, &dists = call.dists, &idx = call.idx;
  const at::ScalarType compute_type = call.compute_type;
  const int64_t B = p1.size(0), N = p1.size(1), dim = p1.size(2);
  if (B * N == 0) return {dists.to(p1.scalar_type()), idx};
  BuildConfig cfg{};
  // Cells of at least the radius: a query visits the <= 3^D cells within it (4^D when misaligned).
  cfg.points_per_cell = kPointsPerCellNN;
  // finite (check_ball_query_inputs); huge: one cell
  cfg.min_cell = switch_number("POINTOPS_GRID_BALL_CELL", 1.0, false) * std::fabs(radius);
  // The shared lists where a cloud fits their bitmap and the queries are many. POINTOPS_GRID_BALL_TILES:
  // 0 the warp per query alone; n > 0 the lists at any number of queries, for groups of >= n.
  const double tiles_override = switch_number("POINTOPS_GRID_BALL_TILES", -1.0, true);
  const bool tiles = K <= kBallWarpMaxK && p2.size(1) <= kTileMaxRefs && call.compute_type == at::kFloat &&
                     (tiles_override < 0 ? B * N >= kTileMinQueries : tiles_override > 0);
  // With the lists, the keys sorted per cloud in one launch where the clouds fit it (build_grid);
  // POINTOPS_GRID_BLOCK_SORT=0 (debugging) keeps the device-wide sort.
  const bool block_sort = tiles && switch_number("POINTOPS_GRID_BLOCK_SORT", 1.0, true) > 0;
  AT_DISPATCH_FLOATING_TYPES(compute_type, "ball_query_grid_cuda", [&] {
    using acc_t = scalar_t;
    dispatch_dim(dim, [&](auto dim_tag) {
      constexpr int D = decltype(dim_tag)::value;
      if constexpr (D == 2 || D == 3) {
        const auto build = build_grid<acc_t, D>(q, r, lengths1, lengths2, cfg, 0, false, tiles, block_sort);
        auto a = make_search_args<acc_t, D>(q, r, lengths1, lengths2, K, build, dists, idx);
        a.r2 = squared_radius<acc_t>(radius);
        a.ball_min_group = tiles_override > 0 ? static_cast<int>(std::min(tiles_override, 32.0)) : kTileMinGroup;
        a.ball_tile_log2_words = tile_log2_words_per_lane(r.size(1));
        launch_ball<acc_t, D>(a);
        if (tiles && switch_number("POINTOPS_GRID_BALL_DEBUG", 0.0, false) > 0) print_ball_routes(a, build.block_sorted);
      }
    });
  });
  return {dists.to(p1.scalar_type()), idx};
}

}  // namespace pointops
