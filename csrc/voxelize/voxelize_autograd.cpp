// Autograd for the voxelization ops, in C++ (a Python-registered autograd kernel costs ~20 us a call).
//
// Reverse mode records hand-made nodes (common/autograd_node.h), in plain autograd and under the
// torch.func transforms alike: voxel_features' backward is the fused _voxel_features_backward op;
// voxelize's (its `voxels` are the kept points, gathered, and `features` their mean) is a gather of
// the gradients by each point's voxel and slot. The backward op is linear in the features' gradient
// and piecewise constant in the points (the winner of a max changes only at ties): its own backward
// is that linear map's adjoint. Forward-mode tangents take the path of common/transforms.h: the
// kernel on detached inputs, the derivatives of the same outputs written with torch ops.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#include "common/autograd_node.h"
#include "common/transforms.h"
#include "common/vmap.h"

namespace pointops {
namespace voxelize {

// ---- the outputs as differentiable torch ops of the points, given the kernel's assignment
// (point_to_voxel, num_points): the forward-mode formulas, voxelize's backward, and the vmap rule of
// the backward op. Integer work (ranks, winners) only decides which point feeds which output; the
// floating values flow through gathers and sums.
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

// voxelize's backward: each point's gradient from the voxel slot it was kept in (grad_voxels
// (V, P, F)) and from its voxel's mean (grad_features (V, F)); 0 for points not kept. Either gradient
// may be undefined (that output unused). No size is read from V, so it traces under torch.compile
// with V data-dependent.
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

// voxel_features' features (V, F): the sum, mean or (per column, the first point attaining it) max
// of each voxel's points.
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

// _voxel_features_backward: each point's share of its voxel's feature gradient (N, F).
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

// voxelize's voxels (rows, P, F) -- each voxel's first P points in input order, zeros after -- and
// features (rows, F), their mean (0 for an empty row).
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

using OptionalTensor = c10::optional<at::Tensor>;
using FeaturesResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using VoxelizeResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using PaddedResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

const auto& voxel_features_handle() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::voxel_features", "")
                             .typed<FeaturesResult(const at::Tensor&, const OptionalTensor&, at::ArrayRef<double>,
                                                   at::ArrayRef<double>, c10::string_view)>();
  return op;
}

const auto& voxel_features_backward_handle() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::_voxel_features_backward", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&, c10::string_view)>();
  return op;
}

const auto& voxelize_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pointops::voxelize", "")
          .typed<VoxelizeResult(const at::Tensor&, const OptionalTensor&, at::ArrayRef<double>, at::ArrayRef<double>,
                                int64_t, int64_t)>();
  return op;
}

const auto& voxelize_padded_handle() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("pointops::voxelize_padded", "")
          .typed<PaddedResult(const at::Tensor&, const OptionalTensor&, at::ArrayRef<double>, at::ArrayRef<double>,
                              int64_t, int64_t)>();
  return op;
}

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// voxel_features' backward: the features' gradient in, the points' out.
struct VoxelFeaturesBackward : torch::autograd::Node {
  VoxelFeaturesBackward(const at::Tensor& points, const at::Tensor& point_to_voxel, const at::Tensor& num_points,
                        const at::Tensor& features, c10::string_view reduce)
      // features only pick the max's winners (no derivative flows through them): saved detached,
      // which keeps the node out of a cycle with its own output
      : points_(points, false), point_to_voxel_(point_to_voxel, false), num_points_(num_points, false),
        features_(detached(features), false), reduce_(reduce) {}

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor()};
    return {voxel_features_backward_handle().call(grads[0], points_.unpack(), point_to_voxel_.unpack(),
                                                  num_points_.unpack(), features_.unpack(), reduce_)};
  }

  std::string name() const override { return "VoxelFeaturesBackward"; }

  void release_variables() override {
    points_.reset_data();
    point_to_voxel_.reset_data();
    num_points_.reset_data();
    features_.reset_data();
  }

  SavedVariable points_, point_to_voxel_, num_points_, features_;
  std::string reduce_;
};

