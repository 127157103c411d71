// Autograd for knn_points and ball_query, in C++ (a Python autograd kernel is entered on every call,
// even under no_grad, and costs more host time than a small search). Both return distances
// d(p1[i], p2[idx[i, k]]) with the indices fixed, so their reverse mode is the nearest-neighbour
// backward over (B, N, K) indices (record_distances_backward, csrc/chamfer/chamfer_autograd.cpp),
// itself differentiable to any order, and their forward mode the path of common/transforms.h: the
// search on detached inputs, the tangents from the gathered distances.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "chamfer/chamfer.h"
#include "common/autograd_node.h"
#include "common/gathered_distances.h"
#include "common/transforms.h"
#include "common/vmap.h"
#include "neighbors/neighbors_ops.h"

namespace pointops {
namespace {

std::tuple<at::Tensor, at::Tensor> knn_points_autograd(c10::DispatchKeySet ks, const at::Tensor& p1,
                                                       const at::Tensor& p2, const OptionalTensor& lengths1,
                                                       const OptionalTensor& lengths2, int64_t K, int64_t norm,
                                                       c10::string_view algorithm) {
  if (any_has_forward_grad({&p1, &p2})) {
    auto [dists, idx] = knn_points_handle().call(detached(p1), detached(p2), lengths1, lengths2, K, norm, algorithm);
    return {distances_with_derivatives(dists, p1, p2, idx, norm), idx};
  }
  if (!needs_backward({&p1, &p2})) {
    return knn_points_handle().redispatch(below_autograd(ks), p1, p2, lengths1, lengths2, K, norm, algorithm);
  }
  auto [dists, idx] = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return knn_points_handle().redispatch(below_autograd(ks), p1, p2, lengths1, lengths2, K, norm, algorithm);
  }();
  record_distances_backward(p1, p2, norm, dists, idx);
  return {dists, idx};
}

std::tuple<at::Tensor, at::Tensor> ball_query_autograd(c10::DispatchKeySet ks, const at::Tensor& p1,
                                                       const at::Tensor& p2, const OptionalTensor& lengths1,
                                                       const OptionalTensor& lengths2, int64_t K, double radius,
                                                       c10::string_view algorithm) {
  if (any_has_forward_grad({&p1, &p2})) {
    auto [dists, idx] =
        ball_query_handle().call(detached(p1), detached(p2), lengths1, lengths2, K, radius, algorithm);
    return {distances_with_derivatives(dists, p1, p2, idx, /*norm=*/2), idx};
  }
  if (!needs_backward({&p1, &p2})) {
    return ball_query_handle().redispatch(below_autograd(ks), p1, p2, lengths1, lengths2, K, radius, algorithm);
  }
  auto [dists, idx] = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return ball_query_handle().redispatch(below_autograd(ks), p1, p2, lengths1, lengths2, K, radius, algorithm);
  }();
  record_distances_backward(p1, p2, /*norm=*/2, dists, idx);  // squared Euclidean distances
  return {dists, idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, Autograd, m) {
  m.impl("knn_points", &knn_points_autograd);
  m.impl("ball_query", &ball_query_autograd);
}

// ---- vmap
// vmap batching rules of the neighbourhood ops (common/vmap.h): the vmapped dimension is folded into
// the clouds' batch B, one search (or sampling) for every sample.
namespace {

std::tuple<at::Tensor, at::Tensor> knn_points_batched(const at::Tensor& p1, const at::Tensor& p2,
                                                      const OptionalTensor& lengths1, const OptionalTensor& lengths2,
                                                      int64_t K, int64_t norm, c10::string_view algorithm) {
  const BatchFold f({&p1, &p2, &value_or_undefined(lengths1), &value_or_undefined(lengths2)});
  if (!f.any_batched()) return knn_points_handle().call(p1, p2, lengths1, lengths2, K, norm, algorithm);
  const int64_t B = f.require_clouds(p1, p2, "p1", "p2");
  auto [dists, idx] =
      knn_points_handle().call(f.fold(p1), f.fold(p2), f.fold(lengths1), f.fold(lengths2), K, norm, algorithm);
  return {f.unfold(dists, B), f.unfold(idx, B)};
}

std::tuple<at::Tensor, at::Tensor> ball_query_batched(const at::Tensor& p1, const at::Tensor& p2,
                                                      const OptionalTensor& lengths1, const OptionalTensor& lengths2,
                                                      int64_t K, double radius, c10::string_view algorithm) {
  const BatchFold f({&p1, &p2, &value_or_undefined(lengths1), &value_or_undefined(lengths2)});
  if (!f.any_batched()) return ball_query_handle().call(p1, p2, lengths1, lengths2, K, radius, algorithm);
  const int64_t B = f.require_clouds(p1, p2, "p1", "p2");
  auto [dists, idx] =
      ball_query_handle().call(f.fold(p1), f.fold(p2), f.fold(lengths1), f.fold(lengths2), K, radius, algorithm);
  return {f.unfold(dists, B), f.unfold(idx, B)};
}

at::Tensor sample_farthest_points_batched(const at::Tensor& points, const OptionalTensor& lengths,
                                          const OptionalTensor& K, int64_t max_K, const OptionalTensor& start_idx) {
  const BatchFold f({&points, &value_or_undefined(lengths), &value_or_undefined(K), &value_or_undefined(start_idx)});
  if (!f.any_batched()) return sample_farthest_points_handle().call(points, lengths, K, max_K, start_idx);
  f.require_dim(points, 3, "points", "(B, N, D)");
  const int64_t B = f.front(points).size(1);
  return f.unfold(
      sample_farthest_points_handle().call(f.fold(points), f.fold(lengths), f.fold(K), max_K, f.fold(start_idx)), B);
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("knn_points", &knn_points_batched);
  m.impl("ball_query", &ball_query_batched);
  m.impl("sample_farthest_points", &sample_farthest_points_batched);
}

}  // namespace pointops
