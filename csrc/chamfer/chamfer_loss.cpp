// The Chamfer loss without normals (pointops.chamfer_distance's common path) as one op with one
// autograd node: the masks and reductions that chamfer_loss.py composed from ~6 torch ops (each a
// Python call, an autograd node and a launch) run here, below autograd, and the backward writes
// the per-point gradients directly. Semantics are chamfer_distance's (pointops/chamfer_loss.py):
//   term[b, i] = w[b] f(d[b, i]), d the distance to the nearest point of the other cloud, 0 for
//   padding and for a point whose partner cloud is empty; f = identity, or sqrt (squared = false);
//   per cloud: "sum" or "mean" over its valid points (an empty mean is 0); the two directions added;
//   batch: "sum", "mean" (divided by B, or by the weights' sum: 1 when it is 0) or none ((B,)).
// "max" (Hausdorff), normals and point_reduction=None stay in Python.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <vector>

#include "chamfer/chamfer.h"
#include "chamfer/chamfer_loss.h"
#include "chamfer/chamfer_ops.h"
#include "common/autograd_node.h"
#include "common/transforms.h"
#include "common/vmap.h"

namespace pointops {

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_op(const at::Tensor& grad_dist, const at::Tensor& x,
                                                                const at::Tensor& y, const at::Tensor& idx,
                                                                int64_t norm);

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// Everything the forward computes and the backward needs.
struct Pieces {
  at::Tensor loss, dist1, dist2, idx1, idx2;  // dist*: the kernel's distances (+inf: empty partner)
};

// t in dtype; t itself when it has it already (never the same tensor as a new result: an op below
// autograd must not return one of its inputs, and Tensor::to would).
at::Tensor as_type(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t.view(t.sizes()) : t.to(dtype);
}

const at::Tensor& defined_or_empty(const OptionalTensor& t) {
  static const at::Tensor undefined;
  return t.has_value() ? *t : undefined;
}

// One direction's per-cloud value (B,): its terms d * w summed, over the valid count for "mean"
// (an empty mean is 0), in the order chamfer_loss.py's torch ops used.
at::Tensor direction_value(const at::Tensor& d, const at::Tensor& lengths, bool mean, const at::Tensor& w) {
  const at::Tensor terms = w.defined() ? d * as_type(w.view({-1, 1}), d.scalar_type()) : d;
  if (mean && lengths.defined()) return terms.sum(1) / as_type(lengths.clamp_min(1), d.scalar_type());
  if (mean && d.size(1) > 0) return terms.mean(1);
  return terms.sum(1);
}

// d value / d terms of one direction, (B, 1) or (1, 1): the weight over the count for "mean";
// undefined for 1.
at::Tensor direction_scale(const at::Tensor& d, const at::Tensor& lengths, bool mean, const at::Tensor& w) {
  at::Tensor scale;
  if (mean && lengths.defined()) {
    scale = at::reciprocal(as_type(lengths.clamp_min(1), d.scalar_type())).view({-1, 1});
  } else if (mean && d.size(1) > 1) {
    scale = at::full({1, 1}, 1.0 / static_cast<double>(d.size(1)), d.options());
  }
  if (w.defined()) {
    const at::Tensor wc = as_type(w.view({-1, 1}), d.scalar_type());
    scale = scale.defined() ? scale * wc : wc;
  }
  return scale;
}

at::Tensor batch_reduce(const at::Tensor& per_cloud, BatchReduction br, const at::Tensor& w) {
  if (br == BatchReduction::None) return per_cloud;
  if (br == BatchReduction::Sum || per_cloud.size(0) == 0) return per_cloud.sum();  // an empty mean is 0
  if (!w.defined()) return per_cloud.mean();
  const at::Tensor weight_sum = as_type(w.sum(), per_cloud.scalar_type());
  // all-zero weights: every term is already 0; dividing by 1 keeps the zero
  return per_cloud.sum() / at::where(weight_sum > 0, weight_sum, at::ones_like(weight_sum));
}

// sqrt(d) for d >= 0 whose derivative at 0 is taken as 1 instead of infinite (the point's
// 2 (x - y) is 0 there anyway): no NaN gradient for a point sitting on its neighbour.
at::Tensor sqrt_zero_grad_at_zero(const at::Tensor& d) {
  const at::Tensor positive = d > 0;
  return at::where(positive, at::where(positive, d, at::ones_like(d)).sqrt(), d);
}

// One direction's distances as the loss sees them: 0 where the partner cloud is empty (the kernel
// reports +inf there), sqrt'ed when not squared.
at::Tensor loss_distances(const at::Tensor& dist, const OptionalTensor& partner_lengths, int64_t partner_size,
                          bool squared) {
  at::Tensor d = dist;
  if (partner_lengths.has_value() && partner_lengths->defined()) {
    d = d.masked_fill((*partner_lengths == 0).view({-1, 1}), 0.0);
  } else if (partner_size == 0) {
    d = at::zeros_like(d);
  }
  return squared ? d : sqrt_zero_grad_at_zero(d);
}

// ---- the CPU path: the same arithmetic as plain loops (a torch reduction's setup costs
// microseconds, several times a small cloud's whole search). Sums in float64, rounded once.
// A tensor the fused ops (_chamfer_distance_loss, _chamfer_distance_backward) can take: a CPU or
// CUDA tensor, real or fake (their fake kernels trace under torch.compile), but not a functorch
// wrapper (they have no batching rule; the torch-op composition below has).
bool fusable(const at::Tensor& t) {
  static const c10::DispatchKeySet transformed({c10::DispatchKey::FuncTorchBatched,
                                                c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Batched,
                                                c10::DispatchKey::BatchedNestedTensor});
  return (t.is_cpu() || t.is_cuda()) && !t.key_set().has_any(transformed);
}

c10::string_view point_reduction_name(bool mean) { return mean ? "mean" : "sum"; }

c10::optional<c10::string_view> batch_reduction_name(BatchReduction br) {
  if (br == BatchReduction::None) return c10::nullopt;
  return c10::string_view(br == BatchReduction::Sum ? "sum" : "mean");
}

OptionalTensor optional_of(const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : OptionalTensor(); }

std::vector<double> to_doubles(const at::Tensor& t) {
  if (!t.defined()) return {};
  const at::Tensor d = as_type(t.detach(), at::kDouble).contiguous();
  return std::vector<double>(d.const_data_ptr<double>(), d.const_data_ptr<double>() + d.numel());
}

std::vector<int64_t> to_longs(const OptionalTensor& t) {
  if (!t.has_value() || !t->defined()) return {};
  const at::Tensor l = as_type(*t, at::kLong).contiguous();
  return std::vector<int64_t>(l.const_data_ptr<int64_t>(), l.const_data_ptr<int64_t>() + l.numel());
}

// The per-cloud numbers of the CPU loops: the weights, and both clouds' lengths, which each
// direction's DirectionFactors (chamfer_loss.h, shared with the CUDA kernels) reads by pointer.
struct CpuFactors {
  std::vector<double> weight;                 // w[b], or empty for 1
  std::vector<int64_t> x_lengths, y_lengths;  // empty: every cloud full

