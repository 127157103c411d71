// Farthest point sampling on CUDA.
//
// Every sample depends on the one before, so the work is a long chain of tiny steps: the cloud
// stays on chip and one launch runs every step, with no host round trip. A group of blocks owns a
// cloud, each block a contiguous slice of it: D = 2, 3 in registers (each thread's first points)
// and shared memory rows [coords..., mind], any D in shared memory rows. One step: each thread
// lowers the mind of its points to their distance to the newest sample and keeps its best (largest
// mind, ties -> smallest index); each warp reduces those with two hardware reductions over an
// ordered key (the mind's bits, then the smallest index among the largest); the warps' bests meet
// in shared memory; a block publishes its best (with coordinates) to a slot that its group reads;
// one group barrier; then the group's best is reduced again from the slots, so every block knows
// the next sample without a second exchange. Slots are double-buffered by step parity, which makes
// one barrier per step enough: a block writes the slots of parity p again only after the next
// barrier, which no block reaches before it has read them.
//
// The step is a chain of dependent latencies, not throughput: 16 x 65536 -> 4096 on an H100 spends
// ~1.4 us a step, of which the pass over a block's points is ~0.5 us. So every reduction is a REDUX
// pair, not a shuffle tree; clusters exchange with st.async on mbarriers instead of cluster.sync()
// (2.13 -> 1.53 us a step, with the unrolled shared-memory tier); and the grid's slots are read by
// one warp per block, not by every warp, behind an arrival count instead of grid.sync() (1 x 2^20
// -> 16384: 13.4 -> 3.4 us a step; 132 blocks x 8 warps each reading all 132 slots put ~0.5M L2
// requests on a few cache lines per step). Timed with this file built alone (a harness kept in the
// repository's history).
//
// Groups, by cloud size:
//  - one block, when the cloud fits one block's shared memory: the barrier is __syncthreads, and
//    every warp reduces the warps' bests itself;
//  - a thread-block cluster of 2..8 blocks (sm_90): slots in every block's shared memory, sent by
//    st.async and awaited on a per-parity mbarrier (send_to_rank below), no cluster barrier;
//  - the whole grid (cooperative launch), one cloud after another, for larger clouds: slots in
//    global memory, a fused arrive-and-wait on an arrival count (arrive_release below). Points past
//    a block's shared memory are read from global memory.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cooperative_groups.h>

#include <algorithm>
#include <limits>
#include <type_traits>

#include "common/cuda_utils.cuh"
#include "neighbors/neighbors.h"