// The backward op's adjoint in the features' gradient: each voxel sums its points' upstream
// gradients times their weights (1, 1 / count, or the max's winner), the backward applied to ones.
// Its derivative in the points is 0 almost everywhere (none is returned).
struct VoxelFeaturesBackwardBackward : torch::autograd::Node {
  VoxelFeaturesBackwardBackward(const at::Tensor& points, const at::Tensor& point_to_voxel,
                                const at::Tensor& num_points, const at::Tensor& features, c10::string_view reduce)
      : points_(points, false), point_to_voxel_(point_to_voxel, false), num_points_(num_points, false),
        features_(features, false), reduce_(reduce) {}

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor points = points_.unpack(), point_to_voxel = point_to_voxel_.unpack(), features = features_.unpack();
    const at::Tensor weight = voxel_features_backward_handle().call(
        at::ones_like(features), points, point_to_voxel, num_points_.unpack(), features, reduce_);
    const at::Tensor terms = at::where((point_to_voxel >= 0).unsqueeze(1), grads[0] * weight, at::zeros({}, weight.options()));
    // index_add is deterministic under torch.use_deterministic_algorithms (a sort on CUDA).
    return {at::zeros_like(features).index_add(0, point_to_voxel.clamp_min(0), terms), at::Tensor(), at::Tensor()};
  }

  std::string name() const override { return "VoxelFeaturesBackwardBackward"; }

  void release_variables() override {
    points_.reset_data();
    point_to_voxel_.reset_data();
    num_points_.reset_data();
    features_.reset_data();
  }

  SavedVariable points_, point_to_voxel_, num_points_, features_;
  std::string reduce_;
};

// voxelize's backward: the gradients of voxels and features in, the points' out.
struct VoxelizeBackward : torch::autograd::Node {
  VoxelizeBackward(const at::Tensor& points, const at::Tensor& point_to_voxel, const at::Tensor& num_points,
                   int64_t max_points_per_voxel)
      : points_(points, false), point_to_voxel_(point_to_voxel, false), num_points_(num_points, false),
        max_points_per_voxel_(max_points_per_voxel) {}

  variable_list apply(variable_list&& grads) override {
    if (!grads[0].defined() && !grads[1].defined()) return {at::Tensor()};
    return {voxelize_backward_formula(grads[0], grads[1], points_.unpack(), point_to_voxel_.unpack(),
                                      num_points_.unpack(), max_points_per_voxel_)};
  }

  std::string name() const override { return "VoxelizeBackward"; }

  void release_variables() override {
    points_.reset_data();
    point_to_voxel_.reset_data();
    num_points_.reset_data();
  }

  SavedVariable points_, point_to_voxel_, num_points_;
  int64_t max_points_per_voxel_;
};

FeaturesResult voxel_features_autograd(c10::DispatchKeySet ks, const at::Tensor& points, const OptionalTensor& batch,
                                       at::ArrayRef<double> voxel_size, at::ArrayRef<double> point_range,
                                       c10::string_view reduce) {
  if (has_forward_grad(points)) {  // forward mode: common/transforms.h
    auto [features, coords, num_points, point_to_voxel] =
        voxel_features_handle().call(detached(points), batch, voxel_size, point_range, reduce);
    const at::Tensor formula = voxel_features_formula(points, point_to_voxel, num_points, features, reduce);
    return {with_derivatives_of(features, formula), coords, num_points, point_to_voxel};
  }
  if (!needs_backward({&points})) {
    return voxel_features_handle().redispatch(below_autograd(ks), points, batch, voxel_size, point_range, reduce);
  }
  auto [features, coords, num_points, point_to_voxel] = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return voxel_features_handle().redispatch(below_autograd(ks), points, batch, voxel_size, point_range, reduce);
  }();
  record_backward(make_node<VoxelFeaturesBackward>(points, point_to_voxel, num_points, features, reduce), {&features},
                  points);
  return {features, coords, num_points, point_to_voxel};
}

at::Tensor voxel_features_backward_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_features,
                                           const at::Tensor& points, const at::Tensor& point_to_voxel,
                                           const at::Tensor& num_points, const at::Tensor& features,
                                           c10::string_view reduce) {
  if (any_has_forward_grad({&grad_features, &points, &features})) {
    const at::Tensor grad_points = voxel_features_backward_handle().call(
        detached(grad_features), detached(points), point_to_voxel, num_points, detached(features), reduce);
    return with_derivatives_of(grad_points, voxel_features_backward_formula(grad_features, points, point_to_voxel,
                                                                            num_points, features, reduce));
  }
  if (!needs_backward({&grad_features, &points, &features})) {
    return voxel_features_backward_handle().redispatch(below_autograd(ks), grad_features, points, point_to_voxel,
                                                       num_points, features, reduce);
  }
  at::Tensor grad_points = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return voxel_features_backward_handle().redispatch(below_autograd(ks), grad_features, points, point_to_voxel,
                                                       num_points, features, reduce);
  }();
  record_backward(make_node<VoxelFeaturesBackwardBackward>(points, point_to_voxel, num_points, features, reduce),
                  {&grad_points}, grad_features, points, features);
  return grad_points;
}

// voxels and features with the derivatives of the gathered points (forward mode).
void differentiate_voxels(const at::Tensor& points, const at::Tensor& point_to_voxel, const at::Tensor& num_points,
                          at::Tensor& voxels, at::Tensor& features) {
  auto [voxels_formula, features_formula] = voxelize_formula(points, point_to_voxel, num_points, voxels.size(0),
                                                             voxels.size(1));
  voxels = with_derivatives_of(voxels, voxels_formula);
  features = with_derivatives_of(features, features_formula);
}

