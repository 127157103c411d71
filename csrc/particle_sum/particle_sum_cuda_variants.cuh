// The compiled variants of the particle-sum kernels: which template arguments exist and how a
// call picks one. Included only by the translation units that instantiate them
// (particle_sum_cuda_{gaussian,laplace,helmholtz,generic}.cu), so that each family compiles in
// its own nvcc process.
#pragma once

#include <cstdlib>

#include "common/switches.h"
#include "particle_sum/particle_sum_cuda.cuh"

namespace pointops {
namespace particle_sum_cuda {

template <ParticleKernel K, typename T, int R, int Q, bool MOM>
void launch_d3_variant(const LaunchArgs<T>& args, const at::TensorOptions& device, cudaStream_t stream) {
  launch_planned(particle_sum_d3_kernel<K, T, R, Q, MOM>, args, static_cast<int64_t>(kThreads) * Q, 0, device,
                 stream);
}

// Few targets: one per thread, except when all sources fit one shared-memory tile and the targets
// exceed one wave of one-target blocks: then two per thread, which share each source read and take
// half the blocks. The seed's 480,000 targets x 50 sources on an H100 (benchmarks/RESULTS.md,
// per-call overhead section): 3,750 one-target blocks (1.8 waves) 14.5 us, 1,875 two-target blocks
// (1.6 waves: 56 registers, 9 blocks per SM) 13.4 us. With 500-1,500 sources the two variants
// measured within noise of each other, either way by up to 10% (one run each on an H200), so those
// keep one target per thread. So does Helmholtz, whose pairs (rsqrt, a Newton step, sincos)
// outweigh a shared source read: 480,000 x 50 complex weights 34.6 us one per thread, 36.9-37.2 us
// two (H100, two runs of a sweep over targets per thread; four per thread, tried there, was within
// 3% of two for Gaussian and Laplace sums and 11% slower for this one, so it is not compiled).
// POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD=1 or 2 forces either (debugging and that sweep; read at
// the first call of each kernel variant; other values are ignored).
template <ParticleKernel K, typename T, int R, bool MOM>
void launch_d3_few(const LaunchArgs<T>& args, const at::TensorOptions& device, cudaStream_t stream) {
  static const int forced = static_cast<int>(switch_number("POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD", 0, false));
  // More targets than one wave of one-target blocks holds (the occupancy query is cached, and only
  // asked where the sources fit one tile).
  const auto beyond_one_wave = [&] {
    const auto one = particle_sum_d3_kernel<K, T, R, 1, MOM>;
    const int64_t wave = static_cast<int64_t>(multiprocessor_count()) *
                         resident_blocks(reinterpret_cast<const void*>(one), kThreads, 0) * kThreads;
    return args.B * args.M > wave;
  };
  constexpr bool kShareSources = K != ParticleKernel::Helmholtz;
  if (forced == 2 || (forced != 1 && kShareSources && args.N <= kTile && beyond_one_wave())) {
    return launch_d3_variant<K, T, R, 2, MOM>(args, device, stream);
  }
  launch_d3_variant<K, T, R, 1, MOM>(args, device, stream);
}

template <ParticleKernel K, typename T, int R, bool MOM>
void launch_d3_columns(const LaunchArgs<T>& args, bool few_targets, const at::TensorOptions& device,
                       cudaStream_t stream) {
  constexpr int Q = targets_per_thread<T, K, R, MOM>();
  if constexpr (Q > 2 && !MOM && R <= 2) {
    if (few_targets) return launch_d3_few<K, T, R, MOM>(args, device, stream);
  }
  launch_d3_variant<K, T, R, Q, MOM>(args, device, stream);
}

template <ParticleKernel K, typename T>
void launch_d3(const LaunchArgs<T>& args, int R, bool moments, bool few_targets, const at::TensorOptions& device,
               cudaStream_t stream) {
  constexpr bool kFloat = sizeof(T) == 4;
  if (moments) {
    switch (R) {
      case 1: return launch_d3_columns<K, T, 1, true>(args, few_targets, device, stream);
      case 2: return launch_d3_columns<K, T, 2, true>(args, few_targets, device, stream);
    }
  } else {
    switch (R) {
      case 1: return launch_d3_columns<K, T, 1, false>(args, few_targets, device, stream);
      case 2: return launch_d3_columns<K, T, 2, false>(args, few_targets, device, stream);
      case 4: return launch_d3_columns<K, T, 4, false>(args, few_targets, device, stream);
      case 8:
        if constexpr (kFloat) return launch_d3_columns<K, T, 8, false>(args, few_targets, device, stream);
        break;
      case 16:  // not helmholtz: its 32 accumulators would not fit the shared-memory staging
        if constexpr (kFloat && K != ParticleKernel::Helmholtz) return launch_d3_columns<K, T, 16, false>(args, few_targets, device, stream);
        break;
    }
  }
  TORCH_CHECK(false, "particle_sum: no CUDA kernel for ", R, " weight columns", moments ? " with moments" : "",
              " (internal error: column_chunk and launch_d3 disagree)");
}

template <typename T, int R, int MD>
void launch_generic_variant(const LaunchArgs<T>& args, const at::TensorOptions& device, cudaStream_t stream) {
  // As many sources per tile as fit the default shared-memory limit, at most kBlockSum (one
  // partial sum per tile), at least 1.
  const int64_t per_source = (args.D + R) * static_cast<int64_t>(sizeof(T));
  const int64_t budget = static_cast<int64_t>(kDefaultSharedLimit) - kThreads * R * (1 + MD) * 8;
  const int tile_points = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kBlockSum, budget / per_source)));
  TORCH_CHECK(tile_points * per_source <= budget, "particle_sum: D = ", args.D,
              " is too large for the CUDA kernel's shared-memory tile (one source needs ", per_source, " bytes)");
  launch_planned(particle_sum_generic_kernel<T, R, MD>, args, kThreads, static_cast<size_t>(tile_points * per_source),
                 device, stream, tile_points);
}

template <typename T>
void launch_generic(const LaunchArgs<T>& args, int R, bool moments, const at::TensorOptions& device,
                    cudaStream_t stream) {
  constexpr int MD = kGenericMomentDims;
  if (moments) {
    switch (R) {
      case 1: return launch_generic_variant<T, 1, MD>(args, device, stream);
      case 2: return launch_generic_variant<T, 2, MD>(args, device, stream);
    }
  } else {
    switch (R) {
      case 1: return launch_generic_variant<T, 1, 0>(args, device, stream);
      case 2: return launch_generic_variant<T, 2, 0>(args, device, stream);
      case 4: return launch_generic_variant<T, 4, 0>(args, device, stream);
    }
  }
  TORCH_CHECK(false, "particle_sum: no generic CUDA kernel for ", R, " weight columns",
              moments ? " with moments" : "", " (internal error)");
}

}  // namespace particle_sum_cuda
}  // namespace pointops
