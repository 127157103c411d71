// Particle sums on CUDA: the kernels, their launch planning and the split merge. Included by the
// per-kernel translation units (particle_sum_cuda_{gaussian,laplace,helmholtz,generic}.cu), which
// instantiate them in parallel compiles, and by the launcher (particle_sum_cuda.cu).
//
// D = 3 kernels: each thread owns Q targets in registers; tiles of kTile sources (coordinates and
// their weight columns) stream through shared memory, and every source read from shared memory
// serves Q pairs. Per pair the Gaussian costs 3 FADD + FMUL + 2 FFMA (r^2 from exact differences),
// FMUL (the scale), MUFU.EX2 and the FFMA of the accumulation: the exact difference form costs
// one instruction more than pre-scaled coordinates would, and pre-scaling loses up to 2e-6 at
// sigma = 0.01 in the unit cube (extent / sigma times the float32 rounding), over the accuracy
// target. Issue-bound: 9 instructions per pair, ~14 pairs per clock per SM.
//
// Accuracy: each block of kBlockSum sources is summed in the compute type into fresh
// accumulators, which are then added into float64 totals (a plain float32 running sum over 10^6
// terms loses ~1e-5). The singular kernels do not test r = 0 per pair: 1/sqrt(0) makes the block
// sum non-finite, and only then is the block summed again with coincident pairs dropped (the
// rule of the CPU kernels: r^2 below the smallest normal number). NaN inputs take the same path
// and stay NaN.
//
// Few targets: the sources are split across blocks (grid.y); each split writes its float64 totals
// and a merge kernel adds them in a fixed order (no atomics: bitwise reproducible).
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/cuda_utils.cuh"
#include "particle_sum/particle_sum.h"

