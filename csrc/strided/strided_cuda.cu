// Strided map / zip on CUDA. The entries (checks, allocation, the > kMaxDims fallback) are shared
// with the CPU (strided_entries.h); this file holds the elementwise kernels and their launch
// choices (reductions: strided_reduce_cuda.cu, matmul: strided_matmul_cuda.cu).
//
// Three kernels, picked from the merged StridedLayout (ordered by the output's strides):
//   flat: the layout merged to one dim (contiguous operands, a 1-D stepped view, a scalar
//     broadcast). Each thread moves kUnroll items, all loads issued before any compute; an item
//     is a 16-byte vector when every operand is unit-stride and 16-byte aligned.
//   tiled: an input is unit-stride along an outer dim while the output is unit-stride along the
//     innermost one (a + b.t()). A kTile x kTile tile of that input is read along its own fast dim
//     into shared memory and read back transposed, so both the reads and the writes are coalesced.
//   general: one thread per element, offsets from the index decomposed over the merged dims (32-bit
//     arithmetic while the element count allows), 16-byte vectors when every operand's innermost
//     dim is unit-stride and aligned.
// Offsets are int64 everywhere.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

#include <cstdint>

#include "common/cuda_utils.cuh"
#include "strided/strided_cuda.cuh"
#include "strided/strided_entries.h"

namespace pointops {
namespace strided {
namespace {

constexpr int kUnroll = 4;      // items per thread in the flat kernel
constexpr int kTile = 32;       // tiled kernel: kTile x kTile elements per tile,
constexpr int kTileRows = 8;    // a kTile x kTileRows block, kTile / kTileRows rows per thread

template <MapFn F>
struct MapOp {
  template <typename A>
  __device__ A operator()(A x) const { return map_value<F>(x); }
};
template <ZipFn F>
struct ZipOp {
  template <typename A>
  __device__ A operator()(A a, A b) const { return zip_value<F>(a, b); }
};

template <typename T, int NIn>
struct Inputs {
  const T* p[NIn];
};

template <typename T, int NIn, typename F>
__device__ __forceinline__ T apply(const F& f, const at::opmath_type<T> (&x)[NIn]) {
  if constexpr (NIn == 1) return static_cast<T>(f(x[0]));
  else return static_cast<T>(f(x[0], x[1]));
}

// One merged dim: out[i * so] = f(in_k[i * s_k]) in units of V-element vectors. V > 1 (the vector
// path) implies every stride is 1, which the index arithmetic then knows at compile time.
template <typename T, int V, int NIn, typename F>
__global__ void __launch_bounds__(kThreads)
    elementwise_flat_kernel(T* __restrict__ out, const Inputs<T, NIn> in, const std::array<int64_t, NIn + 1> strides,
                            const int64_t n, const F f) {
  using A = at::opmath_type<T>;
  using P = Pack<T, V>;
  std::array<int64_t, NIn + 1> s = strides;
  if constexpr (V > 1) {
#pragma unroll
    for (int op = 0; op <= NIn; ++op) s[op] = 1;
  }
  constexpr int64_t kStep = static_cast<int64_t>(kThreads) * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kStep; base < n; base += static_cast<int64_t>(gridDim.x) * kStep) {
    P x[kUnroll][NIn];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      if (i < n) {
#pragma unroll
        for (int k = 0; k < NIn; ++k) x[u][k] = *reinterpret_cast<const P*>(in.p[k] + i * s[k + 1] * V);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      if (i < n) {
        P r;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A args[NIn];
#pragma unroll
          for (int k = 0; k < NIn; ++k) args[k] = static_cast<A>(x[u][k].v[j]);
          r.v[j] = apply<T, NIn>(f, args);
        }
        *reinterpret_cast<P*>(out + i * s[0] * V) = r;
      }
    }
  }
}

// out[i] = f(in_0[i], ...) over the layout (offsets in units of V elements).
template <typename T, int V, typename I, int NIn, typename F>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(const StridedLayout<NIn + 1> L, T* __restrict__ out, const Inputs<T, NIn> in, const I n,
                       const F f) {
  using A = at::opmath_type<T>;
  using P = Pack<T, V>;
  for (I i = static_cast<I>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += static_cast<I>(gridDim.x) * kThreads) {
    int64_t off[NIn + 1];
    offsets_of<I>(L, i, off);
    P x[NIn];
#pragma unroll
    for (int k = 0; k < NIn; ++k) x[k] = *reinterpret_cast<const P*>(in.p[k] + off[k + 1] * V);
    P r;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A args[NIn];
#pragma unroll
      for (int k = 0; k < NIn; ++k) args[k] = static_cast<A>(x[k].v[j]);
      r.v[j] = apply<T, NIn>(f, args);
    }
    *reinterpret_cast<P*>(out + off[0] * V) = r;
  }
}

