// Strided map / zip / reduce on CUDA. The entries (checks, allocation, the > kMaxDims fallback) are
// shared with the CPU (strided_entries.h); this file holds the kernels and their launch choices.
//
// Elementwise: one thread per element (grid-stride), offsets from the merged StridedLayout (int64
// offsets; the index decomposition in 32 bits when the element count allows). When every operand's
// innermost dim is unit-stride, its length a multiple of the vector width and every outer stride
// and base pointer 16-byte aligned, the layout is rescaled to 16-byte vectors and each thread moves
// 128 bits per operand.
// Reductions (deterministic: the launch shape depends only on the problem's shape):
//   inner (a reduced dim is the input's innermost): a warp per output for short reductions; a block
//     per (output, chunk of kInnerChunk elements) for long ones, chunk partials combined in order by
//     a second kernel;
//   outer (a kept dim is innermost): a thread per output, adjacent threads reading adjacent
//     columns (coalesced); the reduced range split into chunks of kOuterChunk across grid.y, the
//     partials combined in chunk order.
// Sums accumulate in float64 per thread and combine in fixed trees; other fns in the compute type.
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

constexpr int64_t kInnerChunk = 1 << 16;  // reduced elements per block (long inner reductions)
constexpr int64_t kWarpMax = 2048;        // inner reductions up to this length: a warp per output
constexpr int64_t kOuterChunk = 4096;     // reduced elements per thread and chunk (outer reductions)

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
      if constexpr (NIn == 1) {
        r.v[j] = static_cast<T>(f(static_cast<A>(x[0].v[j])));
      } else {
        r.v[j] = static_cast<T>(f(static_cast<A>(x[0].v[j]), static_cast<A>(x[1].v[j])));
      }
    }
    *reinterpret_cast<P*>(out + off[0] * V) = r;
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

template <typename T, int NIn, typename F>
void launch_elementwise(const at::Tensor& out, const std::array<const at::Tensor*, NIn>& in, const F& f) {
  constexpr int NOps = NIn + 1;
  std::array<std::vector<int64_t>, NOps> strides;
  strides[0] = out.strides().vec();
  for (int k = 0; k < NIn; ++k) strides[k + 1] = broadcast_strides(*in[k], out.sizes());
  StridedLayout<NOps> L;
  TORCH_INTERNAL_ASSERT(make_layout<NOps>(out.sizes(), strides, L));
  Inputs<T, NIn> ptrs{};
  const void* raw[NOps];
  raw[0] = out.data_ptr();
  for (int k = 0; k < NIn; ++k) {
    ptrs.p[k] = in[k]->template const_data_ptr<T>();
    raw[k + 1] = ptrs.p[k];
  }
  constexpr int kVec = 16 / sizeof(T);
  StridedLayout<NOps> LV = L;
  const bool vec = vectorize<NOps>(LV, raw, kVec);
  const int64_t n = vec ? LV.numel() : L.numel();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const unsigned grid = grid_for(n, kThreads);
  T* o = out.data_ptr<T>();
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
void map_typed(const at::Tensor& out, const at::Tensor& x, MapFn fn) {
  const std::array<const at::Tensor*, 1> in{&x};
  switch (fn) {
#define POINTOPS_MAP_CASE(F) \
  case MapFn::F: launch_elementwise<T, 1>(out, in, MapOp<MapFn::F>{}); break;
    POINTOPS_MAP_CASE(Id) POINTOPS_MAP_CASE(Neg) POINTOPS_MAP_CASE(Exp) POINTOPS_MAP_CASE(Log)
    POINTOPS_MAP_CASE(Sigmoid) POINTOPS_MAP_CASE(Relu) POINTOPS_MAP_CASE(Inv) POINTOPS_MAP_CASE(Tanh)
#undef POINTOPS_MAP_CASE
  }
}

template <typename T>
void zip_typed(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ZipFn fn) {
  const std::array<const at::Tensor*, 2> in{&a, &b};
  switch (fn) {
#define POINTOPS_ZIP_CASE(F) \
  case ZipFn::F: launch_elementwise<T, 2>(out, in, ZipOp<ZipFn::F>{}); break;
    POINTOPS_ZIP_CASE(Add) POINTOPS_ZIP_CASE(Sub) POINTOPS_ZIP_CASE(Mul) POINTOPS_ZIP_CASE(Div)
    POINTOPS_ZIP_CASE(Max) POINTOPS_ZIP_CASE(Min) POINTOPS_ZIP_CASE(Pow) POINTOPS_ZIP_CASE(Lt)
    POINTOPS_ZIP_CASE(Eq) POINTOPS_ZIP_CASE(IsClose) POINTOPS_ZIP_CASE(ReluBack) POINTOPS_ZIP_CASE(LogBack)
    POINTOPS_ZIP_CASE(InvBack)
#undef POINTOPS_ZIP_CASE
  }
}

void map_into_cuda(const at::Tensor& out, const at::Tensor& x, MapFn fn) {
  const c10::cuda::CUDAGuard guard(out.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "strided_map_cuda",
                                  [&] { map_typed<scalar_t>(out, x, fn); });
}

void zip_into_cuda(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ZipFn fn) {
  const c10::cuda::CUDAGuard guard(out.device());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "strided_zip_cuda",
                                  [&] { zip_typed<scalar_t>(out, a, b, fn); });
}

