// Voxelization on the CPU: the reference implementation the CUDA kernels must match bit for bit.
//
// The cell keys are computed in parallel; numbering the voxels by their first point and filling
// them is a single in-order pass over the points, which is what makes the result deterministic
// and gives the summation order that the CUDA kernels reproduce (kept points in input order,
// accumulated in opmath_type, then divided by the count).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "voxelize/voxelize.h"

namespace pointops {
namespace voxelize {
namespace {

constexpr int64_t kGrain = 4096;

// A zero-filled CPU tensor without a dispatched fill (the storage is fresh and contiguous).
at::Tensor zero_filled(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty(sizes, options);
  if (t.numel() > 0) std::memset(t.mutable_data_ptr(), 0, t.nbytes());
  return t;
}

// Voxel id of every point in order of first appearance (-1: out of range), the first point of
// every voxel, and the voxel count. Throws on a bad batch index unless `drop_bad_batch`.
struct Assignment {
  std::vector<int32_t> voxel_of_point;
  std::vector<int32_t> first_point;
};

template <typename scalar_t>
Assignment assign_voxels(const at::Tensor& points, const at::Tensor& batch, const Grid& grid, bool drop_bad_batch) {
  using cell_t = typename CellType<scalar_t>::type;
  const CellParams<cell_t> params = make_cell_params<cell_t>(grid);
  const int64_t n = points.size(0), f = points.size(1);
  const scalar_t* pts = points.const_data_ptr<scalar_t>();
  const int64_t* bat = batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr;

  std::vector<int64_t> keys(n);
  const int64_t num_bad = at::parallel_reduce(
      0, n, kGrain, int64_t(0),
      [&](int64_t begin, int64_t end, int64_t bad) {
        for (int64_t i = begin; i < end; ++i) {
          keys[i] = point_key<scalar_t, cell_t>(pts + i * f, bat ? bat[i] : 0, params);
          bad += keys[i] == kBadBatch;
        }
        return bad;
      },
      std::plus<int64_t>());
  if (!drop_bad_batch) check_bad_batch(num_bad, grid);

  // Open addressing with the same hash as the CUDA table; serial, so ids come out in order of
  // first appearance directly.
  const int64_t capacity = table_capacity(n);
  const uint64_t mask = static_cast<uint64_t>(capacity - 1);
  std::vector<int64_t> table_keys(capacity, -1);
  std::vector<int32_t> table_ids(capacity);
  Assignment out;
  out.voxel_of_point.assign(n, -1);
  out.first_point.reserve(n);  // one allocation instead of a doubling series
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i];
    if (key < 0) continue;
    uint64_t slot = fmix64(static_cast<uint64_t>(key)) & mask;
    while (table_keys[slot] != key && table_keys[slot] != -1) slot = (slot + 1) & mask;
    if (table_keys[slot] == -1) {
      table_keys[slot] = key;
      table_ids[slot] = static_cast<int32_t>(out.first_point.size());
      out.first_point.push_back(static_cast<int32_t>(i));
    }
    out.voxel_of_point[i] = table_ids[slot];
  }
  return out;
}

template <typename scalar_t>
void write_coords(const at::Tensor& points, const at::Tensor& batch, const Grid& grid,
                  const std::vector<int32_t>& first_point, int64_t num_voxels, int32_t* coords) {
  using cell_t = typename CellType<scalar_t>::type;
  const CellParams<cell_t> params = make_cell_params<cell_t>(grid);
  const int64_t f = points.size(1), cols = batch.defined() ? 4 : 3;
  const scalar_t* pts = points.const_data_ptr<scalar_t>();
  const int64_t* bat = batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr;
  at::parallel_for(0, num_voxels, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t v = begin; v < end; ++v) {
      const int64_t i = first_point[v];
      int64_t cell[3];
      point_cell<scalar_t, cell_t>(pts + i * f, params, cell);
      int32_t* out = coords + v * cols;
      if (bat) *out++ = static_cast<int32_t>(bat[i]);
      out[0] = static_cast<int32_t>(cell[2]);
      out[1] = static_cast<int32_t>(cell[1]);
      out[2] = static_cast<int32_t>(cell[0]);
    }
  });
}

