// Voxelization: the input checks and the cell arithmetic shared by the CPU and CUDA launchers.
//
// Both backends turn a point into a cell and a 64-bit key with the functions in this header, so
// they agree bit for bit on which voxel a point falls in (including the rounding edge at max).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include "common/checks.h"
#include "common/hash_table.h"

#if defined(__CUDACC__)
#define POINTOPS_HD __host__ __device__ __forceinline__
#else
#define POINTOPS_HD inline
#endif

namespace pointops {
namespace voxelize {

// Point indices, voxel ids and table slots are int32 inside the kernels: N <= 2^30 keeps every
// one of them (and the hash capacity, a power of two <= 2^31) representable.
constexpr int64_t kMaxPoints = int64_t(1) << 30;

// point_key results that are not keys (keys are >= 0).
constexpr int64_t kOutOfRange = -1;
constexpr int64_t kBadBatch = -2;

enum class Reduce : int { kSum = 0, kMean = 1, kMax = 2 };

// The grid as the host computes it from the op arguments (double precision, as given).
struct Grid {
  double min[3];
  double size[3];
  int64_t dims[3];    // cells along x, y, z: round((max - min) / size)
  int64_t cells;      // dims[0] * dims[1] * dims[2]
  int64_t max_batch;  // the largest batch index whose key (and int32 coordinate) fits
};

// Cells are computed in float32 for float16/bfloat16/float32 points and in float64 for float64,
// the arithmetic the reference voxel counts of the LiDAR data were computed with.
template <typename scalar_t>
struct CellType {
  using type = float;
};
template <>
struct CellType<double> {
  using type = double;
};

// What a kernel needs to compute cells: min and size already rounded to the cell type.
template <typename cell_t>
struct CellParams {
  cell_t min[3];
  cell_t size[3];
  int64_t dims[3];
  int64_t max_batch;
};

template <typename cell_t>
inline CellParams<cell_t> make_cell_params(const Grid& grid) {
  CellParams<cell_t> p;
  for (int k = 0; k < 3; ++k) {
    p.min[k] = static_cast<cell_t>(grid.min[k]);
    p.size[k] = static_cast<cell_t>(grid.size[k]);
    p.dims[k] = grid.dims[k];
  }
  p.max_batch = grid.max_batch;
  return p;
}

POINTOPS_HD float floor_cell(float v) { return floorf(v); }
POINTOPS_HD double floor_cell(double v) { return ::floor(v); }

// floor((coord - min) / size), or -1 when it is outside [0, dim) or not a number. The comparison
// is written so that NaN fails it, and the float is converted to an integer only once it is known
// to be in range (converting NaN or a huge float is undefined behaviour).
template <typename cell_t>
POINTOPS_HD int64_t cell_index(cell_t coord, cell_t min, cell_t size, int64_t dim) {
  const cell_t c = floor_cell((coord - min) / size);
  if (!(c >= cell_t(0) && static_cast<double>(c) < static_cast<double>(dim))) return -1;
  return static_cast<int64_t>(c);
}

// The (x, y, z) cell of one point row; false when it is out of range on any axis.
template <typename scalar_t, typename cell_t>
POINTOPS_HD bool point_cell(const scalar_t* row, const CellParams<cell_t>& g, int64_t cell[3]) {
  for (int k = 0; k < 3; ++k) {
    cell[k] = cell_index<cell_t>(static_cast<cell_t>(row[k]), g.min[k], g.size[k], g.dims[k]);
    if (cell[k] < 0) return false;
  }
  return true;
}

// The flattened key ((b * Z + z) * Y + y) * X + x of point `row` (batch index b), kOutOfRange, or
// kBadBatch when b is negative or beyond g.max_batch. check_voxelize_inputs proves it cannot
// overflow for b <= max_batch.
template <typename scalar_t, typename cell_t>
POINTOPS_HD int64_t point_key(const scalar_t* row, int64_t b, const CellParams<cell_t>& g) {
  if (b < 0 || b > g.max_batch) return kBadBatch;
  int64_t cell[3];
  if (!point_cell(row, g, cell)) return kOutOfRange;
  return ((b * g.dims[2] + cell[2]) * g.dims[1] + cell[1]) * g.dims[0] + cell[0];
}

// A NaN test that compiles the same for host and device code (and for half via opmath_t).
template <typename T>
POINTOPS_HD bool is_nan(T x) {
  return x != x;
}

// One step of the max reduction, the same on both backends: NaN propagates (the first NaN met is
// kept, as in torch.amax), otherwise the larger value, the earlier one on ties.
template <typename T>
POINTOPS_HD T max_step(T acc, T x) {
  return (is_nan(x) || x > acc) && !is_nan(acc) ? x : acc;
}

// fmix64 and table_capacity: common/hash_table.h.

// ---- Checks shared by the CPU and CUDA launchers (mirrored by the Python fake kernels) ----

inline Grid check_voxelize_inputs(const at::Tensor& points, const std::optional<at::Tensor>& batch,
                                  at::ArrayRef<double> voxel_size, at::ArrayRef<double> point_range) {
  TORCH_CHECK(points.defined(), "voxelize: points must be a tensor, got an undefined tensor");
  check_floating_point(points, "voxelize: points");
  check_dim(points, 2, "voxelize: points", "(N, F)");
  TORCH_CHECK(points.size(1) >= 3, "voxelize: points must have F >= 3 columns (x, y, z first), got shape ",
              points.sizes());
  TORCH_CHECK(points.size(0) <= kMaxPoints, "voxelize: points has ", points.size(0),
              " points; at most 2^30 are supported (int32 indices inside the kernels)");
  if (batch.has_value() && batch->defined()) {
    const at::Tensor& b = *batch;
    TORCH_CHECK(b.scalar_type() == at::kLong, "voxelize: batch must be an int64 tensor, got ", b.scalar_type());
    TORCH_CHECK(b.dim() == 1 && b.size(0) == points.size(0), "voxelize: batch must have shape (N,) = (",
                points.size(0), ",) to match points, got shape ", b.sizes());
    check_same_device(b, points, "voxelize: batch", "points");
  }
  TORCH_CHECK(voxel_size.size() == 3, "voxelize: voxel_size must have 3 values (x, y, z), got ",
              voxel_size.size());
  TORCH_CHECK(point_range.size() == 6,
              "voxelize: point_range must have 6 values (x_min, y_min, z_min, x_max, y_max, z_max), got ",
              point_range.size());
  Grid grid;
  const char* axis[3] = {"x", "y", "z"};
  grid.cells = 1;
  for (int k = 0; k < 3; ++k) {
    const double size = voxel_size[k], lo = point_range[k], hi = point_range[k + 3];
    TORCH_CHECK(std::isfinite(size) && size > 0, "voxelize: voxel_size must be positive and finite, got ",
                size, " for ", axis[k]);
    TORCH_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi,
                "voxelize: point_range must have min < max (both finite), got min ", lo, " >= max ", hi,
                " for ", axis[k]);
    const double cells = std::round((hi - lo) / size);
    TORCH_CHECK(cells >= 1, "voxelize: the grid has no cells along ", axis[k], ": round((max - min) / size) = round((",
                hi, " - ", lo, ") / ", size, ") = 0");
    TORCH_CHECK(cells <= static_cast<double>(std::numeric_limits<int32_t>::max()), "voxelize: the grid has ", cells,
                " cells along ", axis[k], "; coordinates are int32, so at most 2^31 - 1");
    grid.min[k] = lo;
    grid.size[k] = size;
    grid.dims[k] = static_cast<int64_t>(cells);
    TORCH_CHECK(grid.cells <= std::numeric_limits<int64_t>::max() / grid.dims[k],
                "voxelize: the grid is too large: ", grid.dims[0], " x ", grid.dims[1], " x ", grid.dims[2],
                " (x, y, z) cells would overflow the 64-bit flattened cell key; use larger voxels or a smaller range");
    grid.cells *= grid.dims[k];
  }
  // b * cells + (cells - 1) <= INT64_MAX  <=>  b <= INT64_MAX / cells - 1 (integer division rounds down).
  grid.max_batch = std::min<int64_t>(std::numeric_limits<int64_t>::max() / grid.cells - 1,
                                     std::numeric_limits<int32_t>::max());
  return grid;
}

inline void check_caps(int64_t max_points_per_voxel, int64_t max_voxels) {
  TORCH_CHECK(max_points_per_voxel >= 1, "voxelize: max_points_per_voxel must be >= 1, got ", max_points_per_voxel);
  TORCH_CHECK(max_voxels >= 1, "voxelize: max_voxels must be >= 1, got ", max_voxels);
  TORCH_CHECK(max_points_per_voxel <= std::numeric_limits<int32_t>::max(),
              "voxelize: max_points_per_voxel must fit in int32, got ", max_points_per_voxel);
}

inline Reduce parse_reduce(std::string_view reduce) {
  if (reduce == "sum") return Reduce::kSum;
  if (reduce == "mean") return Reduce::kMean;
  if (reduce == "max") return Reduce::kMax;
  TORCH_CHECK(false, "voxel_features: reduce must be 'mean', 'sum' or 'max', got '", std::string(reduce), "'");
  return Reduce::kSum;
}

inline void check_bad_batch(int64_t num_bad, const Grid& grid) {
  TORCH_CHECK(num_bad == 0, "voxelize: batch must hold indices in [0, ", grid.max_batch, "], got ", num_bad,
              " point(s) with a batch index outside it");
}

inline void check_voxel_features_backward_inputs(const at::Tensor& grad_features, const at::Tensor& points,
                                                 const at::Tensor& point_to_voxel, const at::Tensor& num_points,
                                                 const at::Tensor& features) {
  check_floating_point(points, "_voxel_features_backward: points");
  check_dim(points, 2, "_voxel_features_backward: points", "(N, F)");
  check_dim(grad_features, 2, "_voxel_features_backward: grad_features", "(V, F)");
  TORCH_CHECK(grad_features.sizes() == features.sizes() && features.size(1) == points.size(1),
              "_voxel_features_backward: grad_features and features must have shape (V, F) with F = ",
              points.size(1), ", got ", grad_features.sizes(), " and ", features.sizes());
  TORCH_CHECK(point_to_voxel.scalar_type() == at::kLong && point_to_voxel.dim() == 1 &&
                  point_to_voxel.size(0) == points.size(0),
              "_voxel_features_backward: point_to_voxel must be int64 of shape (N,) = (", points.size(0),
              ",), got ", point_to_voxel.scalar_type(), " ", point_to_voxel.sizes());
  TORCH_CHECK(num_points.scalar_type() == at::kInt && num_points.dim() == 1 &&
                  num_points.size(0) == features.size(0),
              "_voxel_features_backward: num_points must be int32 of shape (V,) = (", features.size(0),
              ",), got ", num_points.scalar_type(), " ", num_points.sizes());
  check_same_dtype(grad_features, points, "_voxel_features_backward: grad_features", "points");
  check_same_dtype(features, points, "_voxel_features_backward: features", "points");
  for (const at::Tensor* t : {&grad_features, &point_to_voxel, &num_points, &features}) {
    check_same_device(*t, points, "_voxel_features_backward: every tensor", "points");
  }
}

}  // namespace voxelize
}  // namespace pointops