// The layout's last two dims are (rows, cols); the output and the direct inputs step through cols
// fastest, the inputs with tiled[k] through rows. The dims before are the batch. Tile t covers
// rows [r0, r0 + kTile) x cols [c0, c0 + kTile) of batch entry b.
template <typename T, int NIn, typename F>
__global__ void __launch_bounds__(kTile * kTileRows)
    elementwise_tiled_kernel(const StridedLayout<NIn + 1> L, T* __restrict__ out, const Inputs<T, NIn> in,
                             const std::array<bool, NIn> tiled, const int64_t row_tiles, const int64_t col_tiles,
                             const int64_t tiles, const F f) {
  using A = at::opmath_type<T>;
  constexpr int kPerThread = kTile / kTileRows;
  __shared__ T tile[NIn][kTile][kTile + 1];  // [k][col][row]: +1 keeps the transposed reads off one bank
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int nd = L.ndim;
  const int64_t rows = L.sizes[nd - 2], cols = L.sizes[nd - 1];
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t ct = t % col_tiles, rt = (t / col_tiles) % row_tiles, b = t / col_tiles / row_tiles;
    int64_t off[NIn + 1];
#pragma unroll
    for (int op = 0; op <= NIn; ++op) off[op] = 0;
    int64_t rest = b;
    for (int d = nd - 3; d >= 0; --d) {
      const int64_t idx = rest % L.sizes[d];
      rest /= L.sizes[d];
#pragma unroll
      for (int op = 0; op <= NIn; ++op) off[op] += idx * L.strides[op][d];
    }
    const int64_t r0 = rt * kTile, c0 = ct * kTile;
    T direct[NIn][kPerThread];
#pragma unroll
    for (int k = 0; k < NIn; ++k) {
      const int64_t sr = L.strides[k + 1][nd - 2], sc = L.strides[k + 1][nd - 1];
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int y = ty + j * kTileRows;
        if (tiled[k]) {  // thread tx walks rows: this input's unit-stride dim
          if (r0 + tx < rows && c0 + y < cols) tile[k][y][tx] = in.p[k][off[k + 1] + (r0 + tx) * sr + (c0 + y) * sc];
        } else if (r0 + y < rows && c0 + tx < cols) {
          direct[k][j] = in.p[k][off[k + 1] + (r0 + y) * sr + (c0 + tx) * sc];
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int y = ty + j * kTileRows;
      if (r0 + y < rows && c0 + tx < cols) {
        A args[NIn];
#pragma unroll
        for (int k = 0; k < NIn; ++k) args[k] = static_cast<A>(tiled[k] ? tile[k][tx][y] : direct[k][j]);
        out[off[0] + (r0 + y) * L.strides[0][nd - 2] + (c0 + tx) * L.strides[0][nd - 1]] = apply<T, NIn>(f, args);
      }
    }
    __syncthreads();  // the next tile overwrites the shared memory
  }
}

// The layout in units of V-element vectors, when every operand allows 128-bit accesses.
template <int NOps>
bool vectorize(StridedLayout<NOps>& L, const void* const (&ptrs)[NOps], int V) {
  if (V == 1) return true;
  const int inner = L.ndim - 1;
  if (L.sizes[inner] % V != 0) return false;
  for (int op = 0; op < NOps; ++op) {
    if (L.strides[op][inner] != 1 || reinterpret_cast<uintptr_t>(ptrs[op]) % 16 != 0) return false;
    for (int d = 0; d < inner; ++d)
      if (L.strides[op][d] % V != 0) return false;
  }
  L.sizes[inner] /= V;
  for (int op = 0; op < NOps; ++op)
    for (int d = 0; d < inner; ++d) L.strides[op][d] /= V;
  return true;
}

