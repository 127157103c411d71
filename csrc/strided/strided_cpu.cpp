// Strided map / zip / reduce on the CPU: the reference implementation.
//
// Every kernel walks its operands with StridedLayout / for_each_run (strided.h): the element range
// is split across threads by at::parallel_for, and each thread walks runs along the innermost
// merged dim. Runs whose operands are all unit-stride take a plain indexed loop the compiler
// vectorises; other runs step by their strides. Nothing is copied unless more than kMaxDims dims
// remain after merging (then the inputs are made contiguous: slower, same answer).
//
// Reductions are deterministic: the work split depends only on the shapes and strides, never on the
// thread count. Sums are taken in blocks of kBlock = 1024 elements in the compute type (32
// interleaved partial sums of 32 terms, combined in a fixed tree: enough independent vector adds to
// hide their latency, and a block long enough to amortise the tree) and the block sums added in
// float64: a float32 sum of 2^22 terms stays within float32 rounding of the float64 sum. Two layouts:
//   inner: the reduced dims include the input's innermost (smallest-stride) dim: each output sums
//          its own runs; a long reduction is cut into fixed chunks of kChunk elements whose
//          partial results are combined in chunk order;
//   outer: a kept dim is innermost: a tile of kTile adjacent outputs is accumulated together, so
//          each reduced step reads kTile adjacent elements (vectorised across the columns).
// Tuple dims are handled by walking the reduced dims (in their own merged layout) inside the kept
// ones: a permutation of the walk, not of the data.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <limits>
#include <type_traits>

#include "common/cpu_dispatch.h"
#include "strided/strided_entries.h"

// The loops are compiled for AVX2 + FMA and for the baseline ISA and chosen at run time (the
// package is built once for any x86-64), as in particle_sum.
#if defined(__GNUC__) && defined(__x86_64__)
#define POINTOPS_STRIDED_X86 1
#define POINTOPS_INLINE inline __attribute__((always_inline))
#include <immintrin.h>
// SLEEF's dispatching 8-wide float functions, exported by libtorch_cpu: torch's CPU exp / log / tanh.
extern "C" __m256 Sleef_expf8_u10(__m256);
extern "C" __m256 Sleef_logf8_u10(__m256);
extern "C" __m256 Sleef_tanhf8_u10(__m256);
#else
#define POINTOPS_INLINE inline
#endif

