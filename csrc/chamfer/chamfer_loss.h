// chamfer_distance's fused loss (chamfer_loss.cpp, chamfer_loss_cuda.cu): the option parsing and the
// per-cloud factors the forward reduction and the backward share, on either device.
//
// The loss without normals, per cloud b and direction (distances d of the direction's queries):
//   value[b] = [partner cloud not empty] * w[b] / count * sum_i f(d[b, i])
// f = identity (squared) or sqrt; count = max(lengths[b], 1) for "mean" with lengths, the point
// count n for "mean" without (1 when n = 0), 1 for "sum"; w[b] = 1 without weights. The two
// directions add; the batch reduction sums (or averages over B, or over the weights' sum when it
// is positive) or keeps (B,).
#pragma once

#include <ATen/ATen.h>
#include <c10/macros/Macros.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace pointops {

enum class BatchReduction { None, Sum, Mean };

inline BatchReduction parse_batch_reduction(const c10::optional<c10::string_view>& name) {
  if (!name.has_value()) return BatchReduction::None;
  if (*name == "sum") return BatchReduction::Sum;
  TORCH_CHECK(*name == "mean", "batch_reduction must be 'mean', 'sum' or None, got '", std::string(*name), "'");
  return BatchReduction::Mean;
}

// True for "mean", false for "sum"; "max" and None never reach the fused ops.
inline bool parse_point_mean(c10::string_view name) {
  TORCH_CHECK(name == "mean" || name == "sum", "_chamfer_distance: point_reduction must be 'mean' or 'sum', got '",
              std::string(name), "'");
  return name == "mean";
}

// The shapes the two private ops need, checked the same way on both devices. (Length values are the
// caller's: chamfer_distance validated them; checking them here would cost a device sync.)
inline void check_chamfer_distance_loss_shapes(const at::Tensor& dist1, const c10::optional<at::Tensor>& dist2,
                                               int64_t num_y) {
  TORCH_CHECK(dist1.dim() == 2, "_chamfer_distance_loss: dist1 must be (B, N), got ", dist1.sizes());
  TORCH_CHECK(!(dist2.has_value() && dist2->defined()) ||
                  (dist2->dim() == 2 && dist2->size(0) == dist1.size(0) && dist2->size(1) == num_y),
              "_chamfer_distance_loss: dist2 must be (B, num_y) = (", dist1.size(0), ", ", num_y, "), got ",
              dist2.has_value() && dist2->defined() ? dist2->sizes() : at::IntArrayRef{});
}

inline void check_chamfer_distance_backward_shapes(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& y,
                                                   const at::Tensor& dist1, const at::Tensor& idx1,
                                                   const c10::optional<at::Tensor>& dist2,
                                                   const c10::optional<at::Tensor>& idx2, BatchReduction batch) {
  const bool both = dist2.has_value() && dist2->defined();
  TORCH_CHECK(!both || (idx2.has_value() && idx2->defined()), "_chamfer_distance_backward: dist2 needs idx2");
  TORCH_CHECK(x.dim() == 3 && y.dim() == 3 && x.size(0) == y.size(0) && x.size(2) == y.size(2),
              "_chamfer_distance_backward: x (B, N, D) and y (B, M, D) expected, got ", x.sizes(), " and ", y.sizes());
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1);
  TORCH_CHECK(idx1.sizes() == at::IntArrayRef({B, N}) && dist1.sizes() == idx1.sizes(),
              "_chamfer_distance_backward: dist1 and idx1 must be (B, N) = (", B, ", ", N, "), got ", dist1.sizes(),
              " and ", idx1.sizes());
  TORCH_CHECK(!both || (idx2->sizes() == at::IntArrayRef({B, M}) && dist2->sizes() == idx2->sizes()),
              "_chamfer_distance_backward: dist2 and idx2 must be (B, M) = (", B, ", ", M, ")");
  TORCH_CHECK(grad.numel() == (batch == BatchReduction::None ? B : 1),
              "_chamfer_distance_backward: grad must hold one value per cloud without a batch reduction, else one; got ",
              grad.sizes());
}

// Raw views of one direction's per-cloud factors, usable on the host and in a kernel.
struct DirectionFactors {
  const int64_t* lengths;          // the direction's own cloud's lengths (B,), or nullptr
  const int64_t* partner_lengths;  // the searched cloud's lengths, or nullptr
  int64_t n;                       // the direction's query count (the padded size)
  int64_t partner_n;               // the searched cloud's padded size
  bool mean;

  // 1 / count: the point reduction's factor of cloud b (the weight applies separately).
  C10_HOST_DEVICE double inverse_count(int64_t b) const {
    if (!mean) return 1.0;
    if (lengths != nullptr) return 1.0 / static_cast<double>(lengths[b] > 1 ? lengths[b] : 1);
    return n > 1 ? 1.0 / static_cast<double>(n) : 1.0;
  }
  // PyTorch3D: a direction whose searched cloud is empty contributes 0.
  C10_HOST_DEVICE bool partner_empty(int64_t b) const {
    return partner_lengths != nullptr ? partner_lengths[b] == 0 : partner_n == 0;
  }
};

}  // namespace pointops