// The tiled kernel's layout: a dim `t` along which some input is unit-stride, moved next to the
// innermost; tiled[k] for the inputs read through shared memory. False when no input needs it
// (the output is not unit-stride innermost, or every input already is, or the dims are short).
template <int NOps>
bool plan_tiles(const StridedLayout<NOps>& L, StridedLayout<NOps>& T, std::array<bool, NOps - 1>& tiled) {
  const int inner = L.ndim - 1;
  if (L.ndim < 2 || L.strides[0][inner] != 1 || L.sizes[inner] < kTile / 2) return false;
  int t = -1;
  for (int k = 1; k < NOps && t < 0; ++k) {
    if (std::abs(L.strides[k][inner]) <= 1) continue;  // unit-stride or broadcast along cols already
    for (int d = 0; d < inner; ++d)
      if (std::abs(L.strides[k][d]) == 1 && L.sizes[d] >= kTile / 2) t = d;
  }
  if (t < 0) return false;
  T = L;
  for (int d = t; d < inner - 1; ++d) {  // dims t+1 .. inner-1 shift out, t lands at inner - 1
    T.sizes[d] = L.sizes[d + 1];
    for (int op = 0; op < NOps; ++op) T.strides[op][d] = L.strides[op][d + 1];
  }
  T.sizes[inner - 1] = L.sizes[t];
  for (int op = 0; op < NOps; ++op) T.strides[op][inner - 1] = L.strides[op][t];
  for (int k = 1; k < NOps; ++k)
    tiled[k - 1] = std::abs(T.strides[k][inner - 1]) == 1 && std::abs(T.strides[k][inner]) > 1;
  return true;
}

