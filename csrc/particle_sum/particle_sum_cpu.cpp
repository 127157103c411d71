// Particle sums on the CPU: the reference implementation.
//
// A task is (batch, block of kLanes targets, split of the sources). The targets of a block sit in
// structure-of-arrays form, so every per-pair loop runs across the kLanes targets with no
// dependence between iterations and the compiler vectorises it (a branch-free exp2 for float32,
// so no libm call blocks the vector loop). Sources are taken in tiles of kTile: each tile is
// summed into fresh compute-type accumulators, which are then added into float64 totals; this
// keeps float32 sums of a million terms within ~1e-7 of float64 (the running float32 sum of a
// long series is not). Splitting the sources gives few-target calls enough tasks; the splits are
// added in split order, so results never depend on the thread count.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "particle_sum/particle_sum.h"

// The per-pair loops are compiled three times, for AVX-512, AVX2 + FMA and the baseline ISA,
// and chosen at run time (the package is built once and runs on any x86-64): the build's
// default flags target the baseline, whose 4-wide vectors run several times slower.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define POINTOPS_X86_DISPATCH 1
#define POINTOPS_INLINE inline __attribute__((always_inline))
#else
#define POINTOPS_INLINE inline
#endif

namespace pointops {
namespace {

constexpr int kLanes = 16;       // targets per task, the vector loops' trip count
constexpr int64_t kTile = 64;    // sources per compute-type partial sum (as on CUDA)

// 2^t for t <= 0 (or NaN), branch-free so that loops calling it vectorise: t = n + f with n an
// integer and |f| <= 1/2, 2^f from its degree-7 Taylor polynomial (truncation error 5e-9,
// ~1 ulp after rounding), 2^n assembled in the exponent bits. Below 2^-126 the result is 0,
// like the CUDA kernels' flush-to-zero exp2. NaN stays NaN.
POINTOPS_INLINE float exp2_nonpositive(float t) {
  t = t < -127.0f ? -127.0f : t;
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (t + kShifter) - kShifter;
  const float f = t - n;
  float p = 1.5252733804059838e-05f;
  p = p * f + 1.5403530393381606e-04f;
  p = p * f + 1.3333558146428441e-03f;
  p = p * f + 9.6181291076284770e-03f;
  p = p * f + 5.5504108664821576e-02f;
  p = p * f + 2.4022650695910071e-01f;
  p = p * f + 6.9314718055994531e-01f;
  p = p * f + 1.0f;
  const int32_t biased = static_cast<int32_t>(n) + 127;  // 0 for n = -127: the scale is +0
  const uint32_t bits = static_cast<uint32_t>(biased) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

POINTOPS_INLINE double exp2_nonpositive(double t) { return std::exp2(t); }

// g (value) and h-factor (moment weight) of one pair, part v written to g[v * stride] and
// h[v * stride] (the lane arrays: per-lane temporaries would stop the loop from vectorising).
// See particle_sum.h for h; the constant factors (1 / 4 pi, -1 / sigma^2) are applied by finalize.
template <ParticleKernel K, typename T>
struct PairMath;

template <typename T>
struct PairMath<ParticleKernel::Gaussian, T> {
  static constexpr int kParts = 1;
  T exp2_scale;
  POINTOPS_INLINE void eval(T r2, T* g, T* h, int stride) const {
    g[0] = exp2_nonpositive(r2 * exp2_scale);
    h[0] = g[0];
  }
};

template <typename T>
struct PairMath<ParticleKernel::Laplace, T> {
  static constexpr int kParts = 1;
  POINTOPS_INLINE void eval(T r2, T* g, T* h, int stride) const {
    // Coincident pairs (r^2 below the smallest normal number) are dropped; NaN fails the
    // comparison and propagates.
    const T a = r2 < std::numeric_limits<T>::min() ? T(0) : T(1) / std::sqrt(r2);
    g[0] = a;
    h[0] = a * a * a;
  }
};

// float64: the phase with libm's exact range reduction.
template <typename T>
struct PairMath<ParticleKernel::Helmholtz, T> {
  static constexpr int kParts = 2;
  double k;
  explicit PairMath(const ParticleKernelConstants& c) : k(c.wavenumber) {}
  POINTOPS_INLINE void eval(T r2, T* g, T* h, int stride) const {
    if (r2 < std::numeric_limits<T>::min()) {
      g[0] = g[stride] = h[0] = h[stride] = T(0);
      return;
    }
    const double r = std::sqrt(static_cast<double>(r2)), a = 1.0 / r, kr = k * r;
    const double c = std::cos(kr), s = std::sin(kr), a3 = a * a * a;
    g[0] = static_cast<T>(a * c);
    g[stride] = static_cast<T>(a * s);
    h[0] = static_cast<T>(a3 * (-c - kr * s));
    h[stride] = static_cast<T>(a3 * (kr * c - s));
  }
};

// float32, branch-free so that it vectorises: the phase in turns, u = r k / (2 pi), reduced
// exactly to |f| <= 1/2 (k / 2 pi split in two floats, fma) as in the CUDA kernels, then to a
// quarter turn q / 4 plus |t| <= pi / 4; sine and cosine of t from Taylor polynomials (truncation
// below 3e-8), rotated by the quarter turns. Valid while |u| < 2^22 (the rounding trick).
template <>
struct PairMath<ParticleKernel::Helmholtz, float> {
  static constexpr int kParts = 2;
  float k, turns_hi, turns_lo;
  explicit PairMath(const ParticleKernelConstants& c)
      : k(static_cast<float>(c.wavenumber)), turns_hi(c.turns_hi), turns_lo(c.turns_lo) {}
  POINTOPS_INLINE void eval(float r2, float* g, float* h, int stride) const {
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const bool keep = !(r2 < std::numeric_limits<float>::min());  // coincident pairs are dropped; NaN stays
    const float r = std::sqrt(keep ? r2 : 1.0f);
    const float a = keep ? 1.0f / r : 0.0f;
    const float n = (r * turns_hi + kRound) - kRound;
    const float f = __builtin_fmaf(r, turns_lo, __builtin_fmaf(r, turns_hi, -n));
    const float quarters = (4.0f * f + kRound) - kRound;  // -2 ... 2
    const float t = (f - 0.25f * quarters) * 6.28318530717958647692f;
    const float t2 = t * t;
    const float sin_t = t * (1.0f + t2 * (-1.0f / 6 + t2 * (1.0f / 120 + t2 * (-1.0f / 5040 + t2 * (1.0f / 362880)))));
    const float cos_t = 1.0f + t2 * (-0.5f + t2 * (1.0f / 24 + t2 * (-1.0f / 720 + t2 * (1.0f / 40320))));
    const float q = quarters < 0.0f ? quarters + 4.0f : quarters;  // 0, 1, 2 or 3
    const bool odd = (q == 1.0f) | (q == 3.0f);
    const float s = (odd ? cos_t : sin_t) * (q >= 2.0f ? -1.0f : 1.0f);
    const float c = (odd ? sin_t : cos_t) * (((q == 1.0f) | (q == 2.0f)) ? -1.0f : 1.0f);
    g[0] = a * c;
    g[stride] = a * s;
    const float kr = r * k, a3 = a * a * a;
    h[0] = a3 * (-c - kr * s);
    h[stride] = a3 * (kr * c - s);
  }
};

struct CpuCall {
  const void* targets;  // (B, M, D) compute type
  const void* sources;  // (B, N, D)
  const void* weights;  // (B, N, R)
  int64_t B, M, N, D, R;
  bool moments;
};

// Accumulates one task: targets [i0, i0 + lanes) of batch b against sources [j0, j1) into
// `totals` ((R * parts * slots) x kLanes float64, accumulator-major). Every lane loop is a
// `omp simd` loop over the kLanes targets.
template <ParticleKernel K, typename T, int DIM>
POINTOPS_INLINE void accumulate_task_body(const PairMath<K, T>& math, const CpuCall& call, int64_t b, int64_t i0,
                                          int lanes, int64_t j0, int64_t j1, double* totals) {
  constexpr int P = PairMath<K, T>::kParts;
  const int64_t D = DIM > 0 ? DIM : call.D, R = call.R;
  const int slots = call.moments ? static_cast<int>(1 + D) : 1;
  const int64_t accumulators = R * P * slots;
  const T* x = static_cast<const T*>(call.targets) + (b * call.M + i0) * D;
  const T* y = static_cast<const T*>(call.sources) + b * call.N * D;
  const T* w = static_cast<const T*>(call.weights) + b * call.N * R;

  std::vector<T> scratch((2 * D + accumulators) * kLanes, T(0));
  T* __restrict xs = scratch.data();                 // (D, kLanes) target coordinates
  T* __restrict diff = xs + D * kLanes;              // (D, kLanes) x - y of the current source
  T* __restrict inner = diff + D * kLanes;           // (accumulators, kLanes) this tile's sums
  for (int l = 0; l < lanes; ++l) {
    for (int64_t d = 0; d < D; ++d) xs[d * kLanes + l] = x[l * D + d];
  }
  for (int64_t a = 0; a < accumulators * kLanes; ++a) totals[a] = 0.0;
  for (int64_t tile = j0; tile < j1; tile += kTile) {
    for (int64_t a = 0; a < accumulators * kLanes; ++a) inner[a] = T(0);
    const int64_t tile_end = std::min(tile + kTile, j1);
    for (int64_t j = tile; j < tile_end; ++j) {
      const T* yj = y + j * D;
      alignas(64) T r2[kLanes] = {};
      for (int64_t d = 0; d < D; ++d) {
        const T yd = yj[d];
        T* __restrict dd = diff + d * kLanes;
        const T* __restrict xd = xs + d * kLanes;
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) {
          const T e = xd[l] - yd;
          dd[l] = e;
          r2[l] += e * e;
        }
      }
      alignas(64) T gl[P][kLanes];
      alignas(64) T hl[P][kLanes];
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) math.eval(r2[l], &gl[0][l], &hl[0][l], kLanes);  // part v at [v][l]
      const T* wj = w + j * R;
      for (int64_t r = 0; r < R; ++r) {
        const T wr = wj[r];
        for (int v = 0; v < P; ++v) {
          T* __restrict acc = inner + ((r * P + v) * slots) * kLanes;
#pragma omp simd
          for (int l = 0; l < kLanes; ++l) acc[l] += gl[v][l] * wr;
          if (!call.moments) continue;
          alignas(64) T hw[kLanes];
#pragma omp simd
          for (int l = 0; l < kLanes; ++l) hw[l] = hl[v][l] * wr;
          for (int64_t d = 0; d < D; ++d) {
            T* __restrict accd = acc + (1 + d) * kLanes;
            const T* __restrict dd = diff + d * kLanes;
#pragma omp simd
            for (int l = 0; l < kLanes; ++l) accd[l] += hw[l] * dd[l];
          }
        }
      }
    }
    for (int64_t a = 0; a < accumulators * kLanes; ++a) totals[a] += static_cast<double>(inner[a]);
  }
}

#ifdef POINTOPS_X86_DISPATCH
template <ParticleKernel K, typename T, int DIM>
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma"))) void accumulate_task_avx512(
    const PairMath<K, T>& math, const CpuCall& call, int64_t b, int64_t i0, int lanes, int64_t j0, int64_t j1,
    double* totals) {
  accumulate_task_body<K, T, DIM>(math, call, b, i0, lanes, j0, j1, totals);
}

