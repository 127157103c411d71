// The spatial order of spatial_order_cuda.cuh: common bounds per cloud pair, Morton keys, a stable
// segmented sort of each cloud (at::sort along the points), then the sorted reference points with
// their original indices and the bounds of each box.
#include <ATen/Dispatch.h>

#include <limits>

#include "common/cuda_utils.cuh"
#include "neighbors/spatial_order_cuda.cuh"

namespace pointops {
namespace {

constexpr int kThreads = 256;
constexpr int32_t kNoKey = std::numeric_limits<int32_t>::max();  // padded or non-finite points: last

template <typename acc_t>
__device__ bool finite_point(const acc_t* p, int D) {
  bool finite = true;
  for (int c = 0; c < D; ++c) finite = finite && isfinite(p[c]);
  return finite;
}

// Block-wide min (lo) and max (hi) of D values per thread (Threads threads), into lo_out / hi_out.
template <typename acc_t, int D, int Threads = kThreads>
__device__ void block_bounds(acc_t (&lo)[D], acc_t (&hi)[D], acc_t* lo_out, acc_t* hi_out) {
  __shared__ acc_t shared_lo[D][Threads], shared_hi[D][Threads];
#pragma unroll
  for (int c = 0; c < D; ++c) {
    shared_lo[c][threadIdx.x] = lo[c];
    shared_hi[c][threadIdx.x] = hi[c];
  }
  for (int width = Threads / 2; width > 0; width /= 2) {
    __syncthreads();
    if (threadIdx.x < width) {
#pragma unroll
      for (int c = 0; c < D; ++c) {
        shared_lo[c][threadIdx.x] = ::fmin(shared_lo[c][threadIdx.x], shared_lo[c][threadIdx.x + width]);
        shared_hi[c][threadIdx.x] = ::fmax(shared_hi[c][threadIdx.x], shared_hi[c][threadIdx.x + width]);
      }
    }
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int c = 0; c < D; ++c) {
      lo_out[c] = shared_lo[c][0];
      hi_out[c] = shared_hi[c][0];
    }
  }
}

// One block per cloud pair: the bounds of the finite valid points of both clouds, (B, 2, D).
template <typename acc_t, int D>
__global__ void __launch_bounds__(kThreads) pair_bounds_kernel(const acc_t* queries, const acc_t* refs,
                                                               const int64_t* lengths1, const int64_t* lengths2,
                                                               int64_t N, int64_t M, acc_t* bounds) {
  const int64_t b = blockIdx.x;
  acc_t lo[D], hi[D];
#pragma unroll
  for (int c = 0; c < D; ++c) {
    lo[c] = std::numeric_limits<acc_t>::infinity();
    hi[c] = -std::numeric_limits<acc_t>::infinity();
  }
  auto include = [&](const acc_t* cloud, int64_t count) {
    for (int64_t j = threadIdx.x; j < count; j += kThreads) {
      const acc_t* p = cloud + j * D;
      if (!finite_point(p, D)) continue;
#pragma unroll
      for (int c = 0; c < D; ++c) {
        lo[c] = ::fmin(lo[c], p[c]);
        hi[c] = ::fmax(hi[c], p[c]);
      }
    }
  };
  include(queries + b * N * D, lengths1 ? lengths1[b] : N);
  include(refs + b * M * D, lengths2 ? lengths2[b] : M);
  block_bounds<acc_t, D>(lo, hi, bounds + b * 2 * D, bounds + b * 2 * D + D);
}

// The bits of v (< 2^10) spread to every third bit, and (< 2^15) to every second.
__device__ inline uint32_t spread_by_3(uint32_t v) {
  v = (v | (v << 16)) & 0x030000FFu;
  v = (v | (v << 8)) & 0x0300F00Fu;
  v = (v | (v << 4)) & 0x030C30C3u;
  v = (v | (v << 2)) & 0x09249249u;
  return v;
}
__device__ inline uint32_t spread_by_2(uint32_t v) {
  v = (v | (v << 8)) & 0x00FF00FFu;
  v = (v | (v << 4)) & 0x0F0F0F0Fu;
  v = (v | (v << 2)) & 0x33333333u;
  v = (v | (v << 1)) & 0x55555555u;
  return v;
}

// Morton keys of both clouds: 10 bits per axis in 3-D, 15 in 2-D (30 bits), kNoKey for padded and
// non-finite points. Quantised in double: the key only orders the search, it never decides a result.
template <typename acc_t, int D>
__global__ void morton_keys_kernel(const acc_t* points, const int64_t* lengths, int64_t B, int64_t N,
                                   const acc_t* bounds, int32_t* keys) {
  constexpr int kBits = D == 3 ? 10 : 15;
  constexpr double kCells = double(1 << kBits);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < B * N;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = e / N, i = e % N;
    const acc_t* p = points + e * D;
    int32_t key = kNoKey;
    if (i < (lengths ? lengths[b] : N) && finite_point(p, D)) {
      uint32_t code = 0;
#pragma unroll
      for (int c = 0; c < D; ++c) {
        const double lo = bounds[b * 2 * D + c], hi = bounds[b * 2 * D + D + c];
        const double extent = hi - lo;
        const double u = extent > 0 ? (static_cast<double>(p[c]) - lo) / extent * kCells : 0.0;
        const uint32_t cell = static_cast<uint32_t>(::fmin(::fmax(u, 0.0), kCells - 1));
        code |= (D == 3 ? spread_by_3(cell) : spread_by_2(cell)) << c;
      }
      key = static_cast<int32_t>(code);
    }
    keys[e] = key;
  }
}