template <typename T, int NIn, typename F>
void launch_elementwise(const at::Tensor& out, const std::array<const at::Tensor*, NIn>& in,
                        const StridedLayout<NIn + 1>& L, const F& f) {
  constexpr int NOps = NIn + 1;
  Inputs<T, NIn> ptrs{};
  const void* raw[NOps];
  raw[0] = out.data_ptr();
  for (int k = 0; k < NIn; ++k) {
    ptrs.p[k] = in[k]->template const_data_ptr<T>();
    raw[k + 1] = ptrs.p[k];
  }
  constexpr int kVec = 16 / sizeof(T);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  T* o = out.data_ptr<T>();
  StridedLayout<NOps> LV = L;
  const bool vec = vectorize<NOps>(LV, raw, kVec);

  if (L.ndim == 1) {
    const StridedLayout<NOps>& F1 = vec ? LV : L;
    std::array<int64_t, NOps> s{};
    for (int op = 0; op < NOps; ++op) s[op] = F1.strides[op][0];
    const int64_t n = F1.sizes[0];
    // a block per kThreads * kUnroll items (no grid-stride rounds: no uneven last round)
    const auto grid = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(n, kThreads * kUnroll), INT32_MAX));
    if (vec) elementwise_flat_kernel<T, kVec, NIn><<<grid, kThreads, 0, stream>>>(o, ptrs, s, n, f);
    else elementwise_flat_kernel<T, 1, NIn><<<grid, kThreads, 0, stream>>>(o, ptrs, s, n, f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }

  StridedLayout<NOps> LT;
  std::array<bool, NIn> tiled{};
  if (!vec && plan_tiles<NOps>(L, LT, tiled)) {
    const int64_t row_tiles = ceil_div<int64_t>(LT.sizes[LT.ndim - 2], kTile);
    const int64_t col_tiles = ceil_div<int64_t>(LT.sizes[LT.ndim - 1], kTile);
    const int64_t tiles = LT.numel() / LT.sizes[LT.ndim - 2] / LT.sizes[LT.ndim - 1] * row_tiles * col_tiles;
    const unsigned grid = grid_for(tiles, 1);  // a tile per block, grid-stride beyond the device's fill
    elementwise_tiled_kernel<T, NIn><<<grid, kTile * kTileRows, 0, stream>>>(LT, o, ptrs, tiled, row_tiles,
                                                                             col_tiles, tiles, f);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }

  const int64_t n = vec ? LV.numel() : L.numel();
  const unsigned grid = grid_for(n, kThreads);
  // 32-bit index arithmetic while n + the grid's stride fits
  const bool small = n + static_cast<int64_t>(grid) * kThreads < (int64_t{1} << 31);
  if (vec) {
    if (small) elementwise_kernel<T, kVec, uint32_t, NIn><<<grid, kThreads, 0, stream>>>(LV, o, ptrs, static_cast<uint32_t>(n), f);
    else elementwise_kernel<T, kVec, int64_t, NIn><<<grid, kThreads, 0, stream>>>(LV, o, ptrs, n, f);
  } else {
    if (small) elementwise_kernel<T, 1, uint32_t, NIn><<<grid, kThreads, 0, stream>>>(L, o, ptrs, static_cast<uint32_t>(n), f);
    else elementwise_kernel<T, 1, int64_t, NIn><<<grid, kThreads, 0, stream>>>(L, o, ptrs, n, f);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T>
void map_typed(const at::Tensor& out, const at::Tensor& x, const StridedLayout<2>& L, MapFn fn) {
  const std::array<const at::Tensor*, 1> in{&x};
  switch (fn) {
#define POINTOPS_MAP_CASE(F) \
  case MapFn::F: launch_elementwise<T, 1>(out, in, L, MapOp<MapFn::F>{}); break;
    POINTOPS_MAP_CASE(Id) POINTOPS_MAP_CASE(Neg) POINTOPS_MAP_CASE(Exp) POINTOPS_MAP_CASE(Log)
    POINTOPS_MAP_CASE(Sigmoid) POINTOPS_MAP_CASE(Relu) POINTOPS_MAP_CASE(Inv) POINTOPS_MAP_CASE(Tanh)
#undef POINTOPS_MAP_CASE
  }
}

template <typename T>
void zip_typed(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L, ZipFn fn) {
  const std::array<const at::Tensor*, 2> in{&a, &b};
  switch (fn) {
#define POINTOPS_ZIP_CASE(F) \
  case ZipFn::F: launch_elementwise<T, 2>(out, in, L, ZipOp<ZipFn::F>{}); break;
    POINTOPS_ZIP_CASE(Add) POINTOPS_ZIP_CASE(Sub) POINTOPS_ZIP_CASE(Mul) POINTOPS_ZIP_CASE(Div)
    POINTOPS_ZIP_CASE(Max) POINTOPS_ZIP_CASE(Min) POINTOPS_ZIP_CASE(Pow) POINTOPS_ZIP_CASE(Lt)
    POINTOPS_ZIP_CASE(Eq) POINTOPS_ZIP_CASE(IsClose) POINTOPS_ZIP_CASE(ReluBack) POINTOPS_ZIP_CASE(LogBack)
    POINTOPS_ZIP_CASE(InvBack)
#undef POINTOPS_ZIP_CASE
  }
}

void map_into_cuda(const at::Tensor& out, const at::Tensor& x, const StridedLayout<2>& L, MapFn fn) {
  const c10::cuda::CUDAGuard guard(out.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "strided_map_cuda",
                                  [&] { map_typed<scalar_t>(out, x, L, fn); });
}

void zip_into_cuda(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L,
                   ZipFn fn) {
  const c10::cuda::CUDAGuard guard(out.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "strided_zip_cuda",
                                  [&] { zip_typed<scalar_t>(out, a, b, L, fn); });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("strided_map", &map_entry<map_into_cuda>);
  m.impl("strided_map_out", &map_out_entry<map_into_cuda>);
  m.impl("strided_zip", &zip_entry<zip_into_cuda>);
  m.impl("strided_zip_out", &zip_out_entry<zip_into_cuda>);
}

}  // namespace strided
}  // namespace pointops
