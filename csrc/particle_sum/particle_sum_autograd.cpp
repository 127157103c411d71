// Autograd for particle_sum, in C++ (a Python autograd wrapper costs more host time than a small
// GPU call). With G the output's gradient and h = g'(r) / r (particle_sum.h):
//   weights: grad_c_j = sum_i conj(g_ij) G_i                 = conj(S_j)
//   sources: grad_y_j = Re sum_c c_j^c sum_i h_ij conj(G_i^c) (y_j - x_i) = Re sum_c c_j^c M_j^c
//   targets: grad_x_i = Re sum_c conj(G_i^c) sum_j h_ij c_j^c (x_i - y_j) = Re sum_c conj(G_i^c) m_i^c
// where (S, M) = _particle_sum_moments(sources, targets, conj(G)), one fused pass with the roles
// swapped (G has the output's shape, which is the shape the swapped pass takes as weights), and m
// comes from _particle_sum_moments(targets, sources, weights) in the forward pass (computed with
// the sum, from the same pair values) when targets require grad. The kernels are
// symmetric in their two points, so no other pass is needed. Each pass is O(M N) time, O(M + N)
// memory. sigma and wavenumber are Python floats: no gradient.
// Forward-mode AD and the torch.func transforms go through pointops/_particle_sum_function.py (a
// torch.autograd.Function with jvp and a generated vmap rule over this op's batching rule): the
// derivatives here are no ATen formula (that would form the M x N matrix), and functorch refuses a
// C++ autograd::Function. This op refuses them with a clear error instead of a missing tangent.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "common/transforms.h"
#include "common/vmap.h"
#include "particle_sum/particle_sum.h"

namespace pointops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalDouble = c10::optional<double>;

at::Tensor particle_sum_op(const at::Tensor& targets, const at::Tensor& sources, const at::Tensor& weights,
                           c10::string_view kernel, OptionalDouble sigma, OptionalDouble wavenumber) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pointops::particle_sum", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
                                         OptionalDouble, OptionalDouble)>();
  return op.call(targets, sources, weights, kernel, sigma, wavenumber);
}

std::tuple<at::Tensor, at::Tensor> particle_sum_moments_op(const at::Tensor& targets, const at::Tensor& sources,
                                                           const at::Tensor& weights, c10::string_view kernel,
                                                           OptionalDouble sigma, OptionalDouble wavenumber) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("pointops::_particle_sum_moments", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                 const at::Tensor&, c10::string_view, OptionalDouble,
                                                                 OptionalDouble)>();
  return op.call(targets, sources, weights, kernel, sigma, wavenumber);
}

OptionalDouble saved_double(AutogradContext* ctx, const char* key) {
  const auto& v = ctx->saved_data[key];
  return v.isNone() ? OptionalDouble() : OptionalDouble(v.toDouble());
}

at::Tensor real_part(const at::Tensor& t) { return t.is_complex() ? at::real(t) : t; }

// sum_j h(r_ij) w_j (a_i - b_j) for the gaussian, h = g'(r) / r = -g / sigma^2, written as two
// differentiable particle sums: -(a_i sum_j g_ij w_j - sum_j g_ij w_j b_j) / sigma^2. The double
// backward uses it, so second (and higher) derivatives go through the particle_sum autograd.
// It cancels where the fused moments kernel does not (a_i f_i and the second sum are both ~ |a| f):
// the caller shifts a and b so the sources' mean is at the origin, which bounds the loss by the
// cloud's extent over sigma rather than its distance from the origin. Returns (sums, moments), as
// the fused moments op does: sums = sum_j g_ij w_j is the first of the two.
std::tuple<at::Tensor, at::Tensor> gaussian_moments_composite(const at::Tensor& a, const at::Tensor& b,
                                                              const at::Tensor& w, double sigma) {
  const bool columns = w.dim() == a.dim();
  const at::Tensor sums = particle_sum_op(a, b, w, "gaussian", sigma, c10::nullopt);
  at::Tensor weighted_points_sums, a_times_sums;
  if (columns) {  // w (..., N, C): weights w_j^c b_j flattened to (..., N, C * D)
    const at::Tensor wb = (w.unsqueeze(-1) * b.unsqueeze(-2)).flatten(-2);
    weighted_points_sums =
        particle_sum_op(a, b, wb, "gaussian", sigma, c10::nullopt).unflatten(-1, {w.size(-1), b.size(-1)});
    a_times_sums = a.unsqueeze(-2) * sums.unsqueeze(-1);
  } else {
    weighted_points_sums = particle_sum_op(a, b, w.unsqueeze(-1) * b, "gaussian", sigma, c10::nullopt);
    a_times_sums = a * sums.unsqueeze(-1);
  }
  return {sums, (a_times_sums - weighted_points_sums) * (-1.0 / (sigma * sigma))};
}

