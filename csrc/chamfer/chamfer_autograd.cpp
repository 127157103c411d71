// Autograd for the distance ops -- nearest_neighbor, chamfer, and (csrc/neighbors) knn_points and
// ball_query -- and for their backward op, in C++: a Python autograd wrapper costs ~100 us of host
// time per call, more than the whole GPU forward of a typical training batch.
//
// Reverse mode records hand-made nodes (common/autograd_node.h): the kernel runs below autograd and
// DistancesBackward, whose backward is the _nearest_neighbor_backward op, becomes the distances'
// grad_fn. The backward op records a node of its own, so double backward (and any order) works, in
// plain autograd and at every level of the torch.func transforms alike; torch.compile traces them
// through the fake kernels. Forward-mode tangents take the path of common/transforms.h: the search
// on detached inputs, the derivatives from the gathered distances (common/gathered_distances.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "chamfer/chamfer.h"
#include "chamfer/chamfer_ops.h"
#include "common/autograd_node.h"
#include "common/gathered_distances.h"
#include "common/transforms.h"
#include "common/vmap.h"

namespace pointops {

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_op(const at::Tensor& grad_dist, const at::Tensor& x,
                                                                const at::Tensor& y, const at::Tensor& idx,
                                                                int64_t norm) {
  return nearest_neighbor_backward_handle().call(grad_dist.contiguous(), x, y, idx, norm);
}

namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// The backward of distances d(q, r[idx]) with the indices fixed, for the one or two directions of a
// call with inputs (x, y): direction 1 has queries x and references y (idx1), direction 2 the other
// way round (idx2, chamfer only). Gradients in, one per distance output; (grad_x, grad_y) out.
struct DistancesBackward : torch::autograd::Node {
  DistancesBackward(const at::Tensor& x, const at::Tensor& y, const at::Tensor& idx1, const at::Tensor& idx2,
                    int64_t norm, const char* name)
      : x_(x, false), y_(y, false), idx1_(idx1, false), idx2_(idx2, false), norm_(norm), name_(name) {}

  variable_list apply(variable_list&& grads) override {
    const at::Tensor x = x_.unpack(), y = y_.unpack();
    at::Tensor grad_x, grad_y;
    if (grads[0].defined()) std::tie(grad_x, grad_y) = nearest_neighbor_backward_op(grads[0], x, y, idx1_.unpack(), norm_);
    if (grads.size() > 1 && grads[1].defined()) {
      auto [grad_y2, grad_x2] = nearest_neighbor_backward_op(grads[1], y, x, idx2_.unpack(), norm_);
      grad_x = grad_x.defined() ? add_gradients(grad_x, grad_x2) : grad_x2;
      grad_y = grad_y.defined() ? add_gradients(grad_y, grad_y2) : grad_y2;
    }
    return {grad_x, grad_y};
  }

  std::string name() const override { return name_; }

  void release_variables() override {
    x_.reset_data();
    y_.reset_data();
    idx1_.reset_data();
    idx2_.reset_data();
  }

  SavedVariable x_, y_, idx1_, idx2_;
  int64_t norm_;
  std::string name_;
};

// The backward op is differentiable too (double backward: gradient penalties, meta-learning).
// With d' the metric's derivative and the indices fixed,
//   grad_x[q] = g[q] d'(x[q] - y[idx q]),   grad_y[r] = -sum_{q : idx q = r} g[q] d'(x[q] - y[r]).
// For upstream gradients (u_x, u_y) and v[q] = u_x[q] - u_y[idx q]:
//   d/dg[q] = sum_k v[q, k] d'(x[q, k] - y[idx q, k]);
//   squared L2 (d' = 2 diff): d/dx = 2 g v and d/dy = -scatter(2 g v), which is this same op
//   applied to (g, u_x, u_y); L1 (d' = sign, d'' = 0 almost everywhere): d/dx = d/dy = 0.
// Everything here goes through differentiable ops, so any order of derivative works.
struct NearestNeighborBackwardBackward : torch::autograd::Node {
  NearestNeighborBackwardBackward(const at::Tensor& grad_dist, const at::Tensor& x, const at::Tensor& y,
                                  const at::Tensor& idx, int64_t norm)
      : grad_dist_(grad_dist, false), x_(x, false), y_(y, false), idx_(idx, false), norm_(norm) {}

