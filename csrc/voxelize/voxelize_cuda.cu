// Voxelization on CUDA: an open-addressing hash table of cell keys, then first-appearance order.
//
// Pipeline (one thread per point unless noted; every buffer lives on the current stream, and all
// the scratch of one call is carved from a single byte allocation):
//   memset        keys = all-ones (empty), first = UINT32_MAX, status = all-ones  (one memset)
//   insert        key of the point's cell -> atomicCAS insert with linear probing (bounded by the
//                 capacity), atomicMin(first[slot], i): the voxel's first point; zeroes counts[i]
//   scan          (cub) voxel id of a first point = number of first points up to it, the flag
//                 "i is the first point of its voxel" computed on the fly by the scan's input
//                 iterator: ids in order of first appearance, independent of the atomics' order
//   assign        point_to_voxel[i], per-voxel point counts (integer atomics: order-independent)
//   scan          (cub) CSR offsets of the voxels
//   fill_csr      the points of each voxel, in arbitrary order (the set is deterministic)
//   -- voxelize: one host sync to learn V (none in voxelize_padded) --
//   gather        one resident wave of warps, each owning a contiguous range of voxels (walked
//                 in chunks of 32, the next voxel's members prefetched): ranks a voxel's members
//                 by point index (input order), keeps the P smallest, copies those rows, sums them
//                 in input order in opmath_t and divides: bit-identical to the CPU loop. Padding
//                 rows (padded op): one flat fill by the whole grid.
// voxel_features instead stable-sorts point_to_voxel and reduces every point of a voxel in input
// order, one warp per voxel, one lane per feature column.
//
// Cost on an H100 (torch.profiler; nuScenes scan: 271,156 points, F = 5 float32, voxel
// 0.075 x 0.075 x 0.2, P = 10, max_voxels 160,000 -> 105,086 voxels, 2,026 with > 10 points,
// the largest 1,051), per call:
//   before (commit 525ec6a): GPU ~120 us = gather 75 (85 padded) + insert 11 + 2 x at::cumsum ~10
//     + assign 7 + fill_csr 7 + init_table 5 + mark_first 4; each at::cumsum ~30 us of host time,
//     9 scratch at::empty ~4 us each. Whole call 0.203 ms (padded 0.195 ms).
//   expected now (NOT yet measured; compare against the above):
//     gather ~12-20 us (padded ~+4 us for the 11 MB of padding): per voxel of <= 32 points
//       (nearly all) one coalesced load of its members (prefetched during the previous voxel),
//       count shuffles to rank them, the selection staged in shared memory, then the P x F row
//       written by consecutive lanes (coalesced) and the mean summed from L1-resident rows, instead
//       of P serial warp-min rounds (5-shuffle chains) each with a 20-byte scattered store, then a
//       re-read of the row. Counts/starts come in one coalesced load per 32 voxels. The kernel is
//       latency-bound: ~34 voxels per warp (76-80 registers, 3 blocks/SM) x ~0.4 us exposed
//       latency (the point rows) per voxel. Crowded voxels (> 32 points) keep the round-based
//       selection, with the first 32 members in a register and the rest L1-resident.
//     insert ~11 us (+ zeroing the 1 MB of counts, - atomicMin where first[] is already smaller),
//     memset ~4 us (was init_table 5), mark_first gone (fused into the cub scan's input iterator),
//     2 x cub scan ~3-5 us of GPU and ~5 us of host time each (at::cumsum: ~30 us host), assign 7,
//     fill_csr 7. Host: 2 allocations before the sync (was 9 + the cumsum outputs), the SM count
//     cached, the status read an 8-byte memcpy_and_sync instead of Tensor::to(kCPU).
//     Whole call expected ~0.10-0.12 ms (padded ~0.08-0.10 ms).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/device/device_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <atomic>
#include <limits>

#include "common/cuda_utils.cuh"
#include "voxelize/voxelize.h"