// Shared by voxelize and voxelize_padded: fills outputs with `rows` voxel rows, of which the first
// min(total voxels, max_voxels) are real and the rest are padding (zeros, coords -1).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t> voxelize_impl(
    const at::Tensor& points_in, const std::optional<at::Tensor>& batch_in, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels, bool padded) {
  const Grid grid = check_voxelize_inputs(points_in, batch_in, voxel_size, point_range);
  check_caps(max_points_per_voxel, max_voxels);
  const at::Tensor points = points_in.contiguous();
  const at::Tensor batch = (batch_in.has_value() && batch_in->defined()) ? batch_in->contiguous() : at::Tensor();
  const int64_t n = points.size(0), f = points.size(1), p = max_points_per_voxel;
  const int64_t cols = batch.defined() ? 4 : 3;
  const auto int_opts = points.options().dtype(at::kInt);

  at::Tensor voxels, coords, num_points, features, point_to_voxel = at::empty({n}, points.options().dtype(at::kLong));
  int64_t kept_voxels = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Assignment a = assign_voxels<scalar_t>(points, batch, grid, /*drop_bad_batch=*/padded);
    const int64_t total = static_cast<int64_t>(a.first_point.size());
    kept_voxels = std::min(total, max_voxels);
    const int64_t rows = padded ? max_voxels : kept_voxels;
    // Allocated uninitialised and filled here: at::zeros / at::full would each add a dispatched
    // fill, which is a measurable share of a small call's host time.
    voxels = zero_filled({rows, p, f}, points.options());
    coords = at::empty({rows, cols}, int_opts);
    std::fill_n(coords.mutable_data_ptr<int32_t>(), rows * cols, int32_t(-1));
    num_points = zero_filled({rows}, int_opts);
    features = zero_filled({rows, f}, points.options());
    std::vector<opmath_t> sums(kept_voxels * f, opmath_t(0));

    const scalar_t* pts = points.const_data_ptr<scalar_t>();
    scalar_t* vox = voxels.mutable_data_ptr<scalar_t>();
    int32_t* counts = num_points.mutable_data_ptr<int32_t>();
    int64_t* p2v = point_to_voxel.mutable_data_ptr<int64_t>();
    // In input order: the rank of a point in its voxel is the number of earlier points there.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = a.voxel_of_point[i];
      if (v < 0 || v >= kept_voxels) {
        p2v[i] = -1;
        continue;
      }
      p2v[i] = v;
      const int64_t rank = counts[v];
      if (rank >= p) continue;  // voxel full: the point keeps its voxel id but is not stored
      counts[v] = static_cast<int32_t>(rank + 1);
      const scalar_t* src = pts + i * f;
      scalar_t* dst = vox + (v * p + rank) * f;
      opmath_t* sum = sums.data() + v * f;
      for (int64_t k = 0; k < f; ++k) {
        dst[k] = src[k];
        sum[k] += static_cast<opmath_t>(src[k]);
      }
    }
    scalar_t* feat = features.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, kept_voxels, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t v = begin; v < end; ++v) {
        const opmath_t count = static_cast<opmath_t>(counts[v]);
        for (int64_t k = 0; k < f; ++k) feat[v * f + k] = static_cast<scalar_t>(sums[v * f + k] / count);
      }
    });
    write_coords<scalar_t>(points, batch, grid, a.first_point, kept_voxels, coords.mutable_data_ptr<int32_t>());
  });
  return {voxels, coords, num_points, features, point_to_voxel, kept_voxels};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_cpu(
    const at::Tensor& points, const std::optional<at::Tensor>& batch, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels) {
  auto [voxels, coords, num_points, features, point_to_voxel, kept] =
      voxelize_impl(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels, /*padded=*/false);
  return {voxels, coords, num_points, features, point_to_voxel};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_padded_cpu(
    const at::Tensor& points, const std::optional<at::Tensor>& batch, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels) {
  auto [voxels, coords, num_points, features, point_to_voxel, kept] =
      voxelize_impl(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels, /*padded=*/true);
  return {voxels, coords, num_points, features, point_to_voxel,
          at::scalar_tensor(kept, points.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxel_features_cpu(
    const at::Tensor& points_in, const std::optional<at::Tensor>& batch_in, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, c10::string_view reduce_name) {
  const Grid grid = check_voxelize_inputs(points_in, batch_in, voxel_size, point_range);
  const Reduce reduce = parse_reduce(std::string_view(reduce_name.data(), reduce_name.size()));
  const at::Tensor points = points_in.contiguous();
  const at::Tensor batch = (batch_in.has_value() && batch_in->defined()) ? batch_in->contiguous() : at::Tensor();
  const int64_t n = points.size(0), f = points.size(1);
  const auto int_opts = points.options().dtype(at::kInt);

  at::Tensor features, coords, num_points, point_to_voxel = at::empty({n}, points.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const Assignment a = assign_voxels<scalar_t>(points, batch, grid, /*drop_bad_batch=*/false);
    const int64_t nv = static_cast<int64_t>(a.first_point.size());
    features = at::empty({nv, f}, points.options());
    coords = at::empty({nv, batch.defined() ? 4 : 3}, int_opts);
    num_points = zero_filled({nv}, int_opts);
    std::vector<opmath_t> acc(nv * f, opmath_t(0));
    const scalar_t* pts = points.const_data_ptr<scalar_t>();
    int32_t* counts = num_points.mutable_data_ptr<int32_t>();
    int64_t* p2v = point_to_voxel.mutable_data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = a.voxel_of_point[i];
      p2v[i] = v;
      if (v < 0) continue;
      const bool first = counts[v]++ == 0;
      opmath_t* dst = acc.data() + v * f;
      for (int64_t k = 0; k < f; ++k) {
        const opmath_t x = static_cast<opmath_t>(pts[i * f + k]);
        dst[k] = reduce != Reduce::kMax ? dst[k] + x : (first ? x : max_step(dst[k], x));
      }
    }
    scalar_t* feat = features.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, nv, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t v = begin; v < end; ++v) {
        const opmath_t count = static_cast<opmath_t>(counts[v]);
        for (int64_t k = 0; k < f; ++k) {
          const opmath_t x = acc[v * f + k];
          feat[v * f + k] = static_cast<scalar_t>(reduce == Reduce::kMean ? x / count : x);
        }
      }
    });
    write_coords<scalar_t>(points, batch, grid, a.first_point, nv, coords.mutable_data_ptr<int32_t>());
  });
  return {features, coords, num_points, point_to_voxel};
}

