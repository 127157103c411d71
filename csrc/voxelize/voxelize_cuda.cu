// Voxelization on CUDA: an open-addressing hash table of cell keys, then first-appearance order.
//
// Pipeline (one thread per point unless noted; every buffer is a torch tensor on the current
// stream):
//   init_table    keys = empty, first = INT32_MAX                        (one thread per slot)
//   insert        key of the point's cell -> atomicCAS insert with linear probing (bounded by the
//                 capacity), atomicMin(first[slot], i): the voxel's first point
//   mark_first    flag[i] = (i is the first point of its voxel)
//   cumsum        voxel id of a first point = number of first points before it: ids in order of
//                 first appearance, independent of the order the atomics ran in
//   assign        point_to_voxel[i], per-voxel point counts (integer atomics: order-independent)
//   cumsum        CSR offsets of the voxels
//   fill_csr      the points of each voxel, in arbitrary order (the set is deterministic)
//   -- voxelize: one host sync to learn V (none in voxelize_padded) --
//   gather        one warp per voxel: selects the P smallest point indices of the voxel in
//                 increasing order (input order), copies those rows, sums them in input order in
//                 opmath_t and divides: bit-identical to the CPU loop
// voxel_features instead stable-sorts point_to_voxel and reduces every point of a voxel in input
// order, one warp per voxel, one lane per feature column.
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "common/cuda_utils.cuh"
#include "voxelize/voxelize.h"

namespace pointops {
namespace voxelize {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// Keys are >= 0, so all-ones (the int64 -1) never collides with a real key.
constexpr unsigned long long kEmptyKey = ~0ull;
constexpr int32_t kNoPoint = std::numeric_limits<int32_t>::max();

__global__ void init_table_kernel(unsigned long long* __restrict__ keys, int32_t* __restrict__ first,
                                  int64_t capacity, int32_t* __restrict__ status) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < capacity; s += stride) {
    keys[s] = kEmptyKey;
    first[s] = kNoPoint;
  }
  if (blockIdx.x == 0 && threadIdx.x < 2) status[threadIdx.x] = 0;
}

// status[1] counts points with a bad batch index (an error for the exact ops, dropped by the
// padded one, which cannot raise without a sync).
template <typename scalar_t, typename cell_t>
__global__ void insert_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                              const int64_t* __restrict__ batch, int64_t n, CellParams<cell_t> grid,
                              unsigned long long* __restrict__ keys, int32_t* __restrict__ first,
                              uint64_t mask, int32_t* __restrict__ slot_of_point, int32_t* __restrict__ status) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t key = point_key<scalar_t, cell_t>(points + i * num_features, batch ? batch[i] : 0, grid);
    int32_t slot = -1;
    if (key >= 0) {
      uint64_t h = fmix64(static_cast<uint64_t>(key)) & mask;
      // At most N distinct keys in a table of >= 2N slots: an empty slot or the key is always found;
      // the bound only makes "can never loop forever" true by construction.
      for (uint64_t probe = 0; probe <= mask; ++probe) {
        unsigned long long current = keys[h];
        if (current == kEmptyKey) current = atomicCAS(&keys[h], kEmptyKey, static_cast<unsigned long long>(key));
        if (current == kEmptyKey || current == static_cast<unsigned long long>(key)) {
          atomicMin(&first[h], static_cast<int32_t>(i));
          slot = static_cast<int32_t>(h);
          break;
        }
        h = (h + 1) & mask;
      }
    } else if (key == kBadBatch) {
      atomicAdd(&status[1], 1);
    }
    slot_of_point[i] = slot;
  }
}

// Also zeroes the per-voxel counts (sized N, an upper bound on V) that `assign` accumulates into.
__global__ void mark_first_kernel(const int32_t* __restrict__ slot_of_point, const int32_t* __restrict__ first,
                                  int64_t n, int32_t* __restrict__ is_first, int32_t* __restrict__ counts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int32_t slot = slot_of_point[i];
    is_first[i] = slot >= 0 && first[slot] == static_cast<int32_t>(i);
    counts[i] = 0;
  }
}

