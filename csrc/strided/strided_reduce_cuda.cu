// Strided reductions on CUDA (entries shared with the CPU in strided_entries.h).
//
// Deterministic: the launch shape and every thread's share of the elements depend only on the
// problem's shape (never on the GPU's SM count or on pointer alignment), and partials combine in
// fixed trees and in chunk order, so the same input gives bitwise the same output on every run.
//   inner (a reduced dim is the input's innermost): a group of G threads reduces one output, or
//     one chunk of it (G = a warp for reductions up to kWarpMax elements,
//     else a block). Thread `lane` takes the runs of V consecutive elements q = lane, lane + G, ...
//     (V = 16 bytes of elements), read as one 16-byte vector when the reduced dim is unit-stride
//     and aligned, else element by element in the same order.
//   outer (a kept dim is innermost): a 32 x 8 block reduces 32 runs of V adjacent outputs (or 32
//     single outputs when the columns cannot be read as vectors): threadIdx.x walks the columns
//     (coalesced), threadIdx.y every 8th reduced element; the 8 partials combine in order through
//     shared memory. The reduced range is split into chunks across grid.y so that about
//     kOuterBlocks blocks run.
// Chunk partials (inner: [output][chunk]; outer: [chunk][output]) combine in chunk order in a
// second kernel, launched as a programmatic dependent launch on Hopper (cuda_utils.cuh): it is
// resident while the first kernel drains and waits for its writes there, instead of being launched
// after it (the sum of all 2^25 float32 elements: 0.90x torch without, 0.91-0.92x with, two H200s).
// Sums: each thread adds a run of up to 8 terms (a vector's elements, or the rows loaded together)
// pairwise in the compute type (at most 3 roundings of the run's magnitude), then accumulates the
// run sums in float64; other fns combine element by element in the compute type.
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

constexpr int64_t kInnerChunk = 16384;  // long inner reductions: at least this many elements per block,
// ... in chunks until about this many blocks run. Measured on two H200s (a sum of all 2^25 float32,
// three runs each): 1024 blocks of 32768 elements 0.91-0.92x torch, 2048 of 16384 0.96x, 4096 of
// 8192 0.90x.
constexpr int64_t kInnerBlocks = 2048;
constexpr int64_t kWarpMax = 2048;      // inner reductions up to this length: a warp per output
constexpr int kOuterRows = 8;           // threadIdx.y extent of the outer kernel
constexpr int64_t kOuterBlocks = 1024;  // outer reductions: chunks until about this many blocks run
constexpr int64_t kOuterMinChunk = 256; // ... but at least this many reduced elements per chunk
constexpr int kLoadsInFlight = 4;       // independent loads per thread before combining them
constexpr int64_t kCombineSerialMax = 64;  // up to this many chunk partials: a thread per output

int64_t round_up(int64_t x, int64_t m) { return ceil_div(x, m) * m; }

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

template <ReduceFn F, typename T>
using TotalOf = typename DeviceReducer<F, at::opmath_type<T>>::Total;

template <ReduceFn F, typename Total>
__device__ __forceinline__ Total warp_combine(Total v) {
#pragma unroll
  for (int w = 16; w >= 1; w /= 2) v = DeviceReducer<F, Total>::combine(v, __shfl_down_sync(0xffffffffu, v, w));
  return v;
}

// The values of the block's threads combined in a fixed tree (each warp's, then the warps'
// results); true for the thread that holds the result (thread 0). Every thread must call it.
template <ReduceFn F, typename Total>
__device__ __forceinline__ bool block_combine(Total& acc) {
  __shared__ Total warps[kThreads / 32];
  acc = warp_combine<F>(acc);
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x >= 32) return false;
  acc = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : DeviceReducer<F, Total>::identity();
  acc = warp_combine<F>(acc);
  return threadIdx.x == 0;
}

// The pairwise sum of v[0..N) (N a power of two) in the compute type.
template <int N, typename A>
__device__ __forceinline__ A pairwise_sum(const A* v) {
  if constexpr (N == 1) return v[0];
  else return pairwise_sum<N / 2>(v) + pairwise_sum<N / 2>(v + N / 2);
}

