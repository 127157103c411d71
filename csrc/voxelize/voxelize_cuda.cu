// Voxelization on CUDA: an open-addressing hash table of cell keys, then first-appearance order.
//
// Pipeline (one thread per point unless noted; every buffer lives on the current stream, and all
// the scratch of one call is carved from a single byte allocation). Each step is one launch: the
// whole nuScenes call is short enough that host-side launch and dispatch work decides its wall time.
//   memset   the table (key = all-ones: empty; first = UINT32_MAX; count = -1), the per-voxel
//            lists of first points (empty), the scan's tile states and counter, status: one 0xFF
//            memset
//   insert   key of the point's cell -> atomicCAS insert with linear probing (bounded by the
//            capacity); atomicMin(first, i): the voxel's first point; atomicAdd(count, 1)
//   number   one scan (decoupled look-back, common/lookback_scan.cuh) over the points of the pair
//            (is the first point of its voxel, that voxel's count): at a voxel's first point, the
//            exclusive prefix is (voxel id, start of the voxel's run in sorted order). Ids come out
//            in order of first appearance, whatever order the atomics ran in.
//   assign   point_to_voxel, and the point offers its index to its voxel's list of P first points:
//            atomicMin down the list (see assign_kernel), which leaves the P smallest indices in
//            order however the atomics interleave
//   -- voxelize: one host sync to learn V (none in voxelize_padded) --
//   outputs  one launch, two block ranges: features/coords/num_points, one thread per (voxel,
//            column), summing the voxel's first min(count, P) points in input order in opmath_t
//            and dividing once (bit-identical to the CPU loop); voxels, one thread per output
//            element (v, r, k): the r-th kept point's column k, or 0. Padding rows (padded op):
//            zeros, coords -1, num_points 0.
// voxel_features keeps every point of every voxel, so its "lists" would be as long as the largest
// voxel; it sorts (voxel id, point) pairs with cub's stable radix sort instead, which puts voxel
// v's points at runs[v].start in input order, and reduces each run with one warp.
//
// Cost on an H100 (nuScenes scan: 271,156 points, F = 5 float32, voxel 0.075 x 0.075 x 0.2, P =
// 10, max_voxels 160,000 -> 105,086 voxels, 217,374 kept points, the largest voxel 1,147 points;
// torch.profiler over repeated calls): GPU 76 us per call = outputs 22.9 +
// assign 19.9 + insert 12.7 + number 11.6 + memset 7.4 + the read of V 1.6; whole call 0.120 ms
// (padded 0.100). The previous pipeline (cub scan + onesweep radix sort, ~14 host operations) took
// 117 us of GPU and 0.17-0.19 ms per call. Ranking by counting the members of unordered runs, in
// place of the atomic lists, took 38 us on its own: the big voxels' points are adjacent in the
// input, so whole warps waited on threads scanning long runs. insert and assign are bound by
// latency (dependent L2 round trips), not bandwidth.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>

#include <limits>

#include "common/cuda_utils.cuh"
#include "common/lookback_scan.cuh"
#include "voxelize/voxelize.h"

// __match_any_sync and the look-back's spinning lanes (independent thread scheduling) need Volta.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "pointops needs a GPU of compute capability 7.0 or newer: leave older ones out of TORCH_CUDA_ARCH_LIST"
#endif