namespace pointops {
namespace particle_sum_cuda {

constexpr int kThreads = 128;     // threads per block, every kernel
constexpr int kTile = 256;        // sources per shared-memory tile (D = 3 kernels)
constexpr int kBlockSum = 64;     // sources per compute-type partial sum (as on the CPU)
constexpr int64_t kMinSplit = 1024;  // the fewest sources a split gets
constexpr int64_t kScratchBytes = int64_t(32) << 20;  // split totals: at most this much scratch

// Kernel constants in the compute type.
template <typename T>
struct PairConstants {
  T exp2_scale;    // gaussian: g = exp2(exp2_scale * r^2)
  T wavenumber;    // helmholtz k
  float turns_hi;  // float helmholtz: k / (2 pi) = turns_hi + turns_lo
  float turns_lo;
};

// One launch: a chunk of R real weight columns (from column_begin) for all targets.
template <typename T>
struct LaunchArgs {
  const T* targets;  // (B, M, D)
  const T* sources;  // (B, N, D)
  const T* weights;  // (B, N, weight_row)
  int64_t B, M, N, D, weight_row, column_begin;
  int64_t target_chunks;  // blocks along one batch's targets
  int64_t split_len;      // sources per split (a multiple of kBlockSum)
  int64_t num_splits;
  PairConstants<T> k;
  double sum_scale, moment_scale;
  AccumulatorLayout acc;
  OutputLayout out;
  T* sums_real;     // final outputs (num_splits == 1)
  T* moments_real;
  double* partial;  // (num_splits, B * M, accumulators) float64 totals (num_splits > 1)
  bool direct_epilogue;  // accumulator a is output element a (see write_target)
};

// ---------------------------------------------------------------------------------- pair math
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ double fast_exp2(double x) { return exp2(x); }
__device__ __forceinline__ float fast_rsqrt(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ double fast_rsqrt(double x) { return rsqrt(x); }

// g (values) and h = g'(r) / r up to the constant factors finalize applies (h only when MOM).
template <ParticleKernel K, bool MOM>
struct KernelValues;

template <bool MOM>
struct KernelValues<ParticleKernel::Gaussian, MOM> {
  template <typename T>
  __device__ __forceinline__ static void eval(T r2, const PairConstants<T>& c, T* g, T* h) {
    g[0] = fast_exp2(r2 * c.exp2_scale);
    if (MOM) h[0] = g[0];
  }
};

template <bool MOM>
struct KernelValues<ParticleKernel::Laplace, MOM> {
  template <typename T>
  __device__ __forceinline__ static void eval(T r2, const PairConstants<T>&, T* g, T* h) {
    const T a = fast_rsqrt(r2);  // +inf at r = 0: the block is then summed again (see above)
    g[0] = a;
    if (MOM) h[0] = a * a * a;
  }
};

template <bool MOM>
struct KernelValues<ParticleKernel::Helmholtz, MOM> {
  // float: the phase in turns, u = r k / (2 pi), reduced to [-1/2, 1/2] exactly (k / 2 pi split
  // in two floats, fma), so that the fast sine and cosine only see small arguments; r is refined
  // by one Newton step (without it, r's few-ulp error times k r gives 1.1e-5 at k r = 100, over
  // the 1e-5 contract; the step costs 1% of the time). Valid while |u| < 2^22 (the magic-number
  // rounding); beyond that a float32 phase has no correct digits anyway.
  __device__ __forceinline__ static void eval(float r2, const PairConstants<float>& c, float* g, float* h) {
    const float a = fast_rsqrt(r2);
    float r = r2 * a;
    r = fmaf(fmaf(-r, r, r2), 0.5f * a, r);
    const float u = r * c.turns_hi;
    const float n = __fsub_rn(__fadd_rn(u, 12582912.0f), 12582912.0f);  // 1.5 * 2^23: round to integer
    float f = fmaf(r, c.turns_hi, -n);
    f = fmaf(r, c.turns_lo, f);
    float s, co;
    __sincosf(f * 6.28318530717958647692f, &s, &co);
    g[0] = a * co;
    g[1] = a * s;
    if (MOM) {
      const float kr = r * c.wavenumber, a3 = a * a * a;
      h[0] = a3 * (-co - kr * s);
      h[1] = a3 * (kr * co - s);
    }
  }
  __device__ __forceinline__ static void eval(double r2, const PairConstants<double>& c, double* g, double* h) {
    const double a = rsqrt(r2), r = r2 * a, kr = c.wavenumber * r;
    double s, co;
    sincos(kr, &s, &co);
    g[0] = a * co;
    g[1] = a * s;
    if (MOM) {
      const double a3 = a * a * a;
      h[0] = a3 * (-co - kr * s);
      h[1] = a3 * (kr * co - s);
    }
  }
};

// Adds one pair's terms: for every weight column r and part v, acc[(r P + v) S] += g_v w_r and,
// with moments, acc[(r P + v) S + 1 + d] += h_v w_r diff[d] for the first MD dimensions of diff.
// CAREFUL drops coincident pairs of the singular kernels (r^2 below the smallest normal number;
// NaN goes on and propagates).
template <ParticleKernel K, typename T, int R, int MD, bool CAREFUL>
__device__ __forceinline__ void add_pair(T* acc, T r2, const T* diff, const T* w, const PairConstants<T>& c) {
  constexpr int P = kernel_parts(K);
  constexpr int S = 1 + MD;
  if (CAREFUL && r2 < std::numeric_limits<T>::min()) return;
  T g[P], h[P];
  KernelValues<K, (MD > 0)>::eval(r2, c, g, h);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int v = 0; v < P; ++v) {
      T* a = acc + (r * P + v) * S;
      if (MD == 0) {
        a[0] = fma(g[v], w[r], a[0]);
      } else {
        a[0] += g[v] * w[r];
        const T hw = h[v] * w[r];
#pragma unroll
        for (int d = 0; d < MD; ++d) a[1 + d] = fma(hw, diff[d], a[1 + d]);
      }
    }
  }
}

template <typename T, int A>
__device__ __forceinline__ bool all_finite(const T (&acc)[A]) {
  bool ok = true;
#pragma unroll
  for (int a = 0; a < A; ++a) ok &= isfinite(acc[a]);
  return ok;
}

// --------------------------------------------------------------------------------- epilogue
// Writes one target's float64 totals: finalized into the outputs (one split), else as this
// split's partial. Without moments, and unless helmholtz meets complex weights, accumulator a
// is output element a of the chunk (see output_term): a direct store. Otherwise finalize_target,
// reading the totals from `staged`, this thread's slice of shared memory (finalize indexes the
// accumulators at run time, which would move a register array to local memory).
template <typename T, int A>
__device__ __forceinline__ void write_target(const LaunchArgs<T>& args, int64_t target, const double (&total)[A],
                                             double* staged) {
  if (args.num_splits > 1) {
    double* dst = args.partial + (static_cast<int64_t>(blockIdx.y) * args.B * args.M + target) * A;
#pragma unroll
    for (int a = 0; a < A; ++a) dst[a] = total[a];
    return;
  }
  if (args.direct_epilogue) {
    T* dst = args.sums_real + target * args.out.sums_row + args.column_begin * args.acc.parts;
#pragma unroll
    for (int a = 0; a < A; ++a) dst[a] = static_cast<T>(total[a] * args.sum_scale);
    return;
  }
#pragma unroll
  for (int a = 0; a < A; ++a) staged[a] = total[a];
  finalize_target<T>(args.acc, args.out, args.sum_scale, args.moment_scale, [&](int a) { return staged[a]; },
                     args.sums_real + target * args.out.sums_row,
                     args.out.moments_row ? args.moments_real + target * args.out.moments_row : nullptr);
}

// ------------------------------------------------------------------------------- D = 3 kernel
template <typename T>
struct alignas(16) SourcePoint {
  T c[4];  // x, y, z, and the weight when R == 1
};

template <ParticleKernel K, int R, bool MOM>
constexpr int accumulators_d3() {
  return R * kernel_parts(K) * (MOM ? 4 : 1);
}

// The per-source body is unrolled this many times (fewer for the heavy variants: code size).
template <int Q, int A>
constexpr int unroll_d3() {
  return Q * A <= 16 ? 8 : (Q * A <= 32 ? 4 : 2);
}

template <ParticleKernel K, typename T, int R, int Q, bool MOM>
__global__ void __launch_bounds__(kThreads) particle_sum_d3_kernel(const LaunchArgs<T> args) {
  constexpr int A = accumulators_d3<K, R, MOM>();
  constexpr int MD = MOM ? 3 : 0;
  constexpr bool kSingular = K != ParticleKernel::Gaussian;
  __shared__ SourcePoint<T> points[kTile];
  __shared__ T point_weights[R > 1 ? kTile * R : 1];
  __shared__ double staged[kThreads * A];

  const int64_t b = blockIdx.x / args.target_chunks, chunk = blockIdx.x % args.target_chunks;
  const int64_t i0 = chunk * (kThreads * Q);
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * args.split_len;
  const int64_t j1 = min(args.N, j0 + args.split_len);
  const T* X = args.targets + b * args.M * 3;
  const T* Y = args.sources + b * args.N * 3;
  const T* W = args.weights + b * args.N * args.weight_row + args.column_begin;
  const PairConstants<T> c = args.k;

  T x[Q][3];
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const int64_t i = min(i0 + q * kThreads + threadIdx.x, args.M - 1);  // past the end: a copy of the last
#pragma unroll
    for (int d = 0; d < 3; ++d) x[q][d] = X[i * 3 + d];
  }
  double total[Q][A];
#pragma unroll
  for (int q = 0; q < Q; ++q) {
#pragma unroll
    for (int a = 0; a < A; ++a) total[q][a] = 0.0;
  }

