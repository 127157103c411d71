// Strided matmul on CUDA: C (..., n, m) = A (..., n, k) @ B (..., k, m), batch dims broadcast.
//
// A block computes a BM x BN tile of C for one batch entry (grid.z, offsets from the merged batch
// layout). K advances in BK slices staged through shared memory, double-buffered: the next slice's
// global loads are issued into registers before the current slice is multiplied, then stored into
// the other buffer (one __syncthreads per slice). Each thread accumulates a block of C in
// registers (register blocking) in the compute type with explicit IEEE fused multiply-adds (never
// TF32 or a widened double fma). Loads follow the operands' actual strides: consecutive threads
// walk whichever of an operand's two dims has the smaller stride, so a transposed view is read as
// coalesced as a contiguous one; the tiles are stored k-major in shared memory either way. Every C
// element is summed in the same order on every run (deterministic).
//
// float32 (matmul_f32_kernel): 128 x 128 tiles, 256 threads. A thread
// owns a 2 x 2 grid of 4 x 4 blocks of C, 64 rows / columns apart, so each k step reads four
// 16-byte vectors from shared memory with no bank conflicts (a warp's B reads are one contiguous
// 256-byte run, its A reads two broadcasts). Each thread loads 4 consecutive elements of A and of
// B along the operand's fast dim per load: one 16-byte load when that dim is unit-stride and
// aligned and the tile lies inside the matrix, else 4 checked loads into the same slots. When the
// whole product is made of whole tiles (n, m multiples of 128, k of 16, aligned unit-stride
// operands) a variant without any bounds runs with 16-deep k slices at two blocks per SM; else
// 8-deep slices at one block per SM (the bounds arithmetic would spill at two).
// float64 and the half types (matmul_kernel): 64 x 64 (double) or 128 x 128 tiles, 4 x 4 or 8 x 8
// per thread, element loads.
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
  bool a_vec, b_vec, c_vec;  // 16-byte loads / stores where a tile lies inside the matrix
};

constexpr int kF32Tile = 128, kF32Pad = 4;  // +4 floats per shared row: see the stores
constexpr int kF32K = 8, kF32KWhole = 16;    // k slice depth: checked kernel, whole-tile kernel

// 4 consecutive elements along the operand's fast dim, starting at element (i0, j0) of an
// operand with strides (s0, s1); fast_j: the 4 run along j. Zero outside (rows x cols).
__device__ __forceinline__ float4 load4(const float* __restrict__ p, int64_t i0, int64_t j0, int64_t s0, int64_t s1,
                                        int64_t rows, int64_t cols, bool fast_j, bool vec) {
  if (vec) return *reinterpret_cast<const float4*>(p + i0 * s0 + j0 * s1);
  float v[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int64_t i = fast_j ? i0 : i0 + e, j = fast_j ? j0 + e : j0;
    v[e] = (i < rows && j < cols) ? p[i * s0 + j * s1] : 0.f;
  }
  return make_float4(v[0], v[1], v[2], v[3]);
}