namespace pointops {
namespace voxelize {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
// The number kernel's tile: kThreads threads x kScanItems consecutive points.
constexpr int kScanItems = 4;
constexpr int64_t kScanTile = kThreads * kScanItems;
// Output elements per thread and grid-stride step in the voxels part (their loads are batched).
constexpr int kVoxelsUnroll = 4;
constexpr int32_t kNoPoint = std::numeric_limits<int32_t>::max();

// Division by a divisor fixed for the whole launch: a multiply-high and a shift for 32-bit
// indices (the outputs kernel divides every element index twice), plain division for 64-bit.
template <typename index_t>
using Divider = at::cuda::detail::IntDivider<index_t>;

// One hash table slot: the fields every point of a voxel touches share a 16-byte line segment.
// All-ones is the cleared state: key = empty (keys are >= 0, so the int64 -1 never collides),
// first = UINT32_MAX (the atomicMin start), count_minus_one = -1 (count 0).
struct alignas(16) Slot {
  unsigned long long key;
  unsigned int first;
  int32_t count_minus_one;
};
constexpr unsigned long long kEmptyKey = ~0ull;
// An empty place in a voxel's list of first points (point indices are < 2^30).
constexpr unsigned int kEmptyIndex = ~0u;

// status[0] = total voxel count (written by the number kernel); status[1] counts points with a
// bad batch index (an error for the exact ops, dropped by the padded one, which cannot raise
// without a sync). Both start as all-ones (the memset), so status[1] holds count - 1.
inline int64_t bad_batch_count(int32_t raw_status1) { return static_cast<int64_t>(raw_status1) + 1; }

// Grid-stride loops whose every warp runs the same number of iterations (the bound is rounded up
// to whole warps; the stride is a multiple of 32), so warp-wide intrinsics can use the full mask.
// Lanes past n carry valid = false. Within a warp, lanes hold consecutive point indices: the
// lowest lane of a group of peers holds the group's first point.
#define POINTOPS_FOR_EACH_POINT_BY_WARPS(i, n)                                                              \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,                            \
               i##_end = ceil_div<int64_t>(n, kWarp) * kWarp,                                               \
               i##_stride = static_cast<int64_t>(gridDim.x) * blockDim.x;                                   \
       i < i##_end; i += i##_stride)

// Lanes of the warp below this one (the peers a lane comes after, in input order).
__device__ __forceinline__ unsigned lanes_below() { return (1u << (threadIdx.x % kWarp)) - 1u; }

// Lanes of a warp whose points share a cell go through the table once: the group's lowest lane
// probes and inserts, offers its index as the voxel's first point (the smallest index of the
// group) and adds the group's size to the count. LiDAR scans list neighbouring returns next to
// each other, so dense voxels are touched once per warp instead of once per point.
template <typename scalar_t, typename cell_t>
__global__ void insert_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                              const int64_t* __restrict__ batch, int64_t n, CellParams<cell_t> grid,
                              Slot* __restrict__ table, uint64_t mask, int32_t* __restrict__ slot_of_point,
                              int32_t* __restrict__ status) {
  POINTOPS_FOR_EACH_POINT_BY_WARPS(i, n) {
    const bool valid = i < n;
    const int64_t key =
        valid ? point_key<scalar_t, cell_t>(points + i * num_features, batch ? batch[i] : 0, grid) : kOutOfRange;
    const unsigned peers = __match_any_sync(kFullMask, static_cast<unsigned long long>(key));
    const int leader = __ffs(peers) - 1;
    int32_t slot = -1;
    if (key >= 0 && threadIdx.x % kWarp == leader) {
      uint64_t h = fmix64(static_cast<uint64_t>(key)) & mask;
      // At most N distinct keys in a table of >= 2N slots: an empty slot or the key is always found;
      // the bound only makes "can never loop forever" true by construction.
      for (uint64_t probe = 0; probe <= mask; ++probe) {
        const Slot seen = table[h];  // key and first in one 16-byte load
        unsigned long long current = seen.key;
        if (current == kEmptyKey) current = atomicCAS(&table[h].key, kEmptyKey, static_cast<unsigned long long>(key));
        if (current == kEmptyKey || current == static_cast<unsigned long long>(key)) {
          // first only ever decreases, so any value read is >= the final minimum: when it is
          // already below i, i cannot be the first point and the atomic can be skipped. Neither
          // atomic's result is used, so both are issued without waiting.
          const unsigned int me = static_cast<unsigned int>(i);
          if (seen.first > me) atomicMin(&table[h].first, me);
          atomicAdd(&table[h].count_minus_one, __popc(peers));
          slot = static_cast<int32_t>(h);
          break;
        }
        h = (h + 1) & mask;
      }
    } else if (key == kBadBatch) {
      atomicAdd(&status[1], 1);
    }
    slot = __shfl_sync(kFullMask, slot, leader);
    if (valid) slot_of_point[i] = slot;
  }
}

// Per kept voxel (id < cap): its point count, and where its run starts in the sorted points of
// voxel_features (the sum of the counts of voxels 0 .. id - 1).
struct VoxelRun {
  int32_t start;
  int32_t count;
};

// One block per tile of kScanTile points. The scanned pair per point is (1, count of its voxel) at
// a voxel's first point and (0, 0) elsewhere, so at a first point the exclusive prefix is (voxel
// id, run start): ids in order of first appearance, runs laid out in id order. A kept voxel's
// first point also fills slot 0 of its list (voxelize). The last tile writes the voxel total
// (status[0]; *num_voxels = min(total, cap) for the padded op).
__global__ void __launch_bounds__(kThreads) number_voxels_kernel(
    const int32_t* __restrict__ slot_of_point, const Slot* __restrict__ table, int64_t n, int64_t cap,
    uint32_t* __restrict__ tile_counter, uint64_t* __restrict__ tile_states, int32_t* __restrict__ voxel_of_slot,
    VoxelRun* __restrict__ runs, unsigned int* __restrict__ first_points, int32_t max_points,
    int32_t* __restrict__ status, int64_t* __restrict__ num_voxels) {
  __shared__ LookbackScanStorage<kThreads> storage;
  const uint32_t tile = claim_tile<kThreads>(tile_counter, storage);
  const int64_t base = static_cast<int64_t>(tile) * kScanTile + static_cast<int64_t>(threadIdx.x) * kScanItems;
  int32_t slot[kScanItems];
  if (base + kScanItems <= n) {
    const int4 four = *reinterpret_cast<const int4*>(slot_of_point + base);  // base is a multiple of 4
    slot[0] = four.x, slot[1] = four.y, slot[2] = four.z, slot[3] = four.w;
  } else {
#pragma unroll
    for (int k = 0; k < kScanItems; ++k) slot[k] = base + k < n ? slot_of_point[base + k] : -1;
  }
  uint64_t item[kScanItems];
  uint64_t thread_sum = 0;
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    item[k] = 0;
    if (slot[k] >= 0) {
      const Slot s = table[slot[k]];
      if (s.first == static_cast<unsigned int>(base + k)) {
        item[k] = (uint64_t{1} << 32) | static_cast<uint32_t>(s.count_minus_one + 1);
      }
    }
    thread_sum += item[k];
  }
  uint64_t block_total;
  const uint64_t before_thread = block_exclusive_scan<kThreads>(thread_sum, storage, &block_total);
  const uint64_t before_tile = tile_exclusive_prefix<kThreads>(tile_states, tile, block_total, storage);
  uint64_t prefix = before_tile + before_thread;
#pragma unroll
  for (int k = 0; k < kScanItems; ++k) {
    if (item[k] != 0) {
      const int32_t id = static_cast<int32_t>(prefix >> 32), start = static_cast<int32_t>(prefix & 0xffffffffu);
      voxel_of_slot[slot[k]] = id;
      if (id < cap) {
        runs[id] = VoxelRun{start, static_cast<int32_t>(item[k] & 0xffffffffu)};
        // Slot 0 of the voxel's list of first points is its first point (see assign_kernel).
        if (first_points) first_points[static_cast<int64_t>(id) * max_points] = static_cast<unsigned int>(base + k);
      }
    }
    prefix += item[k];
  }
  if (threadIdx.x == 0 && static_cast<int64_t>(tile) == (n - 1) / kScanTile) {
    const int64_t total = static_cast<int64_t>((before_tile + block_total) >> 32);
    status[0] = static_cast<int32_t>(total);
    if (num_voxels) *num_voxels = std::min<int64_t>(total, cap);
  }
}