namespace pointops {
namespace strided {
namespace {

constexpr int64_t kGrain = 32768;   // elements per parallel task, at least
constexpr int64_t kBlock = 1024;    // summands per compute-type partial sum
constexpr int64_t kChunk = 1 << 16; // reduced elements per task when an output's reduction is split
constexpr int64_t kTile = 64;       // adjacent outputs accumulated together (outer reductions)
constexpr int kLanes = 32;          // interleaved partial results within a block (4 AVX2 vectors of float)

// ------------------------------------------------------------------------------------ elementwise
// The fns as types, so that a vector path can recognise them.
template <MapFn F>
struct MapOp {
  static constexpr MapFn fn = F;
  template <typename A>
  A operator()(A x) const { return map_value<F>(x); }
};
template <ZipFn F>
struct ZipOp {
  template <typename A>
  A operator()(A a, A b) const { return zip_value<F>(a, b); }
};

// One run of n elements. Unit-stride runs are plain indexed loops the compiler vectorises; float32
// exp / log / tanh / sigmoid on AVX2 call SLEEF's 8-wide functions (torch's own vector math, exported
// by libtorch_cpu), the rest of the loop and the other fns are compiled code.
template <typename T, typename F>
POINTOPS_INLINE void unary_run(T* po, const T* pi, int64_t n, int64_t so, int64_t si, const F& f) {
  using opmath = at::opmath_type<T>;
  if (so == 1 && si == 1) {
    for (int64_t j = 0; j < n; ++j) po[j] = static_cast<T>(f(static_cast<opmath>(pi[j])));
  } else {
    for (int64_t j = 0; j < n; ++j) po[j * so] = static_cast<T>(f(static_cast<opmath>(pi[j * si])));
  }
}

template <typename T, typename F>
POINTOPS_INLINE void binary_run(T* po, const T* ra, const T* rb, int64_t n, int64_t so, int64_t sa, int64_t sb,
                                const F& f) {
  using opmath = at::opmath_type<T>;
  if (so == 1 && sa == 1 && sb == 1) {
    for (int64_t j = 0; j < n; ++j) po[j] = static_cast<T>(f(static_cast<opmath>(ra[j]), static_cast<opmath>(rb[j])));
  } else if (so == 1 && sa == 1 && sb == 0) {  // b broadcast along the run
    const opmath vb = static_cast<opmath>(rb[0]);
    for (int64_t j = 0; j < n; ++j) po[j] = static_cast<T>(f(static_cast<opmath>(ra[j]), vb));
  } else if (so == 1 && sa == 0 && sb == 1) {
    const opmath va = static_cast<opmath>(ra[0]);
    for (int64_t j = 0; j < n; ++j) po[j] = static_cast<T>(f(va, static_cast<opmath>(rb[j])));
  } else {
    for (int64_t j = 0; j < n; ++j)
      po[j * so] = static_cast<T>(f(static_cast<opmath>(ra[j * sa]), static_cast<opmath>(rb[j * sb])));
  }
}

#ifdef POINTOPS_STRIDED_X86
template <typename F>
constexpr bool sleef_fn() {
  if constexpr (std::is_same_v<F, MapOp<MapFn::Exp>> || std::is_same_v<F, MapOp<MapFn::Log>> ||
                std::is_same_v<F, MapOp<MapFn::Tanh>> || std::is_same_v<F, MapOp<MapFn::Sigmoid>>)
    return true;
  return false;
}

template <typename T, typename F>
__attribute__((target("avx2,fma"))) void unary_run_avx2(T* po, const T* pi, int64_t n, int64_t so, int64_t si,
                                                       const F& f) {
  if constexpr (std::is_same_v<T, float> && sleef_fn<F>()) {
    if (so == 1 && si == 1) {
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const __m256 v = _mm256_loadu_ps(pi + j);
        __m256 r;
        if constexpr (F::fn == MapFn::Exp) r = Sleef_expf8_u10(v);
        if constexpr (F::fn == MapFn::Log) r = Sleef_logf8_u10(v);
        if constexpr (F::fn == MapFn::Tanh) r = Sleef_tanhf8_u10(v);
        if constexpr (F::fn == MapFn::Sigmoid) {  // 1 / (1 + exp(-x)), as torch's vector sigmoid
          const __m256 one = _mm256_set1_ps(1.0f);
          r = _mm256_div_ps(one, _mm256_add_ps(one, Sleef_expf8_u10(_mm256_sub_ps(_mm256_setzero_ps(), v))));
        }
        _mm256_storeu_ps(po + j, r);
      }
      unary_run<T>(po + j, pi + j, n - j, 1, 1, f);
      return;
    }
  }
  unary_run<T>(po, pi, n, so, si, f);
}

template <typename T, typename F>
__attribute__((target("avx2,fma"))) void binary_run_avx2(T* po, const T* ra, const T* rb, int64_t n, int64_t so,
                                                        int64_t sa, int64_t sb, const F& f) {
  binary_run<T>(po, ra, rb, n, so, sa, sb, f);
}
#endif

// out = f(x) or out = f(a, b) over out's shape; the inputs are broadcast to it.
template <typename T, typename F>
void unary_kernel(const at::Tensor& out, const at::Tensor& x, const StridedLayout<2>& L, const F& f) {
  T* o = out.data_ptr<T>();
  const T* in = x.const_data_ptr<T>();
  const int64_t so = L.strides[0][L.ndim - 1], si = L.strides[1][L.ndim - 1];
  const bool avx2 = cpu_has_avx2_fma();
  at::parallel_for(0, L.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for_each_run(L, begin, end, [&](const std::array<int64_t, 2>& off, int64_t n) {
#ifdef POINTOPS_STRIDED_X86
      if (avx2) return unary_run_avx2<T>(o + off[0], in + off[1], n, so, si, f);
#endif
      unary_run<T>(o + off[0], in + off[1], n, so, si, f);
    });
  });
}

template <typename T, typename F>
void binary_kernel(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L,
                   const F& f) {
  T* o = out.data_ptr<T>();
  const T* pa = a.const_data_ptr<T>();
  const T* pb = b.const_data_ptr<T>();
  const int64_t so = L.strides[0][L.ndim - 1], sa = L.strides[1][L.ndim - 1], sb = L.strides[2][L.ndim - 1];
  const bool avx2 = cpu_has_avx2_fma();
  at::parallel_for(0, L.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for_each_run(L, begin, end, [&](const std::array<int64_t, 3>& off, int64_t n) {
#ifdef POINTOPS_STRIDED_X86
      if (avx2) return binary_run_avx2<T>(o + off[0], pa + off[1], pb + off[2], n, so, sa, sb, f);
#endif
      binary_run<T>(o + off[0], pa + off[1], pb + off[2], n, so, sa, sb, f);
    });
  });
}

