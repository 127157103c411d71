// Farthest point sampling on CUDA.
//
// Every sample depends on the one before, so the work is a long chain of tiny steps: the cloud
// stays on chip and one launch runs every step, with no host round trip. A group of blocks owns a
// cloud, each block a contiguous slice of it: D = 2, 3 in registers (each thread's first points)
// and shared memory rows [coords..., mind], any D in shared memory rows. One step: each thread
// lowers the mind of its points to their distance to the newest sample and keeps its best (largest
// mind, ties -> smallest index); warps, then the block, reduce those; the block publishes its best
// (with coordinates) to a slot that every block of the group reads; one group barrier; then every
// block reduces the slots itself, so all of them know the next sample without a second exchange.
// Slots are double-buffered by step parity, which makes one barrier per step enough: a block
// writes the slots of parity p again only after the next barrier, which no block reaches before it
// has read them.
//
// Groups, by cloud size:
//  - one block, when the cloud fits one block's shared memory: the barrier is __syncthreads;
//  - a thread-block cluster of 2..8 blocks (sm_90): slots in every block's shared memory, written
//    through distributed shared memory; cluster.sync();
//  - the whole grid (cooperative launch), one cloud after another, for larger clouds: slots in
//    global memory; grid.sync(). Points past a block's shared memory are read from global memory.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <limits>

#include "common/cuda_utils.cuh"
#include "neighbors/neighbors.h"

namespace pointops {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
// One step's reductions and barriers cost about as much as updating this many points in a block
// (a cluster barrier more than a block's): weighs a group size that runs every cloud in one wave
// against a larger one that needs two, and one block against a cluster.
constexpr int64_t kBlockStepOverheadPoints = 4096;
constexpr int64_t kClusterStepOverheadPoints = 8192;

enum class GroupKind { kBlock, kCluster, kGrid };

// The best point for the next sample: largest mind, then smallest index; idx -1 when there is none.
// D = 2, 3 carry the coordinates, so the next step needs no dependent load; any-D kernels read
// them from global memory.
template <typename acc_t, int D>
struct Candidate {
  acc_t mind;
  int32_t idx;
  acc_t c[D > 0 ? D : 1];
};

// A shared-memory row of D = 2, 3: [coords, mind, padding], 16 bytes in float32 (32 in float64),
// aligned for vector loads.
template <typename acc_t>
struct alignas(16) Row4 {
  acc_t v[4];
};

// Elements per shared-memory row; mind is element `dim`. Any D: an odd stride, so that the rows a
// warp reads fall in distinct banks.
template <int D>
__host__ __device__ inline int64_t row_elements(int64_t dim) {
  return D > 0 ? 4 : ((dim + 1) | 1);
}

template <typename acc_t, int D>
struct FarthestPointArgs {
  const acc_t* points;       // (B, N, dim), contiguous
  const int64_t* lengths;    // (B,) or nullptr
  const int64_t* K;          // (B,) or nullptr
  const int64_t* start_idx;  // (B,) or nullptr
  int64_t B, N, dim, max_K;
  int group_size;            // blocks per cloud (kGrid: the whole grid)
  int smem_points;           // rows of a block's shared memory
  Candidate<acc_t, D>* grid_slots;  // kGrid: (2, gridDim.x)
  // kGrid, when slices outgrow shared memory: the mind of row p >= smem_points of block r at
  // [r * overflow_stride + p - smem_points]. Indexed by row, not by point, so that a row's owner
  // thread is the same in every cloud: a point's index moves between blocks with the cloud size.
  acc_t* overflow_mind;
  int64_t overflow_stride;
  int64_t* out;              // (B, max_K)
};

template <typename acc_t>
__device__ __forceinline__ bool beats(acc_t m, int32_t i, acc_t best_m, int32_t best_i) {
  return m > best_m || (m == best_m && i < best_i);
}

// Every lane ends with the best (mind, index) of its aligned group of `width` lanes (a power of two).
template <typename acc_t>
__device__ __forceinline__ void warp_best(acc_t& m, int32_t& i, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    const acc_t other_m = __shfl_xor_sync(kFullMask, m, offset);
    const int32_t other_i = __shfl_xor_sync(kFullMask, i, offset);
    if (beats(other_m, other_i, m, i)) {
      m = other_m;
      i = other_i;
    }
  }
}