// voxel id = (inclusive count of first points up to the voxel's first point) - 1. Voxels with an
// id >= cap are dropped (-1). status[0] = total voxel count; num_voxels (padded op) = min(total, cap).
__global__ void assign_kernel(const int32_t* __restrict__ slot_of_point, const int32_t* __restrict__ first,
                              const int32_t* __restrict__ first_rank, int64_t n, int64_t cap,
                              int64_t* __restrict__ point_to_voxel, int32_t* __restrict__ counts,
                              int32_t* __restrict__ status, int64_t* __restrict__ num_voxels) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int32_t slot = slot_of_point[i];
    int64_t voxel = -1;
    if (slot >= 0) {
      const int64_t id = first_rank[first[slot]] - 1;
      if (id < cap) {
        voxel = id;
        atomicAdd(&counts[id], 1);
      }
    }
    point_to_voxel[i] = voxel;
    if (i == n - 1) {
      status[0] = first_rank[n - 1];
      if (num_voxels) *num_voxels = std::min<int64_t>(first_rank[n - 1], cap);
    }
  }
}

// `cursor` enters as the inclusive prefix sum of the counts and leaves as the exclusive one.
__global__ void fill_csr_kernel(const int64_t* __restrict__ point_to_voxel, int64_t n, int32_t* __restrict__ cursor,
                                int32_t* __restrict__ members) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t v = point_to_voxel[i];
    if (v >= 0) members[atomicSub(&cursor[v], 1) - 1] = static_cast<int32_t>(i);
  }
}

__device__ __forceinline__ int32_t warp_min(int32_t x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x = min(x, __shfl_xor_sync(kFullMask, x, offset));
  return x;
}

template <typename scalar_t, typename cell_t>
__device__ __forceinline__ void write_coords(const scalar_t* row, const int64_t* batch, int64_t point,
                                             const CellParams<cell_t>& grid, int32_t* out) {
  int64_t cell[3];
  point_cell<scalar_t, cell_t>(row, grid, cell);
  if (batch) *out++ = static_cast<int32_t>(batch[point]);
  out[0] = static_cast<int32_t>(cell[2]);
  out[1] = static_cast<int32_t>(cell[1]);
  out[2] = static_cast<int32_t>(cell[0]);
}

// One warp per output row. Rows >= the real voxel count (read from the device in the padded op)
// are padding: zeros, coords -1.
template <typename scalar_t, typename cell_t>
__global__ void gather_voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                                     const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                                     const int32_t* __restrict__ members, const int32_t* __restrict__ starts,
                                     const int32_t* __restrict__ counts, const int32_t* __restrict__ device_total,
                                     int64_t cap, int64_t rows, int32_t max_points, int coord_cols,
                                     scalar_t* __restrict__ voxels, int32_t* __restrict__ coords,
                                     int32_t* __restrict__ num_points, scalar_t* __restrict__ features) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t real = device_total ? std::min<int64_t>(*device_total, cap) : rows;
  const int64_t F = num_features, row_elems = static_cast<int64_t>(max_points) * F;
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; v < rows;
       v += total_warps) {
    scalar_t* voxel = voxels + v * row_elems;
    if (v >= real) {
      for (int64_t e = lane; e < row_elems; e += kWarp) voxel[e] = scalar_t(0);
      for (int64_t k = lane; k < F; k += kWarp) features[v * F + k] = scalar_t(0);
      if (lane < coord_cols) coords[v * coord_cols + lane] = -1;
      if (lane == 0) num_points[v] = 0;
      continue;
    }
    const int32_t count = counts[v], start = starts[v];
    const int32_t kept = min(count, max_points);
    // Most voxels hold <= 32 points: one member per lane, kept in a register across the rounds.
    const int32_t mine = lane < count ? members[start + lane] : kNoPoint;
    int32_t last = -1;
    for (int32_t r = 0; r < kept; ++r) {
      // Round r selects the smallest point index above the previous round's: the r-th point of the
      // voxel in input order.
      int32_t best = mine > last ? mine : kNoPoint;
      for (int32_t j = lane + kWarp; j < count; j += kWarp) {
        const int32_t idx = members[start + j];
        if (idx > last && idx < best) best = idx;
      }
      best = warp_min(best);
      last = best;
      const scalar_t* src = points + static_cast<int64_t>(best) * F;
      for (int64_t k = lane; k < F; k += kWarp) voxel[r * F + k] = src[k];
      if (r == 0 && lane == 0) write_coords(src, batch, best, grid, coords + v * coord_cols);
    }
    __syncwarp();  // the rows written above by other lanes are read back below
    for (int64_t k = lane; k < F; k += kWarp) {
      opmath_t sum = 0;
      for (int32_t r = 0; r < kept; ++r) sum += static_cast<opmath_t>(voxel[r * F + k]);
      features[v * F + k] = static_cast<scalar_t>(sum / static_cast<opmath_t>(kept));
    }
    for (int64_t e = static_cast<int64_t>(kept) * F + lane; e < row_elems; e += kWarp) voxel[e] = scalar_t(0);
    if (lane == 0) num_points[v] = kept;
  }
}