  double weight_of(int64_t b) const { return weight.empty() ? 1.0 : weight[b]; }
  // The direction whose queries are x (from_x) or y; n its query count, partner_n the other's.
  DirectionFactors direction(bool from_x, int64_t n, int64_t partner_n, bool mean) const {
    const std::vector<int64_t>& own = from_x ? x_lengths : y_lengths;
    const std::vector<int64_t>& partner = from_x ? y_lengths : x_lengths;
    return DirectionFactors{own.empty() ? nullptr : own.data(), partner.empty() ? nullptr : partner.data(), n,
                            partner_n, mean};
  }
};

// Adds one direction's per-cloud values to v.
void add_direction_cpu(const at::Tensor& dist, const DirectionFactors& f, const CpuFactors& c, bool squared,
                       std::vector<double>& v) {
  const int64_t B = dist.size(0), n = dist.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dist.scalar_type(), "chamfer_distance_cpu", [&] {
    const scalar_t* d = dist.const_data_ptr<scalar_t>();  // the kernel's output: contiguous
    for (int64_t b = 0; b < B; ++b) {
      if (f.partner_empty(b)) continue;  // PyTorch3D: such a direction contributes 0
      double sum = 0;  // padding holds 0
      for (int64_t i = 0; i < n; ++i) {
        const double di = static_cast<double>(d[b * n + i]);
        sum += squared ? di : std::sqrt(di);
      }
      v[b] += sum * (c.weight_of(b) * f.inverse_count(b));
    }
  });
}

