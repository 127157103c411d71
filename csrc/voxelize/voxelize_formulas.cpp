#include "voxelize/voxelize_formulas.h"

namespace pointops {
namespace voxelize {
namespace {

// Each point's row in a (rows + 1)-row table: its voxel, or the spare last row when it has none.
at::Tensor point_rows(const at::Tensor& point_to_voxel, int64_t rows) {
  return at::where(point_to_voxel >= 0, point_to_voxel, at::full({}, rows, point_to_voxel.options()));
}

// Appends one row of `value` to t (V, F): the spare row that points without a voxel read.
at::Tensor with_spare_row(const at::Tensor& t, double value) {
  return at::cat({t, at::full({1, t.size(1)}, value, t.options())});
}

// For each voxel and column, the first point (input order) whose value equals the voxel's max (NaN
// counts as equal to NaN, as the kernels' backward has it): (rows + 1, F) int64, N where none.
at::Tensor max_winners(const at::Tensor& points, const at::Tensor& row, const at::Tensor& features) {
  const int64_t n = points.size(0), f = points.size(1), rows = features.size(0);
  const at::Tensor best = with_spare_row(features, 0.0).index_select(0, row);  // (N, F): its voxel's max
  const at::Tensor hit = (points == best) | (at::isnan(points) & at::isnan(best));
  const at::Tensor index = at::arange(n, row.options()).unsqueeze(1).expand({n, f});
  const at::Tensor candidates = at::where(hit & (row < rows).unsqueeze(1), index, at::full({}, n, row.options()));
  return at::full({rows + 1, f}, n, row.options())
      .scatter_reduce(0, row.unsqueeze(1).expand({n, f}), candidates, "amin", /*include_self=*/true);
}

// Each point's rank among the points of its voxel, in input order (points in no voxel: any value).
// A stable sort by voxel and the distance to the start of each run: no size taken from the voxels.
at::Tensor point_ranks(const at::Tensor& point_to_voxel) {
  const int64_t n = point_to_voxel.size(0);
  const auto [sorted, order] = point_to_voxel.sort(/*stable=*/c10::optional<bool>(true), /*dim=*/0, false);
  const at::Tensor index = at::arange(n, point_to_voxel.options());
  const at::Tensor run_start = at::cat({at::ones({1}, sorted.options().dtype(at::kBool)),
                                        sorted.slice(0, 1) != sorted.slice(0, 0, n - 1)});
  const at::Tensor start = std::get<0>(at::where(run_start, index, at::zeros_like(index)).cummax(0));
  return at::empty_like(point_to_voxel).scatter(0, order, index - start);
}

}  // namespace

at::Tensor voxelize_backward_formula(const at::Tensor& grad_voxels, const at::Tensor& grad_features,
                                     const at::Tensor& points, const at::Tensor& point_to_voxel,
                                     const at::Tensor& num_points, int64_t max_points_per_voxel) {
  const int64_t n = points.size(0), f = points.size(1), P = max_points_per_voxel;
  if (n == 0) return at::zeros_like(points);
  const at::Tensor rank = point_ranks(point_to_voxel);
  const at::Tensor kept = (point_to_voxel >= 0) & (rank < P);
  const at::Tensor row = point_to_voxel.clamp_min(0);
  at::Tensor grad = at::zeros_like(points);
  if (grad_voxels.defined()) {  // slot (row, rank) of the (V * P, F) rows
    const at::Tensor slot = row * P + rank.clamp(0, P - 1);
    grad = grad + grad_voxels.reshape({-1, f}).index_select(0, slot);
  }
  if (grad_features.defined()) {  // the mean: 1 / count to each kept point
    const at::Tensor count = num_points.index_select(0, row).clamp_min(1).to(points.scalar_type()).unsqueeze(1);
    grad = grad + grad_features.index_select(0, row) / count;
  }
  return at::where(kept.unsqueeze(1), grad, at::zeros({}, grad.options()));
}

at::Tensor voxel_features_formula(const at::Tensor& points, const at::Tensor& point_to_voxel,
                                  const at::Tensor& num_points, const at::Tensor& features, c10::string_view reduce) {
  const int64_t n = points.size(0), rows = features.size(0);
  if (n == 0 || rows == 0) return at::zeros_like(features);
  const at::Tensor row = point_rows(point_to_voxel, rows);
  if (reduce == "max") {
    const at::Tensor winners = max_winners(points, row, features).slice(0, 0, rows);
    const at::Tensor gathered = points.gather(0, winners.clamp_max(n - 1));
    return at::where(winners < n, gathered, at::zeros({}, points.options()));
  }
  const at::Tensor sums =
      at::zeros({rows + 1, points.size(1)}, points.options()).index_add(0, row, points).slice(0, 0, rows);
  if (reduce == "sum") return sums;
  return sums / num_points.clamp_min(1).to(points.scalar_type()).unsqueeze(1);
}

at::Tensor voxel_features_backward_formula(const at::Tensor& grad_features, const at::Tensor& points,
                                           const at::Tensor& point_to_voxel, const at::Tensor& num_points,
                                           const at::Tensor& features, c10::string_view reduce) {
  const int64_t n = points.size(0), rows = features.size(0);
  if (n == 0 || rows == 0) return at::zeros_like(points);
  const at::Tensor row = point_rows(point_to_voxel, rows);
  const at::Tensor share = with_spare_row(grad_features, 0.0).index_select(0, row);  // (N, F)
  if (reduce == "sum") return share;
  if (reduce == "mean") {
    const at::Tensor counts = with_spare_row(num_points.clamp_min(1).unsqueeze(1), 1.0).index_select(0, row);
    return share / counts.to(points.scalar_type());
  }
  const at::Tensor winners = max_winners(points, row, features);
  const at::Tensor index = at::arange(n, row.options()).unsqueeze(1);
  const at::Tensor won = winners.gather(0, row.unsqueeze(1).expand({n, points.size(1)})) == index;
  return at::where(won, share, at::zeros({}, share.options()));
}

std::pair<at::Tensor, at::Tensor> voxelize_formula(const at::Tensor& points, const at::Tensor& point_to_voxel,
                                                   const at::Tensor& num_points, int64_t rows,
                                                   int64_t max_points_per_voxel) {
  const int64_t n = points.size(0), f = points.size(1), P = max_points_per_voxel;
  if (n == 0 || rows == 0) {
    return {at::zeros({rows, P, f}, points.options()), at::zeros({rows, f}, points.options())};
  }
  const at::Tensor row = point_rows(point_to_voxel, rows);
  const at::Tensor rank = point_ranks(point_to_voxel);
  // The point in each (voxel, slot): a (rows + 1, P + 1) table whose spare row and column take the
  // points that are in no voxel or past the first P of theirs.
  const at::Tensor slot = row * (P + 1) + at::where(rank < P, rank, at::full({}, P, rank.options()));
  const at::Tensor source = at::full({(rows + 1) * (P + 1)}, -1, row.options())
                                .scatter(0, slot, at::arange(n, row.options()))
                                .view({rows + 1, P + 1})
                                .slice(0, 0, rows)
                                .slice(1, 0, P);
  const at::Tensor gathered = points.index_select(0, source.clamp_min(0).reshape({-1})).view({rows, P, f});
  const at::Tensor voxels = at::where((source >= 0).unsqueeze(2), gathered, at::zeros({}, points.options()));
  const at::Tensor mean = voxels.sum(1) / num_points.clamp_min(1).to(points.scalar_type()).unsqueeze(1);
  return {voxels, mean};
}

}  // namespace voxelize
}  // namespace pointops