// One warp per voxel; lane k reduces feature column k over the voxel's points in input order
// (`order` is point_to_voxel stable-sorted: out-of-range points first, then voxel 0, 1, ...).
template <typename scalar_t, typename cell_t>
__global__ void reduce_voxels_kernel(const scalar_t* __restrict__ points, int64_t num_features,
                                     const int64_t* __restrict__ batch, CellParams<cell_t> grid,
                                     const int64_t* __restrict__ order, const int32_t* __restrict__ ends,
                                     const int32_t* __restrict__ counts, int64_t num_voxels, int64_t n, Reduce reduce,
                                     int coord_cols, scalar_t* __restrict__ features, int32_t* __restrict__ coords,
                                     int32_t* __restrict__ num_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int lane = threadIdx.x % kWarp;
  const int64_t total_warps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
  const int64_t F = num_features;
  const int64_t base = n - ends[num_voxels - 1];  // the out-of-range points sorted first
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; v < num_voxels;
       v += total_warps) {
    const int32_t count = counts[v];
    const int64_t start = base + ends[v] - count;
    for (int64_t k0 = 0; k0 < F; k0 += kWarp) {
      const int64_t k = k0 + lane;
      opmath_t acc = 0;
      for (int32_t j0 = 0; j0 < count; j0 += kWarp) {
        // Lanes load 32 member indices at once (coalesced), then broadcast them in order.
        const int64_t mine = j0 + lane < count ? order[start + j0 + lane] : 0;
        const int m = min(kWarp, count - j0);
        for (int jj = 0; jj < m; ++jj) {
          const int64_t idx = __shfl_sync(kFullMask, mine, jj);
          if (k < F) {
            const opmath_t x = static_cast<opmath_t>(points[idx * F + k]);
            acc = reduce != Reduce::kMax ? acc + x : (j0 + jj == 0 ? x : max_step(acc, x));
          }
        }
      }
      if (k < F) features[v * F + k] = static_cast<scalar_t>(reduce == Reduce::kMean ? acc / static_cast<opmath_t>(count) : acc);
    }
    if (lane == 0) {
      const int64_t first = order[start];
      write_coords(points + first * F, batch, first, grid, coords + v * coord_cols);
      num_points[v] = count;
    }
  }
}

template <typename scalar_t>
__global__ void sum_mean_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ point_to_voxel,
                                         const int32_t* __restrict__ counts, int64_t n, int64_t num_features,
                                         bool mean, scalar_t* __restrict__ grad_points) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, total = n * num_features;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t v = point_to_voxel[e / num_features], k = e % num_features;
    opmath_t g = 0;
    if (v >= 0) {
      g = static_cast<opmath_t>(grad[v * num_features + k]);
      if (mean) g = g / static_cast<opmath_t>(counts[v]);
    }
    grad_points[e] = static_cast<scalar_t>(g);
  }
}

