// A single-pass block-tiled exclusive scan with decoupled look-back (Merrill & Garland, 2016), for
// kernels that consume each item's prefix in the same pass that computes it.
//
// Why not cub::DeviceScan: cub's scan is two launches (tile-state init + scan) plus host-side
// dispatch queries on every call, and its output is an array that a further kernel has to read
// back. Here the tile states live in scratch that the caller clears with a memset it already
// issues, and the kernel that scans also uses the prefixes: one launch.
//
// What is scanned: a pair of non-negative counters packed into one uint64 (high 32 bits, low 32
// bits), so two prefix sums cost one scan. Every total must stay below 2^31 (callers: <= 2^30
// points), which keeps the two halves from carrying into each other.
//
// Usage, inside a kernel launched with one block per tile and blockDim.x == kThreads:
//   __shared__ LookbackScanStorage<kThreads> storage;
//   const uint32_t tile = claim_tile(tile_counter, storage);      // 0, 1, 2, ... in claim order
//   uint64_t block_total;
//   const uint64_t before_me = block_exclusive_scan<kThreads>(my_sum, storage, &block_total);
//   const uint64_t before_tile = tile_exclusive_prefix<kThreads>(tile_states, tile, block_total, storage);
//   // item prefix = before_tile + before_me + (my earlier items)
// tile_counter (one uint32) and tile_states (one uint64 per tile) must be all-ones (0xFF bytes)
// before the launch.
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "common/cuda_utils.cuh"

namespace pointops {

template <int kThreads>
struct LookbackScanStorage {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  uint64_t warp_totals[kThreads / 32];
  uint64_t tile_prefix;
  uint32_t tile;
};

namespace lookback_detail {

// A tile's state word: 2 status bits, then the two 31-bit halves of its value.
constexpr uint64_t kInvalid = 3;    // all-ones: what the caller's 0xFF memset leaves
constexpr uint64_t kAggregate = 1;  // the value is the tile's own sum
constexpr uint64_t kPrefix = 2;     // the value is the sum of every tile up to and including it
constexpr uint64_t kHalfMask = 0x7fffffffull;

__device__ __forceinline__ uint64_t encode(uint64_t status, uint64_t pair) {
  return (status << 62) | (((pair >> 32) & kHalfMask) << 31) | (pair & kHalfMask);
}
__device__ __forceinline__ uint64_t status_of(uint64_t state) { return state >> 62; }
__device__ __forceinline__ uint64_t value_of(uint64_t state) {
  return (((state >> 31) & kHalfMask) << 32) | (state & kHalfMask);
}

using StateRef = cuda::atomic_ref<unsigned long long, cuda::thread_scope_device>;

__device__ __forceinline__ unsigned long long load_state(uint64_t* states, int64_t index) {
  return StateRef(*reinterpret_cast<unsigned long long*>(states + index)).load(cuda::memory_order_relaxed);
}
__device__ __forceinline__ void store_state(uint64_t* states, int64_t index, uint64_t value) {
  StateRef(*reinterpret_cast<unsigned long long*>(states + index)).store(value, cuda::memory_order_relaxed);
}

}  // namespace lookback_detail

// Tiles are numbered in the order blocks claim them, not by blockIdx: a tile only ever waits for
// tiles claimed before it, whose blocks are already running, so the look-back cannot deadlock
// whatever order the hardware schedules blocks in. The counter starts at all-ones, so the first
// claim returns 0.
template <int kThreads>
__device__ __forceinline__ uint32_t claim_tile(uint32_t* tile_counter, LookbackScanStorage<kThreads>& storage) {
  if (threadIdx.x == 0) storage.tile = atomicAdd(tile_counter, 1u) + 1u;
  __syncthreads();
  return storage.tile;
}

// The exclusive prefix of `value` over the block's threads (in threadIdx order); *block_total gets
// the sum over the whole block. Every thread of the block must call it.
template <int kThreads>
__device__ __forceinline__ uint64_t block_exclusive_scan(uint64_t value, LookbackScanStorage<kThreads>& storage,
                                                         uint64_t* block_total) {
  using namespace lookback_detail;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint64_t inclusive = warp_inclusive_sum(value);
  if (lane == 31) storage.warp_totals[warp] = inclusive;
  __syncthreads();
  uint64_t before_warp = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) {
    const uint64_t t = storage.warp_totals[w];
    if (w < warp) before_warp += t;
    total += t;
  }
  *block_total = total;
  return before_warp + inclusive - value;
}

// The sum of every tile before `tile`. Publishes this tile's aggregate at once (so later tiles
// need not wait for this one's look-back), then walks back 32 predecessors at a time, one per lane
// of warp 0, until it meets a tile that has published its inclusive prefix; then publishes its
// own. Every thread of the block must call it; the result is returned to all of them.
template <int kThreads>
__device__ __forceinline__ uint64_t tile_exclusive_prefix(uint64_t* tile_states, uint32_t tile, uint64_t tile_total,
                                                          LookbackScanStorage<kThreads>& storage) {
  using namespace lookback_detail;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    uint64_t exclusive = 0;
    if (tile == 0) {
      if (lane == 0) store_state(tile_states, 0, encode(kPrefix, tile_total));
    } else {
      if (lane == 0) store_state(tile_states, tile, encode(kAggregate, tile_total));
      int64_t window_end = static_cast<int64_t>(tile) - 1;
      while (true) {
        const int64_t index = window_end - lane;
        // Before tile 0 there is nothing: read as an inclusive prefix of 0, which ends the walk.
        uint64_t state = index >= 0 ? load_state(tile_states, index) : encode(kPrefix, 0);
        while (status_of(state) == kInvalid) state = load_state(tile_states, index);
        const unsigned prefix_lanes = __ballot_sync(kFullMask, status_of(state) == kPrefix);
        // Lane 0 is the nearest predecessor: sum the lanes up to the nearest inclusive prefix.
        const int last = prefix_lanes ? __ffs(prefix_lanes) - 1 : 31;
        exclusive += warp_sum<uint64_t>(lane <= last ? value_of(state) : 0);
        if (prefix_lanes) break;
        window_end -= 32;
      }
      if (lane == 0) store_state(tile_states, tile, encode(kPrefix, exclusive + tile_total));
    }
    if (lane == 0) storage.tile_prefix = exclusive;
  }
  __syncthreads();
  return storage.tile_prefix;
}

}  // namespace pointops