// The same over aligned groups of `width` lanes (a power of two), coordinates included.
template <typename acc_t, int D>
__device__ __forceinline__ void warp_best(Candidate<acc_t, D>& c, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) {
    Candidate<acc_t, D> other;
    other.mind = __shfl_xor_sync(kFullMask, c.mind, offset);
    other.idx = __shfl_xor_sync(kFullMask, c.idx, offset);
#pragma unroll
    for (int k = 0; k < D; ++k) other.c[k] = __shfl_xor_sync(kFullMask, c.c[k], offset);
    if (beats(other.mind, other.idx, c.mind, c.idx)) c = other;
  }
}

// Grid slots go through L2 only: another SM wrote them, and this SM's L1 may hold an old copy.
template <typename acc_t, int D>
__device__ __forceinline__ Candidate<acc_t, D> load_global_slot(const Candidate<acc_t, D>* slot) {
  Candidate<acc_t, D> c;
  c.mind = __ldcg(&slot->mind);
  c.idx = __ldcg(&slot->idx);
#pragma unroll
  for (int k = 0; k < D; ++k) c.c[k] = __ldcg(&slot->c[k]);
  return c;
}

template <typename acc_t, int D>
__device__ __forceinline__ void store_global_slot(Candidate<acc_t, D>* slot, const Candidate<acc_t, D>& c) {
  __stcg(&slot->mind, c.mind);
  __stcg(&slot->idx, c.idx);
#pragma unroll
  for (int k = 0; k < D; ++k) __stcg(&slot->c[k], c.c[k]);
}

template <GroupKind kind>
__device__ __forceinline__ void group_sync() {
  if constexpr (kind == GroupKind::kBlock) {
    __syncthreads();
  } else if constexpr (kind == GroupKind::kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cg::this_cluster().sync();
#endif
  } else {
    cg::this_grid().sync();
  }
}

// D = 2, 3: each thread keeps its first kRegisterPoints points (coordinates and mind) in registers,
// so that the per-step pass reads no shared memory, whose bandwidth would otherwise bound it (a
// 16-byte row per point and step). Blocks of at most 256 threads leave room for them (up to 255
// registers a thread); the rest of a slice stays in shared memory rows, which also hold every
// point's coordinates for the lookup of a block's best. Any D: shared memory only, 8 points a thread.
template <typename acc_t, int D>
struct Tuning {
  static constexpr int kRegisterPoints = D == 0 ? 0 : (sizeof(acc_t) == 4 ? 32 : 16);
  static constexpr int kMaxThreads = D == 0 ? 1024 : 256;
  static constexpr int kPointsPerThread = D == 0 ? 8 : kRegisterPoints;
};