// point_to_voxel[i]: the voxel id, or -1 (out of range, or a voxel numbered >= cap). Then either
// (voxelize) the point offers itself to its voxel's list of first points, or (voxel_features) it
// becomes a (voxel id, i) pair for the stable sort (a point without a voxel gets the key cap,
// above every id, and sorts last).
//
// The list of voxel v is first_points[v * P, v * P + P), all-ones (empty) at the start, except
// slot 0: the number kernel already wrote the voxel's first point there (the smallest index, which
// every other point would pass on unchanged), so the first point does nothing here and the others
// start at slot 1. Slot k keeps the atomicMin of every index offered to it, and the index a slot
// gives up (the larger of the two) moves on to slot k + 1; an index that reaches an empty slot,
// or passes slot P - 1, stops. So slot 0 ends with the smallest index of the voxel, slot 1 with the smallest of the
// rest, and so on: the list holds the voxel's first min(count, P) points in input order, whatever
// order the atomics ran in. Slots only ever decrease and the list is sorted at every moment, so a
// slot read (even stale: >= its true value) at <= i would only pass i on unchanged: a point of a
// voxel with more than P points starts at the first slot read above i, and skips the list
// entirely when its last slot already is <= i or when P earlier points of its voxel sit in its
// own warp.
__global__ void assign_kernel(const int32_t* __restrict__ slot_of_point, const Slot* __restrict__ table,
                              const int32_t* __restrict__ voxel_of_slot,
                              int64_t n, int64_t cap, int32_t max_points, int64_t* __restrict__ point_to_voxel,
                              unsigned int* first_points, uint32_t* __restrict__ sort_keys,
                              int32_t* __restrict__ sort_points) {
  POINTOPS_FOR_EACH_POINT_BY_WARPS(i, n) {
    const bool valid = i < n;
    const int32_t slot = valid ? slot_of_point[i] : -1;
    int64_t voxel = -1;
    int32_t count = 0;
    unsigned int first = 0;
    if (slot >= 0) {
      const int32_t id = voxel_of_slot[slot];
      const Slot entry = table[slot];  // loaded alongside the id
      count = entry.count_minus_one + 1;
      first = entry.first;
      if (id < cap) voxel = id;
    }
    // A point with P earlier peers in its own warp cannot be among its voxel's first P points.
    // (first_points is the same for the whole launch, so every lane takes the same branch.)
    bool may_be_kept = false;
    if (first_points) {
      const unsigned peers = __match_any_sync(kFullMask, static_cast<unsigned long long>(voxel));
      may_be_kept = voxel >= 0 && __popc(peers & lanes_below()) < max_points;
    }
    if (!valid) continue;
    point_to_voxel[i] = voxel;
    if (may_be_kept && static_cast<unsigned int>(i) != first) {
      volatile unsigned int* list = first_points + voxel * max_points;
      unsigned int offered = static_cast<unsigned int>(i);
      int32_t k = 1;
      // A voxel of at most P points keeps them all: the walk starts at slot 1 without reading the
      // list first (most voxels; each read is a round trip to L2). In a larger voxel the point
      // skips the list when its last slot is already <= i, else starts at the first slot above i
      // (binary search: the list is sorted).
      if (count > max_points) {
        k = max_points;
        if (list[max_points - 1] > offered) {
          int32_t last = max_points - 1;
          k = 1;
          while (k < last) {
            const int32_t mid = k + (last - k) / 2;
            if (list[mid] <= offered) k = mid + 1; else last = mid;
          }
        }
      }
      for (; k < max_points; ++k) {
        const unsigned int held = atomicMin(const_cast<unsigned int*>(list + k), offered);
        if (held == kEmptyIndex) break;
        offered = max(offered, held);
      }
    }
    if (sort_keys) {
      sort_keys[i] = static_cast<uint32_t>(voxel >= 0 ? voxel : cap);  // cap <= n <= 2^30
      sort_points[i] = static_cast<int32_t>(i);
    }
  }
}

template <typename scalar_t, typename cell_t>
__device__ __forceinline__ void write_coords(const scalar_t* row, const int64_t* batch, int64_t point,
                                             const CellParams<cell_t>& grid, int32_t* out) {
  int64_t cell[3];
  point_cell<scalar_t, cell_t>(row, grid, cell);
  if (batch) *out++ = static_cast<int32_t>(batch[point]);
  out[0] = static_cast<int32_t>(cell[2]);
  out[1] = static_cast<int32_t>(cell[1]);
  out[2] = static_cast<int32_t>(cell[0]);
}

// The number of real (non-padding) rows: `rows` for the exact op, min(total, cap) read from the
// device for the padded one.
__device__ __forceinline__ int64_t real_rows(const int32_t* device_total, int64_t cap, int64_t rows) {
  return device_total ? std::min<int64_t>(*device_total, cap) : rows;
}