namespace pointops {
namespace voxelize {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;
// Keys are >= 0, so all-ones (the int64 -1) never collides with a real key; the table is cleared
// with a 0xFF memset.
constexpr unsigned long long kEmptyKey = ~0ull;
constexpr int32_t kNoPoint = std::numeric_limits<int32_t>::max();
// gather: at least 3 resident blocks of 256 threads per SM (<= 85 registers; it needs ~76-80, no
// spills; 64 would spill ~150 bytes). The grid is at most that many blocks: one wave.
constexpr int kGatherMinBlocks = 3;

// The SM count, cached per device (the attribute query costs host time on every launch).
inline int64_t cached_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sm_count[kMaxDevices];  // static storage: zero-initialized
  const int device = c10::cuda::current_device();
  const bool cacheable = device >= 0 && device < kMaxDevices;
  int sms = cacheable ? sm_count[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    sms = multiprocessor_count();
    if (cacheable) sm_count[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

// grid_for (common/cuda_utils.cuh) with the cached SM count.
inline unsigned int blocks_for(int64_t n, int threads) {
  const int64_t wanted = ceil_div<int64_t>(n, threads);
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(wanted, cached_sm_count() * 32)));
}

// status[0] = total voxel count (written by assign); status[1] counts points with a bad batch
// index (an error for the exact ops, dropped by the padded one, which cannot raise without a
// sync). Both start as all-ones (the table memset covers them), so status[1] holds count - 1.
inline int64_t bad_batch_count(int32_t raw_status1) { return static_cast<int64_t>(raw_status1) + 1; }

template <typename scalar_t, typename cell_t>
__global__ void insert_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                              const int64_t* __restrict__ batch, int64_t n, CellParams<cell_t> grid,
                              unsigned long long* __restrict__ keys, unsigned int* __restrict__ first,
                              uint64_t mask, int32_t* __restrict__ slot_of_point, int32_t* __restrict__ counts,
                              int32_t* __restrict__ status) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t key = point_key<scalar_t, cell_t>(points + i * num_features, batch ? batch[i] : 0, grid);
    int32_t slot = -1;
    if (key >= 0) {
      uint64_t h = fmix64(static_cast<uint64_t>(key)) & mask;
      // At most N distinct keys in a table of >= 2N slots: an empty slot or the key is always found;
      // the bound only makes "can never loop forever" true by construction.
      for (uint64_t probe = 0; probe <= mask; ++probe) {
        unsigned long long current = keys[h];
        if (current == kEmptyKey) current = atomicCAS(&keys[h], kEmptyKey, static_cast<unsigned long long>(key));
        if (current == kEmptyKey || current == static_cast<unsigned long long>(key)) {
          // first[h] only ever decreases, so any value read here is >= the final minimum: when it
          // is already below i, i cannot be the first point and the atomic can be skipped.
          const unsigned int me = static_cast<unsigned int>(i);
          if (first[h] > me) atomicMin(&first[h], me);
          slot = static_cast<int32_t>(h);
          break;
        }
        h = (h + 1) & mask;
      }
    } else if (key == kBadBatch) {
      atomicAdd(&status[1], 1);
    }
    slot_of_point[i] = slot;
    counts[i] = 0;  // per-voxel counts (sized N >= V) that assign accumulates into
  }
}

// The scan's input: 1 when point i is the first point of its voxel (replaces a mark_first pass).
struct IsFirstPoint {
  const int32_t* slot_of_point;
  const unsigned int* first;
  __host__ __device__ int32_t operator()(int32_t i) const {
    const int32_t slot = slot_of_point[i];
    return slot >= 0 && first[slot] == static_cast<unsigned int>(i) ? 1 : 0;
  }
};
using IsFirstIterator = thrust::transform_iterator<IsFirstPoint, thrust::counting_iterator<int32_t>>;

inline IsFirstIterator is_first_iterator(const int32_t* slot_of_point, const unsigned int* first) {
  return IsFirstIterator(thrust::counting_iterator<int32_t>(0), IsFirstPoint{slot_of_point, first});
}

// voxel id = (inclusive count of first points up to the voxel's first point) - 1. Voxels with an
// id >= cap are dropped (-1). status[0] = total voxel count; num_voxels (padded op) = min(total, cap).
__global__ void assign_kernel(const int32_t* __restrict__ slot_of_point, const unsigned int* __restrict__ first,
                              const int32_t* __restrict__ first_rank, int64_t n, int64_t cap,
                              int64_t* __restrict__ point_to_voxel, int32_t* __restrict__ counts,
                              int32_t* __restrict__ status, int64_t* __restrict__ num_voxels) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int32_t slot = slot_of_point[i];
    int64_t voxel = -1;
    if (slot >= 0) {
      const int64_t id = first_rank[first[slot]] - 1;
      if (id < cap) {
        voxel = id;
        atomicAdd(&counts[id], 1);
      }
    }
    point_to_voxel[i] = voxel;
    if (i == n - 1) {
      status[0] = first_rank[n - 1];
      if (num_voxels) *num_voxels = std::min<int64_t>(first_rank[n - 1], cap);
    }
  }
}