// ------------------------------------------------------------------------------------ reductions
template <ReduceFn F, typename A>
struct DeviceReducer {
  using Total = std::conditional_t<F == ReduceFn::Sum, double, A>;
  __device__ static Total identity() {
    if constexpr (F == ReduceFn::Sum) return Total(0);
    if constexpr (F == ReduceFn::Prod) return Total(1);
    if constexpr (F == ReduceFn::Max) return -INFINITY;
    if constexpr (F == ReduceFn::Min) return INFINITY;
  }
  __device__ static Total combine(Total a, Total b) {
    if constexpr (F == ReduceFn::Sum) return a + b;
    if constexpr (F == ReduceFn::Prod) return a * b;
    if constexpr (F == ReduceFn::Max) return (a != a || a > b) ? a : b;  // NaN propagates
    if constexpr (F == ReduceFn::Min) return (a != a || a < b) ? a : b;
  }
};

template <typename Total>
__device__ __forceinline__ Total shuffle_down(Total v, int delta) {
  return __shfl_down_sync(0xffffffffu, v, delta);
}

template <ReduceFn F, typename Total>
__device__ __forceinline__ Total warp_combine(Total v) {
#pragma unroll
  for (int w = 16; w >= 1; w /= 2) v = DeviceReducer<F, Total>::combine(v, shuffle_down(v, w));
  return v;
}

// Inner reductions, short: warp w of the grid reduces output w.
template <ReduceFn F, typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_inner_warp(const StridedLayout<2> kept, const StridedLayout<1> red, T* __restrict__ out,
                      const T* __restrict__ x, int64_t outputs, int64_t count) {
  using A = at::opmath_type<T>;
  using R = DeviceReducer<F, A>;
  const int64_t o = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (o >= outputs) return;  // whole warps leave together
  int64_t ko[2];
  offsets_of<int64_t>(kept, o, ko);
  typename R::Total acc = R::identity();
  for (int64_t r = lane; r < count; r += 32) {
    int64_t ro[1];
    offsets_of<int64_t>(red, r, ro);
    acc = R::combine(acc, static_cast<typename R::Total>(static_cast<A>(x[ko[1] + ro[0]])));
  }
  acc = warp_combine<F>(acc);
  if (lane == 0) out[ko[0]] = static_cast<T>(acc);
}

// Inner reductions, long: block (o, c) reduces chunk c of output o into partial[o * chunks + c].
template <ReduceFn F, typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_inner_block(const StridedLayout<2> kept, const StridedLayout<1> red, const T* __restrict__ x,
                       typename DeviceReducer<F, at::opmath_type<T>>::Total* __restrict__ partial, int64_t count,
                       int64_t chunks) {
  using A = at::opmath_type<T>;
  using R = DeviceReducer<F, A>;
  using Total = typename R::Total;
  const int64_t o = blockIdx.x / chunks, c = blockIdx.x % chunks;
  int64_t ko[2];
  offsets_of<int64_t>(kept, o, ko);
  const int64_t end = std::min(count, (c + 1) * kInnerChunk);
  Total acc = R::identity();
  for (int64_t r = c * kInnerChunk + threadIdx.x; r < end; r += kThreads) {
    int64_t ro[1];
    offsets_of<int64_t>(red, r, ro);
    acc = R::combine(acc, static_cast<Total>(static_cast<A>(x[ko[1] + ro[0]])));
  }
  __shared__ Total warps[kThreads / 32];
  acc = warp_combine<F>(acc);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : R::identity();
    acc = warp_combine<F>(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
  }
}

// Outer reductions: thread (o, chunk) reduces chunk blockIdx.y of output o.
template <ReduceFn F, typename T>
__global__ void __launch_bounds__(kThreads)
    reduce_outer(const StridedLayout<2> kept, const StridedLayout<1> red, T* __restrict__ out, const T* __restrict__ x,
                 typename DeviceReducer<F, at::opmath_type<T>>::Total* __restrict__ partial, int64_t outputs,
                 int64_t count) {
  using A = at::opmath_type<T>;
  using R = DeviceReducer<F, A>;
  using Total = typename R::Total;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (o >= outputs) return;
  int64_t ko[2];
  offsets_of<int64_t>(kept, o, ko);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kOuterChunk, end = std::min(count, begin + kOuterChunk);
  Total acc = R::identity();
  for (int64_t r = begin; r < end; ++r) {
    int64_t ro[1];
    offsets_of<int64_t>(red, r, ro);
    acc = R::combine(acc, static_cast<Total>(static_cast<A>(x[ko[1] + ro[0]])));
  }
  if (gridDim.y == 1) out[ko[0]] = static_cast<T>(acc);
  else partial[o * gridDim.y + blockIdx.y] = acc;
}