double batch_divisor(const std::vector<double>& weight, BatchReduction br, int64_t B) {
  if (br != BatchReduction::Mean || B == 0) return 1.0;  // an empty mean is the empty sum, 0
  if (weight.empty()) return static_cast<double>(B);
  double total = 0;
  for (double w : weight) total += w;
  return total > 0 ? total : 1.0;  // all-zero weights: every term is 0 already
}

// _chamfer_distance_loss on the CPU: the fused reduction as plain loops.
at::Tensor chamfer_distance_loss_cpu(const at::Tensor& dist1, const OptionalTensor& dist2,
                                     const OptionalTensor& x_lengths, const OptionalTensor& y_lengths,
                                     const OptionalTensor& weights, int64_t num_y, c10::string_view point_reduction,
                                     c10::optional<c10::string_view> batch_reduction, bool squared) {
  const bool mean = parse_point_mean(point_reduction);
  const BatchReduction br = parse_batch_reduction(batch_reduction);
  check_chamfer_distance_loss_shapes(dist1, dist2, num_y);
  const int64_t B = dist1.size(0);
  const CpuFactors c{to_doubles(defined_or_empty(weights)), to_longs(x_lengths), to_longs(y_lengths)};
  std::vector<double> v(B, 0.0);
  add_direction_cpu(dist1.contiguous(), c.direction(true, dist1.size(1), num_y, mean), c, squared, v);
  if (dist2.has_value() && dist2->defined()) {
    add_direction_cpu(dist2->contiguous(), c.direction(false, num_y, dist1.size(1), mean), c, squared, v);
  }
  if (br != BatchReduction::None) {
    double total = 0;
    for (double value : v) total += value;
    v.assign(1, total / batch_divisor(c.weight, br, B));
  }
  at::Tensor out = br == BatchReduction::None ? at::empty({B}, dist1.options()) : at::empty({}, dist1.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dist1.scalar_type(), "chamfer_distance_cpu", [&] {
    scalar_t* o = out.data_ptr<scalar_t>();
    for (size_t b = 0; b < v.size(); ++b) o[b] = static_cast<scalar_t>(v[b]);
  });
  return out;
}

// The loss's gradient as doubles: (B,) values without a batch reduction, else one.
std::vector<double> grad_values(const at::Tensor& g) {
  std::vector<double> values(g.numel());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.scalar_type(), "chamfer_distance_backward_cpu", [&] {
    const at::Tensor gc = g.contiguous();
    const scalar_t* p = gc.const_data_ptr<scalar_t>();
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(p[i]);
  });
  return values;
}