// One block per (cloud, box) of box_points (<= kBoxThreads) sorted positions: the box's reference
// points in sorted order with their original indices, and the bounds of its finite points.
constexpr int kBoxThreads = 64;

template <typename acc_t, int D>
__global__ void __launch_bounds__(kBoxThreads) sorted_boxes_kernel(const acc_t* refs, const int64_t* lengths2,
                                                                   const int64_t* perm, int64_t M, int64_t boxes,
                                                                   int64_t box_points, acc_t* sorted,
                                                                   int32_t* ref_index, acc_t* box_bounds) {
  const int64_t b = blockIdx.x / boxes, t = blockIdx.x % boxes;
  const int64_t m_valid = lengths2 ? lengths2[b] : M;
  acc_t lo[D], hi[D];
#pragma unroll
  for (int c = 0; c < D; ++c) {
    lo[c] = std::numeric_limits<acc_t>::infinity();
    hi[c] = -std::numeric_limits<acc_t>::infinity();
  }
  const int64_t s = t * box_points + threadIdx.x;
  if (threadIdx.x < box_points && s < M) {
    const int64_t j = perm[b * M + s];
    const acc_t* p = refs + (b * M + j) * D;
#pragma unroll
    for (int c = 0; c < D; ++c) sorted[(b * M + s) * D + c] = p[c];
    ref_index[b * M + s] = static_cast<int32_t>(j);
    if (s < m_valid && finite_point(p, D)) {
#pragma unroll
      for (int c = 0; c < D; ++c) {
        lo[c] = p[c];
        hi[c] = p[c];
      }
    }
  }
  acc_t* out = box_bounds + (b * boxes + t) * 2 * D;
  block_bounds<acc_t, D, kBoxThreads>(lo, hi, out, out + D);
}

}  // namespace

SpatialOrder spatial_order_cuda(const at::Tensor& queries, const at::Tensor& refs, const at::Tensor& lengths1,
                                const at::Tensor& lengths2, int64_t box_points) {
  const int64_t B = queries.size(0), N = queries.size(1), M = refs.size(1), D = queries.size(2);
  TORCH_CHECK(D == 2 || D == 3, "spatial_order_cuda: D must be 2 or 3, got ", D);
  TORCH_CHECK(box_points >= 1 && box_points <= kBoxThreads, "spatial_order_cuda: box_points must lie in [1, ",
              kBoxThreads, "], got ", box_points);
  TORCH_CHECK(M <= std::numeric_limits<int32_t>::max(), "spatial_order_cuda: at most 2^31 - 1 reference points");
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t boxes = ceil_div<int64_t>(M, box_points);
  TORCH_CHECK(B * boxes <= std::numeric_limits<int32_t>::max(), "spatial_order_cuda: too many boxes");
  const int64_t* len1 = lengths1.defined() ? lengths1.data_ptr<int64_t>() : nullptr;
  const int64_t* len2 = lengths2.defined() ? lengths2.data_ptr<int64_t>() : nullptr;
  auto bounds = at::empty({B, 2, D}, queries.options());
  auto keys1 = at::empty({B, N}, queries.options().dtype(at::kInt));
  auto keys2 = at::empty({B, M}, queries.options().dtype(at::kInt));
  SpatialOrder order;
  order.refs = at::empty_like(refs);
  order.ref_index = at::empty({B, M}, keys2.options());
  order.box_bounds = at::empty({B, boxes, 2, D}, queries.options());
  AT_DISPATCH_FLOATING_TYPES(queries.scalar_type(), "spatial_order_cuda", [&] {
    using acc_t = scalar_t;
    auto run = [&](auto dim_tag) {
      constexpr int kD = decltype(dim_tag)::value;
      pair_bounds_kernel<acc_t, kD><<<static_cast<unsigned>(B), kThreads, 0, stream>>>(
          queries.data_ptr<acc_t>(), refs.data_ptr<acc_t>(), len1, len2, N, M, bounds.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      morton_keys_kernel<acc_t, kD><<<grid_for(B * N, kThreads), kThreads, 0, stream>>>(
          queries.data_ptr<acc_t>(), len1, B, N, bounds.data_ptr<acc_t>(), keys1.data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      morton_keys_kernel<acc_t, kD><<<grid_for(B * M, kThreads), kThreads, 0, stream>>>(
          refs.data_ptr<acc_t>(), len2, B, M, bounds.data_ptr<acc_t>(), keys2.data_ptr<int32_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      // Stable: equal keys keep index order, so valid points precede padded ones (both kNoKey when
      // non-finite), and the order -- hence the time -- is reproducible. All four arguments: with
      // three, (keys, true, 1) binds to sort(self, dim, descending).
      std::tie(order.query_keys, order.query_perm) = at::sort(keys1, /*stable=*/true, /*dim=*/1, /*descending=*/false);
      at::Tensor ref_perm;
      std::tie(order.ref_keys, ref_perm) = at::sort(keys2, /*stable=*/true, /*dim=*/1, /*descending=*/false);
      sorted_boxes_kernel<acc_t, kD><<<static_cast<unsigned>(B * boxes), kBoxThreads, 0, stream>>>(
          refs.data_ptr<acc_t>(), len2, ref_perm.data_ptr<int64_t>(), M, boxes, box_points,
          order.refs.data_ptr<acc_t>(), order.ref_index.data_ptr<int32_t>(), order.box_bounds.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (D == 2) {
      run(std::integral_constant<int, 2>{});
    } else {
      run(std::integral_constant<int, 3>{});
    }
  });
  return order;
}

}  // namespace pointops
