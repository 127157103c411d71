// Device helpers shared by the strided family's CUDA files.
#pragma once

#include <cstdint>

#include "strided/strided.h"

namespace pointops {
namespace strided {

constexpr int kThreads = 256;

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// Element offsets of linear index i (I: the index type for the decomposition).
template <typename I, int NOps>
__device__ __forceinline__ void offsets_of(const StridedLayout<NOps>& L, I i, int64_t (&off)[NOps]) {
#pragma unroll
  for (int op = 0; op < NOps; ++op) off[op] = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < L.ndim) {
      const I size = static_cast<I>(L.sizes[d]);
      const I idx = i % size;
      i /= size;
#pragma unroll
      for (int op = 0; op < NOps; ++op) off[op] += static_cast<int64_t>(idx) * L.strides[op][d];
    }
  }
}

}  // namespace strided
}  // namespace pointops
