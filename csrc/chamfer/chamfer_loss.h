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