  for (int64_t tile_begin = j0; tile_begin < j1; tile_begin += kTile) {
    const int count = static_cast<int>(min(static_cast<int64_t>(kTile), j1 - tile_begin));
    __syncthreads();  // the previous tile is no longer read
    for (int s = threadIdx.x; s < count; s += kThreads) {
      const int64_t j = tile_begin + s;
      SourcePoint<T> p;
      p.c[0] = Y[j * 3];
      p.c[1] = Y[j * 3 + 1];
      p.c[2] = Y[j * 3 + 2];
      p.c[3] = R == 1 ? W[j * args.weight_row] : T(0);
      points[s] = p;
      if (R > 1) {
#pragma unroll
        for (int r = 0; r < R; ++r) point_weights[s * R + r] = W[j * args.weight_row + r];
      }
    }
    __syncthreads();

    auto source_weights = [&](int s, const SourcePoint<T>& p) -> const T* {
      return R == 1 ? &p.c[3] : &point_weights[s * R];
    };
    // A warp none of whose targets exist (few targets) only helps load the tiles.
    if (i0 + (threadIdx.x & ~31) >= args.M) continue;
    for (int block = 0; block < count; block += kBlockSum) {
      const int block_end = min(block + kBlockSum, count);
      T acc[Q][A];
#pragma unroll
      for (int q = 0; q < Q; ++q) {
#pragma unroll
        for (int a = 0; a < A; ++a) acc[q][a] = T(0);
      }
      auto body = [&](int s) {
        const SourcePoint<T> p = points[s];
        const T* w = source_weights(s, p);
#pragma unroll
        for (int q = 0; q < Q; ++q) {
          const T diff[3] = {x[q][0] - p.c[0], x[q][1] - p.c[1], x[q][2] - p.c[2]};
          const T r2 = diff[0] * diff[0] + diff[1] * diff[1] + diff[2] * diff[2];
          add_pair<K, T, R, MD, false>(acc[q], r2, diff, w, c);
        }
      };
      // A partial block is unrolled too: with few sources it is the whole sum (the seed's 50 sources,
      // one target per thread, on an H100: 17.9 us rolled, 14.5 us unrolled; the same additions in
      // the same order, so the same result).
      if (block_end - block == kBlockSum) {
#pragma unroll(unroll_d3<Q, A>())
        for (int s = block; s < block + kBlockSum; ++s) body(s);
      } else {
#pragma unroll(unroll_d3<Q, A>())
        for (int s = block; s < block_end; ++s) body(s);
      }
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        if (kSingular && !all_finite(acc[q])) {
#pragma unroll
          for (int a = 0; a < A; ++a) acc[q][a] = T(0);
#pragma unroll 1
          for (int s = block; s < block_end; ++s) {
            const SourcePoint<T> p = points[s];
            const T diff[3] = {x[q][0] - p.c[0], x[q][1] - p.c[1], x[q][2] - p.c[2]};
            const T r2 = diff[0] * diff[0] + diff[1] * diff[1] + diff[2] * diff[2];
            add_pair<K, T, R, MD, true>(acc[q], r2, diff, source_weights(s, p), c);
          }
        }
#pragma unroll
        for (int a = 0; a < A; ++a) total[q][a] += static_cast<double>(acc[q][a]);
      }
    }
  }

