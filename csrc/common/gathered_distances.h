// The distance of each query to its chosen neighbours, as differentiable ATen ops: the derivative
// formula of nearest_neighbor, chamfer, knn_points and ball_query under forward-mode AD and the
// torch.func transforms (common/transforms.h). With the indices fixed, the kernels' distances are
// exactly this function of the coordinates.
#pragma once

#include <ATen/ATen.h>

namespace pointops {

// d(q[b, i], r[b, idx[b, i(, k)]]) for queries q (B, N, D), references r (B, M, D) and idx (B, N) or
// (B, N, K) int64 in [-1, M): the squared Euclidean distance (norm = 2) or the L1 distance (norm = 1),
// computed in float32 for half types, 0 (a constant) where idx is -1.
at::Tensor gathered_distances(const at::Tensor& q, const at::Tensor& r, const at::Tensor& idx, int64_t norm);

// The kernel's distances `dist` (any of the ops above) with the derivatives of gathered_distances.
at::Tensor distances_with_derivatives(const at::Tensor& dist, const at::Tensor& q, const at::Tensor& r,
                                      const at::Tensor& idx, int64_t norm);

}  // namespace pointops
