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
//   assign        point_to_voxel[i], per-voxel point counts (integer atomics: order-independent),
//                 the sort pairs (key = voxel id, or cap for a dropped point; value = i)
//   sort          (cub) stable radix sort of the pairs on the bits of [0, cap]: every voxel's
//                 points become a contiguous run in input order (voxel 0 first, dropped points
//                 last), so nothing downstream has to rank or select
//   starts        starts[v] = the position of voxel v's run (where the sorted key changes)
//   -- voxelize: one host sync to learn V (none in voxelize_padded) --
//   means         one thread per (voxel, column): sums the voxel's first min(count, P) points in
//                 input order in opmath_t and divides once (bit-identical to the CPU loop); the
//                 column-0 thread writes coords (from the voxel's first point) and num_points.
//                 Padding rows (padded op): zeros, coords -1, num_points 0
//   voxels        one thread per output element (v, r, k), consecutive threads on consecutive
//                 elements: the r-th sorted point's column k, or 0 (r >= kept, padding rows)
// voxel_features shares everything up to starts and reduces every point of a voxel in input
// order, one warp per voxel, one lane per feature column.
//
// Cost on an H100 (torch.profiler; nuScenes scan: 271,156 points, F = 5 float32, voxel
// 0.075 x 0.075 x 0.2, P = 10, max_voxels 160,000 -> 105,086 voxels, 217,374 kept points, 2,026
// voxels with > 10 points, the largest 1,051), per call:
//   before (commit b685e58): GPU ~130 us = gather 79 + is-first scan 13 + insert 13 + fill_csr 6
//     + assign 6 + memset 4.4 + counts scan 3.5 + scan init 2 + DtoH 1.6. Whole call 0.174 ms
//     (padded 0.161 ms). The gather (a persistent one-wave grid, each warp walking ~33 voxels, each
//     voxel a chain of dependent loads: counts/starts -> unordered CSR members -> rank/select ->
//     rows) was latency-bound at ~2.4 us per voxel per warp.
//   expected now (NOT yet measured; compare against the above):
//     sort ~12-18 us: 19 key bits (cap = 271,156 < 2^19) = 3 onesweep passes of 8 bits, each
//       reading and writing 271k x 8 B (~4.3 MB, L2-resident), plus cub's histogram and
//       exclusive-sum kernels and 5 small memsets (10 operations: ~1 us of GPU each for the
//       memsets, ~3-4 us per pass).
//     starts ~2-3 us (reads 1 MB of sorted keys, writes 0.4 MB), replacing fill_csr 6 + the
//       counts scan 3.5 + its init 2.
//     voxels ~8-12 us: writes V x P x F x 4 B = 21 MB (~8 us at ~2.5 TB/s) and reads 217k point
//       rows (L2-resident); each thread handles 4 elements with their 3 dependent loads (count and
//       start -> sorted point -> value) batched, so each warp has 4 chains in flight.
//     means ~3-5 us: 525k threads, each summing <= P values of one column (L1/L2 hits).
//     Unchanged: insert 13, is-first scan 13 + init 2, assign ~6-7 (+ 2 MB of sort pairs written),
//     memset 4.4. GPU ~75-85 us. Host: the sort adds ~10 launches before the sync, where they
//     overlap the GPU; after the sync 2 launches (was 1). Whole call expected ~0.11-0.13 ms.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <limits>

#include "common/cuda_utils.cuh"
#include "voxelize/voxelize.h"