// features/coords/num_points, one thread per (row v, column k); the k == 0 thread also writes
// coords[v] and num_points[v]. Real rows: the voxel's kept points are first_points[v * P, v * P +
// kept), in input order; column k is summed over them in that order in opmath_t and divided once
// by kept (the CPU's loop, bit for bit). Padding rows: 0, coords -1, num_points 0.
template <typename scalar_t, typename cell_t, typename index_t>
__device__ __forceinline__ void write_features(const scalar_t* __restrict__ points, int64_t num_features,
                                               const int64_t* __restrict__ batch, const CellParams<cell_t>& grid,
                                               const unsigned int* __restrict__ first_points,
                                               const VoxelRun* __restrict__ runs, index_t real, index_t rows,
                                               int32_t max_points, int coord_cols,
                                               Divider<index_t> by_f, index_t first_thread, index_t num_threads,
                                               scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                                               int32_t* __restrict__ num_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t F = num_features;
  const index_t f = static_cast<index_t>(num_features);
  const index_t total = rows * f;
  for (index_t e = first_thread; e < total; e += num_threads) {
    const auto vk = by_f.divmod(e);
    const index_t v = vk.div, k = vk.mod;
    if (v < real) {
      const int32_t kept = min(runs[v].count, max_points);  // >= 1: the first point is counted
      const unsigned int* __restrict__ members = first_points + static_cast<int64_t>(v) * max_points;
      opmath_t sum = 0;
      int32_t q = 0;
      // Four rows' loads issued together, added strictly in order.
      for (; q + 4 <= kept; q += 4) {
        const int64_t i0 = members[q], i1 = members[q + 1], i2 = members[q + 2], i3 = members[q + 3];
        const opmath_t x0 = static_cast<opmath_t>(points[i0 * F + k]);
        const opmath_t x1 = static_cast<opmath_t>(points[i1 * F + k]);
        const opmath_t x2 = static_cast<opmath_t>(points[i2 * F + k]);
        const opmath_t x3 = static_cast<opmath_t>(points[i3 * F + k]);
        sum += x0;
        sum += x1;
        sum += x2;
        sum += x3;
      }
      for (; q < kept; ++q) sum += static_cast<opmath_t>(points[static_cast<int64_t>(members[q]) * F + k]);
      features[e] = static_cast<scalar_t>(sum / static_cast<opmath_t>(kept));
      if (k == 0) {
        const int64_t first_point = members[0];
        write_coords(points + first_point * F, batch, first_point, grid, coords + static_cast<int64_t>(v) * coord_cols);
        num_points[v] = kept;
      }
    } else {
      features[e] = scalar_t(0);
      if (k == 0) {
        for (int c = 0; c < coord_cols; ++c) coords[static_cast<int64_t>(v) * coord_cols + c] = -1;
        num_points[v] = 0;
      }
    }
  }
}

// voxels, one thread per element e = (v, r, k) of (rows x P x F), kVoxelsUnroll elements per
// thread and step (blockDim.x apart: each of them coalesced across the warp), their loads
// batched in two rounds: count of v and its r-th first point -> value. The value is the r-th kept
// point's column k, or 0 for r >= kept and for padding rows.
template <typename scalar_t, typename index_t>
__device__ __forceinline__ void write_voxels(const scalar_t* __restrict__ points, int64_t num_features,
                                             const unsigned int* __restrict__ first_points,
                                             const VoxelRun* __restrict__ runs, index_t real, index_t rows,
                                             int32_t max_points, Divider<index_t> by_f, Divider<index_t> by_row,
                                             index_t first_thread, index_t num_threads,
                                             scalar_t* __restrict__ voxels) {
  const int64_t F = num_features;
  const index_t f = static_cast<index_t>(num_features);
  const index_t row_elems = static_cast<index_t>(max_points) * f;
  const index_t total = rows * row_elems;
  const index_t real_elems = real * row_elems;
  for (index_t base = first_thread; base < total; base += num_threads * kVoxelsUnroll) {
    index_t col[kVoxelsUnroll];
    bool kept[kVoxelsUnroll];
    unsigned int candidate[kVoxelsUnroll];
#pragma unroll
    for (int j = 0; j < kVoxelsUnroll; ++j) {
      const index_t e = base + static_cast<index_t>(j) * blockDim.x;
      col[j] = 0;
      kept[j] = false;  // padding rows and elements past the end: nothing kept
      candidate[j] = 0;
      if (e < real_elems) {
        const auto v_rem = by_row.divmod(e);
        const auto rank_col = by_f.divmod(v_rem.mod);
        const index_t v = v_rem.div, rank = rank_col.div;
        col[j] = rank_col.mod;
        kept[j] = rank < static_cast<index_t>(runs[v].count);  // the list is full up to the count (or P)
        candidate[j] = first_points[static_cast<int64_t>(v) * max_points + rank];
      }
    }
    int64_t point[kVoxelsUnroll];
#pragma unroll
    for (int j = 0; j < kVoxelsUnroll; ++j) point[j] = kept[j] ? static_cast<int64_t>(candidate[j]) : -1;
    scalar_t value[kVoxelsUnroll];
#pragma unroll
    for (int j = 0; j < kVoxelsUnroll; ++j) {
      value[j] = point[j] >= 0 ? points[point[j] * F + static_cast<int64_t>(col[j])] : scalar_t(0);
    }
#pragma unroll
    for (int j = 0; j < kVoxelsUnroll; ++j) {
      const index_t e = base + static_cast<index_t>(j) * blockDim.x;
      if (e < total) voxels[e] = value[j];
    }
  }
}