// Element offset of reduced element r (one multiply when the reduced dims merged into one).
__device__ __forceinline__ int64_t reduced_offset(const StridedLayout<1>& red, int64_t r) {
  if (red.ndim == 1) return r * red.strides[0][0];
  int64_t off[1];
  offsets_of<int64_t>(red, r, off);
  return off[0];
}

// Inner reductions: group g = blockIdx.x * (kThreads / G) + threadIdx.x / G reduces chunk
// g % chunks of output g / chunks. Vec: the reduced dim is unit-stride, count a multiple of V and
// every row 16-byte aligned.
template <ReduceFn F, typename T, int G, bool Vec>
__global__ void __launch_bounds__(kThreads)
    reduce_inner_kernel(const StridedLayout<2> kept, const StridedLayout<1> red, T* __restrict__ out,
                        const T* __restrict__ x, TotalOf<F, T>* __restrict__ partial, const int64_t groups,
                        const int64_t count, const int64_t chunk, const int64_t chunks) {
  using A = at::opmath_type<T>;
  using R = DeviceReducer<F, A>;
  using Total = TotalOf<F, T>;
  constexpr int V = 16 / sizeof(T);
  using P = Pack<T, V>;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * (kThreads / G) + threadIdx.x / G;
  const int lane = threadIdx.x % G;
  if (chunks > 1) allow_dependent_launch();  // the combine kernel may take its SM slot now
  if (g >= groups) return;  // whole groups leave together (G = kThreads: one group per block)
  const int64_t o = g / chunks, c = g % chunks;
  int64_t ko[2];
  offsets_of<int64_t>(kept, o, ko);
  const T* row = x + ko[1];
  const int64_t begin = c * chunk, len = std::min(count, begin + chunk) - begin;
  const int64_t runs = ceil_div<int64_t>(len, V);
  Total acc = R::identity();
  for (int64_t q0 = lane; q0 < runs; q0 += static_cast<int64_t>(G) * kLoadsInFlight) {
    A v[kLoadsInFlight][V];
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t q = q0 + static_cast<int64_t>(u) * G;
      if (q >= runs) continue;
      if constexpr (Vec) {
        const P p = *reinterpret_cast<const P*>(row + begin + q * V);
#pragma unroll
        for (int j = 0; j < V; ++j) v[u][j] = static_cast<A>(p.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const int64_t e = q * V + j;
          v[u][j] = e < len ? static_cast<A>(row[reduced_offset(red, begin + e)]) : A(0);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsInFlight; ++u) {
      const int64_t q = q0 + static_cast<int64_t>(u) * G;
      if constexpr (F == ReduceFn::Sum) {  // the missing elements of a partial run read as 0
        if (q < runs) acc += static_cast<Total>(pairwise_sum<V>(v[u]));
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j)
          if (q < runs && q * V + j < len) acc = R::combine(acc, static_cast<Total>(v[u][j]));
      }
    }
  }
  static_assert(G == 32 || G == kThreads, "a warp or a block per group");
  if constexpr (G == 32) {
    acc = warp_combine<F>(acc);
    if (lane != 0) return;
  } else if (!block_combine<F>(acc)) {
    return;
  }
  if (chunks == 1) out[ko[0]] = static_cast<T>(acc);
  else partial[g] = acc;
}

// Outer reductions: block (bx, c) reduces chunk c of outputs [(bx * 32 + tx) * V, ... + V), which
// are adjacent along the kept innermost dim (width: its size, a multiple of V).
template <ReduceFn F, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    reduce_outer_kernel(const StridedLayout<2> kept, const StridedLayout<1> red, T* __restrict__ out,
                        const T* __restrict__ x, TotalOf<F, T>* __restrict__ partial, const int64_t outputs,
                        const int64_t count, const int64_t chunk) {
  using A = at::opmath_type<T>;
  using R = DeviceReducer<F, A>;
  using Total = TotalOf<F, T>;
  using P = Pack<T, V>;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  if (gridDim.y > 1) allow_dependent_launch();  // the combine kernel may take its SM slot now
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * 32 + tx) * V;
  const bool active = o0 < outputs;
  int64_t ko[2] = {0, 0};
  if (active) offsets_of<int64_t>(kept, o0, ko);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk, end = std::min(count, begin + chunk);
  Total acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = R::identity();
  if (active) {
    for (int64_t r0 = begin + ty; r0 < end; r0 += kOuterRows * kLoadsInFlight) {
      P p[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int64_t r = r0 + u * kOuterRows;
        if (r < end) p[u] = *reinterpret_cast<const P*>(x + ko[1] + reduced_offset(red, r));
      }
      if constexpr (F == ReduceFn::Sum) {  // the rows loaded together, pairwise; missing rows add 0
#pragma unroll
        for (int j = 0; j < V; ++j) {
          A v[kLoadsInFlight];
#pragma unroll
          for (int u = 0; u < kLoadsInFlight; ++u) v[u] = r0 + u * kOuterRows < end ? static_cast<A>(p[u].v[j]) : A(0);
          acc[j] += static_cast<Total>(pairwise_sum<kLoadsInFlight>(v));
        }
      } else {
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          if (r0 + u * kOuterRows < end) {
#pragma unroll
            for (int j = 0; j < V; ++j) acc[j] = R::combine(acc[j], static_cast<Total>(static_cast<A>(p[u].v[j])));
          }
        }
      }
    }
  }
  __shared__ Total rows[kOuterRows][32][V];