template <typename acc_t, int D, GroupKind kind>
__global__ void __launch_bounds__(Tuning<acc_t, D>::kMaxThreads, 1)
farthest_points_kernel(const FarthestPointArgs<acc_t, D> a) {
  using Cand = Candidate<acc_t, D>;
  constexpr Metric kL2 = Metric::kSquaredL2;
  constexpr int R = Tuning<acc_t, D>::kRegisterPoints;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  acc_t* rows = reinterpret_cast<acc_t*>(smem_bytes);
  Row4<acc_t>* rows4 = reinterpret_cast<Row4<acc_t>*>(smem_bytes);
  __shared__ acc_t warp_mind[kWarpSize];
  __shared__ int32_t warp_idx[kWarpSize];
  __shared__ Cand block_slots[2][kind == GroupKind::kGrid ? 1 : kMaxClusterBlocks];

  const int G = a.group_size;
  int rank = 0;
  int64_t first_cloud = blockIdx.x, cloud_stride = gridDim.x;
  if constexpr (kind == GroupKind::kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    rank = static_cast<int>(cg::this_cluster().block_rank());
    first_cloud = blockIdx.x / G;
    cloud_stride = gridDim.x / G;
    cg::this_cluster().sync();  // every block of the cluster runs before any writes to its shared memory
#else
    __trap();  // the launcher only clusters code built for sm_90 or newer
#endif
  } else if constexpr (kind == GroupKind::kGrid) {
    rank = blockIdx.x;
    first_cloud = 0;
    cloud_stride = 1;
  }
  const int tid = threadIdx.x, T = blockDim.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int warps = T / kWarpSize;
  int slots_width = 1;  // lanes that reduce the G slots together
  while (slots_width < G && slots_width < kWarpSize) slots_width *= 2;
  const int64_t dim = D > 0 ? D : a.dim;
  const int64_t stride = row_elements<D>(dim);
  acc_t* overflow = a.overflow_mind + rank * a.overflow_stride;  // row p >= smem_points: [p - smem_points]
  acc_t reg_c[R > 0 ? R : 1][D > 0 ? D : 1];  // point tid + k * T of the slice, k < R
  acc_t reg_m[R > 0 ? R : 1];
  int parity = 0;

  for (int64_t b = first_cloud; b < a.B; b += cloud_stride) {
    const int64_t n = a.lengths ? a.lengths[b] : a.N;
    const int64_t samples = n == 0 ? 0 : (a.K ? min(max(a.K[b], int64_t(0)), a.max_K) : a.max_K);
    const int64_t start = a.start_idx && n > 0 ? ((a.start_idx[b] % n) + n) % n : 0;
    const int64_t slice_len = ceil_div<int64_t>(n, G);
    const int64_t begin64 = min(rank * slice_len, n);
    const int32_t begin = static_cast<int32_t>(begin64);
    const int32_t count = static_cast<int32_t>(min(slice_len, n - begin64));
    const int32_t in_smem = min(count, a.smem_points);
    const int32_t in_registers = min(R * T, in_smem);
    // This thread's first point past the registers; then shared memory rows, then global memory.
    const int32_t first_rest = tid + (in_registers > tid ? ceil_div(in_registers - tid, T) * T : 0);
    const acc_t* cloud = a.points + b * a.N * dim;
    int64_t* out = a.out + b * a.max_K;

    // A row is written only by the thread that owns its point (point p: thread p % T), and read
    // by others only after a barrier: no barrier needed before the steps.
    for (int32_t p = tid; p < count; p += T) {
      const acc_t* q = cloud + static_cast<int64_t>(begin + p) * dim;
      bool finite = true;
      for (int64_t k = 0; k < dim; ++k) finite = finite && isfinite(q[k]);
      const acc_t mind = finite ? std::numeric_limits<acc_t>::infinity() : acc_t(-1);
      if (p >= in_smem) {
        overflow[p - a.smem_points] = mind;
      } else if constexpr (D > 0) {
        Row4<acc_t> r{};
#pragma unroll
        for (int k = 0; k < D; ++k) r.v[k] = q[k];
        r.v[D] = mind;
        rows4[p] = r;
      } else {
        acc_t* row = rows + p * stride;
        for (int64_t k = 0; k < dim; ++k) row[k] = q[k];
        row[dim] = mind;
      }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {  // slots past the slice: mind -1, never a candidate
      const int32_t p = tid + k * T;
      Row4<acc_t> r{};
      r.v[D] = acc_t(-1);
      if (p < in_registers) r = rows4[p];
#pragma unroll
      for (int c = 0; c < D; ++c) reg_c[k][c] = r.v[c];
      reg_m[k] = r.v[D];
    }

    acc_t sel[D > 0 ? D : 1] = {};  // the newest sample (D = 2, 3)
    const acc_t* sel_point = cloud;  // the newest sample (any D)
    int64_t taken = 0;
    for (; taken < samples; ++taken) {
      // This thread's best: visited in increasing index order, so a strict '>' keeps the smallest
      // index among equal minds.
      acc_t best_m = -1;
      int32_t best_p = -1;
      auto consider = [&](acc_t m, int32_t p) {
        if (m > best_m) {
          best_m = m;
          best_p = p;
        }
      };
      if (taken == 0) {
        // The start is the first finite point at or after `start`, cyclically: the largest of
        // 2 (at or after it) or 1 (before it), ties -> smallest index.
        auto start_value = [&](acc_t mind, int32_t p) {
          return mind < 0 ? acc_t(-1) : (begin + p >= start ? acc_t(2) : acc_t(1));
        };
#pragma unroll
        for (int k = 0; k < R; ++k) consider(start_value(reg_m[k], tid + k * T), tid + k * T);
        int32_t p = first_rest;
        for (; p < in_smem; p += T) consider(start_value(rows[p * stride + dim], p), p);
        for (; p < count; p += T) consider(start_value(overflow[p - a.smem_points], p), p);
      } else {
#pragma unroll
        for (int k = 0; k < R; ++k) {
          // fmin equals (d < mind ? d : mind) here: no -0, and NaN (only from non-finite points,
          // whose mind is -1) never lowers.
          reg_m[k] = ::fmin(point_distance<D, kL2>(reg_c[k], sel), reg_m[k]);  // (candidate, sample), as on the CPU
          consider(reg_m[k], tid + k * T);
        }
        int32_t p = first_rest;
        for (; p < in_smem; p += T) {
          acc_t d, mind;
          if constexpr (D > 0) {
            const Row4<acc_t> r = rows4[p];
            d = point_distance<D, kL2>(r.v, sel);
            mind = r.v[D];
          } else {
            d = point_distance_dynamic<kL2>(rows + p * stride, sel_point, dim);
            mind = rows[p * stride + dim];
          }
          if (d < mind) {  // stores only where the mind drops: shared-memory bandwidth
            mind = d;
            rows[p * stride + dim] = d;
          }
          consider(mind, p);
        }
        for (; p < count; p += T) {  // past shared memory (grid groups only)
          const acc_t d = point_distance_any<D, kL2>(cloud + static_cast<int64_t>(begin + p) * dim,
                                                     D > 0 ? sel : sel_point, dim);
          acc_t mind = overflow[p - a.smem_points];
          if (d < mind) {
            mind = d;
            overflow[p - a.smem_points] = d;
          }
          consider(mind, p);
        }
      }

      // The block's best, then its slot in every block of the group.
      int32_t best_i = best_p < 0 ? -1 : begin + best_p;
      warp_best(best_m, best_i, kWarpSize);
      if (lane == 0) {
        warp_mind[warp] = best_m;
        warp_idx[warp] = best_i;
      }
      __syncthreads();
      if (warp == 0) {
        Cand c;
        c.mind = lane < warps ? warp_mind[lane] : acc_t(-1);
        c.idx = lane < warps ? warp_idx[lane] : -1;
        warp_best(c.mind, c.idx, kWarpSize);  // every lane: lanes 0..G-1 publish it
        if constexpr (D > 0) {  // shared memory rows hold the coordinates of register points too
          const int32_t local = c.idx - begin;
#pragma unroll
          for (int k = 0; k < D; ++k) {
            c.c[k] = c.idx < 0          ? acc_t(0)
                     : local < in_smem ? rows[local * stride + k]
                                       : cloud[static_cast<int64_t>(c.idx) * D + k];
          }
        }
        if constexpr (kind == GroupKind::kBlock) {
          if (lane == 0) block_slots[parity][0] = c;
        } else if constexpr (kind == GroupKind::kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
          if (lane < G) *cg::this_cluster().map_shared_rank(&block_slots[parity][rank], lane) = c;
#endif
        } else {
          if (lane == 0) store_global_slot(a.grid_slots + parity * G + rank, c);
        }
      }
      group_sync<kind>();

      // Every warp reduces the group's slots: the same winner everywhere.
      Cand winner;
      winner.mind = acc_t(-1);
      winner.idx = -1;
#pragma unroll
      for (int k = 0; k < D; ++k) winner.c[k] = acc_t(0);
      for (int j = lane % slots_width; j < G; j += slots_width) {
        const Cand s =
            kind == GroupKind::kGrid ? load_global_slot(a.grid_slots + parity * G + j) : block_slots[parity][j];
        if (beats(s.mind, s.idx, winner.mind, winner.idx)) winner = s;
      }
      warp_best(winner, slots_width);
      parity ^= 1;
      if (winner.idx < 0) break;  // every finite point is taken

      if (rank == 0 && tid == 0) out[taken] = winner.idx;
      const int32_t local = winner.idx - begin;  // its owner marks it taken
      if (local >= 0 && local < count && local % T == tid) {
        if (local < in_registers) {
          // Compares with each slot's point rather than indexing reg_m[local / T]: a run-time
          // index would move reg_m to local memory.
#pragma unroll
          for (int k = 0; k < R; ++k) reg_m[k] = tid + k * T == local ? acc_t(-1) : reg_m[k];
        } else if (local < in_smem) {
          rows[local * stride + dim] = acc_t(-1);
        } else {
          overflow[local - a.smem_points] = acc_t(-1);
        }
      }
      if constexpr (D > 0) {
#pragma unroll
        for (int k = 0; k < D; ++k) sel[k] = winner.c[k];
      } else {
        sel_point = cloud + static_cast<int64_t>(winner.idx) * dim;
      }
    }
    if (rank == 0) {
      for (int64_t t = taken + tid; t < a.max_K; t += T) out[t] = -1;
    }
  }
}

// Threads for a block of `points` points: about kPointsPerThread each, whole warps.
template <typename acc_t, int D>
int threads_for(int64_t points) {
  using Tune = Tuning<acc_t, D>;
  const int64_t warps =
      ceil_div<int64_t>(ceil_div<int64_t>(std::max<int64_t>(points, 1), Tune::kPointsPerThread), kWarpSize);
  return static_cast<int>(std::min<int64_t>(warps, Tune::kMaxThreads / kWarpSize) * kWarpSize);
}

int device_attribute(cudaDeviceAttr attribute, int device) {
  int value = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

// Rows of shared memory one block of `kernel` can hold, with its dynamic shared memory limit raised
// to match (the same value on every call, so concurrent callers cannot undo each other).
template <typename Kernel>
int64_t raise_shared_capacity(Kernel kernel, int64_t row_bytes, int optin_bytes, cudaFuncAttributes& attributes) {
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const int64_t dynamic_bytes = optin_bytes - static_cast<int64_t>(attributes.sharedSizeBytes);
  C10_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_bytes)));
  return dynamic_bytes / row_bytes;
}