// The moments are differentiable only through gaussian_moments_composite (gaussian). For the
// singular kernels the derivative of h would need a kernel pointops does not have: this node, placed
// between already computed moments and the (targets, sources, weights) they came from, makes such a
// double backward fail loudly instead of treating the moments as constants (silently wrong).
class RefuseMomentsDerivative : public torch::autograd::Function<RefuseMomentsDerivative> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& /*targets*/, const at::Tensor& /*sources*/,
                               const at::Tensor& /*weights*/, const at::Tensor& moments, c10::string_view kernel) {
    ctx->saved_data["kernel"] = std::string(kernel);
    return {moments.clone()};  // a new tensor for the new node: O(M D), not a second O(M N) pass
  }

  static variable_list backward(AutogradContext* ctx, variable_list) {
    TORCH_CHECK(false, "particle_sum: second derivatives through the targets' or sources' gradient are "
                "implemented for kernel='gaussian' only, got kernel='", ctx->saved_data["kernel"].toStringRef(),
                "' (they need the derivative of g'(r)/r, a kernel pointops does not have yet). First "
                "derivatives, and derivatives of the weights' gradient, work for every kernel.");
    return {};
  }
};

// No sizes are read here (only dim() and dtypes): under torch.compile with dynamic shapes this
// code runs on tensors with symbolic sizes. The ops validate their inputs themselves. (The
// create_graph branch reads sizes; it runs eagerly only: torch.compile has no double backward.)
class ParticleSumFunction : public torch::autograd::Function<ParticleSumFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& targets, const at::Tensor& sources,
                               const at::Tensor& weights, c10::string_view kernel, OptionalDouble sigma,
                               OptionalDouble wavenumber) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor result, moments;
    if (targets.requires_grad()) {
      std::tie(result, moments) = particle_sum_moments_op(targets, sources, weights, kernel, sigma, wavenumber);
    } else {
      result = particle_sum_op(targets, sources, weights, kernel, sigma, wavenumber);
    }
    ctx->save_for_backward({targets, sources, weights, moments});
    ctx->saved_data["kernel"] = std::string(kernel);
    ctx->saved_data["sigma"] = sigma.has_value() ? c10::IValue(*sigma) : c10::IValue();
    ctx->saved_data["wavenumber"] = wavenumber.has_value() ? c10::IValue(*wavenumber) : c10::IValue();
    return {result};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &targets = saved[0], &sources = saved[1], &weights = saved[2], &moments = saved[3];
    const std::string kernel = ctx->saved_data["kernel"].toStringRef();
    const OptionalDouble sigma = saved_double(ctx, "sigma"), wavenumber = saved_double(ctx, "wavenumber");
    const bool need_targets = ctx->needs_input_grad(0), need_sources = ctx->needs_input_grad(1),
               need_weights = ctx->needs_input_grad(2);
    variable_list out(6);
    if (!grads[0].defined() || !(need_targets || need_sources || need_weights)) return out;

    // Vector weights: the output has no column dimension, and neither have G and the moments.
    const bool columns = weights.dim() == targets.dim();
    at::Tensor x = targets, y = sources;
    // conj(G) is the weight of the swapped pass (G has the output's shape, the shape weights take).
    at::Tensor g = grads[0];
    if (g.is_complex()) {
      g = g.conj();
      // Complex weights need float32 or float64 coordinates: widen half coordinates.
      if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) {
        x = x.to(at::kFloat);
        y = y.to(at::kFloat);
      }
    }
    // sum over the weight columns of a (..., C, D) product, or nothing for vector weights
    auto combine = [&](const at::Tensor& factor, const at::Tensor& m) {
      at::Tensor prod = factor.unsqueeze(-1) * m;
      if (columns) prod = prod.sum(-2);
      return real_part(prod);
    };
    // create_graph: the gradients must themselves be differentiable (double backward).
    const bool create_graph = at::GradMode::is_enabled();
    if (create_graph && kernel == "gaussian") {
      // Differentiable composite sums, in float32 at least, with the sources' mean at the origin
      // (the sums depend on differences only).
      at::Tensor w = weights;
      if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kDouble) {
        x = x.to(at::kFloat);
        y = y.to(at::kFloat);
        if (!w.is_complex()) w = w.to(at::kFloat);
        if (!g.is_complex()) g = g.to(at::kFloat);
      }
      const at::Tensor origin =
          y.size(-2) > 0 ? y.detach().mean(-2, /*keepdim=*/true) : at::zeros_like(y.detach().sum(-2, true));
      x = x - origin;
      y = y - origin;
      if (need_targets) {
        out[0] = combine(g, std::get<1>(gaussian_moments_composite(x, y, w, *sigma))).to(targets.scalar_type());
      }
      if (need_sources) {
        auto [swapped_sums, swapped_moments] = gaussian_moments_composite(y, x, g, *sigma);
        out[1] = combine(w, swapped_moments).to(sources.scalar_type());
        if (need_weights) out[2] = swapped_sums;  // the weights' gradient is that same pass (y, x, g)
      }
      if (need_weights && !out[2].defined()) out[2] = particle_sum_op(y, x, g, kernel, sigma, wavenumber);
    } else {
      // With create_graph the moments (constants to autograd) pass through a node that refuses to
      // be differentiated (see RefuseMomentsDerivative).
      auto refusing = [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& w, const at::Tensor& m) {
        return create_graph ? RefuseMomentsDerivative::apply(a, b, w, m, kernel)[0] : m;
      };
      if (need_targets) {
        TORCH_CHECK(moments.defined(), "particle_sum backward: the targets' moments were not computed in the "
                                       "forward pass (targets did not require grad then)");
        out[0] = combine(g, refusing(targets, sources, weights, moments)).to(targets.scalar_type());
      }
      if (need_sources) {
        auto [swapped_sums, swapped_moments] = [&] {
          const at::NoGradGuard constants;  // the moments op has no autograd kernel: refusing() wraps them
          return particle_sum_moments_op(y, x, g, kernel, sigma, wavenumber);
        }();
        out[1] = combine(weights, refusing(y, x, g, swapped_moments)).to(sources.scalar_type());
        // With create_graph the weights' gradient takes its own (differentiable) pass.
        if (need_weights && !create_graph) out[2] = swapped_sums;
      }
      if (need_weights && !out[2].defined()) out[2] = particle_sum_op(y, x, g, kernel, sigma, wavenumber);
    }
    if (need_weights) {
      at::Tensor gw = out[2].is_complex() ? out[2].conj() : out[2];
      if (!weights.is_complex()) gw = real_part(gw);
      out[2] = gw.to(weights.scalar_type());
    }
    return out;
  }
};