// d features[v] / d points[i] for the points of voxel v: 1 (sum), 1 / count (mean), and for max 1
// for the first point (input order) that attains the maximum, per feature column.
at::Tensor voxel_features_backward_cpu(const at::Tensor& grad_features_in, const at::Tensor& points_in,
                                       const at::Tensor& point_to_voxel_in, const at::Tensor& num_points_in,
                                       const at::Tensor& features_in, c10::string_view reduce_name) {
  check_voxel_features_backward_inputs(grad_features_in, points_in, point_to_voxel_in, num_points_in, features_in);
  const Reduce reduce = parse_reduce(std::string_view(reduce_name.data(), reduce_name.size()));
  const at::Tensor grad = grad_features_in.contiguous(), points = points_in.contiguous();
  const at::Tensor p2v_t = point_to_voxel_in.contiguous(), counts_t = num_points_in.contiguous();
  const at::Tensor features = features_in.contiguous();
  const int64_t n = points.size(0), f = points.size(1), nv = features.size(0);
  at::Tensor grad_points = at::zeros_like(points);
  if (n == 0) return grad_points;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_backward_cpu", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    const int64_t* p2v = p2v_t.const_data_ptr<int64_t>();
    const int32_t* counts = counts_t.const_data_ptr<int32_t>();
    scalar_t* out = grad_points.mutable_data_ptr<scalar_t>();
    if (reduce != Reduce::kMax) {
      at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t v = p2v[i];
          if (v < 0) continue;
          TORCH_CHECK(v < nv, "_voxel_features_backward: point_to_voxel holds ", v, " but there are ", nv, " voxels");
          for (int64_t k = 0; k < f; ++k) {
            const opmath_t x = static_cast<opmath_t>(g[v * f + k]);
            out[i * f + k] = static_cast<scalar_t>(reduce == Reduce::kMean ? x / static_cast<opmath_t>(counts[v]) : x);
          }
        }
      });
      return;
    }
    const scalar_t* pts = points.const_data_ptr<scalar_t>();
    const scalar_t* feat = features.const_data_ptr<scalar_t>();
    std::vector<uint8_t> taken(nv * f, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t v = p2v[i];
      if (v < 0) continue;
      TORCH_CHECK(v < nv, "_voxel_features_backward: point_to_voxel holds ", v, " but there are ", nv, " voxels");
      for (int64_t k = 0; k < f; ++k) {
        const scalar_t x = pts[i * f + k], m = feat[v * f + k];
        const bool hit = x == m || (is_nan(static_cast<opmath_t>(x)) && is_nan(static_cast<opmath_t>(m)));
        if (hit && !taken[v * f + k]) {
          taken[v * f + k] = 1;
          out[i * f + k] = g[v * f + k];
        }
      }
    }
  });
  return grad_points;
}

}  // namespace
}  // namespace voxelize
}  // namespace pointops

TORCH_LIBRARY_IMPL(pointops, CPU, m) {
  m.impl("voxelize", &pointops::voxelize::voxelize_cpu);
  m.impl("voxelize_padded", &pointops::voxelize::voxelize_padded_cpu);
  m.impl("voxel_features", &pointops::voxelize::voxel_features_cpu);
  m.impl("_voxel_features_backward", &pointops::voxelize::voxel_features_backward_cpu);
}