  variable_list apply(variable_list&& grads) override {
    const at::Tensor grad_dist = grad_dist_.unpack(), x = x_.unpack(), y = y_.unpack(), idx = idx_.unpack();
    const at::Tensor u_x = grads[0].defined() ? grads[0] : at::zeros_like(x);
    const at::Tensor u_y = grads[1].defined() ? grads[1] : at::zeros_like(y);
    at::Tensor d_grad_dist, d_x, d_y;
    if (y.size(1) == 0 || idx.numel() == 0) {  // nothing was matched: the backward was identically 0
      d_grad_dist = at::zeros_like(grad_dist);
    } else {
      // unmatched: -1, and (as the CUDA backward kernel treats them) indices past y's end; the
      // clamp keeps the gather inside y for both, the mask drops them
      // idx (B, N) or (B, N, K): the gathers work on (B, N * K) pairs, x broadcast over k.
      const int64_t B = x.size(0), D = x.size(2);
      const at::Tensor matched = (idx >= 0) & (idx < y.size(1));
      const at::Tensor gather_index = idx.clamp(0, y.size(1) - 1).reshape({B, -1, 1}).expand({B, -1, D});
      const auto pair_shape = idx.sizes().vec();
      auto point_shape = pair_shape;
      point_shape.push_back(D);
      auto query_shape = x.sizes().vec();
      if (idx.dim() == 3) query_shape.insert(query_shape.begin() + 2, 1);  // (B, N, 1, D)
      const at::Tensor x_pairs = x.reshape(query_shape), u_x_pairs = u_x.reshape(query_shape);
      const at::Tensor v = u_x_pairs - u_y.gather(1, gather_index).view(point_shape);
      const at::Tensor diff = x_pairs - y.gather(1, gather_index).view(point_shape);
      const at::Tensor derivative = norm_ == 2 ? diff * 2 : at::sign(diff);
      d_grad_dist = at::where(matched, (v * derivative).sum(-1), at::zeros_like(grad_dist));
    }
    if (norm_ == 2) {
      std::tie(d_x, d_y) = nearest_neighbor_backward_op(grad_dist, u_x, u_y, idx, norm_);
    } else {
      d_x = at::zeros_like(x);
      d_y = at::zeros_like(y);
    }
    return {d_grad_dist, d_x, d_y};
  }

  std::string name() const override { return "NearestNeighborBackwardBackward"; }

  void release_variables() override {
    grad_dist_.reset_data();
    x_.reset_data();
    y_.reset_data();
    idx_.reset_data();
  }