namespace pointops {
namespace voxelize {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Keys are >= 0, so all-ones (the int64 -1) never collides with a real key; the table is cleared
// with a 0xFF memset.
constexpr unsigned long long kEmptyKey = ~0ull;
constexpr int32_t kNoPoint = std::numeric_limits<int32_t>::max();
// Output elements per thread and grid-stride step in voxels_kernel (their loads are batched).
constexpr int kVoxelsUnroll = 4;


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
// The sort pairs: key = the voxel id, or cap (above every kept id) for a point without one; value = i.
__global__ void assign_kernel(const int32_t* __restrict__ slot_of_point, const unsigned int* __restrict__ first,
                              const int32_t* __restrict__ first_rank, int64_t n, int64_t cap,
                              int64_t* __restrict__ point_to_voxel, int32_t* __restrict__ counts,
                              uint32_t* __restrict__ sort_keys, int32_t* __restrict__ sort_points,
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
    sort_keys[i] = static_cast<uint32_t>(voxel >= 0 ? voxel : cap);  // cap <= n <= 2^30
    sort_points[i] = static_cast<int32_t>(i);
    if (i == n - 1) {
      status[0] = first_rank[n - 1];
      if (num_voxels) *num_voxels = std::min<int64_t>(first_rank[n - 1], cap);
    }
  }
}

// starts[v] = the first position of key v in the sorted keys, for every kept voxel v (each has at
// least its first point). Dropped points (key cap) sort after every kept voxel and write nothing.
__global__ void starts_kernel(const uint32_t* __restrict__ sorted_keys, int64_t n, uint32_t cap,
                              int32_t* __restrict__ starts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t key = sorted_keys[i];
    if (key < cap && (i == 0 || sorted_keys[i - 1] != key)) starts[key] = static_cast<int32_t>(i);
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

// One thread per (row v, column k) of features; the k == 0 thread also writes coords[v] and
// num_points[v]. Real rows: the voxel's kept points are sorted_points[start, start + kept), in
// input order; column k is summed over them in that order in opmath_t and divided once by kept
// (the CPU's loop, bit for bit). Padding rows: 0, coords -1, num_points 0.
// index_t: uint32_t when rows * F <= INT32_MAX (cheaper divisions), else uint64_t.
template <typename scalar_t, typename cell_t, typename index_t>
__global__ void means_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                             const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                             const int32_t* __restrict__ sorted_points, const int32_t* __restrict__ starts,
                             const int32_t* __restrict__ counts, const int32_t* __restrict__ device_total,
                             int64_t cap, int64_t rows, int32_t max_points, int coord_cols,
                             scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                             int32_t* __restrict__ num_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t F = num_features;
  const index_t f = static_cast<index_t>(num_features);
  const index_t real = static_cast<index_t>(real_rows(device_total, cap, rows));
  const index_t total = static_cast<index_t>(rows) * f;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x;
  for (index_t e = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const index_t v = e / f, k = e - v * f;
    if (v < real) {
      const int32_t kept = min(counts[v], max_points);  // >= 1: the first point is counted
      const int32_t* __restrict__ members = sorted_points + starts[v];
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

// One thread per element e = (v, r, k) of voxels (rows x P x F), kVoxelsUnroll elements per
// thread and step (blockDim.x apart: every one of them coalesced across the warp), their loads
// batched in three rounds: count and start of v -> sorted point -> value. The value is the r-th
// kept point's column k, or 0 for r >= kept and for padding rows.
// index_t: uint32_t when rows * P * F <= INT32_MAX, else uint64_t.
template <typename scalar_t, typename index_t>
__global__ void voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                              const int32_t* __restrict__ sorted_points, const int32_t* __restrict__ starts,
                              const int32_t* __restrict__ counts, const int32_t* __restrict__ device_total,
                              int64_t cap, int64_t rows, int32_t max_points, scalar_t* __restrict__ voxels) {
  const int64_t F = num_features;
  const index_t f = static_cast<index_t>(num_features);
  const index_t row_elems = static_cast<index_t>(max_points) * f;
  const index_t total = static_cast<index_t>(rows) * row_elems;
  const index_t real_elems = static_cast<index_t>(real_rows(device_total, cap, rows)) * row_elems;
  const index_t stride = static_cast<index_t>(gridDim.x) * blockDim.x * kVoxelsUnroll;
  for (index_t base = static_cast<index_t>(blockIdx.x) * blockDim.x * kVoxelsUnroll + threadIdx.x; base < total;
       base += stride) {
    index_t rank[kVoxelsUnroll], col[kVoxelsUnroll];
    int32_t kept[kVoxelsUnroll], start[kVoxelsUnroll];
#pragma unroll
    for (int j = 0; j < kVoxelsUnroll; ++j) {
      const index_t e = base + static_cast<index_t>(j) * blockDim.x;
      rank[j] = 0;
      col[j] = 0;
      kept[j] = 0;  // padding rows and elements past the end: nothing kept
      start[j] = 0;
      if (e < real_elems) {
        const index_t v = e / row_elems, rem = e - v * row_elems;
        rank[j] = rem / f;
        col[j] = rem - rank[j] * f;
        kept[j] = min(counts[v], max_points);
        start[j] = starts[v];
      }
    }
    int64_t point[kVoxelsUnroll];
#pragma unroll
    for (int j = 0; j < kVoxelsUnroll; ++j) {
      point[j] = rank[j] < static_cast<index_t>(kept[j]) ? sorted_points[static_cast<int64_t>(start[j]) + rank[j]] : -1;
    }
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

// One warp per voxel; lane k reduces feature column k over the voxel's points in input order
// (sorted_points[starts[v], starts[v] + counts[v]): the voxel's run of the stable sort).
template <typename scalar_t, typename cell_t>
__global__ void reduce_voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                                     const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                                     const int32_t* __restrict__ sorted_points, const int32_t* __restrict__ starts,
                                     const int32_t* __restrict__ counts, int64_t num_voxels, Reduce reduce,
                                     int coord_cols, scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                                     int32_t* __restrict__ num_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t F = num_features;
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; v < num_voxels;
       v += total_warps) {
    const int32_t count = counts[v];
    const int64_t start = starts[v];
    for (int64_t k0 = 0; k0 < F; k0 += kWarp) {
      const int64_t k = k0 + lane;
      opmath_t acc = 0;
      for (int32_t j0 = 0; j0 < count; j0 += kWarp) {
        // Lanes load 32 member indices at once (coalesced), then broadcast them in order.
        const int64_t mine = j0 + lane < count ? sorted_points[start + j0 + lane] : 0;
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
      const int64_t first = sorted_points[start];
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
// every kept voxel's points as one run of a stable sort. Every scratch array lives in one byte
// allocation (`buffer`), carved at 256-byte boundaries.
struct Assigned {
  at::Tensor point_to_voxel;     // (N,) int64, an output
  at::Tensor buffer;             // owns everything below
  unsigned long long* keys;      // (capacity,)  | keys, first and status are contiguous:
  unsigned int* first;           // (capacity,)  | one 0xFF memset clears them
  int32_t* status;               // (2,) total voxels, bad batch indices - 1 (see bad_batch_count)
  int32_t* slot_of_point;        // (N,)
  int32_t* first_rank;           // (N,) inclusive scan of "is a first point"
  int32_t* counts;               // (N,) the first min(V, cap) entries are the voxel counts, the rest 0
  int32_t* starts;               // (cap,) the first min(V, cap) entries: each voxel's run in sorted_points
  uint32_t* sort_keys[2];        // (N,) each: the radix sort's key double buffer
  int32_t* sort_points[2];       // (N,) each: its value double buffer
  const int32_t* sorted_points;  // one of sort_points: point indices grouped by voxel, in input order
  void* temp;                    // cub scan / sort temp storage
  size_t temp_bytes;
  int64_t cap;
};

// The radix sort's end bit: keys are in [0, cap] (cap >= 1: n >= 1 and max_voxels >= 1).
inline int sort_key_bits(int64_t cap) {
  int bits = 1;
  while ((int64_t{1} << bits) <= cap) ++bits;
  return bits;
}

Assigned assign_voxels(const at::Tensor& points, const at::Tensor& batch, const Grid& grid, int64_t cap,
                       int64_t* num_voxels_out) {
  const int64_t n = points.size(0), f = points.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t capacity = table_capacity(n);  // a power of two >= 64
  const int key_bits = sort_key_bits(cap);

  // n <= 2^30 (check_voxelize_inputs), so the int item counts of cub cannot overflow.
  size_t scan_ids_bytes = 0, sort_bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_ids_bytes, is_first_iterator(nullptr, nullptr),
                                               static_cast<int32_t*>(nullptr), static_cast<int>(n), stream));
  {
    cub::DoubleBuffer<uint32_t> sort_keys(nullptr, nullptr);
    cub::DoubleBuffer<int32_t> sort_points(nullptr, nullptr);
    C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, sort_keys, sort_points, static_cast<int>(n),
                                                   0, key_bits, stream));
  }
  const size_t temp_bytes = std::max<size_t>({scan_ids_bytes, sort_bytes, 1});
  const auto align = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t table_bytes = capacity * 8 + capacity * 4 + 2 * 4;
  const int64_t off_slot = align(table_bytes);
  const int64_t off_rank = off_slot + align(n * 4);
  const int64_t off_counts = off_rank + align(n * 4);
  const int64_t off_starts = off_counts + align(n * 4);
  const int64_t off_keys0 = off_starts + align(cap * 4);
  const int64_t off_keys1 = off_keys0 + align(n * 4);
  const int64_t off_points0 = off_keys1 + align(n * 4);
  const int64_t off_points1 = off_points0 + align(n * 4);
  const int64_t off_temp = off_points1 + align(n * 4);
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
  a.starts = reinterpret_cast<int32_t*>(base + off_starts);
  a.sort_keys[0] = reinterpret_cast<uint32_t*>(base + off_keys0);
  a.sort_keys[1] = reinterpret_cast<uint32_t*>(base + off_keys1);
  a.sort_points[0] = reinterpret_cast<int32_t*>(base + off_points0);
  a.sort_points[1] = reinterpret_cast<int32_t*>(base + off_points1);
  a.temp = base + off_temp;
  a.temp_bytes = temp_bytes;
  a.cap = cap;

  // keys = kEmptyKey (all-ones), first = UINT32_MAX (atomicMin start), status = all-ones.
  C10_CUDA_CHECK(cudaMemsetAsync(base, 0xFF, static_cast<size_t>(table_bytes), stream));
  const unsigned int blocks = grid_for(n, kThreads);
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
                                                 a.point_to_voxel.mutable_data_ptr<int64_t>(), a.counts,
                                                 a.sort_keys[0], a.sort_points[0], a.status, num_voxels_out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // Stable: each voxel's points keep their input order. The double buffers' selectors are flipped
  // on the host, so Current() names the sorted arrays as soon as the call returns.
  cub::DoubleBuffer<uint32_t> sort_keys(a.sort_keys[0], a.sort_keys[1]);
  cub::DoubleBuffer<int32_t> sort_points(a.sort_points[0], a.sort_points[1]);
  bytes = a.temp_bytes;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(a.temp, bytes, sort_keys, sort_points, static_cast<int>(n), 0,
                                                 key_bits, stream));
  a.sorted_points = sort_points.Current();
  starts_kernel<<<blocks, kThreads, 0, stream>>>(sort_keys.Current(), n, static_cast<uint32_t>(cap), a.starts);
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
    constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
    const int64_t feature_elems = rows * f, voxel_elems = rows * p * f;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_gather_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      const scalar_t* points_ptr = points.const_data_ptr<scalar_t>();
      const int64_t* batch_ptr = batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr;
      const auto launch_means = [&](auto index_zero) {
        using index_t = decltype(index_zero);
        means_kernel<scalar_t, cell_t, index_t><<<grid_for(feature_elems, kThreads), kThreads, 0, stream>>>(
            points_ptr, f, batch_ptr, make_cell_params<cell_t>(grid), a.sorted_points, a.starts, a.counts,
            device_total, cap, rows, static_cast<int32_t>(p), cols, features.mutable_data_ptr<scalar_t>(),
            coords.mutable_data_ptr<int32_t>(), num_points.mutable_data_ptr<int32_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      const auto launch_voxels = [&](auto index_zero) {
        using index_t = decltype(index_zero);
        voxels_kernel<scalar_t, index_t>
            <<<grid_for(ceil_div<int64_t>(voxel_elems, kVoxelsUnroll), kThreads), kThreads, 0, stream>>>(
                points_ptr, f, a.sorted_points, a.starts, a.counts, device_total, cap, rows, static_cast<int32_t>(p),
                voxels.mutable_data_ptr<scalar_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      // 32-bit element indices when the grid-stride loop cannot wrap them (stride < 2^31).
      if (feature_elems <= kMax32) launch_means(uint32_t{0}); else launch_means(uint64_t{0});
      if (voxel_elems <= kMax32) launch_voxels(uint32_t{0}); else launch_voxels(uint64_t{0});
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
  Assigned a = assign_voxels(points, batch, grid, /*cap=*/n, nullptr);  // cap = n: every voxel kept
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
          make_cell_params<cell_t>(grid), a.sorted_points, a.starts, a.counts, nv, reduce, cols,
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
