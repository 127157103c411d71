// Times cub::BlockRadixSort configurations on the ball query's per-cloud sort (issue 18's 8 x 16384
// case: 16 segments of 16,384 keys, one block each), standalone (no torch), and checks each result
// against std::stable_sort on the host. A key is (cell << 14) | index, cells uniform in [0, 2^17]:
//   full  sorts all 32 bits (the key is a total order, any rank order works)
//   cell  sorts only the cell bits [14, 32): stable, so the keys must enter in index order
//         (blocked arrangement: thread t holds indices t * ITEMS ... t * ITEMS + ITEMS - 1)
// Keys enter coalesced (striped) and go to the blocked arrangement through shared memory, as a
// kernel computing them from points would; they leave striped (coalesced stores). 7 bits and more
// per pass at 1024 threads need more shared memory than a block has.
// H100 (torch 2.11 lease, 2026-11-27), median of 50: 512 x 32 4-bit full 29.3 us, 4-bit cell 23.3,
// 6-bit cell 21.2; 1024 x 16 4-bit full 36.7, 4-bit cell 27.1, 5-bit 28.6, 6-bit 29.5 (64 registers).
//   nvcc -O3 -std=c++17 -arch=sm_90 scripts/debug/block_sort_bench.cu -o /tmp/bsb && /tmp/bsb
#include <cub/block/block_exchange.cuh>
#include <cub/block/block_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));      \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kIndexBits = 14;
constexpr int kCellBits = 18;  // 17 bits of cells and the invalid cell

template <int THREADS, int ITEMS, int BITS>
struct Sorter {
  using Sort = cub::BlockRadixSort<uint32_t, THREADS, ITEMS, cub::NullType, BITS>;
  using Exchange = cub::BlockExchange<uint32_t, THREADS, ITEMS>;
  union Storage {
    typename Sort::TempStorage sort;
    typename Exchange::TempStorage exchange;
  };
};

template <int THREADS, int ITEMS, int BITS, bool FULL>
__global__ void __launch_bounds__(THREADS, 1) sort_kernel(const uint32_t* in, uint32_t* out) {
  using S = Sorter<THREADS, ITEMS, BITS>;
  extern __shared__ __align__(16) unsigned char raw[];
  auto& storage = *reinterpret_cast<typename S::Storage*>(raw);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * THREADS * ITEMS;
  uint32_t key[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) key[k] = in[base + k * THREADS + threadIdx.x];
  typename S::Exchange(storage.exchange).StripedToBlocked(key);
  __syncthreads();
  typename S::Sort(storage.sort).SortBlockedToStriped(key, FULL ? 0 : kIndexBits, kIndexBits + kCellBits);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) out[base + k * THREADS + threadIdx.x] = key[k];
}

template <int THREADS, int ITEMS, int BITS, bool FULL>
void run(const char* name, const std::vector<uint32_t>& host, int segments) {
  const size_t n = host.size();
  const size_t bytes = sizeof(typename Sorter<THREADS, ITEMS, BITS>::Storage);
  const auto kernel = sort_kernel<THREADS, ITEMS, BITS, FULL>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  uint32_t *in, *out;
  CHECK(cudaMalloc(&in, n * 4));
  CHECK(cudaMalloc(&out, n * 4));
  CHECK(cudaMemcpy(in, host.data(), n * 4, cudaMemcpyHostToDevice));
  cudaFuncAttributes attributes;
  CHECK(cudaFuncGetAttributes(&attributes, kernel));
  std::vector<float> times;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int rep = 0; rep < 60; ++rep) {
    CHECK(cudaEventRecord(a));
    kernel<<<segments, THREADS, bytes>>>(in, out);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (rep >= 10) times.push_back(ms * 1000.f);
  }
  CHECK(cudaGetLastError());
  std::sort(times.begin(), times.end());
  std::vector<uint32_t> got(n);
  CHECK(cudaMemcpy(got.data(), out, n * 4, cudaMemcpyDeviceToHost));
  bool ok = true;
  const size_t per = n / segments;
  for (int s = 0; s < segments && ok; ++s) {
    std::vector<uint32_t> want(host.begin() + s * per, host.begin() + (s + 1) * per);
    std::stable_sort(want.begin(), want.end(), [](uint32_t x, uint32_t y) { return (x >> kIndexBits) < (y >> kIndexBits); });
    ok = std::equal(want.begin(), want.end(), got.begin() + s * per);
  }
  std::printf("%-28s %5d B smem %6zu  regs %3d  median %7.2f us  min %7.2f us  %s\n", name, THREADS, bytes,
              attributes.numRegs, times[times.size() / 2], times[0], ok ? "exact" : "WRONG");
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
}

int main() {
  constexpr int kSegments = 16, kPer = 16384;
  std::mt19937 rng(7);
  std::vector<uint32_t> host(static_cast<size_t>(kSegments) * kPer);
  for (int s = 0; s < kSegments; ++s) {
    for (int i = 0; i < kPer; ++i) {
      const uint32_t cell = rng() % (1u << 17);  // ~0.12 points per cell, as uniform 16,384-point clouds
      host[static_cast<size_t>(s) * kPer + i] = (cell << kIndexBits) | static_cast<uint32_t>(i);
    }
  }
  run<512, 32, 4, true>("512x32 4-bit full (branch)", host, kSegments);
  run<512, 32, 4, false>("512x32 4-bit cell", host, kSegments);
  run<512, 32, 6, false>("512x32 6-bit cell", host, kSegments);
  run<1024, 16, 4, true>("1024x16 4-bit full", host, kSegments);
  run<1024, 16, 4, false>("1024x16 4-bit cell", host, kSegments);
  run<1024, 16, 5, false>("1024x16 5-bit cell", host, kSegments);
  run<1024, 16, 6, false>("1024x16 6-bit cell", host, kSegments);
  return 0;
}