// Both outputs in one launch (one host launch fewer after the sync): blocks [0, feature_blocks)
// write features/coords/num_points, the rest write voxels. `real` rows hold voxels: `rows` for
// the exact op, min(status[0], cap) read on the device for the padded one.
// index_t: uint32_t when rows * P * F (the larger part) is below 2^30, else uint64_t; by_f and
// by_row divide by F and by P * F.
template <typename scalar_t, typename cell_t, typename index_t>
__global__ void voxel_outputs_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                                     const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                                     const unsigned int* __restrict__ first_points,
                                     const VoxelRun* __restrict__ runs, const int32_t* __restrict__ device_total,
                                     int64_t cap, int64_t rows,
                                     int32_t max_points, int coord_cols, Divider<index_t> by_f,
                                     Divider<index_t> by_row, unsigned int feature_blocks,
                                     scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                                     int32_t* __restrict__ num_points, scalar_t* __restrict__ voxels) {
  const index_t real = static_cast<index_t>(real_rows(device_total, cap, rows));
  if (blockIdx.x < feature_blocks) {
    write_features<scalar_t, cell_t, index_t>(points, num_features, batch, grid, first_points, runs, real,
                                              static_cast<index_t>(rows), max_points, coord_cols, by_f,
                                              static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                                              static_cast<index_t>(feature_blocks) * blockDim.x, features, coords,
                                              num_points);
  } else {
    const index_t block = blockIdx.x - feature_blocks, blocks = gridDim.x - feature_blocks;
    write_voxels<scalar_t, index_t>(points, num_features, first_points, runs, real, static_cast<index_t>(rows),
                                    max_points, by_f, by_row, block * blockDim.x * kVoxelsUnroll + threadIdx.x,
                                    blocks * blockDim.x, voxels);
  }
}

// One warp per voxel; lane k reduces feature column k over the voxel's points in input order
// (ordered[start, start + count): the voxel's run of the stable sort).
template <typename scalar_t, typename cell_t>
__global__ void reduce_voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                                     const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                                     const int32_t* __restrict__ ordered, const VoxelRun* __restrict__ runs,
                                     int64_t num_voxels, Reduce reduce,
                                     int coord_cols, scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                                     int32_t* __restrict__ num_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t F = num_features;
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; v < num_voxels;
       v += total_warps) {
    const VoxelRun run = runs[v];
    const int32_t count = run.count;
    const int64_t start = run.start;
    for (int64_t k0 = 0; k0 < F; k0 += kWarp) {
      const int64_t k = k0 + lane;
      opmath_t acc = 0;
      for (int32_t j0 = 0; j0 < count; j0 += kWarp) {
        // Lanes load 32 member indices at once (coalesced), then broadcast them in order.
        const int64_t mine = j0 + lane < count ? ordered[start + j0 + lane] : 0;
        const int m = min(kWarp, count - j0);
        for (int jj = 0; jj < m; ++jj) {
          const int64_t idx = __shfl_sync(kFullMask, mine, jj);
          if (k < F) {
            const opmath_t x = static_cast<opmath_t>(points[idx * F + k]);
            acc = reduce != Reduce::kMax ? acc + x : (j0 + jj == 0 ? x : max_step(acc, x));
          }
        }
      }
      if (k < F) features[v * F + k] = static_cast<scalar_t>(reduce == Reduce::kMean ? acc / static_cast<opmath_t>(count) : acc);
    }
    if (lane == 0) {
      const int64_t first = ordered[start];
      write_coords(points + first * F, batch, first, grid, coords + v * coord_cols);
      num_points[v] = count;
    }
  }
}

template <typename scalar_t>
__global__ void sum_mean_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ point_to_voxel,
                                         const int32_t* __restrict__ counts, int64_t n, int64_t num_features,
                                         bool mean, scalar_t* __restrict__ grad_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, total = n * num_features;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t v = point_to_voxel[e / num_features], k = e % num_features;
    opmath_t g = 0;
    if (v >= 0) {
      g = static_cast<opmath_t>(grad[v * num_features + k]);
      if (mean) g = g / static_cast<opmath_t>(counts[v]);
    }
    grad_points[e] = static_cast<scalar_t>(g);
  }
}

// The first point (smallest index) of each voxel and column whose value is the max: integer
// atomicMin, so the winner does not depend on the order the threads ran in.
template <typename scalar_t>
__global__ void max_argmin_kernel(const scalar_t* __restrict__ points, const scalar_t* __restrict__ features,
                                  const int64_t* __restrict__ point_to_voxel, int64_t n, int64_t num_features,
                                  int32_t* __restrict__ winner) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, total = n * num_features;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / num_features, k = e % num_features, v = point_to_voxel[i];
    if (v < 0) continue;
    const opmath_t x = static_cast<opmath_t>(points[e]), m = static_cast<opmath_t>(features[v * num_features + k]);
    if (x == m || (is_nan(x) && is_nan(m))) atomicMin(&winner[v * num_features + k], static_cast<int32_t>(i));
  }
}

template <typename scalar_t>
__global__ void max_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ point_to_voxel,
                                    const int32_t* __restrict__ winner, int64_t n, int64_t num_features,
                                    scalar_t* __restrict__ grad_points) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, total = n * num_features;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / num_features, k = e % num_features, v = point_to_voxel[i];
    const bool wins = v >= 0 && winner[v * num_features + k] == static_cast<int32_t>(i);
    grad_points[e] = wins ? grad[v * num_features + k] : scalar_t(0);
  }
}

