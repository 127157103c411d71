// Neighbourhood ops (knn_points, ball_query, sample_farthest_points): what the CPU and CUDA
// launchers share. Distances are chamfer.h's exact per-coordinate forms, so every op here agrees
// bit for bit with nearest_neighbor on the same pair of points, on either device.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <tuple>

#include "chamfer/chamfer.h"

namespace pointops {

// ---- checks (neighbors_checks.cpp), mirrored by the fake kernels in pointops/neighbors.py

// knn_points: the cloud pair (check_cloud_pair with PyTorch3D's names p1, p2, lengths1, lengths2),
// K >= 1 and the norm. Returns the lengths as int64 (undefined when absent).
std::tuple<at::Tensor, at::Tensor> check_knn_inputs(const at::Tensor& p1, const at::Tensor& p2,
                                                    const c10::optional<at::Tensor>& lengths1,
                                                    const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                    int64_t norm);

// ball_query: the cloud pair, K >= 1 and a finite radius > 0.
std::tuple<at::Tensor, at::Tensor> check_ball_query_inputs(const at::Tensor& p1, const at::Tensor& p2,
                                                           const c10::optional<at::Tensor>& lengths1,
                                                           const c10::optional<at::Tensor>& lengths2, int64_t K,
                                                           double radius);

// sample_farthest_points: points (B, N, D) floating, lengths (B,) in [0, N] (one device-to-host copy
// on CUDA, as every lengths check), K (B,) integer, max_K >= 0, start_idx (B,) integer. Returns
// (lengths, K, start_idx) as contiguous int64 tensors (undefined when absent).
std::tuple<at::Tensor, at::Tensor, at::Tensor> check_farthest_point_inputs(const at::Tensor& points,
                                                                           const c10::optional<at::Tensor>& lengths,
                                                                           const c10::optional<at::Tensor>& K,
                                                                           int64_t max_K,
                                                                           const c10::optional<at::Tensor>& start_idx);

// ---- shared definitions

// The largest K whose sorted candidate list the CUDA kernel keeps in registers; a larger K sorts
// whole rows of distances (knn_cuda.cu).
constexpr int64_t kMaxRegisterK = 64;

// The squared radius the ball test compares with (distance < radius^2): squared in double and
// rounded once to the compute type, the same value on both devices.
template <typename acc_t>
inline acc_t squared_radius(double radius) {
  return static_cast<acc_t>(radius * radius);
}

}  // namespace pointops