namespace pointops {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarpSize = 32;
constexpr int kMaxClusterBlocks = 8;  // the portable cluster size
// One step's reductions and barriers cost about as much as updating this many points in a block
// (a cluster barrier more than a block's): weighs a group size that runs every cloud in one wave
// against a larger one that needs two, and one block against a cluster.
constexpr int64_t kBlockStepOverheadPoints = 4096;
constexpr int64_t kClusterStepOverheadPoints = 8192;

enum class GroupKind { kBlock, kCluster, kGrid };

// A candidate's order as an unsigned integer: 0 for none, else the bits of its mind plus one (a
// mind is >= 0 or +inf, never -0 or NaN, so its bits order as the values do). A larger key wins,
// then the smaller index.
template <typename acc_t>
using KeyType = std::conditional_t<sizeof(acc_t) == 4, uint32_t, unsigned long long>;

template <typename acc_t>
__device__ __forceinline__ KeyType<acc_t> candidate_key(acc_t mind, int32_t idx) {
  if (idx < 0) return 0;
  if constexpr (sizeof(acc_t) == 4) {
    return __float_as_uint(mind) + 1u;
  } else {
    return static_cast<unsigned long long>(__double_as_longlong(mind)) + 1ull;
  }
}

// A block's best, published to its group: key, index (-1 for none) and, for D = 2, 3, the
// coordinates, so that the next step needs no dependent load (any-D kernels read them from global
// memory).
template <typename acc_t, int D>
struct alignas(16) Slot {  // whole 16-byte words: clusters send it with vector st.async
  KeyType<acc_t> key;
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
  Slot<acc_t, D>* grid_slots;  // kGrid: (2, gridDim.x)
  unsigned long long* grid_arrivals;  // kGrid: one zeroed count
  // kGrid, when slices outgrow shared memory: the mind of row p >= smem_points of block r at
  // [r * overflow_stride + p - smem_points]. Indexed by row, not by point, so that a row's owner
  // thread is the same in every cloud: a point's index moves between blocks with the cloud size.
  acc_t* overflow_mind;
  int64_t overflow_stride;
  int64_t* out;              // (B, max_K)
};

template <typename Key>
__device__ __forceinline__ bool beats(Key key, int32_t idx, Key best_key, int32_t best_idx) {
  // Indices compared unsigned: -1 (none) comes only with key 0 and loses to every index.
  return key > best_key || (key == best_key && static_cast<uint32_t>(idx) < static_cast<uint32_t>(best_idx));
}

// Every lane ends with the warp's largest key and, among the lanes that hold it, the smallest
// index. sm_80+: two or three REDUX instructions instead of a five-level shuffle tree.
template <typename Key>
__device__ __forceinline__ void warp_argmax(Key& key, int32_t& idx) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  Key best;
  if constexpr (sizeof(Key) == 4) {
    best = __reduce_max_sync(kFullMask, key);
  } else {
    const uint32_t hi = __reduce_max_sync(kFullMask, static_cast<uint32_t>(key >> 32));
    const uint32_t lo =
        __reduce_max_sync(kFullMask, static_cast<uint32_t>(key >> 32) == hi ? static_cast<uint32_t>(key) : 0u);
    best = (static_cast<Key>(hi) << 32) | lo;
  }
  idx = static_cast<int32_t>(
      __reduce_min_sync(kFullMask, key == best ? static_cast<uint32_t>(idx) : 0xffffffffu));
  key = best;
#else
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const Key other_key = __shfl_xor_sync(kFullMask, key, offset);
    const int32_t other_idx = __shfl_xor_sync(kFullMask, idx, offset);
    if (beats(other_key, other_idx, key, idx)) {
      key = other_key;
      idx = other_idx;
    }
  }
#endif
}

// The winning slot among the lanes' slots (each lane's is its own best or empty): every lane ends
// with it, coordinates shuffled from a lane that holds it.
template <typename acc_t, int D>
__device__ __forceinline__ Slot<acc_t, D> warp_best_slot(const Slot<acc_t, D>& mine) {
  Slot<acc_t, D> w;
  w.key = mine.key;
  w.idx = mine.idx;
  warp_argmax(w.key, w.idx);
  const unsigned holders = __ballot_sync(kFullMask, mine.key == w.key && mine.idx == w.idx);
  const int source = holders ? __ffs(holders) - 1 : 0;
#pragma unroll
  for (int k = 0; k < (D > 0 ? D : 1); ++k) w.c[k] = __shfl_sync(kFullMask, mine.c[k], source);
  return w;
}

// Grid slots go through L2 only: another SM wrote them, and this SM's L1 may hold an old copy.
template <typename acc_t, int D>
__device__ __forceinline__ Slot<acc_t, D> load_global_slot(const Slot<acc_t, D>* slot) {
  Slot<acc_t, D> c;
  c.key = __ldcg(&slot->key);
  c.idx = __ldcg(&slot->idx);
#pragma unroll
  for (int k = 0; k < D; ++k) c.c[k] = __ldcg(&slot->c[k]);
  return c;
}

template <typename acc_t, int D>
__device__ __forceinline__ void store_global_slot(Slot<acc_t, D>* slot, const Slot<acc_t, D>& c) {
  __stcg(&slot->key, c.key);
  __stcg(&slot->idx, c.idx);
#pragma unroll
  for (int k = 0; k < D; ++k) __stcg(&slot->c[k], c.c[k]);
}