template <ParticleKernel K, typename T, int DIM>
__attribute__((target("avx2,fma"))) void accumulate_task_avx2(const PairMath<K, T>& math, const CpuCall& call,
                                                              int64_t b, int64_t i0, int lanes, int64_t j0,
                                                              int64_t j1, double* totals) {
  accumulate_task_body<K, T, DIM>(math, call, b, i0, lanes, j0, j1, totals);
}

// 2: AVX-512, 1: AVX2 + FMA, 0: neither.
int cpu_vector_level() {
  static const int level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw")) {
      return 2;
    }
    return (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 1 : 0;
  }();
  return level;
}
#endif

template <ParticleKernel K, typename T, int DIM>
void accumulate_task(const PairMath<K, T>& math, const CpuCall& call, int64_t b, int64_t i0, int lanes, int64_t j0,
                     int64_t j1, std::vector<double>& totals) {
#ifdef POINTOPS_X86_DISPATCH
  switch (cpu_vector_level()) {
    case 2: return accumulate_task_avx512<K, T, DIM>(math, call, b, i0, lanes, j0, j1, totals.data());
    case 1: return accumulate_task_avx2<K, T, DIM>(math, call, b, i0, lanes, j0, j1, totals.data());
  }
#endif
  accumulate_task_body<K, T, DIM>(math, call, b, i0, lanes, j0, j1, totals.data());
}

