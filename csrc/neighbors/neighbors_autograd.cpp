// Autograd for knn_points and ball_query, in C++ (a Python autograd kernel is entered on every call,
// even under no_grad, and costs more host time than a small search). Both return distances
// d(p1[i], p2[idx[i, k]]) with the indices fixed, so their gradient is the nearest-neighbour
// backward over (B, N, K) indices, which is itself differentiable (any order of derivative).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "chamfer/chamfer.h"

namespace pointops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = c10::optional<at::Tensor>;

variable_list save_and_return(AutogradContext* ctx, const at::Tensor& p1, const at::Tensor& p2, at::Tensor dists,
                              at::Tensor idx, int64_t norm) {
  ctx->save_for_backward({p1, p2, idx});
  ctx->saved_data["norm"] = norm;
  ctx->mark_non_differentiable({idx});
  return {dists, idx};
}

// grad_p1, grad_p2 and no gradient for the other arguments (lengths, K, norm or radius, algorithm).
variable_list distances_backward(AutogradContext* ctx, const variable_list& grads) {
  const auto saved = ctx->get_saved_variables();
  auto [grad_p1, grad_p2] =
      nearest_neighbor_backward_op(grads[0], saved[0], saved[1], saved[2], ctx->saved_data["norm"].toInt());
  return {grad_p1, grad_p2, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

class KnnPointsFunction : public torch::autograd::Function<KnnPointsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& p1, const at::Tensor& p2,
                               const OptionalTensor& lengths1, const OptionalTensor& lengths2, int64_t K,
                               int64_t norm, c10::string_view algorithm) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pointops::knn_points", "")
                         .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                   const OptionalTensor&, const OptionalTensor&,
                                                                   int64_t, int64_t, c10::string_view)>();
    auto [dists, idx] = op.call(p1, p2, lengths1, lengths2, K, norm, algorithm);
    return save_and_return(ctx, p1, p2, dists, idx, norm);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) { return distances_backward(ctx, grads); }
};

class BallQueryFunction : public torch::autograd::Function<BallQueryFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& p1, const at::Tensor& p2,
                               const OptionalTensor& lengths1, const OptionalTensor& lengths2, int64_t K,
                               double radius, c10::string_view algorithm) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("pointops::ball_query", "")
                         .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                   const OptionalTensor&, const OptionalTensor&,
                                                                   int64_t, double, c10::string_view)>();
    auto [dists, idx] = op.call(p1, p2, lengths1, lengths2, K, radius, algorithm);
    return save_and_return(ctx, p1, p2, dists, idx, /*norm=*/2);  // squared Euclidean distances
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) { return distances_backward(ctx, grads); }
};

std::tuple<at::Tensor, at::Tensor> knn_points_autograd(const at::Tensor& p1, const at::Tensor& p2,
                                                       const OptionalTensor& lengths1, const OptionalTensor& lengths2,
                                                       int64_t K, int64_t norm, c10::string_view algorithm) {
  auto out = KnnPointsFunction::apply(p1, p2, lengths1, lengths2, K, norm, algorithm);
  return {out[0], out[1]};
}

std::tuple<at::Tensor, at::Tensor> ball_query_autograd(const at::Tensor& p1, const at::Tensor& p2,
                                                       const OptionalTensor& lengths1, const OptionalTensor& lengths2,
                                                       int64_t K, double radius, c10::string_view algorithm) {
  auto out = BallQueryFunction::apply(p1, p2, lengths1, lengths2, K, radius, algorithm);
  return {out[0], out[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, Autograd, m) {
  m.impl("knn_points", &knn_points_autograd);
  m.impl("ball_query", &ball_query_autograd);
}

}  // namespace pointops
