// Particle (kernel) sums: what the CPU and CUDA launchers share.
//
// Both backends compute, for every target x_i and real weight column r,
//   sum_j  g(r_ij) w_j^r                      (the sum)
//   sum_j  h(r_ij) w_j^r (x_i - y_j)          (the first moments, h = g'(r) / r; only when asked)
// into float64 accumulators laid out per target as [column r][part v][slot m] (m = 0 the sum,
// m = 1 + d the moment along dimension d). Complex weights enter as two real columns (re, im);
// the Helmholtz kernel has two parts (cos and sin of k r). finalize_value() below turns the
// accumulators into the outputs: the complex products, the constant factors (1 / 4 pi, -1 /
// sigma^2) and the rounding to the output type, identically on both backends.
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>

namespace pointops {

enum class ParticleKernel { Gaussian = 0, Laplace = 1, Helmholtz = 2 };

// A validated call; B = 1 and C = 1 where the call has no batch or column dimension.
struct ParticleSumProblem {
  ParticleKernel kernel;
  double sigma = 0;       // gaussian
  double wavenumber = 0;  // helmholtz
  bool batched;           // the caller passed (B, M, D) rather than (M, D)
  bool vector_weights;    // weights (N,) / (B, N): no column dimension in the output
  int64_t B, M, N, D, C;  // C: weight columns (1 for vector weights)
  bool complex_weights;
  bool complex_output;    // complex weights or helmholtz
  at::ScalarType coords_type;   // the coordinates' dtype
  at::ScalarType compute_type;  // kFloat (float16/bfloat16/float32 coordinates) or kDouble
};

// Validates the arguments of particle_sum and _particle_sum_moments (the (M, D) and (B, M, D)
// forms). Every message names the argument, what it got and what was expected.
// pointops/particle_sum.py mirrors the shape checks in its fake kernels.
ParticleSumProblem check_particle_sum_inputs(const at::Tensor& targets, const at::Tensor& sources,
                                             const at::Tensor& weights, c10::string_view kernel,
                                             c10::optional<double> sigma, c10::optional<double> wavenumber);

// The inputs as the kernels read them: contiguous, in the compute type, canonical shapes.
struct ParticleSumOperands {
  at::Tensor targets;  // (B, M, D)
  at::Tensor sources;  // (B, N, D)
  at::Tensor weights;  // (B, N, R) real: R = C, or 2C (re, im interleaved) for complex weights
  int64_t real_columns;
};
ParticleSumOperands particle_sum_operands(const ParticleSumProblem& p, const at::Tensor& targets,
                                          const at::Tensor& sources, const at::Tensor& weights);

// Outputs in the compute type, as the kernels write them ("real views": a complex output is
// stored as (re, im) pairs): sums (B, M, C[, 2]); moments (B, M, C, D[, 2]) when asked.
struct ParticleSumOutputs {
  at::Tensor sums, moments;               // what the op returns (final dtypes and shapes)
  at::Tensor sums_real, moments_real;     // contiguous compute-type views the kernels write
};
ParticleSumOutputs allocate_particle_sum_outputs(const ParticleSumProblem& p, const at::TensorOptions& device,
                                                 bool with_moments);
// Rounds compute-type outputs to the half types where the coordinates are half (a no-op otherwise).
void finish_particle_sum_outputs(const ParticleSumProblem& p, ParticleSumOutputs& out);

// The op's results in the caller's form: drop the batch and column dimensions that the call did
// not have. Sums (B, M, C) -> (B, M) / (M, C) / (M,); moments (B, M, C, D) likewise.
at::Tensor shape_like_call(const ParticleSumProblem& p, at::Tensor sums);
at::Tensor moments_like_call(const ParticleSumProblem& p, at::Tensor moments);

// The cases without any pair to sum: no output elements (nothing to do) or no sources (zeros).
// Returns true when it handled the call (outputs finished).
bool finish_trivial_particle_sum(const ParticleSumProblem& p, ParticleSumOutputs& out);

using ParticleSumImpl = ParticleSumOutputs (*)(const ParticleSumProblem&, const at::Tensor& targets,
                                               const at::Tensor& sources, const at::Tensor& weights,
                                               bool with_moments);

// The two ops' entry points around a backend's implementation (registered per backend).
template <ParticleSumImpl Impl>
at::Tensor particle_sum_entry(const at::Tensor& targets, const at::Tensor& sources, const at::Tensor& weights,
                              c10::string_view kernel, c10::optional<double> sigma, c10::optional<double> wavenumber) {
  const ParticleSumProblem p = check_particle_sum_inputs(targets, sources, weights, kernel, sigma, wavenumber);
  return shape_like_call(p, Impl(p, targets, sources, weights, false).sums);
}

template <ParticleSumImpl Impl>
std::tuple<at::Tensor, at::Tensor> particle_sum_moments_entry(const at::Tensor& targets, const at::Tensor& sources,
                                                              const at::Tensor& weights, c10::string_view kernel,
                                                              c10::optional<double> sigma,
                                                              c10::optional<double> wavenumber) {
  const ParticleSumProblem p = check_particle_sum_inputs(targets, sources, weights, kernel, sigma, wavenumber);
  ParticleSumOutputs out = Impl(p, targets, sources, weights, true);
  return {shape_like_call(p, out.sums), moments_like_call(p, out.moments)};
}

// The constants a kernel evaluation needs, the same for both backends.
struct ParticleKernelConstants {
  double gaussian_exp2_scale;  // -log2(e) / (2 sigma^2): g = exp2(scale * r^2)
  double wavenumber;           // k
  float turns_hi, turns_lo;    // k / (2 pi) as two floats, for the float32 phase reduction
  double sum_scale;            // applied to the sums: 1 (gaussian), 1 / (4 pi)
  double moment_scale;         // applied to the moments: -1 / sigma^2, -1 / (4 pi), 1 / (4 pi)
};
ParticleKernelConstants particle_kernel_constants(const ParticleSumProblem& p);

// The Gaussian's scale in the compute type T. A tiny sigma gives a scale below T's range: the
// lowest finite value keeps exp2(0 * scale) = 1 for coincident points (-inf would make it NaN).
template <typename T>
T gaussian_exp2_scale_as(const ParticleKernelConstants& c) {
  return static_cast<T>(std::max(c.gaussian_exp2_scale, static_cast<double>(std::numeric_limits<T>::lowest())));
}

// Number of value parts per pair: 2 for helmholtz (cos, sin), else 1.
C10_HOST_DEVICE constexpr int kernel_parts(ParticleKernel k) { return k == ParticleKernel::Helmholtz ? 2 : 1; }

// One chunk of weight columns as the kernels see it. Accumulators per target:
// accumulators_per_target() = columns * parts * slots, index (r * parts + v) * slots + m.
struct AccumulatorLayout {
  int columns;          // real weight columns in this chunk
  int parts;            // 1 or 2
  int slots;            // accumulator slots per (column, part): 1 (the sum) + moment dimensions
  int moment_dims;      // moment dimensions computed: [dim_begin, dim_begin + moment_dims)
  int64_t dim_begin;    // first moment dimension of this pass
  bool complex_weights; // columns come in (re, im) pairs
  C10_HOST_DEVICE int accumulators_per_target() const { return columns * parts * slots; }
};

// Where finalize writes, for one chunk of weight columns starting at real column `column_begin`.
struct OutputLayout {
  int64_t sums_row;       // real elements per target in sums_real
  int64_t moments_row;    // real elements per target in moments_real (0: no moments)
  int64_t D;
  bool complex_output;
  int64_t column_begin;   // first real weight column of this chunk
  bool write_sums;        // false on the extra moment passes of the generic-dimension kernel
};

// Number of output values one target gets from a chunk: sums then moments, each real or (re, im).
C10_HOST_DEVICE inline int64_t outputs_per_target(const AccumulatorLayout& a, const OutputLayout& o) {
  const int64_t out_columns = (a.parts == 2 && a.complex_weights) ? a.columns / 2 : a.columns;
  const int64_t per_column = (o.write_sums ? 1 : 0) + a.moment_dims;
  return out_columns * per_column * (o.complex_output && a.parts == 2 ? 2 : 1);
}

// Output value number `n` of a target (0 <= n < outputs_per_target): which accumulators it
// combines (`first` + sign * `second`, second < 0 when absent), its constant factor and where it
// goes (is_sum: into sums_real at `offset` of the target's row, else into moments_real).
struct OutputTerm {
  int first, second;
  double sign;
  bool is_sum;
  int64_t offset;
};

C10_HOST_DEVICE inline OutputTerm output_term(const AccumulatorLayout& a, const OutputLayout& o, int64_t n) {
  // Real kernels: every real column is its own real output (complex weights give the (re, im)
  // of a complex output directly). Helmholtz: real column r gives complex output r as
  // (cos part, sin part); complex weights (a + ib) combine two columns:
  //   re = S_cos(a) - S_sin(b),  im = S_sin(a) + S_cos(b).
  const bool helmholtz = a.parts == 2;
  const int re_im = helmholtz ? 2 : 1;
  const int64_t per_column = ((o.write_sums ? 1 : 0) + a.moment_dims) * re_im;
  const int64_t column = n / per_column;
  int64_t rest = n % per_column;
  const int part = static_cast<int>(rest % re_im);
  rest /= re_im;
  const int slot = o.write_sums ? static_cast<int>(rest) : static_cast<int>(rest) + 1;
  const bool is_sum = slot == 0;
  auto index = [&](int64_t r, int v) { return static_cast<int>((r * a.parts + v) * a.slots + slot); };
  OutputTerm t{};
  t.is_sum = is_sum;
  t.sign = 1.0;
  t.second = -1;
  int64_t out_real;  // the output's index in real elements, counted in this chunk's columns
  if (!helmholtz) {
    t.first = index(column, 0);
    out_real = o.column_begin + column;  // real view of a complex output: the same index space
  } else if (!a.complex_weights) {
    t.first = index(column, part);
    out_real = 2 * (o.column_begin + column) + part;
  } else {
    const int64_t ra = 2 * column, rb = 2 * column + 1;
    t.first = index(ra, part);
    t.second = index(rb, 1 - part);
    t.sign = part == 0 ? -1.0 : 1.0;
    out_real = o.column_begin + 2 * column + part;  // complex column (column_begin / 2 + column)
  }
  if (is_sum) {
    t.offset = out_real;
  } else {
    // moments_real row: [complex or real output column][dimension][re, im]
    const int64_t d = a.dim_begin + slot - 1;
    const int64_t pair = (o.complex_output ? 2 : 1);
    const int64_t out_column = out_real / pair, out_part = out_real % pair;
    t.offset = (out_column * o.D + d) * pair + out_part;
  }
  return t;
}

// Turns one target's accumulators into its outputs. `sum_of(a)` returns accumulator a summed over
// the source splits (in a fixed order); values are combined and scaled in float64 and rounded once.
template <typename T, typename SumOf>
C10_HOST_DEVICE inline void finalize_target(const AccumulatorLayout& a, const OutputLayout& o, double sum_scale,
                                            double moment_scale, const SumOf& sum_of, T* sums_row, T* moments_row) {
  const int64_t outputs = outputs_per_target(a, o);
  for (int64_t n = 0; n < outputs; ++n) {
    const OutputTerm t = output_term(a, o, n);
    double v = sum_of(t.first);
    if (t.second >= 0) v += t.sign * sum_of(t.second);
    if (t.is_sum) {
      sums_row[t.offset] = static_cast<T>(v * sum_scale);
    } else {
      moments_row[t.offset] = static_cast<T>(v * moment_scale);
    }
  }
}

}  // namespace pointops