// One direction's gradient, as the two ops it replaces (the distances' gradient rounded to the
// points' dtype, then _nearest_neighbor_backward) computed it, without their allocations and
// dispatches (a small call's cost is its host time). `own[q]` receives query q's term
// g_q d'(q - r) for its neighbour r; `gathered[r]` accumulates minus the terms of the queries
// matched to r, in increasing query order: the backward op's order, so the sums are bit for bit
// the same. Padding and points of an empty partner have index -1 and contribute nothing.
template <Metric metric, typename scalar_t>
void add_direction_grads_cpu(const std::vector<double>& gv, const at::Tensor& dist, const at::Tensor& idx,
                             const at::Tensor& queries, const at::Tensor& refs, const DirectionFactors& f,
                             const CpuFactors& c, BatchReduction br, bool squared,
                             at::opmath_type<scalar_t>* own, at::opmath_type<scalar_t>* gathered) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t B = dist.size(0), n = dist.size(1), m = refs.size(1), dim = queries.size(2);
  const double g_all = br == BatchReduction::None ? 0.0 : gv[0] / batch_divisor(c.weight, br, B);
  const scalar_t* d = dist.const_data_ptr<scalar_t>();
  const int64_t* nn = idx.const_data_ptr<int64_t>();
  const scalar_t* q_pts = queries.const_data_ptr<scalar_t>();
  const scalar_t* r_pts = refs.const_data_ptr<scalar_t>();
  for (int64_t b = 0; b < B; ++b) {
    const double gb = (br == BatchReduction::None ? gv[b] : g_all) * (c.weight_of(b) * f.inverse_count(b));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t q = b * n + i, j = nn[q];
      // a hand-made index outside [-1, m) would read past the reference cloud
      TORCH_CHECK(j >= -1 && j < m, "_chamfer_distance_backward: idx must hold indices in [-1, ", m, "), got ", j);
      if (j < 0) continue;
      double gi = gb;
      if (!squared) {  // d sqrt(d) / dd = 1 / (2 sqrt(d)) where d > 0; 1 at d = 0 (its 2 (x - y) is 0)
        const double di = static_cast<double>(d[q]);
        gi = di > 0 ? gb * 0.5 / std::sqrt(di) : gb;
      }
      const acc_t g = static_cast<acc_t>(static_cast<scalar_t>(gi));
      const int64_t r = b * m + j;
      for (int64_t k = 0; k < dim; ++k) {
        const acc_t term = g * distance_derivative<metric>(static_cast<acc_t>(q_pts[q * dim + k]) -
                                                           static_cast<acc_t>(r_pts[r * dim + k]));
        own[q * dim + k] = term;
        gathered[r * dim + k] -= term;
      }
    }
  }
}

