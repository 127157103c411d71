// Particle sums on CUDA: the launchers (checks, guard, operands, column chunks, kernel choice).
// The kernels are in particle_sum_cuda.cuh, compiled per family in particle_sum_cuda_<kernel>.cu.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "particle_sum/particle_sum_cuda.cuh"

namespace pointops {
namespace particle_sum_cuda {
namespace {

// Up to this many targets per SM, sources that cannot be split go one target per thread (two when
// they fit one tile and the targets exceed a wave: launch_d3_few). Measured on an H200 (132 SMs;
// a sweep of this bound, ms per call, eight targets per thread -> one): 100,000 x 1,000
// 0.084 -> 0.055, 480,000 x 500 0.121 -> 0.112, 480,000 x 1,500 0.331 -> 0.297; 50 sources unchanged
// (the seed case is host-bound), 1-2 million targets x 50 slower that way (0.037 -> 0.046), hence a
// bound.
constexpr int64_t kUnsplitTargetsPerSm = 4096;

template <typename T>
PairConstants<T> pair_constants(const ParticleKernelConstants& k) {
  return {gaussian_exp2_scale_as<T>(k), static_cast<T>(k.wavenumber), k.turns_hi, k.turns_lo};
}

template <typename T>
void run_particle_sum(const ParticleSumProblem& p, const ParticleSumOperands& op, ParticleSumOutputs& out,
                      bool moments) {
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const ParticleKernelConstants constants = particle_kernel_constants(p);
  const int parts = kernel_parts(p.kernel);
  const bool generic = p.D != 3;  // only the Gaussian reaches here with D != 3
  const int64_t B = p.B, M = p.M;

  LaunchArgs<T> args{};
  args.targets = op.targets.data_ptr<T>();
  args.sources = op.sources.data_ptr<T>();
  args.weights = op.weights.data_ptr<T>();
  args.B = B;
  args.M = M;
  args.N = p.N;
  args.D = p.D;
  args.weight_row = op.real_columns;
  args.k = pair_constants<T>(constants);
  args.sum_scale = constants.sum_scale;
  args.moment_scale = constants.moment_scale;
  args.sums_real = out.sums_real.data_ptr<T>();
  args.moments_real = moments ? out.moments_real.data_ptr<T>() : nullptr;
  args.out.sums_row = out.sums_real.numel() / (B * M);
  args.out.moments_row = moments ? out.moments_real.numel() / (B * M) : 0;
  args.out.D = p.D;
  args.out.complex_output = p.complex_output;
  args.direct_epilogue = !moments && !(parts == 2 && p.complex_weights);

  const int largest = moments ? 2
                      : (generic || sizeof(T) == 8) ? 4
                      : p.kernel == ParticleKernel::Helmholtz ? 8 : 16;
  // The one- or two-targets-per-thread D = 3 variants (launch_d3_few; where compiled: float, no
  // moments, R <= 2) for few targets (with the sources split across blocks), and for targets up to
  // kUnsplitTargetsPerSm per SM when the sources are too few to split (N < 2 kMinSplit), where the
  // eight-targets-per-thread variant would leave the SMs half idle.
  const int64_t sms = multiprocessor_count();
  const bool few_targets =
      B * M < sms * kThreads * 2 || (p.N < 2 * kMinSplit && B * M < sms * kUnsplitTargetsPerSm);
  const auto device = op.targets.options();
  for (int64_t column = 0; column < op.real_columns;) {
    const int R = column_chunk(op.real_columns - column, p.complex_weights, largest);
    args.column_begin = column;
    args.out.column_begin = column;
    if (!generic) {
      const int slots = moments ? 4 : 1;
      args.acc = AccumulatorLayout{R, parts, slots, moments ? 3 : 0, 0, p.complex_weights};
      args.out.write_sums = true;
      switch (p.kernel) {
        case ParticleKernel::Gaussian:
          launch_d3<ParticleKernel::Gaussian, T>(args, R, moments, few_targets, device, stream);
          break;
        case ParticleKernel::Laplace:
          launch_d3<ParticleKernel::Laplace, T>(args, R, moments, few_targets, device, stream);
          break;
        case ParticleKernel::Helmholtz:
          launch_d3<ParticleKernel::Helmholtz, T>(args, R, moments, few_targets, device, stream);
          break;
      }
    } else if (!moments) {
      args.acc = AccumulatorLayout{R, 1, 1, 0, 0, p.complex_weights};
      args.out.write_sums = true;
      launch_generic<T>(args, R, false, device, stream);
    } else {
      // kGenericMomentDims dimensions per launch; the first also writes the sums.
      for (int64_t dim = 0; dim < p.D; dim += kGenericMomentDims) {
        const int dims = static_cast<int>(std::min<int64_t>(kGenericMomentDims, p.D - dim));
        args.acc = AccumulatorLayout{R, 1, 1 + kGenericMomentDims, dims, dim, p.complex_weights};
        args.out.write_sums = dim == 0;
        launch_generic<T>(args, R, true, device, stream);
      }
    }
    column += R;
  }
}

ParticleSumOutputs particle_sum_cuda_impl(const ParticleSumProblem& p, const at::Tensor& targets,
                                          const at::Tensor& sources, const at::Tensor& weights, bool moments) {
  const c10::cuda::CUDAGuard guard(targets.device());
  ParticleSumOutputs out = allocate_particle_sum_outputs(p, targets.options(), moments);
  if (finish_trivial_particle_sum(p, out)) return out;
  const ParticleSumOperands op = particle_sum_operands(p, targets, sources, weights);
  if (p.compute_type == at::kDouble) {
    run_particle_sum<double>(p, op, out, moments);
  } else {
    run_particle_sum<float>(p, op, out, moments);
  }
  finish_particle_sum_outputs(p, out);
  return out;
}

}  // namespace
}  // namespace particle_sum_cuda

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("particle_sum", &particle_sum_entry<particle_sum_cuda::particle_sum_cuda_impl>);
  m.impl("_particle_sum_moments", &particle_sum_moments_entry<particle_sum_cuda::particle_sum_cuda_impl>);
}

}  // namespace pointops