// The fn switch, outside AT_DISPATCH (a macro argument cannot hold #define).
template <typename T>
void map_typed(const at::Tensor& out, const at::Tensor& x, const StridedLayout<2>& L, MapFn fn) {
  switch (fn) {
#define POINTOPS_MAP_CASE(F) \
  case MapFn::F: unary_kernel<T>(out, x, L, MapOp<MapFn::F>{}); break;
    POINTOPS_MAP_CASE(Id) POINTOPS_MAP_CASE(Neg) POINTOPS_MAP_CASE(Exp) POINTOPS_MAP_CASE(Log)
    POINTOPS_MAP_CASE(Sigmoid) POINTOPS_MAP_CASE(Relu) POINTOPS_MAP_CASE(Inv) POINTOPS_MAP_CASE(Tanh)
#undef POINTOPS_MAP_CASE
  }
}

template <typename T>
void zip_typed(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L, ZipFn fn) {
  switch (fn) {
#define POINTOPS_ZIP_CASE(F) \
  case ZipFn::F: binary_kernel<T>(out, a, b, L, ZipOp<ZipFn::F>{}); break;
    POINTOPS_ZIP_CASE(Add) POINTOPS_ZIP_CASE(Sub) POINTOPS_ZIP_CASE(Mul) POINTOPS_ZIP_CASE(Div)
    POINTOPS_ZIP_CASE(Max) POINTOPS_ZIP_CASE(Min) POINTOPS_ZIP_CASE(Pow) POINTOPS_ZIP_CASE(Lt)
    POINTOPS_ZIP_CASE(Eq) POINTOPS_ZIP_CASE(IsClose) POINTOPS_ZIP_CASE(ReluBack) POINTOPS_ZIP_CASE(LogBack)
    POINTOPS_ZIP_CASE(InvBack)
#undef POINTOPS_ZIP_CASE
  }
}

void map_into_cpu(const at::Tensor& out, const at::Tensor& x, const StridedLayout<2>& L, MapFn fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "strided_map_cpu",
                                  [&] { map_typed<scalar_t>(out, x, L, fn); });
}

void zip_into_cpu(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L,
                  ZipFn fn) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "strided_zip_cpu",
                                  [&] { zip_typed<scalar_t>(out, a, b, L, fn); });
}

// ------------------------------------------------------------------------------------ reductions
// Block values in the compute type A; totals (across blocks, runs and chunks) in Total: float64
// for sums, A otherwise.
template <ReduceFn F, typename A>
struct Reducer {
  using Total = std::conditional_t<F == ReduceFn::Sum, double, A>;
  static A identity() {
    if constexpr (F == ReduceFn::Sum) return A(0);
    if constexpr (F == ReduceFn::Prod) return A(1);
    if constexpr (F == ReduceFn::Max) return -std::numeric_limits<A>::infinity();
    if constexpr (F == ReduceFn::Min) return std::numeric_limits<A>::infinity();
  }
  template <typename V>
  static V combine(V a, V b) {
    if constexpr (F == ReduceFn::Sum) return a + b;
    if constexpr (F == ReduceFn::Prod) return a * b;
    // torch.amax / amin propagate NaN
    if constexpr (F == ReduceFn::Max) return (a != a || a > b) ? a : b;
    if constexpr (F == ReduceFn::Min) return (a != a || a < b) ? a : b;
  }
  static Total total(A a) { return static_cast<Total>(a); }
};

