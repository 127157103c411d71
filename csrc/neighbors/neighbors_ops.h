// The neighbourhood ops as typed dispatcher handles (looked up once), for the autograd kernels and
// the vmap batching rules.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

namespace pointops {

using OptionalTensor = c10::optional<at::Tensor>;

using KnnPointsSchema = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                                           const OptionalTensor&, int64_t, int64_t, c10::string_view);
using BallQuerySchema = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                                           const OptionalTensor&, int64_t, double, c10::string_view);
using SampleFarthestPointsSchema = at::Tensor(const at::Tensor&, const OptionalTensor&, const OptionalTensor&, int64_t,
                                              const OptionalTensor&);

inline const c10::TypedOperatorHandle<KnnPointsSchema>& knn_points_handle() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pointops::knn_points", "").typed<KnnPointsSchema>();
  return op;
}

inline const c10::TypedOperatorHandle<BallQuerySchema>& ball_query_handle() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pointops::ball_query", "").typed<BallQuerySchema>();
  return op;
}

inline const c10::TypedOperatorHandle<SampleFarthestPointsSchema>& sample_farthest_points_handle() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::sample_farthest_points", "")
                             .typed<SampleFarthestPointsSchema>();
  return op;
}

}  // namespace pointops