// The shared front half: hash insert, first-appearance ids, point_to_voxel, per-voxel counts, and
// the kept points of every kept voxel in input order: for voxelize its first P points
// (first_points), for voxel_features all of them (ordered, at runs[v].start). Every scratch array
// lives in one byte allocation (`buffer`), carved at 256-byte boundaries.
struct Assigned {
  at::Tensor point_to_voxel;        // (N,) int64, an output
  at::Tensor buffer;                // owns everything below
  Slot* table;                      // (capacity,)  | table, first_points, tile states, tile counter
  unsigned int* first_points;       // (cap, P)     | and status are contiguous: one 0xFF memset
  uint64_t* tile_states;            // (tiles,)     | clears them
  uint32_t* tile_counter;           // (1,)         |
  int32_t* status;                  // (2,) total voxels, bad batch indices - 1 (see bad_batch_count)
  int32_t* slot_of_point;           // (N,)
  int32_t* voxel_of_slot;           // (capacity,) written at the slots in use
  VoxelRun* runs;                   // (cap,) the first min(V, cap) entries
  const int32_t* ordered = nullptr;  // voxel_features: the points sorted by voxel, in input order
};

// How each voxel's points are put in input order: its first P points by the atomic lists of
// assign_kernel (voxelize), or all of them by a stable radix sort (voxel_features).
enum class Ordering { kFirstPoints, kSortAllPoints };

// The radix sort's end bit: keys are in [0, cap] (cap >= 1: n >= 1 and max_voxels >= 1).
inline int sort_key_bits(int64_t cap) {
  int bits = 1;
  while ((int64_t{1} << bits) <= cap) ++bits;
  return bits;
}

inline int64_t align_bytes(int64_t bytes) { return (bytes + 255) / 256 * 256; }

Assigned assign_voxels(const at::Tensor& points, const at::Tensor& batch, const Grid& grid, int64_t cap,
                       Ordering ordering, int32_t max_points, int64_t* num_voxels_out) {
  const int64_t n = points.size(0), f = points.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t capacity = table_capacity(n);  // a power of two >= 64
  const int64_t tiles = ceil_div<int64_t>(n, kScanTile);
  const bool sort = ordering == Ordering::kSortAllPoints;
  const int key_bits = sort_key_bits(cap);

  // n <= 2^30 (check_voxelize_inputs), so the int item count of cub cannot overflow.
  size_t sort_bytes = 0;
  if (sort) {
    cub::DoubleBuffer<uint32_t> keys(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> values(nullptr, nullptr);
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, values, static_cast<int>(n), 0,
                                                   key_bits, stream));
  }
  // The cleared region first (one memset), then the rest.
  int64_t offset = 0;
  const auto carve = [&offset](int64_t bytes) {
    const int64_t at = offset;
    offset += align_bytes(bytes);
    return at;
  };
  const int64_t off_table = carve(capacity * static_cast<int64_t>(sizeof(Slot)));
  const int64_t off_lists = carve(sort ? 0 : cap * max_points * 4);
  const int64_t off_tiles = carve(tiles * 8);
  const int64_t off_counter = carve(4);
  const int64_t off_status = carve(2 * 4);
  const int64_t cleared_bytes = offset;
  const int64_t off_slot = carve(n * 4);
  const int64_t off_voxel_of_slot = carve(capacity * 4);
  const int64_t off_runs = carve(cap * static_cast<int64_t>(sizeof(VoxelRun)));
  // kSortAllPoints: the sort's key and value double buffers and its temp storage.
  const int64_t off_keys0 = sort ? carve(n * 4) : 0, off_keys1 = sort ? carve(n * 4) : 0;
  const int64_t off_values0 = sort ? carve(n * 4) : 0, off_values1 = sort ? carve(n * 4) : 0;
  const int64_t off_temp = sort ? carve(static_cast<int64_t>(sort_bytes)) : 0;

  Assigned a;
  a.point_to_voxel = at::empty({n}, points.options().dtype(at::kLong));
  a.buffer = at::empty({offset}, points.options().dtype(at::kByte));
  char* base = static_cast<char*>(a.buffer.mutable_data_ptr());
  a.table = reinterpret_cast<Slot*>(base + off_table);
  a.first_points = sort ? nullptr : reinterpret_cast<unsigned int*>(base + off_lists);
  a.tile_states = reinterpret_cast<uint64_t*>(base + off_tiles);
  a.tile_counter = reinterpret_cast<uint32_t*>(base + off_counter);
  a.status = reinterpret_cast<int32_t*>(base + off_status);
  a.slot_of_point = reinterpret_cast<int32_t*>(base + off_slot);
  a.voxel_of_slot = reinterpret_cast<int32_t*>(base + off_voxel_of_slot);
  a.runs = reinterpret_cast<VoxelRun*>(base + off_runs);

  C10_CUDA_CHECK(cudaMemsetAsync(base, 0xFF, static_cast<size_t>(cleared_bytes), stream));
  const unsigned int blocks = grid_for(n, kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_insert_cuda", [&] {
    using cell_t = typename CellType<scalar_t>::type;
    insert_kernel<scalar_t, cell_t><<<blocks, kThreads, 0, stream>>>(
        points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr, n,
        make_cell_params<cell_t>(grid), a.table, static_cast<uint64_t>(capacity - 1), a.slot_of_point, a.status);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  number_voxels_kernel<<<static_cast<unsigned int>(tiles), kThreads, 0, stream>>>(
      a.slot_of_point, a.table, n, cap, a.tile_counter, a.tile_states, a.voxel_of_slot, a.runs, a.first_points,
      max_points, a.status, num_voxels_out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  int64_t* point_to_voxel = a.point_to_voxel.mutable_data_ptr<int64_t>();
  if (!sort) {
    assign_kernel<<<blocks, kThreads, 0, stream>>>(a.slot_of_point, a.table, a.voxel_of_slot, n, cap, max_points,
                                                   point_to_voxel, a.first_points, nullptr, nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return a;
  }
  cub::DoubleBuffer<uint32_t> keys(reinterpret_cast<uint32_t*>(base + off_keys0),
                                   reinterpret_cast<uint32_t*>(base + off_keys1));
  cub::DoubleBuffer<int32_t> values(reinterpret_cast<int32_t*>(base + off_values0),
                                    reinterpret_cast<int32_t*>(base + off_values1));
  assign_kernel<<<blocks, kThreads, 0, stream>>>(a.slot_of_point, a.table, a.voxel_of_slot, n, cap, /*max_points=*/0,
                                                 point_to_voxel, nullptr, keys.Current(), values.Current());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // Stable: each voxel's points keep their input order, so voxel v's run starts at the sum of the
  // counts of voxels 0 .. v - 1: runs[v].start. The double buffers' selectors are flipped on the
  // host, so Current() names the sorted arrays as soon as the call returns.
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + off_temp, sort_bytes, keys, values, static_cast<int>(n), 0,
                                                 key_bits, stream));
  a.ordered = values.Current();
  return a;
}

