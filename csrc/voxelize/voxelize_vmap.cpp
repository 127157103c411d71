// vmap and the voxelization ops. The number of voxels depends on the points' values, so vmap cannot
// batch voxelize or voxel_features (a clear error here; batch clouds with `batch=` instead). Their
// backward op, run under vmap when a backward is vmapped (jacrev, batched gradients), is linear in
// the features' gradient: its torch formula batches as it is.
#include <torch/library.h>

#include "common/vmap.h"
#include "voxelize/voxelize_formulas.h"

namespace pointops {
namespace voxelize {
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