  SavedVariable grad_dist_, x_, y_, idx_;
  int64_t norm_;
};

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_autograd(c10::DispatchKeySet ks, const at::Tensor& x,
                                                             const at::Tensor& y, const OptionalTensor& x_lengths,
                                                             const OptionalTensor& y_lengths, int64_t norm,
                                                             c10::string_view algorithm) {
  if (any_has_forward_grad({&x, &y})) {  // forward mode: common/transforms.h
    auto [dist, idx] =
        nearest_neighbor_handle().call(detached(x), detached(y), x_lengths, y_lengths, norm, algorithm);
    return {distances_with_derivatives(dist, x, y, idx, norm), idx};
  }
  if (!needs_backward({&x, &y})) {
    return nearest_neighbor_handle().redispatch(below_autograd(ks), x, y, x_lengths, y_lengths, norm, algorithm);
  }
  auto [dist, idx] = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return nearest_neighbor_handle().redispatch(below_autograd(ks), x, y, x_lengths, y_lengths, norm, algorithm);
  }();
  record_distances_backward(x, y, norm, dist, idx);
  return {dist, idx};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> chamfer_autograd(c10::DispatchKeySet ks,
                                                                            const at::Tensor& x, const at::Tensor& y,
                                                                            const OptionalTensor& x_lengths,
                                                                            const OptionalTensor& y_lengths,
                                                                            int64_t norm, c10::string_view algorithm) {
  if (any_has_forward_grad({&x, &y})) {
    auto [dist1, dist2, idx1, idx2] =
        chamfer_handle().call(detached(x), detached(y), x_lengths, y_lengths, norm, algorithm);
    return {distances_with_derivatives(dist1, x, y, idx1, norm), distances_with_derivatives(dist2, y, x, idx2, norm),
            idx1, idx2};
  }
  if (!needs_backward({&x, &y})) {
    return chamfer_handle().redispatch(below_autograd(ks), x, y, x_lengths, y_lengths, norm, algorithm);
  }
  auto [dist1, dist2, idx1, idx2] = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return chamfer_handle().redispatch(below_autograd(ks), x, y, x_lengths, y_lengths, norm, algorithm);
  }();
  record_backward(make_node<DistancesBackward>(x, y, idx1, idx2, norm, "ChamferBackward"), {&dist1, &dist2}, x, y);
  return {dist1, dist2, idx1, idx2};
}

// The backward op's value as ATen ops, for its tangents in forward mode:
// grad_x[q] = sum_k g[q, k] d'(x[q] - y[idx q k]); grad_y[r] = -(the same terms of the pairs matched to r).
std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_formula(const at::Tensor& grad_dist, const at::Tensor& x,
                                                                     const at::Tensor& y, const at::Tensor& idx,
                                                                     int64_t norm) {
  const int64_t B = x.size(0), D = x.size(2), M = y.size(1);
  if (M == 0 || idx.numel() == 0) return {at::zeros_like(x), at::zeros_like(y)};
  auto pair_shape = idx.sizes().vec();
  pair_shape.push_back(D);
  const at::Tensor index = idx.clamp(0, M - 1).reshape({B, -1, 1}).expand({B, -1, D});
  const at::Tensor queries = idx.dim() == 3 ? x.unsqueeze(2) : x;
  const at::Tensor diff = queries - y.gather(1, index).view(pair_shape);
  const at::Tensor derivative = norm == 2 ? diff * 2 : at::sign(diff);
  const at::Tensor matched = ((idx >= 0) & (idx < M)).unsqueeze(-1);
  const at::Tensor terms = at::where(matched, grad_dist.unsqueeze(-1) * derivative, at::zeros({}, x.options()));
  const at::Tensor grad_x = idx.dim() == 3 ? terms.sum(2) : terms;
  const at::Tensor grad_y = at::zeros_like(y).scatter_add(1, index, -terms.reshape({B, -1, D}));
  return {grad_x, grad_y};
}

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_dist,
                                                                      const at::Tensor& x, const at::Tensor& y,
                                                                      const at::Tensor& idx, int64_t norm) {
  if (any_has_forward_grad({&grad_dist, &x, &y})) {
    auto [grad_x, grad_y] =
        nearest_neighbor_backward_handle().call(detached(grad_dist), detached(x), detached(y), idx, norm);
    auto [formula_x, formula_y] = nearest_neighbor_backward_formula(grad_dist, x, y, idx, norm);
    return {with_derivatives_of(grad_x, formula_x), with_derivatives_of(grad_y, formula_y)};
  }
  // A first-order backward (no create_graph) runs with grad mode off: no node for it.
  if (!needs_backward({&grad_dist, &x, &y})) {
    return nearest_neighbor_backward_handle().redispatch(below_autograd(ks), grad_dist, x, y, idx, norm);
  }
  auto [grad_x, grad_y] = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return nearest_neighbor_backward_handle().redispatch(below_autograd(ks), grad_dist, x, y, idx, norm);
  }();
  record_backward(make_node<NearestNeighborBackwardBackward>(grad_dist, x, y, idx, norm), {&grad_x, &grad_y},
                  grad_dist, x, y);
  return {grad_x, grad_y};
}

}  // namespace

