// Run-time choice of the instruction set of the CPU loops. The package is built once for any x86-64,
// so the hot loops are compiled twice, for AVX2 + FMA and for the baseline ISA, and one is picked per
// call. The FMA matters for more than speed: distances use fused multiply-adds on both devices so
// that CPU and CUDA agree bit for bit, and only an FMA unit makes std::fma one instruction (the
// baseline build calls libm's correctly rounded software fma: the same result, slower).
#pragma once

#if defined(__GNUC__) && defined(__x86_64__)
#define POINTOPS_X86_CLONES 1
#define POINTOPS_TARGET_AVX2_FMA __attribute__((target("avx2,fma")))
#else
#define POINTOPS_TARGET_AVX2_FMA
#endif

// For the body lambdas passed to call_best_isa: inlined into each clone, so compiled for its ISA.
#if defined(__GNUC__)
#define POINTOPS_CLONE_BODY __attribute__((always_inline))
#else
#define POINTOPS_CLONE_BODY
#endif

namespace pointops {

// Whether this CPU runs the AVX2 + FMA clones (cached).
inline bool cpu_has_avx2_fma() {
#ifdef POINTOPS_X86_CLONES
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

template <typename Body>
POINTOPS_TARGET_AVX2_FMA void call_avx2_fma(const Body& body) {
  body();
}

// body() compiled for AVX2 + FMA where the CPU has them, else for the baseline ISA. Write the body
// as `[&]() POINTOPS_CLONE_BODY { ... }` and keep the hot loop inside it (a function it calls
// that is not inlined keeps the baseline ISA).
template <typename Body>
void call_best_isa(const Body& body) {
  if (cpu_has_avx2_fma()) {
    call_avx2_fma(body);
  } else {
    body();
  }
}

}  // namespace pointops