at::Tensor particle_sum_autograd(const at::Tensor& targets, const at::Tensor& sources, const at::Tensor& weights,
                                 c10::string_view kernel, OptionalDouble sigma, OptionalDouble wavenumber) {
  if (any_differentiated_by_transform({&targets, &sources, &weights})) {
    refuse_transform("particle_sum", "call pointops.particle_sum, which serves forward mode and torch.func");
  }
  // Nothing to differentiate: skip the autograd node (host time matters for small calls).
  if (!at::GradMode::is_enabled() || !(targets.requires_grad() || sources.requires_grad() || weights.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return particle_sum_op(targets, sources, weights, kernel, sigma, wavenumber);
  }
  return ParticleSumFunction::apply(targets, sources, weights, kernel, sigma, wavenumber)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, Autograd, m) { m.impl("particle_sum", &particle_sum_autograd); }

// ---- vmap
// vmap batching rules of particle_sum and its moments op (common/vmap.h): the vmapped dimension
// becomes the sums' batch, (V, M, D) for unbatched sums and (V * B, M, D) for batched ones: one
// call for every sample.
namespace {

using OptionalDouble = c10::optional<double>;

// The operands as the op takes them for all samples at once, and how to give the outputs back.
struct FoldedSums {
  at::Tensor targets, sources, weights;
  int64_t batch;  // B for batched sums; -1 when each sample is an unbatched sum

  FoldedSums(const BatchFold& f, const at::Tensor& t, const at::Tensor& s, const at::Tensor& w) {
    const int64_t rank = f.front(t).dim() - 1;
    TORCH_CHECK(rank == 2 || rank == 3, "targets must be a 2-D (M, D) or 3-D (B, M, D) tensor (each vmapped "
                "sample), got ", rank, " dims");
    f.require_dim(s, rank, "sources", rank == 2 ? "(N, D)" : "(B, N, D)");
    batch = rank == 3 ? f.front(t).size(1) : -1;
    targets = rank == 3 ? f.fold(t) : f.front(t);
    sources = rank == 3 ? f.fold(s) : f.front(s);
    weights = rank == 3 ? f.fold(w) : f.front(w);
  }

  at::Tensor unfold(const BatchFold& f, const at::Tensor& out) const {
    return batch >= 0 ? f.unfold(out, batch) : f.batched_front(out);
  }
};

at::Tensor particle_sum_batched(const at::Tensor& targets, const at::Tensor& sources, const at::Tensor& weights,
                                c10::string_view kernel, OptionalDouble sigma, OptionalDouble wavenumber) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::particle_sum", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               c10::string_view, OptionalDouble, OptionalDouble)>();
  const BatchFold f({&targets, &sources, &weights});
  if (!f.any_batched()) return op.call(targets, sources, weights, kernel, sigma, wavenumber);
  const FoldedSums folded(f, targets, sources, weights);
  return folded.unfold(f, op.call(folded.targets, folded.sources, folded.weights, kernel, sigma, wavenumber));
}

std::tuple<at::Tensor, at::Tensor> particle_sum_moments_batched(const at::Tensor& targets, const at::Tensor& sources,
                                                                const at::Tensor& weights, c10::string_view kernel,
                                                                OptionalDouble sigma, OptionalDouble wavenumber) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::_particle_sum_moments", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, c10::string_view,
                                                                       OptionalDouble, OptionalDouble)>();
  const BatchFold f({&targets, &sources, &weights});
  if (!f.any_batched()) return op.call(targets, sources, weights, kernel, sigma, wavenumber);
  const FoldedSums folded(f, targets, sources, weights);
  auto [sums, moments] = op.call(folded.targets, folded.sources, folded.weights, kernel, sigma, wavenumber);
  return {folded.unfold(f, sums), folded.unfold(f, moments)};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("particle_sum", &particle_sum_batched);
  m.impl("_particle_sum_moments", &particle_sum_moments_batched);
}

}  // namespace pointops