// The grid's barrier, fused with the exchange: each block stores its slot, then adds one to a
// monotonic arrival count with release semantics; a block's reading warp spins with acquire loads
// until the count reaches (steps so far + 1) x blocks, then reads every slot. Cheaper than
// cg::this_grid().sync() (whose block barriers and fences come on top of the same atomic round
// trip), and the count never needs resetting within a launch.
__device__ __forceinline__ void arrive_release(unsigned long long* count) {
  asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(count) : "memory");
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* count) {
  unsigned long long value;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(value) : "l"(count) : "memory");
  return value;
}

// The cluster's exchange (sm_90): each block's best goes to every block of the cluster with
// st.async, whose bytes complete on the receiving block's mbarrier for that step parity; a block
// waits on its own mbarrier only, for the G slots' bytes. No cluster barrier and no fence on the
// critical path (cluster.sync(), whose release waits for the remote stores and whose wait is for
// every thread of every block, took ~30% of each step in the profile). Safe reuse: a block sends
// step s + 2's slot (same parity) only after receiving every block's step s + 1 slot, which each
// sends after its block barrier of step s + 1, which its warps reach only after reading step s's
// slots; and a block re-arms a parity's mbarrier only after waiting on it two steps before.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// This block's one arrival of the phase, expecting `bytes` from the cluster.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase_parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n\t"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_%=;\n\t}" ::"r"(shared_address(bar)),
      "r"(phase_parity)
      : "memory");
}

// `value` (whole 16-byte words) into block `rank`'s copy of `local`, completing on its copy of `bar`.
template <typename T>
__device__ __forceinline__ void send_to_rank(const T& value, T* local, uint64_t* bar, uint32_t rank) {
  static_assert(sizeof(T) % 16 == 0 && alignof(T) >= 16, "st.async sends 16-byte words");
  uint32_t remote, remote_bar;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(local)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote_bar) : "r"(shared_address(bar)), "r"(rank));
  const uint4* words = reinterpret_cast<const uint4*>(&value);
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(T) / 16); ++i) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                     remote + 16 * i),
                 "r"(words[i].x), "r"(words[i].y), "r"(words[i].z), "r"(words[i].w), "r"(remote_bar)
                 : "memory");
  }
}
#endif

// D = 2, 3: each thread keeps its first kRegisterPoints points (coordinates and mind) in registers,
// so that the per-step pass reads no shared memory, whose bandwidth would otherwise bound it (a
// 16-byte row per point and step). Blocks of at most 256 threads leave room for them (up to 255
// registers a thread); the rest of a slice stays in shared memory rows, which also hold every
// point's coordinates for the lookup of a block's best. 44 float32 points (176 registers; 254-255
// in all, no spills) hold a whole slice of the benchmark's 16 x 65536 clouds in clusters of 6
// (10,923 points a block): 5.76 ms against 6.29 ms with 32 points and a shared-memory tier (H100,
// this file built and timed alone). Any D: shared memory only, 8 points a thread.
template <typename acc_t, int D>
struct Tuning {
  static constexpr int kRegisterPoints = D == 0 ? 0 : (sizeof(acc_t) == 4 ? 44 : 16);
  static constexpr int kMaxThreads = D == 0 ? 1024 : 256;
  static constexpr int kPointsPerThread = D == 0 ? 8 : kRegisterPoints;
};