// partial[o * chunks + c] combined in chunk order into out.
template <ReduceFn F, typename T>
__global__ void __launch_bounds__(kThreads)
    combine_partials(const StridedLayout<2> kept, T* __restrict__ out,
                     const typename DeviceReducer<F, at::opmath_type<T>>::Total* __restrict__ partial, int64_t outputs,
                     int64_t chunks) {
  using R = DeviceReducer<F, at::opmath_type<T>>;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (o >= outputs) return;
  int64_t ko[2];
  offsets_of<int64_t>(kept, o, ko);
  auto acc = partial[o * chunks];
  for (int64_t c = 1; c < chunks; ++c) acc = R::combine(acc, partial[o * chunks + c]);
  out[ko[0]] = static_cast<T>(acc);
}

template <ReduceFn F, typename T>
void reduce_typed(const at::Tensor& res, const at::Tensor& x, const ReducePlan& P, bool outer) {
  using Total = typename DeviceReducer<F, at::opmath_type<T>>::Total;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t outputs = P.kept.numel(), count = P.reduced.numel();
  T* o = res.data_ptr<T>();
  const T* in = x.const_data_ptr<T>();
  const auto total_type = sizeof(Total) == 8 ? at::kDouble : at::kFloat;
  const auto blocks = [](int64_t n) { return static_cast<unsigned>(ceil_div<int64_t>(n, kThreads)); };
  if (outer) {
    const int64_t chunks = ceil_div(count, kOuterChunk);
    TORCH_CHECK(chunks < 65536, "reduce: ", count, " reduced elements per output exceed the CUDA outer-reduction limit");
    at::Tensor partial = chunks > 1 ? at::empty({outputs * chunks}, x.options().dtype(total_type)) : at::Tensor();
    Total* pp = chunks > 1 ? static_cast<Total*>(partial.data_ptr()) : nullptr;
    reduce_outer<F, T><<<dim3(blocks(outputs), static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
        P.kept, P.reduced, o, in, pp, outputs, count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (chunks > 1) {
      combine_partials<F, T><<<blocks(outputs), kThreads, 0, stream>>>(P.kept, o, pp, outputs, chunks);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  } else if (count <= kWarpMax) {
    reduce_inner_warp<F, T><<<blocks(outputs * 32), kThreads, 0, stream>>>(P.kept, P.reduced, o, in, outputs, count);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    const int64_t chunks = ceil_div(count, kInnerChunk);
    TORCH_CHECK(outputs * chunks < (int64_t{1} << 31), "reduce: too many blocks for the CUDA inner reduction");
    at::Tensor partial = at::empty({outputs * chunks}, x.options().dtype(total_type));
    Total* pp = static_cast<Total*>(partial.data_ptr());
    reduce_inner_block<F, T><<<static_cast<unsigned>(outputs * chunks), kThreads, 0, stream>>>(P.kept, P.reduced, in,
                                                                                               pp, count, chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    combine_partials<F, T><<<blocks(outputs), kThreads, 0, stream>>>(P.kept, o, pp, outputs, chunks);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

void reduce_into_cuda(const at::Tensor& res, const at::Tensor& x, const ReducePlan& P, ReduceFn fn) {
  const c10::cuda::CUDAGuard guard(res.device());
  const bool outer = reduce_is_outer(P);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "strided_reduce_cuda", [&] {
    switch (fn) {
      case ReduceFn::Sum: reduce_typed<ReduceFn::Sum, scalar_t>(res, x, P, outer); break;
      case ReduceFn::Prod: reduce_typed<ReduceFn::Prod, scalar_t>(res, x, P, outer); break;
      case ReduceFn::Max: reduce_typed<ReduceFn::Max, scalar_t>(res, x, P, outer); break;
      case ReduceFn::Min: reduce_typed<ReduceFn::Min, scalar_t>(res, x, P, outer); break;
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("strided_map", &map_entry<map_into_cuda>);
  m.impl("strided_map_out", &map_out_entry<map_into_cuda>);
  m.impl("strided_zip", &zip_entry<zip_into_cuda>);
  m.impl("strided_zip_out", &zip_out_entry<zip_into_cuda>);
  m.impl("strided_reduce", &reduce_entry<reduce_into_cuda>);
}

}  // namespace strided
}  // namespace pointops