// Blocks per cloud for clouds of N points: 1 (when `block_fits`) or a cluster size, whichever
// finishes the B clouds first, counting waves of co-resident groups and the points each block
// updates per step; 0 when neither fits.
template <typename acc_t, int D, typename BlockKernel, typename ClusterKernel>
int choose_group_size(BlockKernel block_kernel, bool block_fits, ClusterKernel cluster_kernel, int64_t cluster_capacity,
                      int64_t B, int64_t N, int64_t row_bytes) {
  int best_size = 0;
  double best_cost = std::numeric_limits<double>::infinity();
  auto consider = [&](int G, int64_t active_groups, int64_t overhead) {
    if (active_groups < 1) return;
    const double cost = static_cast<double>(ceil_div(B, active_groups)) * (overhead + ceil_div<int64_t>(N, G));
    if (cost < best_cost) {
      best_cost = cost;
      best_size = G;
    }
  };
  if (block_fits) {
    int blocks_per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks_per_sm, block_kernel, threads_for<acc_t, D>(N), static_cast<size_t>(N * row_bytes)));
    consider(1, static_cast<int64_t>(blocks_per_sm) * multiprocessor_count(), kBlockStepOverheadPoints);
  }
  const int smallest = static_cast<int>(std::max<int64_t>(2, ceil_div(N, std::max<int64_t>(cluster_capacity, 1))));
  for (int G = smallest; G <= kMaxClusterBlocks; ++G) {
    const int64_t slice = ceil_div<int64_t>(N, G);
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = G;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(G);
    config.blockDim = dim3(threads_for<acc_t, D>(slice));
    config.dynamicSmemBytes = static_cast<size_t>(slice * row_bytes);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int active = 0;
    if (cudaOccupancyMaxActiveClusters(&active, cluster_kernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // an unsupported size: not a candidate
      active = 0;
    }
    consider(G, active, kClusterStepOverheadPoints);
  }
  return best_size;
}

