// The nearest-neighbour ops as typed dispatcher handles (looked up once), for the code that calls
// them from C++: the autograd kernels, the loss and the vmap batching rules.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

namespace pointops {

using OptionalTensor = c10::optional<at::Tensor>;

using NearestNeighborSchema = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                 const OptionalTensor&, const OptionalTensor&,
                                                                 int64_t, c10::string_view);
using ChamferSchema = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const OptionalTensor&, const OptionalTensor&, int64_t, c10::string_view);
using NearestNeighborBackwardSchema = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                         const at::Tensor&, const at::Tensor&,
                                                                         int64_t);

inline const c10::TypedOperatorHandle<NearestNeighborSchema>& nearest_neighbor_handle() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("pointops::nearest_neighbor", "").typed<NearestNeighborSchema>();
  return op;
}

inline const c10::TypedOperatorHandle<ChamferSchema>& chamfer_handle() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("pointops::chamfer", "").typed<ChamferSchema>();
  return op;
}

inline const c10::TypedOperatorHandle<NearestNeighborBackwardSchema>& nearest_neighbor_backward_handle() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::_nearest_neighbor_backward", "")
                             .typed<NearestNeighborBackwardSchema>();
  return op;
}

}  // namespace pointops
