// Input validation and device-independent preparation for the particle sums, shared by the CPU
// and CUDA launchers (pointops/particle_sum.py mirrors the shape checks in its fake kernels).
#include "particle_sum/particle_sum.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "common/checks.h"

namespace pointops {
namespace {

constexpr double kPi = 3.14159265358979323846;

ParticleKernel parse_kernel(c10::string_view name) {
  if (name == "gaussian") return ParticleKernel::Gaussian;
  if (name == "laplace") return ParticleKernel::Laplace;
  if (name == "helmholtz") return ParticleKernel::Helmholtz;
  TORCH_CHECK(false, "kernel must be one of 'gaussian', 'laplace', 'helmholtz', got '", std::string(name), "'");
}

// Shortest round-trip text of a double, for messages ("0.1", not "0.100000").
std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void check_kernel_parameters(ParticleKernel kernel, c10::string_view name, c10::optional<double> sigma,
                             c10::optional<double> wavenumber) {
  if (kernel == ParticleKernel::Gaussian) {
    TORCH_CHECK(sigma.has_value(), "the gaussian kernel needs sigma (its width), got none");
    TORCH_CHECK(std::isfinite(*sigma) && *sigma > 0, "sigma must be finite and > 0, got ", number(*sigma));
  } else {
    TORCH_CHECK(!sigma.has_value(), "sigma applies to the gaussian kernel only, got sigma=", number(*sigma),
                " with kernel '", std::string(name), "'");
  }
  if (kernel == ParticleKernel::Helmholtz) {
    TORCH_CHECK(wavenumber.has_value(), "the helmholtz kernel needs wavenumber (k), got none");
    TORCH_CHECK(std::isfinite(*wavenumber), "wavenumber must be finite, got ", number(*wavenumber));
  } else {
    TORCH_CHECK(!wavenumber.has_value(), "wavenumber applies to the helmholtz kernel only, got wavenumber=",
                number(*wavenumber), " with kernel '", std::string(name), "'");
  }
}

}  // namespace

ParticleSumProblem check_particle_sum_inputs(const at::Tensor& targets, const at::Tensor& sources,
                                             const at::Tensor& weights, c10::string_view kernel,
                                             c10::optional<double> sigma, c10::optional<double> wavenumber) {
  ParticleSumProblem p{};
  p.kernel = parse_kernel(kernel);
  check_kernel_parameters(p.kernel, kernel, sigma, wavenumber);
  p.sigma = sigma.value_or(0.0);
  p.wavenumber = wavenumber.value_or(0.0);

  TORCH_CHECK(targets.dim() == 2 || targets.dim() == 3,
              "targets must be a 2-D (M, D) or 3-D (B, M, D) tensor, got shape ", targets.sizes());
  p.batched = targets.dim() == 3;
  TORCH_CHECK(sources.dim() == targets.dim(), "sources must be a ",
              p.batched ? "3-D (B, N, D)" : "2-D (N, D)", " tensor like targets, got shape ", sources.sizes());
  check_floating_point(targets, "targets");
  check_same_dtype(sources, targets, "sources", "targets");
  check_same_device(sources, targets, "sources", "targets");
  check_same_device(weights, targets, "weights", "targets");

  p.B = p.batched ? targets.size(0) : 1;
  p.M = targets.size(-2);
  p.D = targets.size(-1);
  p.N = sources.size(-2);
  TORCH_CHECK(p.D >= 1, "the dimension D must be at least 1, got targets of shape ", targets.sizes());
  TORCH_CHECK(sources.size(-1) == p.D, "sources must have the same dimension D as targets (", p.D,
              "), got shape ", sources.sizes());
  if (p.batched) {
    TORCH_CHECK(sources.size(0) == p.B, "sources must have the same batch size B as targets (", p.B,
                "), got shape ", sources.sizes());
  }
  if (p.kernel != ParticleKernel::Gaussian) {
    TORCH_CHECK(p.D == 3, "the ", std::string(kernel), " kernel needs D = 3, got targets of shape ", targets.sizes());
  }

  // weights: (N,) / (N, C), or (B, N) / (B, N, C).
  const int64_t lead = p.batched ? 1 : 0;
  const bool vector = weights.dim() == lead + 1;
  const bool matrix = weights.dim() == lead + 2;
  const bool shape_ok = (vector || matrix) && (!p.batched || weights.size(0) == p.B) && weights.size(lead) == p.N;
  if (!shape_ok) {
    if (p.batched) {
      TORCH_CHECK(false, "weights must have shape (B, N) or (B, N, C) with B = ", p.B, ", N = ", p.N,
                  ", got shape ", weights.sizes());
    } else {
      TORCH_CHECK(false, "weights must have shape (N,) or (N, C) with N = ", p.N,
                  " (the number of sources), got shape ", weights.sizes());
    }
  }
  p.vector_weights = vector;
  p.C = vector ? 1 : weights.size(-1);

  const auto coords = targets.scalar_type();
  const auto w = weights.scalar_type();
  p.complex_weights = at::isComplexType(w);
  if (coords == at::kFloat || coords == at::kDouble) {
    const auto complex = coords == at::kFloat ? at::kComplexFloat : at::kComplexDouble;
    TORCH_CHECK(w == coords || w == complex, "weights must be ", coords, " or ", complex, " to match targets (",
                coords, "), got ", w);
  } else {
    TORCH_CHECK(w == coords, "weights must be ", coords, " to match targets (", coords, "), got ", w);
  }
  p.complex_output = p.complex_weights || p.kernel == ParticleKernel::Helmholtz;
  p.coords_type = coords;
  p.compute_type = coords == at::kDouble ? at::kDouble : at::kFloat;
  return p;
}

ParticleSumOperands particle_sum_operands(const ParticleSumProblem& p, const at::Tensor& targets,
                                          const at::Tensor& sources, const at::Tensor& weights) {
  ParticleSumOperands op;
  // .to() and .contiguous() copy only when needed; the half types are widened once here.
  op.targets = targets.reshape({p.B, p.M, p.D}).to(p.compute_type).contiguous();
  op.sources = sources.reshape({p.B, p.N, p.D}).to(p.compute_type).contiguous();
  at::Tensor w = weights.reshape({p.B, p.N, p.C});
  if (p.complex_weights) w = at::view_as_real(w.resolve_conj()).reshape({p.B, p.N, 2 * p.C});
  op.weights = w.to(p.compute_type).contiguous();
  op.real_columns = op.weights.size(2);
  return op;
}

ParticleSumOutputs allocate_particle_sum_outputs(const ParticleSumProblem& p, const at::TensorOptions& device,
                                                 bool with_moments) {
  ParticleSumOutputs out;
  const auto real = device.dtype(p.compute_type);
  const auto final_real = p.compute_type == at::kDouble ? at::kDouble : at::kFloat;
  if (p.complex_output) {
    const auto complex = device.dtype(final_real == at::kDouble ? at::kComplexDouble : at::kComplexFloat);
    out.sums = at::empty({p.B, p.M, p.C}, complex);
    out.sums_real = at::view_as_real(out.sums);
    if (with_moments) {
      out.moments = at::empty({p.B, p.M, p.C, p.D}, complex);
      out.moments_real = at::view_as_real(out.moments);
    }
  } else {
    out.sums = out.sums_real = at::empty({p.B, p.M, p.C}, real);
    if (with_moments) out.moments = out.moments_real = at::empty({p.B, p.M, p.C, p.D}, real);
  }
  return out;
}

void finish_particle_sum_outputs(const ParticleSumProblem& p, ParticleSumOutputs& out) {
  // Real outputs of half coordinates were computed in float32: one rounding to the half type.
  // Complex outputs stay complex64 (there is no usable complex half type).
  if (p.complex_output || p.coords_type == p.compute_type) return;
  out.sums = out.sums.to(p.coords_type);
  if (out.moments.defined()) out.moments = out.moments.to(p.coords_type);
}

bool finish_trivial_particle_sum(const ParticleSumProblem& p, ParticleSumOutputs& out) {
  if (p.B * p.M * p.C != 0 && p.N != 0) return false;
  if (p.N == 0) {
    out.sums_real.zero_();
    if (out.moments_real.defined()) out.moments_real.zero_();
  }
  finish_particle_sum_outputs(p, out);
  return true;
}

at::Tensor shape_like_call(const ParticleSumProblem& p, at::Tensor sums) {
  if (p.vector_weights) sums = sums.squeeze(-1);
  if (!p.batched) sums = sums.squeeze(0);
  return sums;
}

at::Tensor moments_like_call(const ParticleSumProblem& p, at::Tensor moments) {
  if (p.vector_weights) moments = moments.squeeze(-2);
  if (!p.batched) moments = moments.squeeze(0);
  return moments;
}

ParticleKernelConstants particle_kernel_constants(const ParticleSumProblem& p) {
  ParticleKernelConstants c{};
  const double inv_4pi = 1.0 / (4.0 * kPi);
  switch (p.kernel) {
    case ParticleKernel::Gaussian:
      c.gaussian_exp2_scale = -1.0 / (2.0 * p.sigma * p.sigma * std::log(2.0));
      c.sum_scale = 1.0;
      c.moment_scale = -1.0 / (p.sigma * p.sigma);
      break;
    case ParticleKernel::Laplace:
      c.sum_scale = inv_4pi;
      c.moment_scale = -inv_4pi;
      break;
    case ParticleKernel::Helmholtz: {
      c.wavenumber = p.wavenumber;
      const double turns = p.wavenumber / (2.0 * kPi);
      c.turns_hi = static_cast<float>(turns);
      c.turns_lo = static_cast<float>(turns - static_cast<double>(c.turns_hi));
      c.sum_scale = inv_4pi;
      c.moment_scale = inv_4pi;
      break;
    }
  }
  return c;
}

}  // namespace pointops