// Reduces n elements p[0], p[s], ..., into `total`, in blocks of kBlock.
template <ReduceFn F, typename T>
POINTOPS_INLINE void reduce_run_impl(const T* p, int64_t n, int64_t s,
                                     typename Reducer<F, at::opmath_type<T>>::Total& total) {
  using A = at::opmath_type<T>;
  using R = Reducer<F, A>;
  // max / min are exact in any order: one block per run (no tree per kBlock elements)
  constexpr bool exact = F == ReduceFn::Max || F == ReduceFn::Min;
  const int64_t block = exact ? std::max<int64_t>(n, 1) : kBlock;
  for (int64_t j0 = 0; j0 < n; j0 += block) {
    const int64_t len = std::min(block, n - j0);
    A lanes[kLanes];
    for (int l = 0; l < kLanes; ++l) lanes[l] = R::identity();
    const T* q = p + j0 * s;
    int64_t j = 0;
    if (exact && s == 1) {
      // x > acc ? x : acc is one vector max (maxps); NaNs are tracked apart, so the loop vectorises
      int nan[kLanes] = {};
      for (; j + kLanes <= len; j += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          const A v = static_cast<A>(q[j + l]);
          if constexpr (F == ReduceFn::Max) lanes[l] = v > lanes[l] ? v : lanes[l];
          else lanes[l] = v < lanes[l] ? v : lanes[l];
          nan[l] |= v != v;
        }
      int any_nan = 0;
      for (int l = 0; l < kLanes; ++l) any_nan |= nan[l];
      if (any_nan) lanes[0] = std::numeric_limits<A>::quiet_NaN();
    } else if (s == 1) {
      for (; j + kLanes <= len; j += kLanes)
        for (int l = 0; l < kLanes; ++l) lanes[l] = R::combine(lanes[l], static_cast<A>(q[j + l]));
    } else {
      for (; j + kLanes <= len; j += kLanes)
        for (int l = 0; l < kLanes; ++l) lanes[l] = R::combine(lanes[l], static_cast<A>(q[(j + l) * s]));
    }
    for (int l = 0; j < len; ++j, ++l) lanes[l] = R::combine(lanes[l], static_cast<A>(q[j * s]));
    for (int w = kLanes / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) lanes[l] = R::combine(lanes[l], lanes[l + w]);
    total = R::combine(total, R::total(lanes[0]));
  }
}

#ifdef POINTOPS_STRIDED_X86
template <ReduceFn F, typename T>
__attribute__((target("avx2,fma"))) void reduce_run_avx2(const T* p, int64_t n, int64_t s,
                                                        typename Reducer<F, at::opmath_type<T>>::Total& total) {
  reduce_run_impl<F, T>(p, n, s, total);
}
#endif

template <ReduceFn F, typename T>
inline void reduce_run(const T* p, int64_t n, int64_t s, typename Reducer<F, at::opmath_type<T>>::Total& total) {
#ifdef POINTOPS_STRIDED_X86
  if (cpu_has_avx2_fma()) return reduce_run_avx2<F, T>(p, n, s, total);
#endif
  reduce_run_impl<F, T>(p, n, s, total);
}

template <ReduceFn F, typename T>
void reduce_inner(const ReducePlan& P, T* out, const T* x) {
  using A = at::opmath_type<T>;
  using R = Reducer<F, A>;
  using Total = typename R::Total;
  const int64_t outputs = P.kept.numel(), count = P.reduced.numel();
  const int64_t rs = P.reduced.strides[0][P.reduced.ndim - 1];
  auto reduce_range = [&](int64_t base, int64_t begin, int64_t end) {
    Total total = R::total(R::identity());
    for_each_run(P.reduced, begin, end, [&](const std::array<int64_t, 1>& off, int64_t n) {
      reduce_run<F>(x + base + off[0], n, rs, total);
    });
    return total;
  };
  const int64_t ks = P.kept.strides[1][P.kept.ndim - 1], os = P.kept.strides[0][P.kept.ndim - 1];
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  if (chunks <= 1) {
    at::parallel_for(0, outputs, std::max<int64_t>(1, kGrain / std::max<int64_t>(count, 1)), [&](int64_t b, int64_t e) {
      for_each_run(P.kept, b, e, [&](const std::array<int64_t, 2>& off, int64_t n) {
        for (int64_t j = 0; j < n; ++j) out[off[0] + j * os] = static_cast<T>(reduce_range(off[1] + j * ks, 0, count));
      });
    });
    return;
  }
  // Few long reductions: fixed chunks in parallel, combined in chunk order.
  std::vector<Total> partial(outputs * chunks);
  at::parallel_for(0, outputs * chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / chunks, c = t % chunks;
      for_each_run(P.kept, o, o + 1, [&](const std::array<int64_t, 2>& off, int64_t) {
        partial[t] = reduce_range(off[1], c * kChunk, std::min(count, (c + 1) * kChunk));
      });
    }
  });
  at::parallel_for(0, outputs, 1024, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      Total total = partial[o * chunks];
      for (int64_t c = 1; c < chunks; ++c) total = R::combine(total, partial[o * chunks + c]);
      for_each_run(P.kept, o, o + 1, [&](const std::array<int64_t, 2>& off, int64_t) {
        out[off[0]] = static_cast<T>(total);
      });
    }
  });
}

// The kept innermost dim (C outputs, input stride cs) is walked kTile outputs at a time; each
// reduced step reads the tile's adjacent inputs (a vector loop across the columns).
struct OuterGeometry {
  int64_t C, cs, os, rs, count;
};