#pragma unroll
  for (int j = 0; j < V; ++j) rows[ty][tx][j] = acc[j];
  __syncthreads();
  if (ty != 0 || !active) return;
  const int64_t out_stride = kept.strides[0][kept.ndim - 1];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    Total a = rows[0][tx][j];
    for (int y = 1; y < kOuterRows; ++y) a = R::combine(a, rows[y][tx][j]);
    if (gridDim.y == 1) out[ko[0] + j * out_stride] = static_cast<T>(a);
    else partial[static_cast<int64_t>(blockIdx.y) * outputs + o0 + j] = a;
  }
}

// Output o combines partial[o * stride_o + c * stride_c], c = 0, 1, ... : G threads per output,
// lane taking c = lane, lane + G, ... in order, then a fixed tree (G = 1: one thread, in order).
template <ReduceFn F, typename T, int G>
__global__ void __launch_bounds__(kThreads)
    combine_partials(const StridedLayout<2> kept, T* __restrict__ out, const TotalOf<F, T>* __restrict__ partial,
                     const int64_t outputs, const int64_t chunks, const int64_t stride_o, const int64_t stride_c) {
  using R = DeviceReducer<F, at::opmath_type<T>>;
  using Total = TotalOf<F, T>;
  const int64_t o = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / G;
  const int lane = threadIdx.x % G;
  wait_for_previous_grid();  // the partials are the previous kernel's (a dependent launch)
  if (o >= outputs) return;  // whole groups leave together
  Total acc = R::identity();
#pragma unroll 4
  for (int64_t c = lane; c < chunks; c += G) acc = R::combine(acc, partial[o * stride_o + c * stride_c]);
  if constexpr (G > 1) {
    static_assert(G == kThreads, "a block per output");
    if (!block_combine<F>(acc)) return;
  }
  int64_t ko[2];
  offsets_of<int64_t>(kept, o, ko);
  out[ko[0]] = static_cast<T>(acc);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <ReduceFn F, typename T>
void reduce_typed(const at::Tensor& res, const at::Tensor& x, const ReducePlan& P, bool outer) {
  using Total = TotalOf<F, T>;
  constexpr int V = 16 / sizeof(T);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t outputs = P.kept.numel(), count = P.reduced.numel();
  T* o = res.data_ptr<T>();
  const T* in = x.const_data_ptr<T>();
  const auto total_type = sizeof(Total) == 8 ? at::kDouble : at::kFloat;
  const auto blocks = [](int64_t n) { return static_cast<unsigned>(ceil_div<int64_t>(n, kThreads)); };
  auto combine = [&](const Total* pp, int64_t chunks, int64_t stride_o, int64_t stride_c) {
    if (chunks > kCombineSerialMax) {
      TORCH_CHECK(outputs < (int64_t{1} << 31), "reduce: ", outputs, " outputs exceed the CUDA grid");
      launch_after_previous(combine_partials<F, T, kThreads>, dim3(static_cast<unsigned>(outputs)), dim3(kThreads),
                            stream, P.kept, o, pp, outputs, chunks, stride_o, stride_c);
    } else {
      launch_after_previous(combine_partials<F, T, 1>, dim3(blocks(outputs)), dim3(kThreads), stream, P.kept, o, pp,
                            outputs, chunks, stride_o, stride_c);
    }
  };
  const int ki = P.kept.ndim - 1, ri = P.reduced.ndim - 1;
  if (outer) {
    // V adjacent outputs per thread when they are adjacent in x and every run is 16-byte aligned
    bool vec = P.kept.strides[1][ki] == 1 && P.kept.sizes[ki] % V == 0 && aligned16(in);
    for (int d = 0; d < ki; ++d) vec = vec && P.kept.strides[1][d] % V == 0;
    for (int d = 0; d <= ri; ++d) vec = vec && P.reduced.strides[0][d] % V == 0;
    const int64_t xblocks = ceil_div<int64_t>(outputs, 32 * (vec ? V : 1));
    TORCH_CHECK(xblocks < (int64_t{1} << 31), "reduce: ", outputs, " outputs exceed the CUDA grid");
    // the chunking depends on the shape only (as if vectorised), never on the alignment
    const int64_t wanted = std::max<int64_t>(1, ceil_div<int64_t>(kOuterBlocks, ceil_div<int64_t>(outputs, 32 * V)));
    const int64_t chunk = std::max(kOuterMinChunk, ceil_div<int64_t>(count, wanted));
    const int64_t chunks = ceil_div<int64_t>(count, chunk);
    at::Tensor partial = chunks > 1 ? at::empty({outputs * chunks}, x.options().dtype(total_type)) : at::Tensor();
    Total* pp = chunks > 1 ? static_cast<Total*>(partial.data_ptr()) : nullptr;
    const dim3 grid(static_cast<unsigned>(xblocks), static_cast<unsigned>(chunks));
    if (vec) reduce_outer_kernel<F, T, V><<<grid, kThreads, 0, stream>>>(P.kept, P.reduced, o, in, pp, outputs, count, chunk);
    else reduce_outer_kernel<F, T, 1><<<grid, kThreads, 0, stream>>>(P.kept, P.reduced, o, in, pp, outputs, count, chunk);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (chunks > 1) combine(pp, chunks, 1, outputs);
    return;
  }
  // inner: vector reads when the reduced elements are one unit-stride run per output, aligned
  bool vec = P.reduced.ndim == 1 && P.reduced.strides[0][0] == 1 && count % V == 0 && aligned16(in);
  for (int d = 0; d <= ki; ++d) vec = vec && P.kept.strides[1][d] % V == 0;
  const bool warp = count <= kWarpMax;
  // long reductions: chunks of at least kInnerChunk elements until about kInnerBlocks blocks run
  // (a multiple of 2048 elements keeps every chunk 16-byte aligned for any V)
  const int64_t per_output = ceil_div<int64_t>(kInnerBlocks, outputs);
  const int64_t chunk = warp ? count : round_up(std::max(kInnerChunk, ceil_div<int64_t>(count, per_output)), 2048);
  const int64_t chunks = ceil_div<int64_t>(count, chunk);
  const int64_t groups = outputs * chunks;
  const int64_t nblocks = warp ? ceil_div<int64_t>(groups, kThreads / 32) : groups;
  TORCH_CHECK(nblocks < (int64_t{1} << 31), "reduce: ", outputs, " outputs of ", count,
              " elements need too many blocks for the CUDA inner reduction");
  at::Tensor partial = chunks > 1 ? at::empty({groups}, x.options().dtype(total_type)) : at::Tensor();
  Total* pp = chunks > 1 ? static_cast<Total*>(partial.data_ptr()) : nullptr;
  const auto grid = static_cast<unsigned>(nblocks);
#define POINTOPS_INNER(G, VEC) \
  reduce_inner_kernel<F, T, G, VEC><<<grid, kThreads, 0, stream>>>(P.kept, P.reduced, o, in, pp, groups, count, chunk, chunks)
  if (warp) {
    if (vec) POINTOPS_INNER(32, true);
    else POINTOPS_INNER(32, false);
  } else {
    if (vec) POINTOPS_INNER(kThreads, true);
    else POINTOPS_INNER(kThreads, false);
  }
#undef POINTOPS_INNER
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (chunks > 1) combine(pp, chunks, chunks, 1);
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

TORCH_LIBRARY_IMPL(pointops, CUDA, m) { m.impl("strided_reduce", &reduce_entry<reduce_into_cuda>); }

}  // namespace strided
}  // namespace pointops