#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const int64_t i = i0 + q * kThreads + threadIdx.x;
    if (i < args.M) write_target<T, A>(args, b * args.M + i, total[q], staged + threadIdx.x * A);
  }
}

// ------------------------------------------------------------------------ any-D Gaussian kernel
// One target per thread, its coordinates read through the cache; a tile of `tile_points` <=
// kBlockSum sources (D coordinates, then R weights each) in dynamic shared memory. With moments,
// one launch covers MD dimensions from acc.dim_begin (the launcher loops over the dimensions).
template <typename T, int R, int MD>
__global__ void __launch_bounds__(kThreads) particle_sum_generic_kernel(const LaunchArgs<T> args, int tile_points) {
  constexpr int A = R * (1 + MD);
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* tile_coords = reinterpret_cast<T*>(shared_bytes);
  T* tile_weights = tile_coords + static_cast<int64_t>(tile_points) * args.D;
  __shared__ double staged[kThreads * A];

  const int64_t D = args.D;
  const int64_t b = blockIdx.x / args.target_chunks, chunk = blockIdx.x % args.target_chunks;
  const int64_t i = chunk * kThreads + threadIdx.x;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * args.split_len;
  const int64_t j1 = min(args.N, j0 + args.split_len);
  const T* x = args.targets + (b * args.M + min(i, args.M - 1)) * D;
  const T* Y = args.sources + b * args.N * D;
  const T* W = args.weights + b * args.N * args.weight_row + args.column_begin;
  const int64_t dim_begin = args.acc.dim_begin;
  const int moment_dims = args.acc.moment_dims;
  const PairConstants<T> c = args.k;

  double total[A];
#pragma unroll
  for (int a = 0; a < A; ++a) total[a] = 0.0;
  for (int64_t tile_begin = j0; tile_begin < j1; tile_begin += tile_points) {
    const int count = static_cast<int>(min(static_cast<int64_t>(tile_points), j1 - tile_begin));
    __syncthreads();
    for (int64_t e = threadIdx.x; e < count * D; e += kThreads) tile_coords[e] = Y[tile_begin * D + e];
    for (int e = threadIdx.x; e < count * R; e += kThreads) {
      tile_weights[e] = W[(tile_begin + e / R) * args.weight_row + e % R];
    }
    __syncthreads();
    if (chunk * kThreads + (threadIdx.x & ~31) >= args.M) continue;  // a warp with no targets
    T acc[A];
#pragma unroll
    for (int a = 0; a < A; ++a) acc[a] = T(0);
    for (int s = 0; s < count; ++s) {
      const T* y = tile_coords + static_cast<int64_t>(s) * D;
      T r2 = T(0);
      for (int64_t d = 0; d < D; ++d) {
        const T e = x[d] - y[d];
        r2 = fma(e, e, r2);
      }
      T diff[MD > 0 ? MD : 1];
#pragma unroll
      for (int k = 0; k < MD; ++k) diff[k] = k < moment_dims ? x[dim_begin + k] - y[dim_begin + k] : T(0);
      add_pair<ParticleKernel::Gaussian, T, R, MD, false>(acc, r2, diff, tile_weights + s * R, c);
    }
#pragma unroll
    for (int a = 0; a < A; ++a) total[a] += static_cast<double>(acc[a]);
  }
  if (i < args.M) write_target<T, A>(args, b * args.M + i, total, staged + threadIdx.x * A);
}