template <ReduceFn F, typename T>
POINTOPS_INLINE void outer_tile(const ReducePlan& P, const OuterGeometry& g, T* out, const T* x, int64_t row,
                                int64_t c0) {
  using A = at::opmath_type<T>;
  using R = Reducer<F, A>;
  using Total = typename R::Total;
  const int64_t width = std::min(kTile, g.C - c0);
  int64_t out_base = 0, x_base = 0;
  for_each_run(P.kept, row * g.C + c0, row * g.C + c0 + 1, [&](const std::array<int64_t, 2>& off, int64_t) {
    out_base = off[0];
    x_base = off[1];
  });
  A acc[kTile];
  Total total[kTile];
  for (int64_t c = 0; c < kTile; ++c) {
    acc[c] = R::identity();
    total[c] = R::total(R::identity());
  }
  int64_t in_block = 0;
  for_each_run(P.reduced, 0, g.count, [&](const std::array<int64_t, 1>& off, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
      const T* q = x + x_base + off[0] + j * g.rs;
      if (g.cs == 1 && width == kTile) {  // constant trip count: fully vectorised
        for (int64_t c = 0; c < kTile; ++c) acc[c] = R::combine(acc[c], static_cast<A>(q[c]));
      } else {
        for (int64_t c = 0; c < width; ++c) acc[c] = R::combine(acc[c], static_cast<A>(q[c * g.cs]));
      }
      if (++in_block == kBlock) {
        for (int64_t c = 0; c < kTile; ++c) {
          total[c] = R::combine(total[c], R::total(acc[c]));
          acc[c] = R::identity();
        }
        in_block = 0;
      }
    }
  });
  for (int64_t c = 0; c < width; ++c) out[out_base + c * g.os] = static_cast<T>(R::combine(total[c], R::total(acc[c])));
}

#ifdef POINTOPS_STRIDED_X86
template <ReduceFn F, typename T>
__attribute__((target("avx2,fma"))) void outer_tile_avx2(const ReducePlan& P, const OuterGeometry& g, T* out,
                                                        const T* x, int64_t row, int64_t c0) {
  outer_tile<F, T>(P, g, out, x, row, c0);
}
#endif

template <ReduceFn F, typename T>
void reduce_outer(const ReducePlan& P, T* out, const T* x) {
  const int inner = P.kept.ndim - 1;
  const OuterGeometry g{P.kept.sizes[inner], P.kept.strides[1][inner], P.kept.strides[0][inner],
                        P.reduced.strides[0][P.reduced.ndim - 1], P.reduced.numel()};
  const int64_t rows = P.kept.numel() / g.C, tiles = (g.C + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(g.count * kTile, 1));
  const bool avx2 = cpu_has_avx2_fma();
  at::parallel_for(0, rows * tiles, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
#ifdef POINTOPS_STRIDED_X86
      if (avx2) {
        outer_tile_avx2<F, T>(P, g, out, x, t / tiles, (t % tiles) * kTile);
        continue;
      }
#endif
      outer_tile<F, T>(P, g, out, x, t / tiles, (t % tiles) * kTile);
    }
  });
}

void reduce_into_cpu(const at::Tensor& res, const at::Tensor& x, const ReducePlan& P, ReduceFn fn) {
  const bool outer = reduce_is_outer(P);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "strided_reduce_cpu", [&] {
    auto run = [&](auto tag) {
      constexpr ReduceFn F = decltype(tag)::value;
      if (outer) reduce_outer<F>(P, res.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
      else reduce_inner<F>(P, res.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>());
    };
    switch (fn) {
      case ReduceFn::Sum: run(std::integral_constant<ReduceFn, ReduceFn::Sum>{}); break;
      case ReduceFn::Prod: run(std::integral_constant<ReduceFn, ReduceFn::Prod>{}); break;
      case ReduceFn::Max: run(std::integral_constant<ReduceFn, ReduceFn::Max>{}); break;
      case ReduceFn::Min: run(std::integral_constant<ReduceFn, ReduceFn::Min>{}); break;
    }
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CPU, m) {
  m.impl("strided_map", &map_entry<map_into_cpu>);
  m.impl("strided_map_out", &map_out_entry<map_into_cpu>);
  m.impl("strided_zip", &zip_entry<zip_into_cpu>);
  m.impl("strided_zip_out", &zip_out_entry<zip_into_cpu>);
  m.impl("strided_reduce", &reduce_entry<reduce_into_cpu>);
}

}  // namespace strided
}  // namespace pointops