// The voxelize outputs (tuple of 5 or 6) with their derivatives: forward-mode tangents, or the
// backward node when the points require grad; as they are otherwise. compute(points, keys) runs
// the op (keys: the redispatch below autograd; none: a call through the whole dispatcher).
template <typename Result, typename Compute>
Result differentiable_voxelize(c10::DispatchKeySet ks, const at::Tensor& points, int64_t max_points_per_voxel,
                               Compute compute) {
  if (has_forward_grad(points)) {
    Result out = compute(detached(points), c10::nullopt);
    differentiate_voxels(points, std::get<4>(out), std::get<2>(out), std::get<0>(out), std::get<3>(out));
    return out;
  }
  if (!needs_backward({&points})) return compute(points, below_autograd(ks));
  Result out = [&] {
    at::AutoDispatchBelowADInplaceOrView guard;
    return compute(points, below_autograd(ks));
  }();
  record_backward(make_node<VoxelizeBackward>(points, std::get<4>(out), std::get<2>(out), max_points_per_voxel),
                  {&std::get<0>(out), &std::get<3>(out)}, points);
  return out;
}

VoxelizeResult voxelize_autograd(c10::DispatchKeySet ks, const at::Tensor& points, const OptionalTensor& batch,
                                 at::ArrayRef<double> voxel_size, at::ArrayRef<double> point_range,
                                 int64_t max_points_per_voxel, int64_t max_voxels) {
  return differentiable_voxelize<VoxelizeResult>(
      ks, points, max_points_per_voxel, [&](const at::Tensor& p, c10::optional<c10::DispatchKeySet> keys) {
        if (!keys) return voxelize_handle().call(p, batch, voxel_size, point_range, max_points_per_voxel, max_voxels);
        return voxelize_handle().redispatch(*keys, p, batch, voxel_size, point_range, max_points_per_voxel,
                                            max_voxels);
      });
}

PaddedResult voxelize_padded_autograd(c10::DispatchKeySet ks, const at::Tensor& points, const OptionalTensor& batch,
                                      at::ArrayRef<double> voxel_size, at::ArrayRef<double> point_range,
                                      int64_t max_points_per_voxel, int64_t max_voxels) {
  return differentiable_voxelize<PaddedResult>(
      ks, points, max_points_per_voxel, [&](const at::Tensor& p, c10::optional<c10::DispatchKeySet> keys) {
        if (!keys) {
          return voxelize_padded_handle().call(p, batch, voxel_size, point_range, max_points_per_voxel, max_voxels);
        }
        return voxelize_padded_handle().redispatch(*keys, p, batch, voxel_size, point_range, max_points_per_voxel,
                                                   max_voxels);
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, Autograd, m) {
  m.impl("voxel_features", &voxel_features_autograd);
  m.impl("_voxel_features_backward", &voxel_features_backward_autograd);
  m.impl("voxelize", &voxelize_autograd);
  m.impl("voxelize_padded", &voxelize_padded_autograd);
}

// ---- vmap
// vmap and the voxelization ops. The number of voxels depends on the points' values, so vmap cannot
// batch voxelize or voxel_features (a clear error here; batch clouds with `batch=` instead). Their
// backward op, run under vmap when a backward is vmapped (jacrev, batched gradients), is linear in
// the features' gradient: its torch formula batches as it is.
namespace {

using OptionalTensor = c10::optional<at::Tensor>;
constexpr const char* kInstead = "voxelize several clouds in one call with `batch=` (a cloud index per point)";

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_batched(
    const at::Tensor&, const OptionalTensor&, at::ArrayRef<double>, at::ArrayRef<double>, int64_t, int64_t) {
  refuse_vmap("voxelize", kInstead);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_padded_batched(
    const at::Tensor&, const OptionalTensor&, at::ArrayRef<double>, at::ArrayRef<double>, int64_t, int64_t) {
  refuse_vmap("voxelize", kInstead);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxel_features_batched(const at::Tensor&,
                                                                                  const OptionalTensor&,
                                                                                  at::ArrayRef<double>,
                                                                                  at::ArrayRef<double>,
                                                                                  c10::string_view) {
  refuse_vmap("voxel_features", kInstead);
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("voxelize", &voxelize_batched);
  m.impl("voxelize_padded", &voxelize_padded_batched);
  m.impl("voxel_features", &voxel_features_batched);
  m.impl("_voxel_features_backward", &voxel_features_backward_formula);
}

}  // namespace voxelize
}  // namespace pointops