// _chamfer_distance_backward on the CPU: both directions' terms in opmath buffers, then each
// point's gradient as the sum of its own term and its gathered terms, each rounded first (the
// add of two backward-op results it replaces).
std::tuple<at::Tensor, at::Tensor> chamfer_distance_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x_in, const at::Tensor& y_in, const at::Tensor& dist1,
    const at::Tensor& idx1, const OptionalTensor& dist2, const OptionalTensor& idx2, const OptionalTensor& x_lengths,
    const OptionalTensor& y_lengths, const OptionalTensor& weights, c10::string_view point_reduction,
    c10::optional<c10::string_view> batch_reduction, int64_t norm, bool squared) {
  const bool mean = parse_point_mean(point_reduction);
  const BatchReduction br = parse_batch_reduction(batch_reduction);
  const Metric metric = metric_from_norm(norm);
  const bool single = !(dist2.has_value() && dist2->defined());
  check_chamfer_distance_backward_shapes(grad, x_in, y_in, dist1, idx1, dist2, idx2, br);
  const CpuFactors c{to_doubles(defined_or_empty(weights)), to_longs(x_lengths), to_longs(y_lengths)};
  const std::vector<double> g = grad_values(grad);
  const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();
  const int64_t N = x.size(1), M = y.size(1);
  at::Tensor grad_x = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor grad_y = at::empty_like(y, at::MemoryFormat::Contiguous);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "chamfer_distance_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    // own_x / gathered_x, then own_y / gathered_y
    std::vector<acc_t> acc(2 * (x.numel() + y.numel()), acc_t(0));
    acc_t *own_x = acc.data(), *gathered_x = own_x + x.numel();
    acc_t *own_y = gathered_x + x.numel(), *gathered_y = own_y + y.numel();
    dispatch_metric(metric, [&](auto metric_tag) {
      constexpr Metric kMetric = decltype(metric_tag)::value;
      add_direction_grads_cpu<kMetric, scalar_t>(g, dist1.contiguous(), idx1.contiguous(), x, y,
                                                 c.direction(true, N, M, mean), c, br, squared, own_x, gathered_y);
      if (!single) {
        add_direction_grads_cpu<kMetric, scalar_t>(g, dist2->contiguous(), idx2->contiguous(), y, x,
                                                   c.direction(false, M, N, mean), c, br, squared, own_y, gathered_x);
      }
    });
    // Each point: its own term plus its gathered terms, each rounded first. With one direction x
    // has only its own terms and y only gathered ones, taken as they are (no add, as before).
    auto finish = [&](scalar_t* out, const acc_t* own, const acc_t* gathered, int64_t count) {
      for (int64_t e = 0; e < count; ++e) {
        const scalar_t a = static_cast<scalar_t>(own[e]), b = static_cast<scalar_t>(gathered[e]);
        out[e] = static_cast<scalar_t>(static_cast<acc_t>(a) + static_cast<acc_t>(b));
      }
    };
    auto round = [](scalar_t* out, const acc_t* terms, int64_t count) {
      for (int64_t e = 0; e < count; ++e) out[e] = static_cast<scalar_t>(terms[e]);
    };
    if (single) {
      round(grad_x.mutable_data_ptr<scalar_t>(), own_x, x.numel());
      round(grad_y.mutable_data_ptr<scalar_t>(), gathered_y, y.numel());
    } else {
      finish(grad_x.mutable_data_ptr<scalar_t>(), own_x, gathered_x, x.numel());
      finish(grad_y.mutable_data_ptr<scalar_t>(), own_y, gathered_y, y.numel());
    }
  });
  return {grad_x, grad_y};
}

// differentiable: the loss is built from torch ops on the search ops' (differentiable) distances,
// never the fused reduction op, which has no derivatives (forward mode, torch.func, vmap).
Pieces forward_pieces(const at::Tensor& x, const at::Tensor& y, const OptionalTensor& x_lengths,
                      const OptionalTensor& y_lengths, const OptionalTensor& weights, bool point_mean,
                      BatchReduction br, int64_t norm, bool single, bool squared, c10::string_view algorithm,
                      bool differentiable = false) {
  Pieces p;
  const at::Tensor& w = defined_or_empty(weights);
  if (single) {
    std::tie(p.dist1, p.idx1) = nearest_neighbor_handle().call(x, y, x_lengths, y_lengths, norm, algorithm);
  } else {
    std::tie(p.dist1, p.dist2, p.idx1, p.idx2) = chamfer_handle().call(x, y, x_lengths, y_lengths, norm, algorithm);
  }
  if (!differentiable && fusable(x) && fusable(p.dist1)) {  // one op: loops on the CPU, one launch on CUDA
    static auto loss = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("pointops::_chamfer_distance_loss", "")
                           .typed<at::Tensor(const at::Tensor&, const OptionalTensor&, const OptionalTensor&,
                                             const OptionalTensor&, const OptionalTensor&, int64_t, c10::string_view,
                                             c10::optional<c10::string_view>, bool)>();
    p.loss = loss.call(p.dist1, single ? OptionalTensor() : OptionalTensor(p.dist2), x_lengths, y_lengths, weights,
                       y.size(1), point_reduction_name(point_mean), batch_reduction_name(br), squared);
    return p;
  }
  at::Tensor per_cloud =
      direction_value(loss_distances(p.dist1, y_lengths, y.size(1), squared), defined_or_empty(x_lengths), point_mean, w);
  if (!single) {
    per_cloud = per_cloud + direction_value(loss_distances(p.dist2, x_lengths, x.size(1), squared),
                                            defined_or_empty(y_lengths), point_mean, w);
  }
  p.loss = batch_reduce(per_cloud, br, w);
  return p;
}

