// The voxelization outputs as differentiable torch ops of the points, given the kernel's assignment
// (point_to_voxel, num_points): the derivative formulas of csrc/voxelize/voxelize_autograd.cpp, and
// the vmap rule of the backward op. Integer work (ranks, winners) only decides which point feeds
// which output; the floating values flow through gathers and sums, so every transform differentiates them.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace pointops {
namespace voxelize {

// voxel_features' features (V, F): the sum, mean or (per column, the first point attaining it) max of
// each voxel's points.
at::Tensor voxel_features_formula(const at::Tensor& points, const at::Tensor& point_to_voxel,
                                  const at::Tensor& num_points, const at::Tensor& features, c10::string_view reduce);

// _voxel_features_backward: each point's share of its voxel's feature gradient (N, F).
at::Tensor voxel_features_backward_formula(const at::Tensor& grad_features, const at::Tensor& points,
                                           const at::Tensor& point_to_voxel, const at::Tensor& num_points,
                                           const at::Tensor& features, c10::string_view reduce);

// voxelize's backward: each point's gradient from the voxel slot it was kept in (grad_voxels
// (V, P, F)) and from its voxel's mean (grad_features (V, F)); 0 for points not kept. Either gradient
// may be undefined (that output unused). No size is read from V, so it traces under torch.compile
// with V data-dependent.
at::Tensor voxelize_backward_formula(const at::Tensor& grad_voxels, const at::Tensor& grad_features,
                                     const at::Tensor& points, const at::Tensor& point_to_voxel,
                                     const at::Tensor& num_points, int64_t max_points_per_voxel);

// voxelize's voxels (rows, P, F) -- each voxel's first P points in input order, zeros after -- and
// features (rows, F), their mean (0 for an empty row).
std::pair<at::Tensor, at::Tensor> voxelize_formula(const at::Tensor& points, const at::Tensor& point_to_voxel,
                                                   const at::Tensor& num_points, int64_t rows,
                                                   int64_t max_points_per_voxel);

}  // namespace voxelize
}  // namespace pointops
