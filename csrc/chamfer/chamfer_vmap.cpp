// vmap batching rules of the nearest-neighbour ops (common/vmap.h): the vmapped dimension is folded
// into the clouds' batch B, one search for every sample. (The loss, _chamfer_distance, decomposes
// into these: csrc/chamfer/chamfer_loss.cpp.)
#include <torch/library.h>

#include "chamfer/chamfer_ops.h"
#include "common/vmap.h"

namespace pointops {
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