// The first point (smallest index) of each voxel and column whose value is the max: integer
// atomicMin, so the winner does not depend on the order the threads ran in.
template <typename scalar_t>
__global__ void max_argmin_kernel(const scalar_t* __restrict__ points, const scalar_t* __restrict__ features,
                                  const int64_t* __restrict__ point_to_voxel, int64_t n, int64_t num_features,
                                  int32_t* __restrict__ winner) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, total = n * num_features;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / num_features, k = e % num_features, v = point_to_voxel[i];
    if (v < 0) continue;
    const opmath_t x = static_cast<opmath_t>(points[e]), m = static_cast<opmath_t>(features[v * num_features + k]);
    if (x == m || (is_nan(x) && is_nan(m))) atomicMin(&winner[v * num_features + k], static_cast<int32_t>(i));
  }
}

template <typename scalar_t>
__global__ void max_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ point_to_voxel,
                                    const int32_t* __restrict__ winner, int64_t n, int64_t num_features,
                                    scalar_t* __restrict__ grad_points) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x, total = n * num_features;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / num_features, k = e % num_features, v = point_to_voxel[i];
    const bool wins = v >= 0 && winner[v * num_features + k] == static_cast<int32_t>(i);
    grad_points[e] = wins ? grad[v * num_features + k] : scalar_t(0);
  }
}

// The shared front half: hash insert, first-appearance ids, point_to_voxel and per-voxel counts.
struct Assigned {
  at::Tensor point_to_voxel;  // (N,) int64
  at::Tensor counts;          // (N,) int32, the first min(V, cap) entries are the voxel counts
  at::Tensor status;          // (2,) int32 on the device: total voxels, bad batch indices
};

