"""Launch-shape sweep for a flat 16-byte-vector elementwise kernel (c = a + b, float32), against
torch.add on the same tensors in the same process: threads per block x vectors per thread, one
block per slice of work versus a persistent grid (SMs x resident blocks, an even share each).

An experiment harness, not part of the library: it JIT-compiles its own small kernel with
torch.utils.cpp_extension.load_inline and prints the median time of 10 back-to-back calls per
config, as benchmarks/bench_strided.py times the ops.

    python scripts/debug/elementwise_sweep.py
"""
import statistics

import torch
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

template <int THREADS, int UNROLL>
__global__ void __launch_bounds__(THREADS) add_kernel(float4* __restrict__ c, const float4* __restrict__ a,
                                                      const float4* __restrict__ b, int64_t n, int64_t per_block) {
  const int64_t begin = blockIdx.x * per_block, end = min(n, begin + per_block);
  for (int64_t base = begin; base < end; base += THREADS * UNROLL) {
    float4 x[UNROLL], y[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = base + u * THREADS + threadIdx.x;
      if (i < end) { x[u] = a[i]; y[u] = b[i]; }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = base + u * THREADS + threadIdx.x;
      if (i < end) c[i] = make_float4(x[u].x + y[u].x, x[u].y + y[u].y, x[u].z + y[u].z, x[u].w + y[u].w);
    }
  }
}

template <int THREADS, int UNROLL>
void launch(torch::Tensor c, torch::Tensor a, torch::Tensor b, bool persistent) {
  const int64_t n = a.numel() / 4;
  int64_t blocks = (n + THREADS * UNROLL - 1) / (THREADS * UNROLL);
  if (persistent) {
    int sms = 0, per_sm = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a.device().index());
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, add_kernel<THREADS, UNROLL>, THREADS, 0);
    blocks = std::min<int64_t>(blocks, int64_t(sms) * per_sm);
  }
  const int64_t per_block = ((n + blocks - 1) / blocks + THREADS - 1) / THREADS * THREADS;  // whole warps
  blocks = (n + per_block - 1) / per_block;
  add_kernel<THREADS, UNROLL><<<blocks, THREADS, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<float4*>(c.data_ptr<float>()), reinterpret_cast<const float4*>(a.data_ptr<float>()),
      reinterpret_cast<const float4*>(b.data_ptr<float>()), n, per_block);
}

void add(torch::Tensor c, torch::Tensor a, torch::Tensor b, int64_t threads, int64_t unroll, bool persistent) {
#define CASE(T, U) if (threads == T && unroll == U) return launch<T, U>(c, a, b, persistent);
  CASE(128, 1) CASE(128, 2) CASE(128, 4) CASE(256, 1) CASE(256, 2) CASE(256, 4) CASE(512, 1) CASE(512, 2)
  TORCH_CHECK(false, "no such config");
}
"""
CPP_SRC = "void add(torch::Tensor c, torch::Tensor a, torch::Tensor b, int64_t threads, int64_t unroll, bool persistent);"


def median_ms(fn, calls=10, repeat=40):
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def main():
    mod = load_inline("elementwise_sweep", CPP_SRC, cuda_sources=CUDA_SRC, functions=["add"],
                      extra_cuda_cflags=["-O3"])
    a = torch.randn(4096, 8192, device="cuda")
    b = torch.randn(4096, 8192, device="cuda")
    c = torch.empty_like(a)
    nbytes = 3 * a.numel() * 4
    for rnd in range(2):
        t_torch = median_ms(lambda: torch.add(a, b, out=c))
        print(f"round {rnd}: torch.add {t_torch * 1e3:.1f} us ({nbytes / t_torch / 1e9:.2f} TB/s)")
        for persistent in (False, True):
            for threads, unroll in ((128, 1), (128, 2), (128, 4), (256, 1), (256, 2), (256, 4), (512, 1), (512, 2)):
                mod.add(c, a, b, threads, unroll, persistent)
                assert torch.equal(c, a + b)
                t = median_ms(lambda: mod.add(c, a, b, threads, unroll, persistent))
                print(f"  threads {threads} x {unroll} vectors, {'persistent' if persistent else 'one slice per block'}: "
                      f"{t * 1e3:.1f} us, torch / this {t_torch / t:.3f}")


if __name__ == "__main__":
    main()