// ---- the backward with torch ops (CUDA, and any device when the backward itself is differentiated)
// The per-cloud gradient: (B, 1) without a batch reduction, else (1, 1).
at::Tensor cloud_grad(const at::Tensor& grad, BatchReduction br, const at::Tensor& w, int64_t B) {
  if (br == BatchReduction::None) return grad.view({B, 1});
  at::Tensor g = grad;
  if (br == BatchReduction::Mean && B > 0) {
    if (w.defined()) {
      const at::Tensor weight_sum = as_type(w.sum(), g.scalar_type());
      g = g / at::where(weight_sum > 0, weight_sum, at::ones_like(weight_sum));
    } else {
      g = g / static_cast<double>(B);
    }
  }
  return g.view({1, 1});
}

// One direction's gradient with respect to the kernel's distances. With sqrt the factor depends on
// the distance, which is recomputed from the points (indices fixed) when a graph is being built, so
// that second derivatives see it; sqrt's derivative is taken as 1 at 0 (as chamfer_loss.py's
// _sqrt_zero_grad_at_zero: the point's 2 (x - y) is 0 there anyway).
at::Tensor torch_direction_grad(const at::Tensor& g, const at::Tensor& x, const at::Tensor& y, const at::Tensor& idx,
                                const at::Tensor& dist, const at::Tensor& lengths, const at::Tensor& partner_lengths,
                                const at::Tensor& w, bool mean, bool squared) {
  const at::Tensor scale = direction_scale(dist, lengths, mean, w);
  at::Tensor grad = (scale.defined() ? g * scale : g).expand(dist.sizes());
  if (squared) return grad;
  at::Tensor d;
  if (at::GradMode::is_enabled() && y.size(1) > 0) {  // squared=False is norm 2: |x - y[idx]|^2
    const at::Tensor gather = idx.clamp_min(0).unsqueeze(-1).expand({x.size(0), idx.size(1), x.size(2)});
    d = at::where(idx >= 0, (x - y.gather(1, gather)).pow(2).sum(-1), at::zeros({}, x.options()));
  } else {
    d = loss_distances(dist, partner_lengths, y.size(1), true);
  }
  const at::Tensor positive = d > 0;
  const at::Tensor root = at::where(positive, at::where(positive, d, at::ones_like(d)).sqrt(), d);
  return grad * at::where(positive, 0.5 / at::where(positive, root, at::ones_like(root)), at::ones_like(root));
}

