// Input validation for the neighbourhood ops, shared by the CPU and CUDA launchers
// (pointops/neighbors.py mirrors the shape checks in its fake kernels).
#include <cmath>

#include "common/checks.h"
#include "neighbors/neighbors.h"

namespace pointops {
namespace {

constexpr CloudPairNames kPyTorch3DNames{"p1", "p2", "lengths1", "lengths2"};

void check_k(int64_t K) { TORCH_CHECK(K >= 1, "K must be at least 1, got ", K); }

// An optional (B,) integer tensor on the device of `points`, as contiguous int64.
at::Tensor check_per_cloud(const c10::optional<at::Tensor>& t, const char* name, const at::Tensor& points) {
  if (!t.has_value() || !t->defined()) return at::Tensor();
  TORCH_CHECK(t->scalar_type() == at::kLong || t->scalar_type() == at::kInt, name,
              " must be an int64 (or int32) tensor, got ", t->scalar_type());
  TORCH_CHECK(t->dim() == 1 && t->size(0) == points.size(0), name, " must have shape (B,) = (", points.size(0),
              ",) to match points, got shape ", t->sizes());
  check_same_device(*t, points, name, "points");
  return t->to(at::kLong).contiguous();
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> check_knn_inputs(const at::Tensor& p1, const at::Tensor& p2,
                                                    const c10::optional<at::Tensor>& lengths1,
                                                    const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                    int64_t norm) {
  auto lengths = check_cloud_pair(p1, p2, lengths1, lengths2, kPyTorch3DNames);
  check_k(K);
  metric_from_norm(norm);
  return lengths;
}

std::tuple<at::Tensor, at::Tensor> check_ball_query_inputs(const at::Tensor& p1, const at::Tensor& p2,
                                                           const c10::optional<at::Tensor>& lengths1,
                                                           const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                           double radius) {
  auto lengths = check_cloud_pair(p1, p2, lengths1, lengths2, kPyTorch3DNames);
  check_k(K);
  TORCH_CHECK(std::isfinite(radius) && radius > 0, "radius must be a finite number > 0, got ", radius);
  return lengths;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> check_farthest_point_inputs(const at::Tensor& points,
                                                                           const c10::optional<at::Tensor>& lengths,
                                                                           const c10::optional<at::Tensor>& K,
                                                                           int64_t max_K,
                                                                           const c10::optional<at::Tensor>& start_idx) {
  check_dim(points, 3, "points", "(B, N, D)");
  check_floating_point(points, "points");
  TORCH_CHECK(points.size(2) >= 1, "the point dimension D must be at least 1, got points ", points.sizes());
  constexpr int64_t kMaxPoints = std::numeric_limits<int32_t>::max();
  TORCH_CHECK(points.size(1) <= kMaxPoints, "at most 2^31 - 1 points per cloud are supported, got points ",
              points.sizes());
  TORCH_CHECK(max_K >= 0, "max_K must be >= 0, got ", max_K);
  at::Tensor lengths_checked = check_per_cloud(lengths, "lengths", points);
  if (lengths_checked.defined() && lengths_checked.numel() > 0) {
    // One host copy of two numbers: a length outside [0, N] would read past the cloud.
    const auto [lo, hi] = at::aminmax(lengths_checked);
    const int64_t min_len = lo.item<int64_t>(), max_len = hi.item<int64_t>();
    TORCH_CHECK(min_len >= 0 && max_len <= points.size(1), "lengths must lie in [0, ", points.size(1),
                "] (the number of points of points), got values in [", min_len, ", ", max_len, "]");
  }
  return {lengths_checked, check_per_cloud(K, "K", points), check_per_cloud(start_idx, "start_idx", points)};
}

}  // namespace pointops