void record_distances_backward(const at::Tensor& x, const at::Tensor& y, int64_t norm, at::Tensor& dist,
                               const at::Tensor& idx) {
  record_backward(make_node<DistancesBackward>(x, y, idx, at::Tensor(), norm, "DistancesBackward"), {&dist}, x, y);
}

TORCH_LIBRARY_IMPL(pointops, Autograd, m) {
  m.impl("nearest_neighbor", &nearest_neighbor_autograd);
  m.impl("chamfer", &chamfer_autograd);
  m.impl("_nearest_neighbor_backward", &nearest_neighbor_backward_autograd);
}

// ---- vmap
// vmap batching rules of the nearest-neighbour ops (common/vmap.h): the vmapped dimension is folded
// into the clouds' batch B, one search for every sample. (The loss, _chamfer_distance, decomposes
// into these: csrc/chamfer/chamfer_loss.cpp.)
namespace {

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_batched(const at::Tensor& x, const at::Tensor& y,
                                                            const OptionalTensor& x_lengths,
                                                            const OptionalTensor& y_lengths, int64_t norm,
                                                            c10::string_view algorithm) {
  const BatchFold f({&x, &y, &value_or_undefined(x_lengths), &value_or_undefined(y_lengths)});
  if (!f.any_batched()) {
    return nearest_neighbor_handle().call(x, y, x_lengths, y_lengths, norm, algorithm);
  }
  const int64_t B = f.require_clouds(x, y, "x", "y");
  auto [dist, idx] =
      nearest_neighbor_handle().call(f.fold(x), f.fold(y), f.fold(x_lengths), f.fold(y_lengths), norm, algorithm);
  return {f.unfold(dist, B), f.unfold(idx, B)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> chamfer_batched(const at::Tensor& x, const at::Tensor& y,
                                                                           const OptionalTensor& x_lengths,
                                                                           const OptionalTensor& y_lengths,
                                                                           int64_t norm, c10::string_view algorithm) {
  const BatchFold f({&x, &y, &value_or_undefined(x_lengths), &value_or_undefined(y_lengths)});
  if (!f.any_batched()) {
    return chamfer_handle().call(x, y, x_lengths, y_lengths, norm, algorithm);
  }
  const int64_t B = f.require_clouds(x, y, "x", "y");
  auto [dist1, dist2, idx1, idx2] =
      chamfer_handle().call(f.fold(x), f.fold(y), f.fold(x_lengths), f.fold(y_lengths), norm, algorithm);
  return {f.unfold(dist1, B), f.unfold(dist2, B), f.unfold(idx1, B), f.unfold(idx2, B)};
}

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_batched(const at::Tensor& grad_dist, const at::Tensor& x,
                                                                     const at::Tensor& y, const at::Tensor& idx,
                                                                     int64_t norm) {
  const BatchFold f({&grad_dist, &x, &y, &idx});
  if (!f.any_batched()) {
    return nearest_neighbor_backward_handle().call(grad_dist, x, y, idx, norm);
  }
  const int64_t B = f.require_clouds(x, y, "x", "y");
  auto [grad_x, grad_y] =
      nearest_neighbor_backward_handle().call(f.fold(grad_dist), f.fold(x), f.fold(y), f.fold(idx), norm);
  return {f.unfold(grad_x, B), f.unfold(grad_y, B)};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("nearest_neighbor", &nearest_neighbor_batched);
  m.impl("chamfer", &chamfer_batched);
  m.impl("_nearest_neighbor_backward", &nearest_neighbor_backward_batched);
}

}  // namespace pointops