// 2^17 accumulators: 16 MiB of scratch per thread.
constexpr int64_t kMaxCpuAccumulators = int64_t(1) << 17;

template <ParticleKernel K, typename T, int DIM>
void particle_sum_cpu_kernel(const PairMath<K, T>& math, const CpuCall& call, const ParticleKernelConstants& constants,
                             const ParticleSumProblem& p, ParticleSumOutputs& out) {
  constexpr int P = PairMath<K, T>::kParts;
  // Each thread keeps kLanes x (columns x parts x slots) double accumulators (128 bytes per
  // accumulator per thread), indexed with int: bound both before anything is allocated.
  const int64_t slots = call.moments ? 1 + call.D : 1;
  const int64_t wanted = call.R * P * slots;
  TORCH_CHECK(wanted <= kMaxCpuAccumulators, "particle_sum on the CPU: ", call.R, " real weight column(s) x ", P,
              " part(s)", call.moments ? " x (1 + D) = (1 + " + std::to_string(call.D) + ") moment slots" : std::string(),
              " need ", wanted, " accumulators per target, more than the ", kMaxCpuAccumulators,
              " supported; split the weight columns into several calls");
  const AccumulatorLayout acc{static_cast<int>(call.R), P, static_cast<int>(slots), call.moments ? static_cast<int>(call.D) : 0, 0,
                              p.complex_weights};
  const int64_t sums_row = out.sums_real.numel() / std::max<int64_t>(1, call.B * call.M);
  const int64_t moments_row = call.moments ? out.moments_real.numel() / std::max<int64_t>(1, call.B * call.M) : 0;
  const OutputLayout layout{sums_row, moments_row, call.D, p.complex_output, 0, true};
  const int64_t accumulators = acc.accumulators_per_target();
  T* sums = out.sums_real.data_ptr<T>();
  T* moments = call.moments ? out.moments_real.data_ptr<T>() : nullptr;

  // Few targets: split the sources so there are enough tasks (independent of the thread count).
  const int64_t blocks = (call.M + kLanes - 1) / kLanes;
  const int64_t target_tasks = call.B * blocks;
  const int64_t max_splits = std::max<int64_t>(1, call.N / (16 * kTile));
  const int64_t splits = std::min(max_splits, std::max<int64_t>(1, (64 + target_tasks - 1) / target_tasks));
  const int64_t split_len = ((call.N + splits - 1) / splits + kTile - 1) / kTile * kTile;

  auto write = [&](int64_t b, int64_t i0, int lanes, auto sum_of_lane) {
    for (int l = 0; l < lanes; ++l) {
      const int64_t t = b * call.M + i0 + l;
      finalize_target<T>(acc, layout, constants.sum_scale, constants.moment_scale,
                         [&](int a) { return sum_of_lane(a, l); }, sums + t * sums_row,
                         moments ? moments + t * moments_row : nullptr);
    }
  };

  if (splits == 1) {
    at::parallel_for(0, target_tasks, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> totals(accumulators * kLanes);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / blocks, i0 = (task % blocks) * kLanes;
        const int lanes = static_cast<int>(std::min<int64_t>(kLanes, call.M - i0));
        accumulate_task<K, T, DIM>(math, call, b, i0, lanes, 0, call.N, totals);
        write(b, i0, lanes, [&](int a, int l) { return totals[a * kLanes + l]; });
      }
    });
    return;
  }
  // Split sources: per-split totals, then the splits added in order.
  std::vector<double> partial(splits * target_tasks * accumulators * kLanes);
  at::parallel_for(0, target_tasks * splits, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> totals(accumulators * kLanes);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task % splits, target_task = task / splits;
      const int64_t b = target_task / blocks, i0 = (target_task % blocks) * kLanes;
      const int lanes = static_cast<int>(std::min<int64_t>(kLanes, call.M - i0));
      const int64_t j0 = std::min(call.N, s * split_len), j1 = std::min(call.N, j0 + split_len);
      accumulate_task<K, T, DIM>(math, call, b, i0, lanes, j0, j1, totals);
      std::copy(totals.begin(), totals.end(), partial.begin() + task * accumulators * kLanes);
    }
  });
  at::parallel_for(0, target_tasks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t target_task = begin; target_task < end; ++target_task) {
      const int64_t b = target_task / blocks, i0 = (target_task % blocks) * kLanes;
      const int lanes = static_cast<int>(std::min<int64_t>(kLanes, call.M - i0));
      write(b, i0, lanes, [&](int a, int l) {
        double v = 0;
        for (int64_t s = 0; s < splits; ++s) v += partial[((target_task * splits + s) * accumulators + a) * kLanes + l];
        return v;
      });
    }
  });
}

