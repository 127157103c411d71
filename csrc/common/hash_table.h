// The open-addressing hash tables of voxelize (cells -> voxels) and the spatial grid (cells -> runs
// of sorted points): the hash and the capacity rule they share, on the host and in kernels.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define POINTOPS_HASH_HD __host__ __device__ __forceinline__
#else
#define POINTOPS_HASH_HD inline
#endif

namespace pointops {

// MurmurHash3's 64-bit finalizer: every key bit affects every hash bit, so neighbouring cells
// (keys that differ by 1 or by X) spread over the table instead of forming probe runs.
POINTOPS_HASH_HD uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ULL;
  k ^= k >> 33;
  return k;
}

// Hash table capacity: the smallest power of two >= 2 * num_keys (at least 64). At most num_keys
// keys are ever inserted, so the table is at most half full and linear probes stay short.
inline int64_t table_capacity(int64_t num_keys) {
  int64_t capacity = 64;
  while (capacity < 2 * num_keys) capacity <<= 1;
  return capacity;
}

}  // namespace pointops

#undef POINTOPS_HASH_HD