// `cursor` enters as the inclusive prefix sum of the counts and leaves as the exclusive one.
__global__ void fill_csr_kernel(const int64_t* __restrict__ point_to_voxel, int64_t n, int32_t* __restrict__ cursor,
                                int32_t* __restrict__ members) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t v = point_to_voxel[i];
    if (v >= 0) members[atomicSub(&cursor[v], 1) - 1] = static_cast<int32_t>(i);
  }
}

__device__ __forceinline__ int32_t warp_min(int32_t x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = min(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

// The smallest member index above `last` over the whole warp (every lane gets it). `mine` is the
// member `lane` (loaded once per voxel); members 32.. are read from memory (L1-resident after the
// first round). All 32 lanes must call it (warp-uniform arguments).
__device__ __forceinline__ int32_t next_member(int32_t mine, const int32_t* __restrict__ members, int64_t start,
                                               int32_t count, int lane, int32_t last) {
  int32_t best = mine > last ? mine : kNoPoint;
#pragma unroll 4
  for (int32_t j = lane + kWarp; j < count; j += kWarp) {
    const int32_t idx = members[start + j];
    best = (idx > last && idx < best) ? idx : best;
  }
  return warp_min(best);
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

// Rows v < real are real voxels; rows in [real, rows) (padded op: real is read from the device)
// are padding: zeros, coords -1, filled flat by the whole grid at the end.
//
// Each warp owns a contiguous range of voxels, taken in chunks of 32: lane j loads the count and
// start of voxel v0 + j (one coalesced load for the chunk), and the warp walks the chunk one voxel at a time,
// loading the next voxel's first 32 members while it works on the current one (so the only
// exposed latency per voxel is the point rows).
//
// A voxel's kept points (at most P, the smallest point indices, in increasing order) are first
// selected into the warp's slice of shared memory, sel[r] = the r-th kept point:
//   count <= 32 (nearly all voxels): lane i holds member i; its rank = the number of members with
//     a smaller index (count shuffles); lanes with rank < kept write sel[rank].
//   count > 32, kept <= 32: kept rounds of "smallest member above the previous one".
// Then the P x F row is written with consecutive lanes on consecutive elements (coalesced), lanes
// k < F sum column k over r = 0..kept-1 in order (the same values the row holds, in the same
// order as the CPU), lane 0 writes coords and the count.
//   count > 32 and kept > 32 (P > 32, rare): sel cannot hold the selection; the rows are written
//     one per round and the mean re-reads them (the original path).
template <typename scalar_t, typename cell_t>
__global__ void __launch_bounds__(kThreads, kGatherMinBlocks)
    gather_voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features, const int64_t* __restrict__ batch,
                         CellParams<cell_t> grid, const int32_t* __restrict__ members,
                         const int32_t* __restrict__ starts, const int32_t* __restrict__ counts,
                         const int32_t* __restrict__ device_total, int64_t cap, int64_t rows, int32_t max_points,
                         int coord_cols, scalar_t* __restrict__ voxels, int32_t* __restrict__ coords,
                         int32_t* __restrict__ num_points, scalar_t* __restrict__ features) {
  using opmath_t = at::opmath_type<scalar_t>;
  __shared__ int32_t selected[kWarpsPerBlock][kWarp];
  const int lane = threadIdx.x % kWarp;
  int32_t* sel = selected[threadIdx.x / kWarp];
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t real = device_total ? std::min<int64_t>(*device_total, cap) : rows;
  const int64_t F = num_features, row_elems = static_cast<int64_t>(max_points) * F;
  // Element e = lane + 32 t of a row is (rank e / F, column e % F), walked without divisions.
  // All four are < 32.
  const int32_t lane_rank = static_cast<int32_t>(lane / F), lane_col = static_cast<int32_t>(lane % F);
  const int32_t step_rank = static_cast<int32_t>(kWarp / F), step_col = static_cast<int32_t>(kWarp % F);
  // Warp w owns the rows [w * per_warp, (w + 1) * per_warp) (a balanced split: the grid is one
  // resident wave), walked in chunks of 32.
  const int64_t warp_id = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  const int64_t per_warp = ceil_div<int64_t>(real, total_warps);
  const int64_t begin = std::min<int64_t>(warp_id * per_warp, real), end = std::min<int64_t>(begin + per_warp, real);
  for (int64_t v0 = begin; v0 < end; v0 += kWarp) {
    const int32_t chunk = static_cast<int32_t>(std::min<int64_t>(kWarp, end - v0));
    const int32_t chunk_count = lane < chunk ? counts[v0 + lane] : 0;
    const int32_t chunk_start = lane < chunk ? starts[v0 + lane] : 0;
    int32_t count = __shfl_sync(kFullMask, chunk_count, 0);  // >= 1: a voxel's first point is counted
    int64_t start = __shfl_sync(kFullMask, chunk_start, 0);
    int32_t mine = lane < count ? members[start + lane] : kNoPoint;
    for (int32_t j = 0; j < chunk; ++j) {
      // The next voxel's count, start and first 32 members, loaded before they are needed.
      const int32_t next_count_raw = __shfl_sync(kFullMask, chunk_count, (j + 1) % kWarp);
      const int64_t next_start = __shfl_sync(kFullMask, chunk_start, (j + 1) % kWarp);
      const int32_t next_count = j + 1 < chunk ? next_count_raw : 0;
      const int32_t next_mine = lane < next_count ? members[next_start + lane] : kNoPoint;

      const int64_t v = v0 + j;
      scalar_t* voxel = voxels + v * row_elems;
      const int32_t kept = min(count, max_points);
      int32_t first_point = 0;  // set below: kept >= 1
      if (count <= kWarp || kept <= kWarp) {
        if (count <= kWarp) {
          int32_t rank = 0;
#pragma unroll 4
          for (int32_t i = 0; i < count; ++i) rank += __shfl_sync(kFullMask, mine, i) < mine ? 1 : 0;
          if (lane < count && rank < kept) sel[rank] = mine;
        } else {
          int32_t last = -1;
#pragma unroll 1
          for (int32_t r = 0; r < kept; ++r) {
            last = next_member(mine, members, start, count, lane, last);
            if (lane == 0) sel[r] = last;
          }
        }
        __syncwarp();  // sel was written by some lanes and is read by all below
        const int64_t data = static_cast<int64_t>(kept) * F;
        int32_t r = lane_rank;
        int64_t k = lane_col;
#pragma unroll 2
        for (int64_t e = lane; e < data; e += kWarp) {
          voxel[e] = points[static_cast<int64_t>(sel[r]) * F + k];
          r += step_rank;
          k += step_col;
          if (k >= F) {
            k -= F;
            ++r;
          }
        }
#pragma unroll 1
        for (int64_t e = data + lane; e < row_elems; e += kWarp) voxel[e] = scalar_t(0);
#pragma unroll 1
        for (int64_t c = lane; c < F; c += kWarp) {
          opmath_t sum = 0;
#pragma unroll 4
          for (int32_t q = 0; q < kept; ++q) sum += static_cast<opmath_t>(points[static_cast<int64_t>(sel[q]) * F + c]);
          features[v * F + c] = static_cast<scalar_t>(sum / static_cast<opmath_t>(kept));
        }
        first_point = sel[0];
        __syncwarp();  // every lane is done reading sel before the next voxel overwrites it
      } else {
        int32_t last = -1;
#pragma unroll 1
        for (int32_t r = 0; r < kept; ++r) {
          last = next_member(mine, members, start, count, lane, last);
          const scalar_t* src = points + static_cast<int64_t>(last) * F;
#pragma unroll 1
          for (int64_t k = lane; k < F; k += kWarp) voxel[r * F + k] = src[k];
          if (r == 0) first_point = last;
        }
        __syncwarp();  // the rows written above by other lanes are read back below
#pragma unroll 1
        for (int64_t k = lane; k < F; k += kWarp) {
          opmath_t sum = 0;
#pragma unroll 1
          for (int32_t r = 0; r < kept; ++r) sum += static_cast<opmath_t>(voxel[r * F + k]);
          features[v * F + k] = static_cast<scalar_t>(sum / static_cast<opmath_t>(kept));
        }
#pragma unroll 1
        for (int64_t e = static_cast<int64_t>(kept) * F + lane; e < row_elems; e += kWarp) voxel[e] = scalar_t(0);
      }
      if (lane == 0) {
        write_coords(points + static_cast<int64_t>(first_point) * F, batch, first_point, grid, coords + v * coord_cols);
        num_points[v] = kept;
      }
      count = next_count;
      start = next_start;
      mine = next_mine;
    }
  }
  if (real < rows) {
    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
#pragma unroll 1
    for (int64_t e = real * row_elems + tid; e < rows * row_elems; e += stride) voxels[e] = scalar_t(0);
#pragma unroll 1
    for (int64_t e = real * F + tid; e < rows * F; e += stride) features[e] = scalar_t(0);
#pragma unroll 1
    for (int64_t e = real * coord_cols + tid; e < rows * coord_cols; e += stride) coords[e] = -1;
#pragma unroll 1
    for (int64_t e = real + tid; e < rows; e += stride) num_points[e] = 0;
  }
}

// One warp per voxel; lane k reduces feature column k over the voxel's points in input order
// (`order` is point_to_voxel stable-sorted: out-of-range points first, then voxel 0, 1, ...).
template <typename scalar_t, typename cell_t>
__global__ void reduce_voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                                     const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                                     const int64_t* __restrict__ order, const int32_t* __restrict__ ends,
                                     const int32_t* __restrict__ counts, int64_t num_voxels, int64_t n, Reduce reduce,
                                     int coord_cols, scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                                     int32_t* __restrict__ num_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t F = num_features;
  const int64_t base = n - ends[num_voxels - 1];  // the out-of-range points sorted first
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; v < num_voxels;
       v += total_warps) {
    const int32_t count = counts[v];
    const int64_t start = base + ends[v] - count;
    for (int64_t k0 = 0; k0 < F; k0 += kWarp) {
      const int64_t k = k0 + lane;
      opmath_t acc = 0;
      for (int32_t j0 = 0; j0 < count; j0 += kWarp) {
        // Lanes load 32 member indices at once (coalesced), then broadcast them in order.
        const int64_t mine = j0 + lane < count ? order[start + j0 + lane] : 0;
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
      const int64_t first = order[start];
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

// The shared front half: hash insert, first-appearance ids, point_to_voxel and per-voxel counts.
// Every scratch array lives in one byte allocation (`buffer`), carved at 256-byte boundaries.
struct Assigned {
  at::Tensor point_to_voxel;  // (N,) int64, an output
  at::Tensor buffer;          // owns everything below
  unsigned long long* keys;   // (capacity,)  | keys, first and status are contiguous:
  unsigned int* first;        // (capacity,)  | one 0xFF memset clears them
  int32_t* status;            // (2,) total voxels, bad batch indices - 1 (see bad_batch_count)
  int32_t* slot_of_point;     // (N,)
  int32_t* first_rank;        // (N,) inclusive scan of "is a first point"
  int32_t* counts;            // (N,) the first min(V, cap) entries are the voxel counts, the rest 0
  int32_t* cursor;            // (cap,) scratch for the CSR offsets (scan_counts)
  int32_t* members;           // (N,) CSR members (fill_csr)
  void* temp;                 // cub scan temp storage
  size_t temp_bytes;
  int64_t cap;
};

// cursor = inclusive prefix sum of counts[0, cap).
void scan_counts(const Assigned& a, cudaStream_t stream) {
  size_t bytes = a.temp_bytes;
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(a.temp, bytes, a.counts, a.cursor, static_cast<int>(a.cap), stream));
}

Assigned assign_voxels(const at::Tensor& points, const at::Tensor& batch, const Grid& grid, int64_t cap,
                       int64_t* num_voxels_out) {
  const int64_t n = points.size(0), f = points.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t capacity = table_capacity(n);  // a power of two >= 64

  // n <= 2^30 (check_voxelize_inputs), so the int item counts of cub cannot overflow.
  size_t scan_ids_bytes = 0, scan_counts_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_ids_bytes, is_first_iterator(nullptr, nullptr),
                                               static_cast<int32_t*>(nullptr), static_cast<int>(n), stream));
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_counts_bytes, static_cast<const int32_t*>(nullptr),
                                               static_cast<int32_t*>(nullptr), static_cast<int>(cap), stream));
  const size_t temp_bytes = std::max<size_t>({scan_ids_bytes, scan_counts_bytes, 1});
  const auto align = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t table_bytes = capacity * 8 + capacity * 4 + 2 * 4;
  const int64_t off_slot = align(table_bytes);
  const int64_t off_rank = off_slot + align(n * 4);
  const int64_t off_counts = off_rank + align(n * 4);
  const int64_t off_cursor = off_counts + align(n * 4);
  const int64_t off_members = off_cursor + align(cap * 4);
  const int64_t off_temp = off_members + align(n * 4);
  const int64_t total_bytes = off_temp + align(static_cast<int64_t>(temp_bytes));

  Assigned a;
  a.point_to_voxel = at::empty({n}, points.options().dtype(at::kLong));
  a.buffer = at::empty({total_bytes}, points.options().dtype(at::kByte));
  char* base = static_cast<char*>(a.buffer.mutable_data_ptr());
  a.keys = reinterpret_cast<unsigned long long*>(base);
  a.first = reinterpret_cast<unsigned int*>(base + capacity * 8);
  a.status = reinterpret_cast<int32_t*>(base + capacity * 12);
  a.slot_of_point = reinterpret_cast<int32_t*>(base + off_slot);
  a.first_rank = reinterpret_cast<int32_t*>(base + off_rank);
  a.counts = reinterpret_cast<int32_t*>(base + off_counts);
  a.cursor = reinterpret_cast<int32_t*>(base + off_cursor);
  a.members = reinterpret_cast<int32_t*>(base + off_members);
  a.temp = base + off_temp;
  a.temp_bytes = temp_bytes;
  a.cap = cap;

  // keys = kEmptyKey (all-ones), first = UINT32_MAX (atomicMin start), status = all-ones.
  C10_CUDA_CHECK(cudaMemsetAsync(base, 0xFF, static_cast<size_t>(table_bytes), stream));
  const unsigned int blocks = blocks_for(n, kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_insert_cuda", [&] {
    using cell_t = typename CellType<scalar_t>::type;
    insert_kernel<scalar_t, cell_t><<<blocks, kThreads, 0, stream>>>(
        points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr, n,
        make_cell_params<cell_t>(grid), a.keys, a.first, static_cast<uint64_t>(capacity - 1), a.slot_of_point,
        a.counts, a.status);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  size_t bytes = a.temp_bytes;
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(a.temp, bytes, is_first_iterator(a.slot_of_point, a.first),
                                               a.first_rank, static_cast<int>(n), stream));
  assign_kernel<<<blocks, kThreads, 0, stream>>>(a.slot_of_point, a.first, a.first_rank, n, cap,
                                                 a.point_to_voxel.mutable_data_ptr<int64_t>(), a.counts, a.status,
                                                 num_voxels_out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  // Only the padded op returns the count (a 0-d device tensor, written by assign_kernel).
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
  Assigned a = assign_voxels(points, batch, grid, cap, padded ? num_voxels.mutable_data_ptr<int64_t>() : nullptr);
  scan_counts(a, stream);
  fill_csr_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(
      a.point_to_voxel.const_data_ptr<int64_t>(), n, a.cursor, a.members);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

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
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_gather_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      // At most one resident wave (see kGatherMinBlocks), at least one row per warp; padding rows
      // are filled by the whole grid.
      const int64_t gather_blocks =
          std::max<int64_t>(1, std::min(ceil_div<int64_t>(rows, kWarpsPerBlock), cached_sm_count() * kGatherMinBlocks));
      gather_voxels_kernel<scalar_t, cell_t><<<static_cast<unsigned int>(gather_blocks), kThreads, 0, stream>>>(
          points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr,
          make_cell_params<cell_t>(grid), a.members, a.cursor, a.counts, device_total, cap, rows,
          static_cast<int32_t>(p), cols, voxels.mutable_data_ptr<scalar_t>(), coords.mutable_data_ptr<int32_t>(),
          num_points.mutable_data_ptr<int32_t>(), features.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
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
  Assigned a = assign_voxels(points, batch, grid, /*cap=*/n, nullptr);
  int64_t nv = 0;
  read_status(a, stream, grid, &nv);  // V sizes the outputs
  at::Tensor features = at::empty({nv, f}, points.options());
  at::Tensor coords = at::empty({nv, cols}, int_opts);
  at::Tensor num_points = at::empty({nv}, int_opts);
  if (nv > 0) {
    scan_counts(a, stream);  // a.cursor = the inclusive ends of the voxels in sorted order
    const at::Tensor order = std::get<1>(at::sort(a.point_to_voxel, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      reduce_voxels_kernel<scalar_t, cell_t><<<blocks_for(nv * kWarp, kThreads), kThreads, 0, stream>>>(
          points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr,
          make_cell_params<cell_t>(grid), order.const_data_ptr<int64_t>(), a.cursor, a.counts, nv, n, reduce, cols,
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
  const unsigned int blocks = blocks_for(n * f, kThreads);
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