template <typename acc_t, int D, GroupKind kind>
__global__ void __launch_bounds__(Tuning<acc_t, D>::kMaxThreads, 1)
farthest_points_kernel(const FarthestPointArgs<acc_t, D> a) {
  using SlotT = Slot<acc_t, D>;
  using Key = KeyType<acc_t>;
  constexpr Metric kL2 = Metric::kSquaredL2;
  constexpr int R = Tuning<acc_t, D>::kRegisterPoints;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  acc_t* rows = reinterpret_cast<acc_t*>(smem_bytes);
  Row4<acc_t>* rows4 = reinterpret_cast<Row4<acc_t>*>(smem_bytes);
  // Double-buffered by step parity: with one block barrier per step, a fast warp writes the next
  // step's entries while a slow one may still read this step's.
  __shared__ Key warp_keys[2][kWarpSize];
  __shared__ int32_t warp_idx[2][kWarpSize];
  // kCluster: the group's slots (written by every block of the cluster); kGrid: the winner, for
  // the block's other warps.
  __shared__ SlotT block_slots[2][kind == GroupKind::kCluster ? kMaxClusterBlocks : 1];
  __shared__ alignas(8) uint64_t exchange_bars[2];  // kCluster: one mbarrier per step parity

  const int G = a.group_size;
  int rank = 0;
  int64_t first_cloud = blockIdx.x, cloud_stride = gridDim.x;
  if constexpr (kind == GroupKind::kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    rank = static_cast<int>(cg::this_cluster().block_rank());
    first_cloud = blockIdx.x / G;
    cloud_stride = gridDim.x / G;
    if (threadIdx.x == 0) {
      mbarrier_init(&exchange_bars[0], 1);
      mbarrier_init(&exchange_bars[1], 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    // Every block of the cluster runs, its mbarriers initialised, before any writes to its shared memory.
    cg::this_cluster().sync();
#else
    (void)exchange_bars;
    __trap();  // the launcher only clusters code built for sm_90 or newer
#endif
  } else if constexpr (kind == GroupKind::kGrid) {
    rank = blockIdx.x;
    first_cloud = 0;
    cloud_stride = 1;
  }
  const int tid = threadIdx.x, T = blockDim.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int warps = T / kWarpSize;
  const int64_t dim = D > 0 ? D : a.dim;
  const int64_t stride = row_elements<D>(dim);
  acc_t* overflow = a.overflow_mind + rank * a.overflow_stride;  // row p >= smem_points: [p - smem_points]
  acc_t reg_c[R > 0 ? R : 1][D > 0 ? D : 1];  // point tid + k * T of the slice, k < R
  acc_t reg_m[R > 0 ? R : 1];
  int parity = 0;
  unsigned long long grid_steps = 0;  // kGrid: exchanges so far (warp 0)
  [[maybe_unused]] uint32_t exchanges = 0;  // kCluster: exchanges so far

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
        // The best register point is tracked by its slot k, a compile-time constant that each
        // select writes as an immediate, rather than by its index (one register per slot).
        // Increasing k is increasing index: a strict '>' keeps the smallest among equal minds.
        int best_k = -1;
#pragma unroll
        for (int k = 0; k < R; ++k) {
          // fmin equals (d < mind ? d : mind) here: no -0, and NaN (only from non-finite points,
          // whose mind is -1) never lowers.
          reg_m[k] = ::fmin(point_distance<D, kL2>(reg_c[k], sel), reg_m[k]);  // (candidate, sample), as on the CPU
          if (reg_m[k] > best_m) {
            best_m = reg_m[k];
            best_k = k;
          }
        }
        best_p = best_k < 0 ? -1 : tid + best_k * T;
        int32_t p = first_rest;
        if constexpr (D > 0) {
          // Four rows' loads in flight before the first use: one at a time, this loop waited on
          // each shared-memory load (~27% of a step's stall samples at 16 x 65536).
          constexpr int kUnroll = 4;
          for (; p + (kUnroll - 1) * T < in_smem; p += kUnroll * T) {
            Row4<acc_t> r[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) r[u] = rows4[p + u * T];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
              const acc_t d = point_distance<D, kL2>(r[u].v, sel);
              acc_t mind = r[u].v[D];
              if (d < mind) {
                mind = d;
                rows[(p + u * T) * stride + D] = d;
              }
              consider(mind, p + u * T);
            }
          }
        }
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

      // The warp's best, then the block's, then the group's.
      Key key = candidate_key(best_m, best_p);
      int32_t idx = best_p < 0 ? -1 : begin + best_p;
      warp_argmax(key, idx);
      // The coordinates of a point of this block's slice: shared memory rows hold those of
      // register points too; past them (grid overflow) global memory.
      auto fill_coordinates = [&](SlotT& c) {
        if constexpr (D > 0) {
          const int32_t local = c.idx - begin;
#pragma unroll
          for (int k = 0; k < D; ++k) {
            c.c[k] = c.idx < 0          ? acc_t(0)
                     : local < in_smem ? rows[local * stride + k]
                                       : cloud[static_cast<int64_t>(c.idx) * D + k];
          }
        }
      };
      if (lane == 0) {
        warp_keys[parity][warp] = key;
        warp_idx[parity][warp] = idx;
      }
      __syncthreads();
      auto block_best = [&]() {
        SlotT c;
        c.key = lane < warps ? warp_keys[parity][lane] : Key(0);
        c.idx = lane < warps ? warp_idx[parity][lane] : -1;
        warp_argmax(c.key, c.idx);
        fill_coordinates(c);
        return c;
      };
      SlotT winner;
      if constexpr (kind == GroupKind::kBlock) {
        winner = block_best();  // every warp: no second barrier
      } else if constexpr (kind == GroupKind::kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (warp == 0) {
          const SlotT c = block_best();
          if (lane == 0) mbarrier_arrive_expect_tx(&exchange_bars[parity], G * static_cast<uint32_t>(sizeof(SlotT)));
          if (lane < G) send_to_rank(c, &block_slots[parity][rank], &exchange_bars[parity], lane);
        }
        // The k-th use of a parity's mbarrier completes its phase k.
        mbarrier_wait(&exchange_bars[parity], static_cast<uint32_t>(exchanges >> 1) & 1u);
        ++exchanges;
        SlotT mine;
        if (lane < G) {
          mine = block_slots[parity][lane];
        } else {
          mine.key = 0;
          mine.idx = -1;
#pragma unroll
          for (int k = 0; k < (D > 0 ? D : 1); ++k) mine.c[k] = acc_t(0);
        }
        winner = warp_best_slot(mine);  // every warp reads the slots
#else
        winner = block_best();  // never runs: compiled for a GPU without clusters, the kernel traps first
#endif
      } else {
        // One warp per block publishes, waits for the group and reads the G slots; the block's
        // other warps wait at the block barrier.
        if (warp == 0) {
          const SlotT c = block_best();
          if (lane == 0) {
            store_global_slot(a.grid_slots + parity * G + rank, c);
            arrive_release(a.grid_arrivals);
          }
          ++grid_steps;
          const unsigned long long everyone = grid_steps * static_cast<unsigned long long>(G);
          while (load_acquire(a.grid_arrivals) < everyone) {
          }
          SlotT mine;
          mine.key = 0;
          mine.idx = -1;
#pragma unroll
          for (int k = 0; k < (D > 0 ? D : 1); ++k) mine.c[k] = acc_t(0);
#pragma unroll 4
          for (int j = lane; j < G; j += kWarpSize) {
            const SlotT other = load_global_slot(a.grid_slots + parity * G + j);
            if (beats(other.key, other.idx, mine.key, mine.idx)) mine = other;
          }
          const SlotT w = warp_best_slot(mine);
          if (lane == 0) block_slots[parity][0] = w;
        }
        __syncthreads();
        winner = block_slots[parity][0];
      }
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
    __syncthreads();  // the last step's coordinate reads before the next cloud's rows are written
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
  using SlotT = Slot<acc_t, D>;
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
  const auto grid_slots = at::empty({static_cast<int64_t>(2 * blocks * sizeof(SlotT))}, options.dtype(at::kByte));
  const auto grid_arrivals = at::zeros({1}, options.dtype(at::kLong));
  at::Tensor overflow_mind;
  if (slice > smem_points) {
    a.overflow_stride = slice - smem_points;
    overflow_mind = at::empty({blocks * a.overflow_stride}, options.dtype(c10::CppTypeToScalarType<acc_t>::value));
  }
  a.group_size = static_cast<int>(blocks);
  a.smem_points = static_cast<int>(smem_points);
  a.grid_slots = reinterpret_cast<SlotT*>(grid_slots.data_ptr<uint8_t>());
  a.grid_arrivals = reinterpret_cast<unsigned long long*>(grid_arrivals.data_ptr<int64_t>());
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
