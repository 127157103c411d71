// Small CUDA helpers shared by the kernels of every op family.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <cstdint>

namespace pointops {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

inline int multiprocessor_count() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// A grid-stride-loop grid for `n` elements: enough blocks to fill the device, never 0.
inline unsigned int grid_for(int64_t n, int threads) {
  const int64_t wanted = ceil_div<int64_t>(n, threads);
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 32;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

}  // namespace pointops