// The loss's backward, a hand-made node (common/autograd_node.h): in plain autograd and under the
// torch.func transforms alike. Without a graph of the backward wanted it is one op (loops on the
// CPU, one launch on CUDA); CUDA under deterministic algorithms, a backward that is itself
// differentiated (create_graph, and every torch.func transform) and vmapped gradients take the
// torch ops and the backward op, which are differentiable and batch.
struct ChamferDistanceBackward : torch::autograd::Node {
  ChamferDistanceBackward(const at::Tensor& x, const at::Tensor& y, const Pieces& p, const OptionalTensor& x_lengths,
                          const OptionalTensor& y_lengths, const OptionalTensor& weights, BatchReduction br,
                          int64_t norm, bool mean, bool single, bool squared)
      : x_(x, false), y_(y, false), dist1_(p.dist1, false), dist2_(p.dist2, false), idx1_(p.idx1, false),
        idx2_(p.idx2, false), x_lengths_(defined_or_empty(x_lengths), false),
        y_lengths_(defined_or_empty(y_lengths), false), weights_(defined_or_empty(weights), false), br_(br),
        norm_(norm), mean_(mean), single_(single), squared_(squared) {}

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor x = x_.unpack(), y = y_.unpack(), dist1 = dist1_.unpack(), dist2 = dist2_.unpack();
    const at::Tensor idx1 = idx1_.unpack(), idx2 = idx2_.unpack(), xl = x_lengths_.unpack(), yl = y_lengths_.unpack();
    const at::Tensor w = weights_.unpack();
    if (!at::GradMode::is_enabled() && fusable(x) && fusable(dist1) && fusable(grads[0]) &&
        !(x.is_cuda() && at::globalContext().deterministicAlgorithms())) {
      static auto fused = c10::Dispatcher::singleton()
                              .findSchemaOrThrow("pointops::_chamfer_distance_backward", "")
                              .typed<std::tuple<at::Tensor, at::Tensor>(
                                  const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&, const OptionalTensor&, const OptionalTensor&,
                                  const OptionalTensor&, const OptionalTensor&, const OptionalTensor&,
                                  c10::string_view, c10::optional<c10::string_view>, int64_t, bool)>();
      auto [grad_x, grad_y] =
          fused.call(grads[0], x, y, dist1, idx1, single_ ? OptionalTensor() : OptionalTensor(dist2),
                     single_ ? OptionalTensor() : OptionalTensor(idx2), optional_of(xl), optional_of(yl),
                     optional_of(w), point_reduction_name(mean_), batch_reduction_name(br_), norm_, squared_);
      return {grad_x, grad_y};
    }
    const at::Tensor g = cloud_grad(grads[0], br_, w, x.size(0));
    const at::Tensor grad_d1 = torch_direction_grad(g, x, y, idx1, dist1, xl, yl, w, mean_, squared_);
    auto [grad_x, grad_y] = nearest_neighbor_backward_op(grad_d1, x, y, idx1, norm_);
    if (!single_) {
      const at::Tensor grad_d2 = torch_direction_grad(g, y, x, idx2, dist2, yl, xl, w, mean_, squared_);
      auto [grad_y2, grad_x2] = nearest_neighbor_backward_op(grad_d2, y, x, idx2, norm_);
      // fresh tensors of the backward op (autograd records this when building a graph)
      grad_x = add_gradients(grad_x, grad_x2);
      grad_y = add_gradients(grad_y, grad_y2);
    }
    return {grad_x, grad_y};
  }

  std::string name() const override { return "ChamferDistanceBackward"; }

  void release_variables() override {
    for (SavedVariable* v : {&x_, &y_, &dist1_, &dist2_, &idx1_, &idx2_, &x_lengths_, &y_lengths_, &weights_}) {
      v->reset_data();
    }
  }

  SavedVariable x_, y_, dist1_, dist2_, idx1_, idx2_, x_lengths_, y_lengths_, weights_;
  BatchReduction br_;
  int64_t norm_;
  bool mean_, single_, squared_;
};

// The loss's value: below autograd the composite forward (every backend, fake tensors included);
// differentiable, torch ops over the search ops called with autograd, whose distances then carry
// tangents (forward mode).
template <bool differentiable>
at::Tensor chamfer_distance_value(const at::Tensor& x, const at::Tensor& y, const OptionalTensor& x_lengths,
                                  const OptionalTensor& y_lengths, const OptionalTensor& weights,
                                  c10::string_view point_reduction, c10::optional<c10::string_view> batch_reduction,
                                  int64_t norm, bool single, bool squared, c10::string_view algorithm) {
  return forward_pieces(x, y, x_lengths, y_lengths, weights, parse_point_mean(point_reduction),
                        parse_batch_reduction(batch_reduction), norm, single, squared, algorithm, differentiable)
      .loss;
}