template <typename acc_t, int D>
void launch_farthest_points(FarthestPointArgs<acc_t, D> a, const at::TensorOptions& options) {
  using Cand = Candidate<acc_t, D>;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int device = c10::cuda::current_device();
  const int optin_bytes = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  const int64_t row_bytes = row_elements<D>(a.dim) * static_cast<int64_t>(sizeof(acc_t));
  const int64_t B = a.B, N = a.N;
  cudaFuncAttributes attributes;

  const auto block_kernel = farthest_points_kernel<acc_t, D, GroupKind::kBlock>;
  const bool block_fits = N <= raise_shared_capacity(block_kernel, row_bytes, optin_bytes, attributes);
  int G = block_fits ? 1 : 0;
  // Clusters need sm_90 hardware and kernel code compiled for it (PTX of an older target, JIT
  // compiled on an H100, has the cluster code compiled out).
  const auto cluster_kernel = farthest_points_kernel<acc_t, D, GroupKind::kCluster>;
  if (device_attribute(cudaDevAttrComputeCapabilityMajor, device) >= 9) {
    const int64_t capacity = raise_shared_capacity(cluster_kernel, row_bytes, optin_bytes, attributes);
    if (attributes.ptxVersion >= 90 && N <= kMaxClusterBlocks * capacity) {
      G = choose_group_size<acc_t, D>(block_kernel, block_fits, cluster_kernel, capacity, B, N, row_bytes);
    }
  }
  if (G == 1) {
    a.group_size = 1;
    a.smem_points = static_cast<int>(N);
    const int64_t blocks = std::min<int64_t>(B, std::numeric_limits<int32_t>::max());
    const int threads = threads_for<acc_t, D>(N);
    block_kernel<<<static_cast<unsigned>(blocks), threads, static_cast<size_t>(N * row_bytes), stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  if (G > 1) {
    const int64_t slice = ceil_div<int64_t>(N, G);
    a.group_size = G;
    a.smem_points = static_cast<int>(slice);
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = G;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.gridDim = dim3(static_cast<unsigned>(G * std::min<int64_t>(B, std::numeric_limits<int32_t>::max() / G)));
    config.blockDim = dim3(threads_for<acc_t, D>(slice));
    config.dynamicSmemBytes = static_cast<size_t>(slice * row_bytes);
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    C10_CUDA_CHECK(cudaLaunchKernelEx(&config, cluster_kernel, a));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }

  // The whole grid on one cloud at a time: one block per SM, all co-resident.
  TORCH_CHECK(device_attribute(cudaDevAttrCooperativeLaunch, device) != 0,
              "sample_farthest_points: clouds of ", N, " points need cooperative launches, which this GPU lacks");
  const auto grid_kernel = farthest_points_kernel<acc_t, D, GroupKind::kGrid>;
  const int64_t capacity = raise_shared_capacity(grid_kernel, row_bytes, optin_bytes, attributes);
  const int64_t blocks = std::min<int64_t>(multiprocessor_count(), N);
  const int64_t slice = ceil_div<int64_t>(N, blocks);
  const int64_t smem_points = std::min(slice, capacity);
  const int threads = threads_for<acc_t, D>(slice);
  const size_t smem_bytes = static_cast<size_t>(smem_points * row_bytes);
  int blocks_per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, grid_kernel, threads, smem_bytes));
  TORCH_CHECK(blocks_per_sm >= 1, "sample_farthest_points: a block of ", threads, " threads with ", smem_bytes,
              " bytes of shared memory does not fit an SM");
  const auto grid_slots = at::empty({static_cast<int64_t>(2 * blocks * sizeof(Cand))}, options.dtype(at::kByte));
  at::Tensor overflow_mind;
  if (slice > smem_points) {
    a.overflow_stride = slice - smem_points;
    overflow_mind = at::empty({blocks * a.overflow_stride}, options.dtype(c10::CppTypeToScalarType<acc_t>::value));
  }
  a.group_size = static_cast<int>(blocks);
  a.smem_points = static_cast<int>(smem_points);
  a.grid_slots = reinterpret_cast<Cand*>(grid_slots.data_ptr<uint8_t>());
  a.overflow_mind = overflow_mind.defined() ? overflow_mind.data_ptr<acc_t>() : nullptr;
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, grid_kernel, a));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor sample_farthest_points_cuda(const at::Tensor& points, const c10::optional<at::Tensor>& lengths,
                                       const c10::optional<at::Tensor>& K, int64_t max_K,
                                       const c10::optional<at::Tensor>& start_idx) {
  const auto [lengths_checked, K_checked, start_checked] =
      check_farthest_point_inputs(points, lengths, K, max_K, start_idx);
  const c10::cuda::CUDAGuard guard(points.device());
  const int64_t B = points.size(0), N = points.size(1), dim = points.size(2);
  auto idx = at::empty({B, max_K}, points.options().dtype(at::kLong));
  if (idx.numel() == 0) return idx;
  if (N == 0) return idx.fill_(-1);
  // Half types compute in float32: converted once (exactly).
  const auto compute_type = points.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const auto cloud = points.to(compute_type).contiguous();
  AT_DISPATCH_FLOATING_TYPES(compute_type, "sample_farthest_points_cuda", [&] {
    using acc_t = scalar_t;
    dispatch_dim(dim, [&](auto dim_tag) {
      constexpr int D = decltype(dim_tag)::value;
      FarthestPointArgs<acc_t, D> a{};
      a.points = cloud.data_ptr<acc_t>();
      a.lengths = lengths_checked.defined() ? lengths_checked.data_ptr<int64_t>() : nullptr;
      a.K = K_checked.defined() ? K_checked.data_ptr<int64_t>() : nullptr;
      a.start_idx = start_checked.defined() ? start_checked.data_ptr<int64_t>() : nullptr;
      a.B = B;
      a.N = N;
      a.dim = dim;
      a.max_K = max_K;
      a.out = idx.data_ptr<int64_t>();
      launch_farthest_points<acc_t, D>(a, cloud.options());
    });
  });
  return idx;
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("sample_farthest_points", &sample_farthest_points_cuda); }

}  // namespace pointops
