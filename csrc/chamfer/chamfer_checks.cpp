// Input validation and device-independent helpers for nearest_neighbor / chamfer, shared by the
// CPU and CUDA launchers (pointops/chamfer.py mirrors the shape checks in its fake kernels).
#include "chamfer/chamfer.h"

#include <limits>
#include <vector>

#include "common/checks.h"

namespace pointops {
namespace {

at::Tensor check_lengths(const c10::optional<at::Tensor>& lengths, const char* name,
                         const at::Tensor& points, const char* points_name) {
  if (!lengths.has_value() || !lengths->defined()) return at::Tensor();
  const at::Tensor& l = *lengths;
  TORCH_CHECK(l.scalar_type() == at::kLong || l.scalar_type() == at::kInt, name,
              " must be an int64 (or int32) tensor, got ", l.scalar_type());
  TORCH_CHECK(l.dim() == 1 && l.size(0) == points.size(0), name, " must have shape (B,) = (",
              points.size(0), ",) to match ", points_name, ", got shape ", l.sizes());
  check_same_device(l, points, name, points_name);
  if (l.numel() > 0) {
    // One host copy of two numbers: a length outside [0, size] would read past the cloud.
    const auto [lo, hi] = at::aminmax(l);
    const int64_t min_len = lo.item<int64_t>(), max_len = hi.item<int64_t>();
    TORCH_CHECK(min_len >= 0 && max_len <= points.size(1), name, " must lie in [0, ",
                points.size(1), "] (the number of points of ", points_name, "), got values in [",
                min_len, ", ", max_len, "]");
  }
  return l.to(at::kLong).contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> check_cloud_pair(const at::Tensor& x, const at::Tensor& y,
                                                    const c10::optional<at::Tensor>& x_lengths,
                                                    const c10::optional<at::Tensor>& y_lengths,
                                                    const CloudPairNames& names) {
  check_dim(x, 3, names.x, "(B, N, D)");
  check_dim(y, 3, names.y, "(B, M, D)");
  check_floating_point(x, names.x);
  check_same_dtype(y, x, names.y, names.x);
  check_same_device(y, x, names.y, names.x);
  TORCH_CHECK(x.size(0) == y.size(0), names.x, " and ", names.y, " must have the same batch size B, got ", names.x,
              " ", x.sizes(), " and ", names.y, " ", y.sizes());
  TORCH_CHECK(x.size(2) == y.size(2), names.x, " and ", names.y, " must have the same point dimension D, got ",
              names.x, " ", x.sizes(), " and ", names.y, " ", y.sizes());
  TORCH_CHECK(x.size(2) >= 1, "the point dimension D must be at least 1, got ", names.x, " ", x.sizes());
  // Indices travel through 32-bit lanes inside the kernels.
  constexpr int64_t kMaxPoints = std::numeric_limits<int32_t>::max();
  TORCH_CHECK(x.size(1) <= kMaxPoints && y.size(1) <= kMaxPoints,
              "at most 2^31 - 1 points per cloud are supported, got ", names.x, " ", x.sizes(), " and ", names.y, " ",
              y.sizes());
  return {check_lengths(x_lengths, names.x_lengths, x, names.x), check_lengths(y_lengths, names.y_lengths, y, names.y)};
}

std::tuple<at::Tensor, at::Tensor> check_nearest_neighbor_inputs(
    const at::Tensor& x, const at::Tensor& y, const c10::optional<at::Tensor>& x_lengths,
    const c10::optional<at::Tensor>& y_lengths) {
  return check_cloud_pair(x, y, x_lengths, y_lengths, {"x", "y", "x_lengths", "y_lengths"});
}

void check_nearest_neighbor_backward_inputs(const at::Tensor& grad_dist, const at::Tensor& x,
                                            const at::Tensor& y, const at::Tensor& idx) {
  check_nearest_neighbor_inputs(x, y, c10::nullopt, c10::nullopt);
  TORCH_CHECK((idx.dim() == 2 || idx.dim() == 3) && idx.size(0) == x.size(0) && idx.size(1) == x.size(1),
              "idx must have shape (B, N) or (B, N, K) with (B, N) = (", x.size(0), ", ", x.size(1), "), got ",
              idx.sizes());
  TORCH_CHECK(idx.scalar_type() == at::kLong, "idx must be int64, got ", idx.scalar_type());
  check_same_device(idx, x, "idx", "x");
  TORCH_CHECK(grad_dist.sizes() == idx.sizes(), "grad_dist must have shape (B, N) or (B, N, K), the shape of idx ",
              idx.sizes(), ", got ", grad_dist.sizes());
  check_same_dtype(grad_dist, x, "grad_dist", "x");
  check_same_device(grad_dist, x, "grad_dist", "x");
}

Metric metric_from_norm(int64_t norm) {
  TORCH_CHECK(norm == 1 || norm == 2, "norm must be 1 (L1 distance) or 2 (squared Euclidean distance), got ", norm);
  return static_cast<Metric>(norm);
}

std::tuple<at::Tensor, at::Tensor> matched_queries_by_reference(const at::Tensor& idx, int64_t M) {
  const int64_t B = idx.size(0);
  const auto batch_base = at::arange(B, idx.options()).mul_(M).view({B, 1});
  const auto flat = idx.reshape({B, -1});
  // An index outside [0, M) (-1, or a hand-made one) belongs to no run: never out of bounds.
  const auto keys = at::where((flat >= 0) & (flat < M), flat + batch_base, at::full({}, B * M, idx.options())).flatten();
  // Stable: the pairs of one reference point stay in increasing order, which fixes the summation
  // order of its gradient.
  const auto [sorted_keys, order] = at::sort(keys, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const auto offsets = at::searchsorted(sorted_keys, at::arange(B * M + 1, idx.options()));
  return {order.contiguous(), offsets.contiguous()};
}

}  // namespace pointops