// ------------------------------------------------------------------------------ split merge
// One warp per target: lane l adds the splits l, l + 32, ... in order, then a fixed butterfly
// adds the lanes; the same inputs always give the same bits.
constexpr int kMergeThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kMergeThreads) particle_sum_merge_splits_kernel(const LaunchArgs<T> args) {
  __shared__ double staged[kMergeThreads / 32][64];
  const int A = args.acc.accumulators_per_target();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t targets = args.B * args.M;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(kMergeThreads / 32) + warp; t < targets;
       t += static_cast<int64_t>(gridDim.x) * (kMergeThreads / 32)) {
    for (int a = 0; a < A; ++a) {
      double v = 0.0;
      for (int64_t s = lane; s < args.num_splits; s += 32) v += args.partial[(s * targets + t) * A + a];
      v = warp_sum(v);
      if (lane == 0) staged[warp][a] = v;
    }
    __syncwarp();
    if (lane == 0) {
      finalize_target<T>(args.acc, args.out, args.sum_scale, args.moment_scale, [&](int a) { return staged[warp][a]; },
                         args.sums_real + t * args.out.sums_row,
                         args.out.moments_row ? args.moments_real + t * args.out.moments_row : nullptr);
    }
    __syncwarp();
  }
}

// ----------------------------------------------------------------------------- planning
// Splits of the sources: enough blocks for two rounds of the resident slots, then the first
// count that loads the SMs evenly (blocks per SM within 3% of the mean), bounded by kMinSplit
// sources per split and kScratchBytes of float64 totals.
template <typename T>
void plan_splits(LaunchArgs<T>& args, int64_t targets_per_block, int resident, int accumulators) {
  const int64_t sms = multiprocessor_count();
  args.target_chunks = ceil_div(args.M, targets_per_block);
  const int64_t target_blocks = args.B * args.target_chunks;
  const int64_t by_length = std::max<int64_t>(1, args.N / kMinSplit);
  const int64_t by_memory =
      std::max<int64_t>(1, kScratchBytes / (args.B * args.M * accumulators * static_cast<int64_t>(sizeof(double))));
  const int64_t cap = std::min<int64_t>({by_length, by_memory, 65535});
  int64_t splits = std::min(cap, std::max<int64_t>(1, ceil_div<int64_t>(2 * sms * resident, target_blocks)));
  const int64_t first = splits;
  double best = 0.0;
  for (int64_t s = first; s <= std::min(cap, 4 * first); ++s) {
    const int64_t blocks = s * target_blocks;
    const double even = static_cast<double>(blocks) / static_cast<double>(sms * ceil_div(blocks, sms));
    if (even > best + 1e-9) {
      best = even;
      splits = s;
    }
    if (even >= 0.97) break;
  }
  args.split_len = ceil_div(ceil_div(args.N, splits), static_cast<int64_t>(kBlockSum)) * kBlockSum;
  args.num_splits = ceil_div(args.N, args.split_len);
}

