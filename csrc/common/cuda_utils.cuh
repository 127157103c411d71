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
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

namespace pointops {

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// The current device's SM count, cached per device: launchers ask on every call, and the
// attribute query costs host time that small launches cannot spare.
inline int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // static storage: zero-initialised
  const int device = c10::cuda::current_device();
  const bool cacheable = device >= 0 && device < kMaxDevices;
  int count = cacheable ? cached[device].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    if (cacheable) cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// Blocks of `kernel` (launched with `threads` threads and `dynamic_shared` bytes) resident per SM
// of the current device, cached per (kernel, threads, shared bytes, device): the occupancy query
// costs host time that a small call cannot spare.
inline int resident_blocks(const void* kernel, int threads, size_t dynamic_shared) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int> cache;
  const int device = c10::cuda::current_device();
  const auto key = std::make_tuple(kernel, threads, dynamic_shared, device);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int blocks = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_shared));
  blocks = std::max(blocks, 1);
  cache.emplace(key, blocks);
  return blocks;
}

// Programmatic dependent launch (compute capability 9.0+): a kernel launched with
// launch_after_previous may start while the previous kernel on the stream is finishing; it must
// call wait_for_previous_grid() before reading anything that kernel wrote. A kernel may call
// allow_dependent_launch() once it no longer needs its SM slots for itself. In code compiled for
// older GPUs both are no-ops, and such a kernel is launched the ordinary way (below).
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether `kernel`, as loaded for the current device, was compiled from PTX for sm_90 or later, so
// that it holds the griddepcontrol instructions. The device's compute capability is not enough: a
// build for older GPUs with PTX (TORCH_CUDA_ARCH_LIST="8.0+PTX") runs on Hopper through that PTX,
// where wait_for_previous_grid() compiled to nothing and an early start could read unfinished
// partials. Cached per (kernel, device): the attribute query costs host time.
inline bool compiled_for_dependent_launch(const void* kernel) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, bool> cached;
  const std::pair<const void*, int> key{kernel, c10::cuda::current_device()};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cached.find(key);
  if (found != cached.end()) return found->second;
  cudaFuncAttributes attributes{};
  C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  return cached[key] = attributes.ptxVersion >= 90;
}

template <typename... KernelArgs, typename... Args>
void launch_after_previous(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, cudaStream_t stream,
                           Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = compiled_for_dependent_launch(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#if defined(__CUDACC__)
constexpr unsigned kFullMask = 0xffffffffu;

// Butterfly reductions over a warp (all 32 lanes must call them): every lane gets the result, and
// the additions happen in the same tree on every call, so a sum is deterministic.
template <typename T, typename Op>
__device__ __forceinline__ T warp_all_reduce(T v, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  return warp_all_reduce(v, [](T x, T y) { return x + y; });
}
template <typename T>
__device__ __forceinline__ T warp_min(T v) {
  return warp_all_reduce(v, [](T x, T y) { return min(x, y); });
}
template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  return warp_all_reduce(v, [](T x, T y) { return max(x, y); });
}
// The sum of v over this lane and the lanes below it (blocks of one dimension).
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T below = __shfl_up_sync(kFullMask, v, o);
    if (lane >= o) v += below;
  }
  return v;
}
#endif  // __CUDACC__

// A grid-stride-loop grid for `n` elements: enough blocks to fill the device, never 0.
inline unsigned int grid_for(int64_t n, int threads) {
  const int64_t wanted = ceil_div<int64_t>(n, threads);
  const int64_t cap = static_cast<int64_t>(multiprocessor_count()) * 32;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min(wanted, cap)));
}

}  // namespace pointops