template <ParticleKernel K, typename T>
void dispatch_dim(const PairMath<K, T>& math, const CpuCall& call, const ParticleKernelConstants& constants,
                  const ParticleSumProblem& p, ParticleSumOutputs& out) {
  switch (call.D) {
    case 1: return particle_sum_cpu_kernel<K, T, 1>(math, call, constants, p, out);
    case 2: return particle_sum_cpu_kernel<K, T, 2>(math, call, constants, p, out);
    case 3: return particle_sum_cpu_kernel<K, T, 3>(math, call, constants, p, out);
    default: return particle_sum_cpu_kernel<K, T, 0>(math, call, constants, p, out);
  }
}

ParticleSumOutputs particle_sum_cpu_impl(const ParticleSumProblem& p, const at::Tensor& targets,
                                         const at::Tensor& sources, const at::Tensor& weights, bool moments) {
  ParticleSumOutputs out = allocate_particle_sum_outputs(p, targets.options(), moments);
  if (finish_trivial_particle_sum(p, out)) return out;
  const ParticleSumOperands op = particle_sum_operands(p, targets, sources, weights);
  const ParticleKernelConstants constants = particle_kernel_constants(p);
  const CpuCall call{op.targets.data_ptr(), op.sources.data_ptr(), op.weights.data_ptr(), p.B, p.M, p.N, p.D,
                     op.real_columns, moments};
  AT_DISPATCH_FLOATING_TYPES(p.compute_type, "particle_sum_cpu", [&] {
    switch (p.kernel) {
      case ParticleKernel::Gaussian:
        dispatch_dim(PairMath<ParticleKernel::Gaussian, scalar_t>{gaussian_exp2_scale_as<scalar_t>(constants)}, call,
                     constants, p, out);
        break;
      case ParticleKernel::Laplace:
        dispatch_dim(PairMath<ParticleKernel::Laplace, scalar_t>{}, call, constants, p, out);
        break;
      case ParticleKernel::Helmholtz:
        dispatch_dim(PairMath<ParticleKernel::Helmholtz, scalar_t>(constants), call, constants, p, out);
        break;
    }
  });
  finish_particle_sum_outputs(p, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CPU, m) {
  m.impl("particle_sum", &particle_sum_entry<particle_sum_cpu_impl>);
  m.impl("_particle_sum_moments", &particle_sum_moments_entry<particle_sum_cpu_impl>);
}

}  // namespace pointops