// Plans, allocates the split totals when needed, launches `kernel` and the merge.
template <typename T, typename Kernel, typename... Extra>
void launch_planned(Kernel kernel, LaunchArgs<T> args, int64_t targets_per_block, size_t dynamic_shared,
                    const at::TensorOptions& device, cudaStream_t stream, Extra... extra) {
  const int accumulators = args.acc.accumulators_per_target();
  plan_splits(args, targets_per_block, resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, dynamic_shared),
              accumulators);
  at::Tensor partial;
  if (args.num_splits > 1) {
    partial = at::empty({args.num_splits, args.B * args.M, accumulators}, device.dtype(at::kDouble));
    args.partial = partial.data_ptr<double>();
  }
  const int64_t grid_x = args.B * args.target_chunks;
  TORCH_CHECK(grid_x <= std::numeric_limits<int32_t>::max(), "particle_sum: too many targets for one launch (",
              args.B, " x ", args.M, ")");
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(args.num_splits));
  kernel<<<grid, kThreads, dynamic_shared, stream>>>(args, extra...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (args.num_splits > 1) {
    TORCH_CHECK(accumulators <= 64, "particle_sum: internal error: ", accumulators, " accumulators per target");
    const int64_t merge_blocks = ceil_div<int64_t>(args.B * args.M, kMergeThreads / 32);
    const unsigned grid_merge = static_cast<unsigned>(std::min<int64_t>(merge_blocks, multiprocessor_count() * 16));
    particle_sum_merge_splits_kernel<T><<<grid_merge, kMergeThreads, 0, stream>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// Shared memory a kernel may take without an opt-in.
constexpr size_t kDefaultSharedLimit = 48 * 1024;

// ------------------------------------------------------------------------ variant selection
// The largest column chunk <= min(remaining, largest) among the compiled sizes (16, 8, 4, 2, 1).
// Complex weights need even chunks (a chunk holds whole (re, im) pairs).
inline int column_chunk(int64_t remaining, bool complex_weights, int largest) {
  for (int r = 16; r >= 1; r /= 2) {
    if (r > largest || r > remaining) continue;
    if (complex_weights && r % 2 != 0) continue;
    return r;
  }
  return complex_weights ? 2 : 1;
}

// Targets per thread of the D = 3 kernels. Each target holds A compute-type accumulators and A
// float64 totals in registers; these counts keep the kernels within ~170 registers with no
// spills (ptxas --resource-usage). float64 is the reference path: one target per thread.
template <typename T, ParticleKernel K, int R, bool MOM>
constexpr int targets_per_thread() {
  constexpr int A = accumulators_d3<K, R, MOM>();
  if (sizeof(T) == 8) return 1;
  if (MOM) return A <= 4 ? 4 : (A <= 8 ? 2 : 1);
  return A <= 4 ? 8 : (A <= 8 ? 4 : (A <= 16 ? 2 : 1));
}

// Launches the D = 3 kernel of family K for one column chunk of R columns (R from column_chunk);
// `few_targets` picks the one- or two-targets-per-thread variant (launch_d3_few) where one is compiled:
// float, no moments, chunks of R <= 2 columns (complex weights count as two).
// Explicitly instantiated for float and double in particle_sum_cuda_<kernel>.cu.
template <ParticleKernel K, typename T>
void launch_d3(const LaunchArgs<T>& args, int R, bool moments, bool few_targets, const at::TensorOptions& device,
               cudaStream_t stream);

// Launches the any-D Gaussian kernel for one column chunk (R in 1, 2, 4; moments: R in 1, 2 and
// the MD = 4 dimensions from args.acc.dim_begin). In particle_sum_cuda_generic.cu.
template <typename T>
void launch_generic(const LaunchArgs<T>& args, int R, bool moments, const at::TensorOptions& device,
                    cudaStream_t stream);

constexpr int kGenericMomentDims = 4;

}  // namespace particle_sum_cuda
}  // namespace pointops