// The one host sync of the exact ops: status[0] (total voxels) and the bad batch count.
void read_status(const Assigned& a, cudaStream_t stream, const Grid& grid, int64_t* total) {
  int32_t host[2];
  c10::cuda::memcpy_and_sync(host, a.status, sizeof(host), cudaMemcpyDeviceToHost, stream);
  check_bad_batch(bad_batch_count(host[1]), grid);
  *total = host[0];
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_cuda_impl(
    const at::Tensor& points_in, const std::optional<at::Tensor>& batch_in, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels, bool padded) {
  const Grid grid = check_voxelize_inputs(points_in, batch_in, voxel_size, point_range);
  check_caps(max_points_per_voxel, max_voxels);
  const c10::cuda::CUDAGuard guard(points_in.device());
  const at::Tensor points = points_in.contiguous();
  const at::Tensor batch = (batch_in.has_value() && batch_in->defined()) ? batch_in->contiguous() : at::Tensor();
  const int64_t n = points.size(0), f = points.size(1), p = max_points_per_voxel;
  const int cols = batch.defined() ? 4 : 3;
  const auto int_opts = points.options().dtype(at::kInt);
  // Only the padded op returns the count (a 0-d device tensor, written by number_voxels_kernel).
  at::Tensor num_voxels = padded ? at::empty({}, points.options().dtype(at::kLong)) : at::Tensor();

  if (n == 0) {
    const int64_t rows = padded ? max_voxels : 0;
    return {at::zeros({rows, p, f}, points.options()), at::full({rows, cols}, -1, int_opts),
            at::zeros({rows}, int_opts), at::zeros({rows, f}, points.options()),
            at::empty({0}, points.options().dtype(at::kLong)),
            padded ? num_voxels.zero_() : num_voxels};
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t cap = std::min(max_voxels, n);
  // The lists of first points take cap x P x 4 bytes of scratch (as the (V, P, F) output itself
  // grows with P); check_caps (P <= INT32_MAX) and kMaxPoints (cap <= N <= 2^30) keep that byte
  // count inside int64.
  static_assert(std::numeric_limits<int32_t>::max() <= std::numeric_limits<int64_t>::max() / 4 / kMaxPoints,
                "the per-voxel point lists' byte count must fit in int64");
  Assigned a = assign_voxels(points, batch, grid, cap, Ordering::kFirstPoints, static_cast<int32_t>(p),
                             padded ? num_voxels.mutable_data_ptr<int64_t>() : nullptr);

  int64_t rows = max_voxels;
  const int32_t* device_total = nullptr;
  if (padded) {
    device_total = a.status;
  } else {
    int64_t total = 0;
    read_status(a, stream, grid, &total);  // V sizes the outputs
    rows = std::min<int64_t>(total, max_voxels);
  }
  at::Tensor voxels = at::empty({rows, p, f}, points.options());
  at::Tensor coords = at::empty({rows, cols}, int_opts);
  at::Tensor num_points = at::empty({rows}, int_opts);
  at::Tensor features = at::empty({rows, f}, points.options());
  if (rows > 0) {
    const int64_t feature_elems = rows * f, voxel_elems = rows * p * f;
    const unsigned int feature_blocks = grid_for(feature_elems, kThreads);
    const unsigned int voxel_blocks = grid_for(ceil_div<int64_t>(voxel_elems, kVoxelsUnroll), kThreads);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_outputs_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      const auto launch = [&](auto index_zero) {
        using index_t = decltype(index_zero);
        voxel_outputs_kernel<scalar_t, cell_t, index_t><<<feature_blocks + voxel_blocks, kThreads, 0, stream>>>(
            points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr,
            make_cell_params<cell_t>(grid), a.first_points, a.runs, device_total, cap, rows, static_cast<int32_t>(p),
            cols,
            Divider<index_t>(static_cast<index_t>(f)), Divider<index_t>(static_cast<index_t>(p * f)), feature_blocks,
            features.mutable_data_ptr<scalar_t>(), coords.mutable_data_ptr<int32_t>(),
            num_points.mutable_data_ptr<int32_t>(), voxels.mutable_data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      // 32-bit element indices when every index stays below 2^31 (the fast divider's range):
      // indices reach voxel_elems plus one grid stride (a few million), and feature_elems <=
      // voxel_elems.
      if (voxel_elems < (int64_t{1} << 30)) launch(uint32_t{0}); else launch(uint64_t{0});
    });
  }
  return {voxels, coords, num_points, features, a.point_to_voxel, num_voxels};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_cuda(
    const at::Tensor& points, const std::optional<at::Tensor>& batch, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels) {
  auto [voxels, coords, num_points, features, point_to_voxel, num_voxels] =
      voxelize_cuda_impl(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels, /*padded=*/false);
  return {voxels, coords, num_points, features, point_to_voxel};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_padded_cuda(
    const at::Tensor& points, const std::optional<at::Tensor>& batch, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels) {
  return voxelize_cuda_impl(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels, /*padded=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxel_features_cuda(
    const at::Tensor& points_in, const std::optional<at::Tensor>& batch_in, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, c10::string_view reduce_name) {
  const Grid grid = check_voxelize_inputs(points_in, batch_in, voxel_size, point_range);
  const Reduce reduce = parse_reduce(std::string_view(reduce_name.data(), reduce_name.size()));
  const c10::cuda::CUDAGuard guard(points_in.device());
  const at::Tensor points = points_in.contiguous();
  const at::Tensor batch = (batch_in.has_value() && batch_in->defined()) ? batch_in->contiguous() : at::Tensor();
  const int64_t n = points.size(0), f = points.size(1);
  const int cols = batch.defined() ? 4 : 3;
  const auto int_opts = points.options().dtype(at::kInt);
  if (n == 0) {
    return {at::empty({0, f}, points.options()), at::empty({0, cols}, int_opts), at::empty({0}, int_opts),
            at::empty({0}, points.options().dtype(at::kLong))};
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  // cap = n: every voxel kept, all of its points in order.
  Assigned a = assign_voxels(points, batch, grid, /*cap=*/n, Ordering::kSortAllPoints, /*max_points=*/0, nullptr);
  int64_t nv = 0;
  read_status(a, stream, grid, &nv);  // V sizes the outputs
  at::Tensor features = at::empty({nv, f}, points.options());
  at::Tensor coords = at::empty({nv, cols}, int_opts);
  at::Tensor num_points = at::empty({nv}, int_opts);
  if (nv > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      reduce_voxels_kernel<scalar_t, cell_t><<<grid_for(nv * kWarp, kThreads), kThreads, 0, stream>>>(
          points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr,
          make_cell_params<cell_t>(grid), a.ordered, a.runs, nv, reduce, cols,
          features.mutable_data_ptr<scalar_t>(), coords.mutable_data_ptr<int32_t>(),
          num_points.mutable_data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {features, coords, num_points, a.point_to_voxel};
}

at::Tensor voxel_features_backward_cuda(const at::Tensor& grad_features_in, const at::Tensor& points_in,
                                        const at::Tensor& point_to_voxel_in, const at::Tensor& num_points_in,
                                        const at::Tensor& features_in, c10::string_view reduce_name) {
  check_voxel_features_backward_inputs(grad_features_in, points_in, point_to_voxel_in, num_points_in, features_in);
  const Reduce reduce = parse_reduce(std::string_view(reduce_name.data(), reduce_name.size()));
  const c10::cuda::CUDAGuard guard(points_in.device());
  const at::Tensor grad = grad_features_in.contiguous(), points = points_in.contiguous();
  const at::Tensor point_to_voxel = point_to_voxel_in.contiguous(), counts = num_points_in.contiguous();
  const at::Tensor features = features_in.contiguous();
  const int64_t n = points.size(0), f = points.size(1), nv = features.size(0);
  at::Tensor grad_points = at::empty_like(points);
  if (n == 0) return grad_points;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const unsigned int blocks = grid_for(n * f, kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_backward_cuda", [&] {
    if (reduce != Reduce::kMax) {
      sum_mean_backward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
          grad.const_data_ptr<scalar_t>(), point_to_voxel.const_data_ptr<int64_t>(), counts.const_data_ptr<int32_t>(),
          n, f, reduce == Reduce::kMean, grad_points.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    at::Tensor winner = at::full({std::max<int64_t>(nv, 1), f}, kNoPoint, counts.options());
    max_argmin_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        points.const_data_ptr<scalar_t>(), features.const_data_ptr<scalar_t>(), point_to_voxel.const_data_ptr<int64_t>(),
        n, f, winner.mutable_data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    max_backward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        grad.const_data_ptr<scalar_t>(), point_to_voxel.const_data_ptr<int64_t>(), winner.const_data_ptr<int32_t>(), n,
        f, grad_points.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_points;
}

}  // namespace
}  // namespace voxelize
}  // namespace pointops

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("voxelize", &pointops::voxelize::voxelize_cuda);
  m.impl("voxelize_padded", &pointops::voxelize::voxelize_padded_cuda);
  m.impl("voxel_features", &pointops::voxelize::voxel_features_cuda);
  m.impl("_voxel_features_backward", &pointops::voxelize::voxel_features_backward_cuda);
}