// AKFast: A's k stride is the smaller (A row-major); BKFast: B's k stride is the smaller (B
// column-major, e.g. a transposed view). Checked = false: every tile lies inside the matrices (n
// and m multiples of 128, k of BK) and every load and store is a 16-byte vector, so the main loop
// carries no bounds and no index arithmetic, only two advancing pointers.
template <bool AKFast, bool BKFast, bool Checked, int BK, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks)
    matmul_f32_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                      const MatmulArgs args) {
  constexpr int BM = kF32Tile, BN = kF32Tile;
  constexpr int L = BM * BK / (4 * kThreads);  // 4-element loads per operand per thread and slice
  constexpr int RPR = BK / 4;                  // k fast: 4-element runs per row of the slice
  static_assert(BM == BN && L * 4 * kThreads == BM * BK, "whole 4-element loads");
  __shared__ __align__(16) float As[2][BK][BM + kF32Pad];
  __shared__ __align__(16) float Bs[2][BK][BN + kF32Pad];
  const MatmulCall& p = args.call;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * BM, col0 = static_cast<int64_t>(blockIdx.x) * BN;
  // this thread's first 4 elements of each slice: k fast: one row / column, k = kq .. kq + 3
  // (RPR threads per row); else: one k, rows / columns r .. r + 3. Load e adds e * (rows, k) step.
  const int a_r = AKFast ? tid / RPR : (tid % 32) * 4, a_k = AKFast ? (tid % RPR) * 4 : tid / 32;
  const int b_c = BKFast ? tid / RPR : (tid % 32) * 4, b_k = BKFast ? (tid % RPR) * 4 : tid / 32;
  constexpr int kStepRows = kThreads / RPR, kStepK = kThreads / 32;
  const bool rows_inside = row0 + BM <= p.n, cols_inside = col0 + BN <= p.m;

  for (int64_t entry = blockIdx.z; entry < args.entries; entry += gridDim.z) {
    int64_t off[3];
    offsets_of<int64_t>(args.batch, entry, off);
    const float* pa = a + off[1];
    const float* pb = b + off[2];
    float* pc = c + off[0];
    float4 ra[L], rb[L];
    const float* a_next = pa + (row0 + a_r) * p.as0 + a_k * p.as1;  // this thread's first element of the slice
    const float* b_next = pb + (col0 + b_c) * p.bs1 + b_k * p.bs0;
    const int64_t a_step = AKFast ? kStepRows * p.as0 : kStepK * p.as1;  // between this thread's loads
    const int64_t b_step = BKFast ? kStepRows * p.bs1 : kStepK * p.bs0;
    auto load = [&](int64_t k0) {
      if constexpr (!Checked) {
#pragma unroll
        for (int e = 0; e < L; ++e) {
          ra[e] = *reinterpret_cast<const float4*>(a_next + e * a_step);
          rb[e] = *reinterpret_cast<const float4*>(b_next + e * b_step);
        }
        a_next += BK * p.as1;
        b_next += BK * p.bs0;
      } else {
        const bool k_inside = k0 + BK <= p.k;
        // A as (row, k) with strides (as0, as1); B as (col, k) with strides (bs1, bs0)
#pragma unroll
        for (int e = 0; e < L; ++e) {
          const int dr = AKFast ? e * kStepRows : 0, dk = AKFast ? 0 : e * kStepK;
          ra[e] = load4(pa, row0 + a_r + dr, k0 + a_k + dk, p.as0, p.as1, p.n, p.k, AKFast,
                        args.a_vec && rows_inside && k_inside);
          const int dc = BKFast ? e * kStepRows : 0, dkb = BKFast ? 0 : e * kStepK;
          rb[e] = load4(pb, col0 + b_c + dc, k0 + b_k + dkb, p.bs1, p.bs0, p.m, p.k, BKFast,
                        args.b_vec && cols_inside && k_inside);
        }
      }
    };
    // k-fast runs are scattered over 4 shared rows; with the +4 padding (BK = 8) the two threads
    // of a row (kq = 0, 4) land 16 banks apart, so a warp's 32 stores hit 32 banks
    auto store = [&](int buf) {
#pragma unroll
      for (int e = 0; e < L; ++e) {
        if (AKFast) {
          const int r = a_r + e * kStepRows;
          As[buf][a_k + 0][r] = ra[e].x; As[buf][a_k + 1][r] = ra[e].y;
          As[buf][a_k + 2][r] = ra[e].z; As[buf][a_k + 3][r] = ra[e].w;
        } else {
          *reinterpret_cast<float4*>(&As[buf][a_k + e * kStepK][a_r]) = ra[e];
        }
        if (BKFast) {
          const int col = b_c + e * kStepRows;
          Bs[buf][b_k + 0][col] = rb[e].x; Bs[buf][b_k + 1][col] = rb[e].y;
          Bs[buf][b_k + 2][col] = rb[e].z; Bs[buf][b_k + 3][col] = rb[e].w;
        } else {
          *reinterpret_cast<float4*>(&Bs[buf][b_k + e * kStepK][b_c]) = rb[e];
        }
      }
    };

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

    const int64_t slices = ceil_div<int64_t>(p.k, BK);
    load(0);
    store(0);
    __syncthreads();
    for (int64_t s = 0; s < slices; ++s) {
      const int buf = static_cast<int>(s & 1);
      if (s + 1 < slices) load((s + 1) * BK);  // in flight during the multiply below
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        const float4 a0 = *reinterpret_cast<const float4*>(&As[buf][kk][ty * 4]);
        const float4 a1 = *reinterpret_cast<const float4*>(&As[buf][kk][64 + ty * 4]);
        const float4 b0 = *reinterpret_cast<const float4*>(&Bs[buf][kk][tx * 4]);
        const float4 b1 = *reinterpret_cast<const float4*>(&Bs[buf][kk][64 + tx * 4]);
        const float fa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float fb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(fa[i], fb[j], acc[i][j]);
      }
      if (s + 1 < slices) store(buf ^ 1);  // the other buffer: nobody reads it in this slice
      __syncthreads();
    }

    const bool vec_out = !Checked || (args.c_vec && rows_inside && cols_inside);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t gr = row0 + (i / 4) * 64 + ty * 4 + i % 4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t gc = col0 + h * 64 + tx * 4;
        if (vec_out) {
          *reinterpret_cast<float4*>(pc + gr * p.cs0 + gc) =
              make_float4(acc[i][h * 4], acc[i][h * 4 + 1], acc[i][h * 4 + 2], acc[i][h * 4 + 3]);
        } else if (gr < p.n) {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (gc + j < p.m) pc[gr * p.cs0 + (gc + j) * p.cs1] = acc[i][h * 4 + j];
        }
      }
    }
  }
}

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

