// Small CUDA helpers shared by the kernels of every op family.
//
// Include this (and c10/cuda/*) rather than ATen/cuda/CUDAContext.h: that header pulls in
// cuSPARSE/cuBLAS/cuSOLVER headers, which a bare nvcc (our CI's compile check) does not have.
// c10::cuda::getCurrentCUDAStream() is the stream at::cuda::getCurrentCUDAStream() returns.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cstdint>

namespace pointops {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

inline int multiprocessor_count() {
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, c10::cuda::current_device()));
  return count;
}

// A grid-stride-loop grid for `n` elements: enough blocks to fill the device, never 0.
inline unsigned int grid_for(int64_t n, int threads) {
  const int64_t wanted = ceil_div<int64_t>(n, threads);
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 32;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

}  // namespace pointops