Assigned assign_voxels(const at::Tensor& points, const at::Tensor& batch, const Grid& grid, int64_t cap,
                       int64_t* num_voxels_out) {
  const int64_t n = points.size(0), f = points.size(1);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto int_opts = points.options().dtype(at::kInt);
  const int64_t capacity = table_capacity(n);
  at::Tensor keys = at::empty({capacity}, points.options().dtype(at::kLong));
  at::Tensor first = at::empty({capacity}, int_opts);
  at::Tensor slot_of_point = at::empty({n}, int_opts);
  at::Tensor is_first = at::empty({n}, int_opts);
  Assigned out{at::empty({n}, points.options().dtype(at::kLong)), at::empty({n}, int_opts), at::empty({2}, int_opts)};
  auto* keys_ptr = reinterpret_cast<unsigned long long*>(keys.mutable_data_ptr<int64_t>());

  init_table_kernel<<<grid_for(capacity, kThreads), kThreads, 0, stream>>>(
      keys_ptr, first.mutable_data_ptr<int32_t>(), capacity, out.status.mutable_data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_insert_cuda", [&] {
    using cell_t = typename CellType<scalar_t>::type;
    insert_kernel<scalar_t, cell_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr, n,
        make_cell_params<cell_t>(grid), keys_ptr, first.mutable_data_ptr<int32_t>(),
        static_cast<uint64_t>(capacity - 1), slot_of_point.mutable_data_ptr<int32_t>(),
        out.status.mutable_data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  mark_first_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      slot_of_point.const_data_ptr<int32_t>(), first.const_data_ptr<int32_t>(), n,
      is_first.mutable_data_ptr<int32_t>(), out.counts.mutable_data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor first_rank = at::cumsum(is_first, 0, at::kInt);
  assign_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      slot_of_point.const_data_ptr<int32_t>(), first.const_data_ptr<int32_t>(), first_rank.const_data_ptr<int32_t>(),
      n, cap, out.point_to_voxel.mutable_data_ptr<int64_t>(), out.counts.mutable_data_ptr<int32_t>(),
      out.status.mutable_data_ptr<int32_t>(), num_voxels_out);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_cuda_impl(
    const at::Tensor& points_in, const std::optional<at::Tensor>& batch_in, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels, bool padded) {
  const Grid grid = check_voxelize_inputs(points_in, batch_in, voxel_size, point_range);
  check_caps(max_points_per_voxel, max_voxels);
  const c10::cuda::CUDAGuard guard(points_in.device());
  const at::Tensor points = points_in.contiguous();
  const at::Tensor batch = (batch_in.has_value() && batch_in->defined()) ? batch_in->contiguous() : at::Tensor();
  const int64_t n = points.size(0), f = points.size(1), p = max_points_per_voxel;
  const int cols = batch.defined() ? 4 : 3;
  const auto int_opts = points.options().dtype(at::kInt);
  // Only the padded op returns the count (a 0-d device tensor, written by assign_kernel).
  at::Tensor num_voxels = padded ? at::empty({}, points.options().dtype(at::kLong)) : at::Tensor();

  if (n == 0) {
    const int64_t rows = padded ? max_voxels : 0;
    return {at::zeros({rows, p, f}, points.options()), at::full({rows, cols}, -1, int_opts),
            at::zeros({rows}, int_opts), at::zeros({rows, f}, points.options()),
            at::empty({0}, points.options().dtype(at::kLong)),
            padded ? num_voxels.zero_() : num_voxels};
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t cap = std::min(max_voxels, n);
  Assigned a = assign_voxels(points, batch, grid, cap, padded ? num_voxels.mutable_data_ptr<int64_t>() : nullptr);
  at::Tensor cursor = at::cumsum(a.counts, 0, at::kInt);
  at::Tensor members = at::empty({n}, int_opts);
  fill_csr_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      a.point_to_voxel.const_data_ptr<int64_t>(), n, cursor.mutable_data_ptr<int32_t>(),
      members.mutable_data_ptr<int32_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  int64_t rows = max_voxels;
  const int32_t* device_total = nullptr;
  if (padded) {
    device_total = a.status.const_data_ptr<int32_t>();
  } else {
    // The one host sync: V sizes the outputs.
    const at::Tensor host_status = a.status.to(at::kCPU);
    check_bad_batch(host_status.const_data_ptr<int32_t>()[1], grid);
    rows = std::min<int64_t>(host_status.const_data_ptr<int32_t>()[0], max_voxels);
  }
  at::Tensor voxels = at::empty({rows, p, f}, points.options());
  at::Tensor coords = at::empty({rows, cols}, int_opts);
  at::Tensor num_points = at::empty({rows}, int_opts);
  at::Tensor features = at::empty({rows, f}, points.options());
  if (rows > 0) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxelize_gather_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      gather_voxels_kernel<scalar_t, cell_t><<<grid_for(rows * kWarp, kThreads), kThreads, 0, stream>>>(
          points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr,
          make_cell_params<cell_t>(grid), members.const_data_ptr<int32_t>(), cursor.const_data_ptr<int32_t>(),
          a.counts.const_data_ptr<int32_t>(), device_total, cap, rows, static_cast<int32_t>(p), cols,
          voxels.mutable_data_ptr<scalar_t>(), coords.mutable_data_ptr<int32_t>(),
          num_points.mutable_data_ptr<int32_t>(), features.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {voxels, coords, num_points, features, a.point_to_voxel, num_voxels};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_cuda(
    const at::Tensor& points, const std::optional<at::Tensor>& batch, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels) {
  auto [voxels, coords, num_points, features, point_to_voxel, num_voxels] =
      voxelize_cuda_impl(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels, /*padded=*/false);
  return {voxels, coords, num_points, features, point_to_voxel};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxelize_padded_cuda(
    const at::Tensor& points, const std::optional<at::Tensor>& batch, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, int64_t max_points_per_voxel, int64_t max_voxels) {
  return voxelize_cuda_impl(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels, /*padded=*/true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> voxel_features_cuda(
    const at::Tensor& points_in, const std::optional<at::Tensor>& batch_in, at::ArrayRef<double> voxel_size,
    at::ArrayRef<double> point_range, c10::string_view reduce_name) {
  const Grid grid = check_voxelize_inputs(points_in, batch_in, voxel_size, point_range);
  const Reduce reduce = parse_reduce(std::string_view(reduce_name.data(), reduce_name.size()));
  const c10::cuda::CUDAGuard guard(points_in.device());
  const at::Tensor points = points_in.contiguous();
  const at::Tensor batch = (batch_in.has_value() && batch_in->defined()) ? batch_in->contiguous() : at::Tensor();
  const int64_t n = points.size(0), f = points.size(1);
  const int cols = batch.defined() ? 4 : 3;
  const auto int_opts = points.options().dtype(at::kInt);
  if (n == 0) {
    return {at::empty({0, f}, points.options()), at::empty({0, cols}, int_opts), at::empty({0}, int_opts),
            at::empty({0}, points.options().dtype(at::kLong))};
  }
  const auto stream = c10::cuda::getCurrentCUDAStream();
  Assigned a = assign_voxels(points, batch, grid, /*cap=*/n, nullptr);
  const at::Tensor host_status = a.status.to(at::kCPU);  // V sizes the outputs
  check_bad_batch(host_status.const_data_ptr<int32_t>()[1], grid);
  const int64_t nv = host_status.const_data_ptr<int32_t>()[0];
  at::Tensor features = at::empty({nv, f}, points.options());
  at::Tensor coords = at::empty({nv, cols}, int_opts);
  at::Tensor num_points = at::empty({nv}, int_opts);
  if (nv > 0) {
    const at::Tensor ends = at::cumsum(a.counts, 0, at::kInt);
    const at::Tensor order = std::get<1>(at::sort(a.point_to_voxel, /*stable=*/true, /*dim=*/0, /*descending=*/false));
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_cuda", [&] {
      using cell_t = typename CellType<scalar_t>::type;
      reduce_voxels_kernel<scalar_t, cell_t><<<grid_for(nv * kWarp, kThreads), kThreads, 0, stream>>>(
          points.const_data_ptr<scalar_t>(), f, batch.defined() ? batch.const_data_ptr<int64_t>() : nullptr,
          make_cell_params<cell_t>(grid), order.const_data_ptr<int64_t>(), ends.const_data_ptr<int32_t>(),
          a.counts.const_data_ptr<int32_t>(), nv, n, reduce, cols, features.mutable_data_ptr<scalar_t>(),
          coords.mutable_data_ptr<int32_t>(), num_points.mutable_data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {features, coords, num_points, a.point_to_voxel};
}

at::Tensor voxel_features_backward_cuda(const at::Tensor& grad_features_in, const at::Tensor& points_in,
                                        const at::Tensor& point_to_voxel_in, const at::Tensor& num_points_in,
                                        const at::Tensor& features_in, c10::string_view reduce_name) {
  check_voxel_features_backward_inputs(grad_features_in, points_in, point_to_voxel_in, num_points_in, features_in);
  const Reduce reduce = parse_reduce(std::string_view(reduce_name.data(), reduce_name.size()));
  const c10::cuda::CUDAGuard guard(points_in.device());
  const at::Tensor grad = grad_features_in.contiguous(), points = points_in.contiguous();
  const at::Tensor point_to_voxel = point_to_voxel_in.contiguous(), counts = num_points_in.contiguous();
  const at::Tensor features = features_in.contiguous();
  const int64_t n = points.size(0), f = points.size(1), nv = features.size(0);
  at::Tensor grad_points = at::empty_like(points);
  if (n == 0) return grad_points;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const unsigned int blocks = grid_for(n * f, kThreads);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "voxel_features_backward_cuda", [&] {
    if (reduce != Reduce::kMax) {
      sum_mean_backward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
          grad.const_data_ptr<scalar_t>(), point_to_voxel.const_data_ptr<int64_t>(), counts.const_data_ptr<int32_t>(),
          n, f, reduce == Reduce::kMean, grad_points.mutable_data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    at::Tensor winner = at::full({std::max<int64_t>(nv, 1), f}, kNoPoint, counts.options());
    max_argmin_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        points.const_data_ptr<scalar_t>(), features.const_data_ptr<scalar_t>(), point_to_voxel.const_data_ptr<int64_t>(),
        n, f, winner.mutable_data_ptr<int32_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    max_backward_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
        grad.const_data_ptr<scalar_t>(), point_to_voxel.const_data_ptr<int64_t>(), winner.const_data_ptr<int32_t>(), n,
        f, grad_points.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_points;
}

}  // namespace
}  // namespace voxelize
}  // namespace pointops

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("voxelize", &pointops::voxelize::voxelize_cuda);
  m.impl("voxelize_padded", &pointops::voxelize::voxelize_padded_cuda);
  m.impl("voxel_features", &pointops::voxelize::voxel_features_cuda);
  m.impl("_voxel_features_backward", &pointops::voxelize::voxel_features_backward_cuda);
}