// Whether 4 consecutive elements along the fast dim (unit stride) starting at any multiple of 4
// are one aligned 16-byte vector, in every batch entry.
bool vec4_ok(const at::Tensor& t, int64_t fast_stride, int64_t other_stride, int batch_op, const StridedLayout<3>& batch) {
  if (t.scalar_type() != at::kFloat || fast_stride != 1 || other_stride % 4 != 0 ||
      reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 != 0)
    return false;
  for (int d = 0; d < batch.ndim; ++d)
    if (batch.strides[batch_op][d] % 4 != 0) return false;
  return true;
}

void matmul_into_cuda(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& batch,
                      const MatmulCall& call) {
  const c10::cuda::CUDAGuard guard(c.device());
  const bool a_rows_fast = std::abs(call.as0) < std::abs(call.as1);
  const bool b_cols_fast = std::abs(call.bs1) < std::abs(call.bs0);
  MatmulArgs args{call, batch, batch.numel(), a_rows_fast, b_cols_fast,
                  a_rows_fast ? vec4_ok(a, call.as0, call.as1, 1, batch) : vec4_ok(a, call.as1, call.as0, 1, batch),
                  b_cols_fast ? vec4_ok(b, call.bs1, call.bs0, 2, batch) : vec4_ok(b, call.bs0, call.bs1, 2, batch),
                  vec4_ok(c, call.cs1, call.cs0, 0, batch)};
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto grid_of = [&](int64_t bm, int64_t bn) {
    const int64_t gx = ceil_div<int64_t>(call.m, bn), gy = ceil_div<int64_t>(call.n, bm);
    TORCH_CHECK(gy < 65536, "matmul: n = ", call.n, " rows exceed the CUDA grid (", 65535 * bm, ")");
    TORCH_CHECK(gx < (int64_t{1} << 31), "matmul: m = ", call.m, " columns exceed the CUDA grid");
    return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                static_cast<unsigned>(std::min<int64_t>(args.entries, 65535)));
  };
  if (a.scalar_type() == at::kFloat) {
    const dim3 grid = grid_of(kF32Tile, kF32Tile);
    const float* pa = a.const_data_ptr<float>();
    const float* pb = b.const_data_ptr<float>();
    float* pc = c.data_ptr<float>();
    const bool a_k_fast = !a_rows_fast, b_k_fast = !b_cols_fast;
    // whole tiles: the unchecked kernel with 16-deep k slices (measured 0.88-0.89 of cuBLAS at
    // 4096^3 on an H100 against 0.79-0.82 with 8-deep ones); anything else: the checked kernel
    const bool unchecked = args.a_vec && args.b_vec && args.c_vec && call.n % kF32Tile == 0 &&
                           call.m % kF32Tile == 0 && call.k % kF32KWhole == 0;
#define POINTOPS_F32(AK, BK)                                                                                 \
  if (unchecked) matmul_f32_kernel<AK, BK, false, kF32KWhole, 2><<<grid, kThreads, 0, stream>>>(pa, pb, pc, args); \
  else matmul_f32_kernel<AK, BK, true, kF32K, 1><<<grid, kThreads, 0, stream>>>(pa, pb, pc, args);
    if (a_k_fast && b_k_fast) { POINTOPS_F32(true, true) }
    else if (a_k_fast) { POINTOPS_F32(true, false) }
    else if (b_k_fast) { POINTOPS_F32(false, true) }
    else { POINTOPS_F32(false, false) }
#undef POINTOPS_F32
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "strided_matmul_cuda", [&] {
    using Tl = Tiles<at::opmath_type<scalar_t>>;
    matmul_kernel<scalar_t><<<grid_of(Tl::BM, Tl::BN), kThreads, 0, stream>>>(
        a.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>(), c.data_ptr<scalar_t>(), args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("strided_matmul", &matmul_entry<matmul_into_cuda>); }

}  // namespace strided
}  // namespace pointops