at::Tensor chamfer_distance_autograd(const at::Tensor& x, const at::Tensor& y,
                                     const OptionalTensor& x_lengths, const OptionalTensor& y_lengths,
                                     const OptionalTensor& weights, c10::string_view point_reduction,
                                     c10::optional<c10::string_view> batch_reduction, int64_t norm, bool single,
                                     bool squared, c10::string_view algorithm) {
  const at::Tensor& w = defined_or_empty(weights);
  // Forward mode: the composite with the search ops called through autograd, which give their
  // distances tangents (common/transforms.h).
  if (any_has_forward_grad({&x, &y, &w})) {
    return chamfer_distance_value<true>(x, y, x_lengths, y_lengths, weights, point_reduction, batch_reduction, norm,
                                        single, squared, algorithm);
  }
  TORCH_CHECK(!(w.defined() && w.requires_grad() && at::GradMode::is_enabled()),
              "_chamfer_distance: weights that require grad take chamfer_distance's general path");
  at::AutoDispatchBelowADInplaceOrView guard;
  const BatchReduction br = parse_batch_reduction(batch_reduction);
  const bool mean = parse_point_mean(point_reduction);
  Pieces p = forward_pieces(x, y, x_lengths, y_lengths, weights, mean, br, norm, single, squared, algorithm);
  if (needs_backward({&x, &y})) {
    record_backward(make_node<ChamferDistanceBackward>(x, y, p, x_lengths, y_lengths, weights, br, norm, mean, single,
                                                       squared),
                    {&p.loss}, x, y);
  }
  return p.loss;
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CompositeExplicitAutograd, m) {
  m.impl("_chamfer_distance", &chamfer_distance_value<false>);
}

TORCH_LIBRARY_IMPL(pointops, CPU, m) {
  m.impl("_chamfer_distance_loss", &chamfer_distance_loss_cpu);
  m.impl("_chamfer_distance_backward", &chamfer_distance_backward_cpu);
}

TORCH_LIBRARY_IMPL(pointops, Autograd, m) { m.impl("_chamfer_distance", &chamfer_distance_autograd); }

// vmap (common/vmap.h): the samples folded into the clouds' batch, one call of the loss without a
// batch reduction, then each sample's reduction over its own clouds.
at::Tensor chamfer_distance_batched(const at::Tensor& x, const at::Tensor& y, const OptionalTensor& x_lengths,
                                    const OptionalTensor& y_lengths, const OptionalTensor& weights,
                                    c10::string_view point_reduction, c10::optional<c10::string_view> batch_reduction,
                                    int64_t norm, bool single, bool squared, c10::string_view algorithm) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pointops::_chamfer_distance", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const OptionalTensor&, const OptionalTensor&,
                            const OptionalTensor&, c10::string_view, c10::optional<c10::string_view>, int64_t, bool,
                            bool, c10::string_view)>();
  const BatchFold f({&x, &y, &value_or_undefined(x_lengths), &value_or_undefined(y_lengths),
                     &value_or_undefined(weights)});
  if (!f.any_batched()) {
    return op.call(x, y, x_lengths, y_lengths, weights, point_reduction, batch_reduction, norm, single, squared,
                   algorithm);
  }
  const int64_t B = f.require_clouds(x, y, "x", "y");
  const at::Tensor per_cloud = op.call(f.fold(x), f.fold(y), f.fold(x_lengths), f.fold(y_lengths), f.fold(weights),
                                       point_reduction, c10::nullopt, norm, single, squared, algorithm);
  const BatchReduction br = parse_batch_reduction(batch_reduction);
  if (br == BatchReduction::None) return f.unfold(per_cloud, B);
  at::Tensor per_sample = per_cloud.reshape({f.size(), B}).sum(1);
  if (br == BatchReduction::Mean && B > 0) {  // an empty mean is the empty sum, 0
    if (weights.has_value() && weights->defined()) {
      const at::Tensor weight_sum = as_type(f.front(*weights).sum(1), per_sample.scalar_type());
      per_sample = per_sample / at::where(weight_sum > 0, weight_sum, at::ones_like(weight_sum));
    } else {
      per_sample = per_sample / static_cast<double>(B);
    }
  }
  return f.batched_front(per_sample);
}

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) { m.impl("_chamfer_distance", &chamfer_distance_batched); }

}  // namespace pointops
