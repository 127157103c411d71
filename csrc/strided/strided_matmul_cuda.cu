// Strided matmul on CUDA: C (..., n, m) = A (..., n, k) @ B (..., k, m), batch dims broadcast.
//
// A block computes a BM x BN tile of C for one batch entry (grid.z, offsets from the merged batch
// layout). K advances in BK slices staged through shared memory, double-buffered: the next slice's
// global loads are issued into registers before the current slice is multiplied, then stored into
// the other buffer (one __syncthreads per slice). Each thread accumulates a TM x TN block of C in
// registers (register blocking) in the compute type: float for float32 and the half types (plain
// fmaf: IEEE float32, never TF32), double for float64. Loads follow the operands' actual strides:
// consecutive threads walk whichever of an operand's two dims has the smaller stride, so a
// transposed view is read as coalesced as a contiguous one; the tiles are stored k-major in shared
// memory either way. Every C element is summed in the same order on every run (deterministic).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include "common/cuda_utils.cuh"
#include "strided/strided_cuda.cuh"
#include "strided/strided_entries.h"

namespace pointops {
namespace strided {
namespace {

template <typename A>
struct Tiles;
template <>
struct Tiles<float> {  // 128 x 128 tile, 8 x 8 per thread, 256 threads
  static constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
};
template <>
struct Tiles<double> {  // 64 x 64 tile, 4 x 4 per thread, 256 threads
  static constexpr int BM = 64, BN = 64, BK = 8, TM = 4, TN = 4;
};

// IEEE fused multiply-adds in the compute type (float: never TF32 or a widened double fma).
__device__ __forceinline__ float fused(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fused(double a, double b, double c) { return __fma_rn(a, b, c); }

struct MatmulArgs {
  MatmulCall call;
  StridedLayout<3> batch;  // operands c, a, b
  int64_t entries;         // batch entries
  bool a_rows_fast;        // A's row stride is the smaller: consecutive threads walk rows (m of A)
  bool b_cols_fast;        // B's column stride is the smaller: consecutive threads walk columns
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    matmul_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, const MatmulArgs args) {
  using A = at::opmath_type<T>;
  using Tl = Tiles<A>;
  constexpr int BM = Tl::BM, BN = Tl::BN, BK = Tl::BK, TM = Tl::TM, TN = Tl::TN;
  constexpr int LA = BM * BK / kThreads, LB = BN * BK / kThreads;  // loads per thread per slice
  static_assert((BM / TM) * (BN / TN) == kThreads, "one TM x TN block per thread");
  __shared__ A As[2][BK][BM];
  __shared__ A Bs[2][BK][BN];

  const MatmulCall& p = args.call;
  const int tid = threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM, col0 = static_cast<int64_t>(blockIdx.x) * BN;
  const int ty = tid / (BN / TN), tx = tid % (BN / TN);

  for (int64_t entry = blockIdx.z; entry < args.entries; entry += gridDim.z) {
    int64_t off[3];
    offsets_of<int64_t>(args.batch, entry, off);
    const T* pa = a + off[1];
    const T* pb = b + off[2];
    T* pc = c + off[0];

    // (tile element e of this thread) -> (row or column, k) of the slice, along the fast dim
    auto a_coord = [&](int e, int& r, int& kk) {
      const int idx = tid + e * kThreads;
      if (args.a_rows_fast) { r = idx % BM; kk = idx / BM; } else { kk = idx % BK; r = idx / BK; }
    };
    auto b_coord = [&](int e, int& col, int& kk) {
      const int idx = tid + e * kThreads;
      if (args.b_cols_fast) { col = idx % BN; kk = idx / BN; } else { kk = idx % BK; col = idx / BK; }
    };
    A ra[LA], rb[LB];
    auto load = [&](int64_t k0) {
#pragma unroll
      for (int e = 0; e < LA; ++e) {
        int r, kk;
        a_coord(e, r, kk);
        const int64_t gr = row0 + r, gk = k0 + kk;
        ra[e] = (gr < p.n && gk < p.k) ? static_cast<A>(pa[gr * p.as0 + gk * p.as1]) : A(0);
      }
#pragma unroll
      for (int e = 0; e < LB; ++e) {
        int col, kk;
        b_coord(e, col, kk);
        const int64_t gc = col0 + col, gk = k0 + kk;
        rb[e] = (gc < p.m && gk < p.k) ? static_cast<A>(pb[gk * p.bs0 + gc * p.bs1]) : A(0);
      }
    };
    auto store = [&](int buf) {
#pragma unroll
      for (int e = 0; e < LA; ++e) {
        int r, kk;
        a_coord(e, r, kk);
        As[buf][kk][r] = ra[e];
      }
#pragma unroll
      for (int e = 0; e < LB; ++e) {
        int col, kk;
        b_coord(e, col, kk);
        Bs[buf][kk][col] = rb[e];
      }
    };

    A acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = A(0);

    const int64_t slices = ceil_div<int64_t>(p.k, BK);
    load(0);
    store(0);
    __syncthreads();
    for (int64_t s = 0; s < slices; ++s) {
      const int buf = static_cast<int>(s & 1);
      if (s + 1 < slices) load((s + 1) * BK);  // in flight during the multiply below
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        A fa[TM], fb[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) fa[i] = As[buf][kk][ty * TM + i];
#pragma unroll
        for (int j = 0; j < TN; ++j) fb[j] = Bs[buf][kk][tx * TN + j];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fused(fa[i], fb[j], acc[i][j]);
      }
      if (s + 1 < slices) store(buf ^ 1);  // the other buffer: nobody reads it in this slice
      __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int64_t gr = row0 + ty * TM + i;
      if (gr >= p.n) continue;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int64_t gc = col0 + tx * TN + j;
        if (gc < p.m) pc[gr * p.cs0 + gc * p.cs1] = static_cast<T>(acc[i][j]);
      }
    }
  }
}

void matmul_into_cuda(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& batch,
                      const MatmulCall& call) {
  const c10::cuda::CUDAGuard guard(c.device());
  MatmulArgs args{call, batch, batch.numel(), std::abs(call.as0) < std::abs(call.as1),
                  std::abs(call.bs1) < std::abs(call.bs0)};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "strided_matmul_cuda", [&] {
    using Tl = Tiles<at::opmath_type<scalar_t>>;
    const int64_t gx = ceil_div<int64_t>(call.m, Tl::BN), gy = ceil_div<int64_t>(call.n, Tl::BM);
    TORCH_CHECK(gy < 65536, "matmul: n = ", call.n, " rows exceed the CUDA grid (", 65535 * Tl::BM, ")");
    const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                    static_cast<unsigned>(std::min<int64_t>(args.entries, 65535)));
    matmul_kernel<scalar_t><<<grid, kThreads, 0, stream>>>(a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(),
                                                          c.data_ptr<scalar_t>(), args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("strided_matmul", &matmul_entry<matmul_into_cuda>); }

}  // namespace strided
}  // namespace pointops
