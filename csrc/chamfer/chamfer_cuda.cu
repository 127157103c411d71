// Nearest neighbour / Chamfer on CUDA.
//
// Forward: each block holds kThreads x Q queries in registers and streams one split of the
// reference cloud through shared memory in tiles. Tracking the index of the minimum costs ALU
// instructions per pair on top of the 6 FP32 ones of (q - r)^2; we compare the minimum of a
// group of kGroup reference points with the running best and record only the group, then
// recompute that group's distances once at the end (bitwise equal: same operations, same order)
// to find the index. Small batches cannot fill the GPU with queries alone, so the reference cloud
// is split across blocks; each split writes a partial (distance, index) and a finalize kernel
// takes the minimum in split order (ties -> smallest index, no atomics, deterministic).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/Atomic.cuh>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <torch/library.h>

#include <array>
#include <limits>
#include <mutex>
#include <tuple>
#include <utility>

#include "chamfer/chamfer.h"
#include "common/cuda_utils.cuh"
#include "common/point_tile.cuh"
#include "grid/grid.h"

namespace pointops {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 256;   // reference points per shared-memory tile (fixed-size kernels)
constexpr int kGroup = 4;    // reference points reduced to one minimum before the index update

// Queries per thread: each shared-memory load then serves Q pairs. Doubles need twice the registers.
template <typename acc_t>
constexpr int queries_per_thread() {
  return sizeof(acc_t) == 8 ? 4 : 8;
}

// One direction of the search: queries (B, N, dim) against refs (B, M, dim).
template <typename scalar_t, typename acc_t>
struct Direction {
  const scalar_t* queries;
  const scalar_t* refs;
  const int64_t* query_lengths;  // (B,) or nullptr
  const int64_t* ref_lengths;    // (B,) or nullptr
  int64_t num_queries;           // N
  int64_t num_refs;              // M
  int64_t query_chunks;          // blocks along the queries of one cloud
  int64_t split_len;             // reference points per split (a multiple of the tile)
  int64_t num_splits;            // 0: nothing to search (M = 0 or N = 0)
  acc_t* partial_dist;           // (num_splits, B, N)
  int32_t* partial_idx;          // (num_splits, B, N); -1: nothing found in that split
  bool zero_unmatched;           // queries without a neighbour report 0 (knn_points), not +inf / NaN
  // "auto" on the grid's sizes (knn_grid_cuda's probe): clouds b with grid_choice[b] == 1 were
  // searched on the grid; brute force skips them and the finalize kernel copies their results.
  const uint8_t* grid_choice;    // (B,) or nullptr
  const acc_t* grid_dist;        // (B, N) in the compute type
  const int64_t* grid_idx;       // (B, N)
};

struct BlockCoordinates {
  int direction;
  int64_t batch, chunk;
};

__device__ inline BlockCoordinates block_coordinates(int64_t batch_size, int64_t max_chunks) {
  const int64_t flat = blockIdx.x;
  const int64_t rest = flat / max_chunks;
  return {static_cast<int>(rest / batch_size), rest % batch_size, flat % max_chunks};
}

// What one search block works on: cloud b, queries from q_base, references [m_begin, m_end).
struct SearchRange {
  int64_t b, n_valid, q_base, m_begin, m_end;
};

// False when the block has nothing to search (past its direction's chunks or splits, or only
// padded queries, whose outputs the finalize kernel writes).
template <typename Dir>
__device__ inline bool search_range(const Dir& dir, const BlockCoordinates& where, int64_t chunk_size,
                                    SearchRange& range) {
  if (where.chunk >= dir.query_chunks || blockIdx.y >= dir.num_splits) return false;
  if (dir.grid_choice != nullptr && dir.grid_choice[where.batch] != 0) return false;  // the grid's cloud
  range.b = where.batch;
  range.n_valid = dir.query_lengths ? dir.query_lengths[range.b] : dir.num_queries;
  const int64_t m_valid = dir.ref_lengths ? dir.ref_lengths[range.b] : dir.num_refs;
  range.q_base = where.chunk * chunk_size;
  range.m_begin = static_cast<int64_t>(blockIdx.y) * dir.split_len;
  range.m_end = min(range.m_begin + dir.split_len, m_valid);
  return range.q_base < range.n_valid;
}

template <typename scalar_t, int D, Metric metric>
__global__ void __launch_bounds__(kThreads)
nearest_neighbor_partial_kernel(Direction<scalar_t, at::opmath_type<scalar_t>> first,
                                Direction<scalar_t, at::opmath_type<scalar_t>> second,
                                int64_t batch_size, int64_t max_chunks) {
  using acc_t = at::opmath_type<scalar_t>;
  constexpr int Q = queries_per_thread<acc_t>();
  constexpr int P = padded_dim<D>();
  __shared__ SharedPoint<acc_t, D> tile[kTile];

  const auto where = block_coordinates(batch_size, max_chunks);
  const auto& dir = where.direction == 0 ? first : second;
  SearchRange range;
  if (!search_range(dir, where, kThreads * Q, range)) return;
  const int64_t b = range.b, N = dir.num_queries, M = dir.num_refs;
  const int64_t n_valid = range.n_valid, q_base = range.q_base, m_begin = range.m_begin, m_end = range.m_end;
  const scalar_t* refs = dir.refs + b * M * D;

  acc_t q[Q][D];
  acc_t best[Q];
  int32_t best_group[Q];
#pragma unroll
  for (int k = 0; k < Q; ++k) {
    const int64_t i = q_base + k * kThreads + threadIdx.x;
#pragma unroll
    for (int c = 0; c < D; ++c) {
      q[k][c] = i < n_valid ? static_cast<acc_t>(dir.queries[(b * N + i) * D + c]) : acc_t(0);
    }
    best[k] = std::numeric_limits<acc_t>::infinity();
    best_group[k] = -1;
  }

  for (int64_t tile_begin = m_begin; tile_begin < m_end; tile_begin += kTile) {
    __syncthreads();  // the previous tile is no longer read
    for (int t = threadIdx.x; t < kTile; t += kThreads) {
      const int64_t j = tile_begin + t;
      SharedPoint<acc_t, D> p;
#pragma unroll
      for (int c = 0; c < P; ++c) {
        // Past the split: +inf is never strictly below any best, so it is never matched.
        p.c[c] = c >= D ? acc_t(0)
                        : (j < m_end ? static_cast<acc_t>(refs[j * D + c]) : std::numeric_limits<acc_t>::infinity());
      }
      tile[t] = p;
    }
    __syncthreads();
    int32_t group = static_cast<int32_t>(tile_begin / kGroup);
#pragma unroll 2
    for (int g = 0; g < kTile / kGroup; ++g, ++group) {
      SharedPoint<acc_t, D> r[kGroup];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) r[u] = tile[g * kGroup + u];
#pragma unroll
      for (int k = 0; k < Q; ++k) {
        acc_t m = point_distance<D, metric>(q[k], r[0].c);
#pragma unroll
        for (int u = 1; u < kGroup; ++u) m = ::fmin(m, point_distance<D, metric>(q[k], r[u].c));  // fmin drops NaN
        if (m < best[k]) {  // strict: an equal later group never replaces an earlier one
          best[k] = m;
          best_group[k] = group;
        }
      }
    }
  }

#pragma unroll
  for (int k = 0; k < Q; ++k) {
    const int64_t i = q_base + k * kThreads + threadIdx.x;
    if (i >= n_valid) continue;
    int32_t found = -1;
    if (best_group[k] >= 0) {
      const int64_t j0 = static_cast<int64_t>(best_group[k]) * kGroup;
      for (int u = 0; u < kGroup && found < 0; ++u) {
        const int64_t j = j0 + u;
        if (j >= m_end) break;
        acc_t r[D];
#pragma unroll
        for (int c = 0; c < D; ++c) r[c] = static_cast<acc_t>(refs[j * D + c]);
        if (point_distance<D, metric>(q[k], r) == best[k]) found = static_cast<int32_t>(j);
      }
    }
    const int64_t out = (static_cast<int64_t>(blockIdx.y) * batch_size + b) * N + i;
    dir.partial_dist[out] = found >= 0 ? best[k] : std::numeric_limits<acc_t>::infinity();
    dir.partial_idx[out] = found;
  }
}

// Any dimension: one query per thread, read from global memory (cached), reference tiles of
// `tile_points` points in dynamic shared memory. Plain index tracking: D > 3 is not the hot path.
template <typename scalar_t, Metric metric>
__global__ void __launch_bounds__(kThreads)
nearest_neighbor_partial_generic_kernel(Direction<scalar_t, at::opmath_type<scalar_t>> first,
                                        Direction<scalar_t, at::opmath_type<scalar_t>> second,
                                        int64_t batch_size, int64_t max_chunks, int64_t dim,
                                        int tile_points) {
  using acc_t = at::opmath_type<scalar_t>;
  extern __shared__ unsigned char shared_bytes[];
  acc_t* tile = reinterpret_cast<acc_t*>(shared_bytes);

  const auto where = block_coordinates(batch_size, max_chunks);
  const auto& dir = where.direction == 0 ? first : second;
  SearchRange range;
  if (!search_range(dir, where, kThreads, range)) return;
  const int64_t b = range.b, N = dir.num_queries, M = dir.num_refs;
  const int64_t n_valid = range.n_valid, q_base = range.q_base, m_begin = range.m_begin, m_end = range.m_end;
  const int64_t i = q_base + threadIdx.x;
  const scalar_t* query = dir.queries + (b * N + min(i, n_valid - 1)) * dim;
  const scalar_t* refs = dir.refs + b * M * dim;

  acc_t best = std::numeric_limits<acc_t>::infinity();
  int32_t best_idx = -1;
  for (int64_t tile_begin = m_begin; tile_begin < m_end; tile_begin += tile_points) {
    const int64_t count = min(static_cast<int64_t>(tile_points), m_end - tile_begin);
    __syncthreads();
    for (int64_t t = threadIdx.x; t < count * dim; t += kThreads) {
      tile[t] = static_cast<acc_t>(refs[tile_begin * dim + t]);
    }
    __syncthreads();
    for (int64_t t = 0; t < count; ++t) {
      acc_t d = coordinate_term<metric>(static_cast<acc_t>(query[0]) - tile[t * dim]);
      for (int64_t c = 1; c < dim; ++c) {
        d = add_coordinate_term<metric>(static_cast<acc_t>(query[c]) - tile[t * dim + c], d);
      }
      if (d < best) {
        best = d;
        best_idx = static_cast<int32_t>(tile_begin + t);
      }
    }
  }
  if (i < n_valid) {
    const int64_t out = (static_cast<int64_t>(blockIdx.y) * batch_size + b) * N + i;
    dir.partial_dist[out] = best;
    dir.partial_idx[out] = best_idx;
  }
}

// The minimum over the splits, in split order (so ties keep the smallest index), plus the
// outputs of padded queries and of queries that found nothing.
template <typename scalar_t>
__global__ void nearest_neighbor_finalize_kernel(Direction<scalar_t, at::opmath_type<scalar_t>> dir,
                                                 int64_t batch_size, scalar_t* dist, int64_t* idx) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t N = dir.num_queries, total = batch_size * N;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = t / N, i = t % N;
    if (dir.grid_choice != nullptr && dir.grid_choice[b] != 0) {  // rounded once, as the grid's own op does
      dist[t] = static_cast<scalar_t>(dir.grid_dist[t]);
      idx[t] = dir.grid_idx[t];
      continue;
    }
    const int64_t n_valid = dir.query_lengths ? dir.query_lengths[b] : N;
    const int64_t m_valid = dir.ref_lengths ? dir.ref_lengths[b] : dir.num_refs;
    if (i >= n_valid) {
      dist[t] = scalar_t(0);
      idx[t] = -1;
      continue;
    }
    acc_t best = std::numeric_limits<acc_t>::infinity();
    int64_t best_idx = -1;
    for (int64_t s = 0; s < dir.num_splits; ++s) {
      const int32_t j = dir.partial_idx[s * total + t];
      const acc_t d = dir.partial_dist[s * total + t];
      if (j >= 0 && (best_idx < 0 || d < best)) {
        best = d;
        best_idx = j;
      }
    }
    dist[t] = static_cast<scalar_t>(best_idx < 0 ? unmatched_distance<acc_t>(m_valid, dir.zero_unmatched) : best);
    idx[t] = best_idx;
  }
}

// Host-side view of one direction: inputs are contiguous; the outputs are allocated by
// allocate_outputs, after the search launch.
struct DirectionTensors {
  at::Tensor queries, refs, query_lengths, ref_lengths;
  at::Tensor dist, idx;
  at::Tensor partials;  // bytes: the (num_splits, B, N) partial distances, then their int32 indices
  bool zero_unmatched = false;
  at::Tensor grid_choice, grid_dist, grid_idx;  // attach_grid_probe
};

template <typename scalar_t>
Direction<scalar_t, at::opmath_type<scalar_t>> make_direction(DirectionTensors& t, int64_t chunk_size,
                                                               int64_t wanted_splits, int64_t tile_points) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t B = t.queries.size(0), N = t.queries.size(1), M = t.refs.size(1);
  Direction<scalar_t, acc_t> d{};
  d.queries = t.queries.data_ptr<scalar_t>();
  d.refs = t.refs.data_ptr<scalar_t>();
  d.query_lengths = t.query_lengths.defined() ? t.query_lengths.data_ptr<int64_t>() : nullptr;
  d.ref_lengths = t.ref_lengths.defined() ? t.ref_lengths.data_ptr<int64_t>() : nullptr;
  d.num_queries = N;
  d.num_refs = M;
  d.zero_unmatched = t.zero_unmatched;
  d.query_chunks = ceil_div(N, chunk_size);
  d.num_splits = 0;
  if (B * N > 0 && M > 0) {
    const int64_t splits = std::min(wanted_splits, ceil_div(M, tile_points));
    d.split_len = ceil_div(ceil_div(M, splits), tile_points) * tile_points;
    d.num_splits = ceil_div(M, d.split_len);
  }
  // One allocation for both arrays (a call's host time is mostly such steps): the distances first,
  // whose size keeps the indices 4-byte aligned.
  const int64_t count = d.num_splits * B * N;
  t.partials = at::empty({count * static_cast<int64_t>(sizeof(acc_t) + sizeof(int32_t))},
                         t.queries.options().dtype(at::kByte));
  d.partial_dist = reinterpret_cast<acc_t*>(t.partials.data_ptr<uint8_t>());
  d.partial_idx = reinterpret_cast<int32_t*>(t.partials.data_ptr<uint8_t>() + count * static_cast<int64_t>(sizeof(acc_t)));
  if (t.grid_choice.defined()) {
    d.grid_choice = t.grid_choice.const_data_ptr<uint8_t>();
    d.grid_dist = t.grid_dist.const_data_ptr<acc_t>();
    d.grid_idx = t.grid_idx.const_data_ptr<int64_t>();
  }
  return d;
}

// The outputs (B, N) of a direction, where not yet allocated. After the search's launch where it
// runs, so that a small call's GPU starts while the host allocates them.
void allocate_outputs(DirectionTensors& t) {
  if (t.dist.defined()) return;
  t.dist = at::empty({t.queries.size(0), t.queries.size(1)}, t.queries.options());
  t.idx = at::empty({t.queries.size(0), t.queries.size(1)}, t.queries.options().dtype(at::kLong));
}

// Runs one or two directions (chamfer) with one search launch, then one finalize per direction.
void nearest_neighbor_cuda_impl(DirectionTensors* dirs, int num_dirs, Metric metric) {
  const at::Tensor& x = dirs[0].queries;
  const int64_t B = x.size(0), dim = x.size(2);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "nearest_neighbor_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    using Dir = Direction<scalar_t, acc_t>;
    auto launch = [&](auto kernel, int64_t chunk_size, int64_t tile_points, size_t shared_bytes, auto... extra) {
      const int blocks_per_sm = resident_blocks(reinterpret_cast<const void*>(kernel), kThreads, shared_bytes);
      // Enough blocks for two full waves; the splits supply what the queries alone cannot.
      const int64_t target_blocks = 2 * static_cast<int64_t>(multiprocessor_count()) * blocks_per_sm;
      int64_t max_chunks = 1, base_blocks = 0;
      for (int d = 0; d < num_dirs; ++d) {
        const int64_t chunks = ceil_div(dirs[d].queries.size(1), chunk_size);
        max_chunks = std::max(max_chunks, chunks);
        base_blocks += B * chunks;
      }
      const int64_t wanted_splits = std::max<int64_t>(1, ceil_div(target_blocks, std::max<int64_t>(base_blocks, 1)));
      std::array<Dir, 2> params{};
      int64_t max_splits = 0;
      for (int d = 0; d < num_dirs; ++d) {
        params[d] = make_direction<scalar_t>(dirs[d], chunk_size, wanted_splits, tile_points);
        max_splits = std::max(max_splits, params[d].num_splits);
      }
      if (num_dirs == 1) params[1] = params[0];
      if (max_splits > 0) {
        const int64_t grid_x = max_chunks * B * num_dirs;
        TORCH_CHECK(grid_x <= std::numeric_limits<int32_t>::max() && max_splits <= 65535,
                    "nearest_neighbor: input too large for one launch (", grid_x, " x ", max_splits, " blocks)");
        const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(max_splits));
        kernel<<<grid, kThreads, shared_bytes, stream>>>(params[0], params[1], B, max_chunks, extra...);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      for (int d = 0; d < num_dirs; ++d) {
        allocate_outputs(dirs[d]);
        const int64_t total = B * dirs[d].queries.size(1);
        if (total == 0) continue;
        nearest_neighbor_finalize_kernel<scalar_t><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
            params[d], B, dirs[d].dist.data_ptr<scalar_t>(), dirs[d].idx.data_ptr<int64_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
    };
    constexpr int64_t kFastChunk = kThreads * queries_per_thread<acc_t>();
    dispatch_metric(metric, [&](auto metric_tag) {
      constexpr Metric m = decltype(metric_tag)::value;
      if (dim == 3) {
        launch(nearest_neighbor_partial_kernel<scalar_t, 3, m>, kFastChunk, kTile, 0);
      } else if (dim == 2) {
        launch(nearest_neighbor_partial_kernel<scalar_t, 2, m>, kFastChunk, kTile, 0);
      } else {
        // Tiles of at most 32 KB of shared memory; one point per tile at worst.
        const int64_t tile_points =
            std::max<int64_t>(1, std::min<int64_t>(kTile, (32 * 1024) / (dim * sizeof(acc_t))));
        launch(nearest_neighbor_partial_generic_kernel<scalar_t, m>, kThreads, tile_points,
               static_cast<size_t>(tile_points * dim * sizeof(acc_t)), dim, static_cast<int>(tile_points));
      }
    });
  });
}

DirectionTensors make_direction_tensors(const at::Tensor& queries, const at::Tensor& refs,
                                        const at::Tensor& query_lengths, const at::Tensor& ref_lengths) {
  DirectionTensors t;
  t.queries = queries.contiguous();
  t.refs = refs.contiguous();
  t.query_lengths = query_lengths;
  t.ref_lengths = ref_lengths;
  return t;
}

// "auto" where the sizes favour the grid: the grid is built and probed, searches the clouds where
// its probe says it pays, and the brute-force pass that follows (nearest_neighbor_cuda_impl)
// searches the others and merges (no host sync; knn_grid_cuda's probe_choice).
void attach_grid_probe(DirectionTensors& t, Metric metric) {
  at::Tensor choice;
  auto [dist, idx] = knn_grid_cuda(t.queries, t.refs, t.query_lengths, t.ref_lengths, /*K=*/1, metric,
                                   t.zero_unmatched, &choice);
  if (!choice.defined()) return;
  t.grid_choice = choice;
  t.grid_dist = dist;
  t.grid_idx = idx;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_direction_cuda(const at::Tensor& x, const at::Tensor& y,
                                                                   const at::Tensor& x_lengths,
                                                                   const at::Tensor& y_lengths, Metric metric,
                                                                   bool zero_unmatched, bool probe_grid) {
  const c10::cuda::CUDAGuard guard(x.device());
  DirectionTensors dirs[1] = {make_direction_tensors(x, y, x_lengths, y_lengths)};
  dirs[0].zero_unmatched = zero_unmatched;
  if (x.size(0) * x.size(1) > 0) {
    if (probe_grid) attach_grid_probe(dirs[0], metric);
    nearest_neighbor_cuda_impl(dirs, 1, metric);
  }
  allocate_outputs(dirs[0]);
  return {dirs[0].dist, dirs[0].idx};
}

namespace {

// One direction on the spatial grid (knn_grid_cuda, K = 1): brute force's result bit for bit.
std::tuple<at::Tensor, at::Tensor> nearest_neighbor_grid_cuda(const at::Tensor& x, const at::Tensor& y,
                                                              const at::Tensor& x_len, const at::Tensor& y_len,
                                                              Metric metric) {
  auto [dist, idx] = knn_grid_cuda(x, y, x_len, y_len, /*K=*/1, metric, /*zero_unmatched=*/false);
  return {dist.squeeze(2), idx.squeeze(2)};
}

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_cuda(const at::Tensor& x, const at::Tensor& y,
                                                         const c10::optional<at::Tensor>& x_lengths,
                                                         const c10::optional<at::Tensor>& y_lengths,
                                                         int64_t norm, c10::string_view algorithm) {
  const auto [x_len, y_len] = check_nearest_neighbor_inputs(x, y, x_lengths, y_lengths);
  const Metric metric = metric_from_norm(norm);
  if (choose_grid(algorithm, x.size(0), x.size(1), y.size(1), x.size(2), 1, &grid_pays_cuda)) {
    if (grid_may_decline(algorithm)) return nearest_neighbor_direction_cuda(x, y, x_len, y_len, metric, false, true);
    const c10::cuda::CUDAGuard guard(x.device());
    return nearest_neighbor_grid_cuda(x, y, x_len, y_len, metric);
  }
  return nearest_neighbor_direction_cuda(x, y, x_len, y_len, metric, false);
}

// Runs first() on the current stream and second() on a side stream at the same time; the current
// stream then waits for both. Why: a grid direction on a LiDAR scan is about one wave of queries
// whose tail (the crowded cells' queries) leaves most of the GPU idle, and its build is a chain of
// small launches: the other direction fills those gaps (KITTI chamfer 0.98 -> 0.66 ms on an H100,
// benchmarks/RESULTS.md). The price: both directions' grids are alive at once (~100 MB each for
// 1M x 1M), where one stream would have freed the first before building the second.
//
// Memory: second()'s temporaries are allocated and freed on the side stream, so the caching
// allocator reuses them in that stream's order. Its results are copied, on the side stream, into
// tensors allocated from the current stream's pool (a few small copies) instead of being marked
// with recordStream: a block marked so returns to the pool only once an event recorded at its free
// has passed, and a caller that queues many calls ahead of the GPU would make the pool grow by one
// output per queued call. The copies wait for everything queued on the current stream after those
// tensors were allocated (a block another thread freed on a shared stream may come back to us).
// Inputs allocated on the current stream are only ever reused by its later work, which is ordered
// after the join; the join happens on every path, exceptions included.
//
// CUDA graphs: the side stream joins a capture through the fork event. A side stream already part
// of another capture (another thread capturing) cannot join this one: the directions then run one
// after the other on the current stream.
//
// side_stream: one per device, created once and never destroyed. The caching allocator keeps each
// stream's blocks apart, so taking the pool's next stream on every call (it hands out 32 in turn)
// left every one of them holding a call's temporaries (KITTI: reserved memory 76 -> 780 MB after
// 32 calls, H100); and a pool stream may be one that other work queues on (c10d's NCCL streams
// come from the same pool), which this search would then wait behind.
c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
  constexpr int kMaxDevices = 64;
  static std::once_flag once[kMaxDevices];
  static cudaStream_t streams[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "chamfer: CUDA device index ", static_cast<int>(device),
              " is beyond the ", kMaxDevices, " this build supports");
  std::call_once(once[device], [&] {
    const c10::cuda::CUDAGuard on_device(device);
    // the first call may come during a capture, whose global mode refuses stream creation
    const c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  });
  return c10::cuda::getStreamFromExternal(streams[device], device);
}

// Whether `side` may join work forked from `current`: it is idle, or already in current's capture.
bool may_fork_into(const c10::cuda::CUDAStream& current, const c10::cuda::CUDAStream& side) {
  cudaStreamCaptureStatus side_status, current_status;
  unsigned long long side_id = 0, current_id = 0;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(side.stream(), &side_status, &side_id));
  if (side_status == cudaStreamCaptureStatusNone) return true;
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(current.stream(), &current_status, &current_id));
  return side_status == cudaStreamCaptureStatusActive && current_status == cudaStreamCaptureStatusActive &&
         side_id == current_id;
}

template <typename First, typename Second>
auto run_side_by_side(First&& first, Second&& second) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = side_stream(current.device_index());
  if (!may_fork_into(current, side)) {
    auto result1 = first();
    return std::make_pair(std::move(result1), second());
  }
  struct Event {  // destroyed on every path; destroying after the wait is enqueued is legal
    cudaEvent_t event = nullptr;
    Event() { C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
    ~Event() { cudaEventDestroy(event); }
  } forked, joined;
  auto fence = [&](const Event& e, const c10::cuda::CUDAStream& from, const c10::cuda::CUDAStream& to) {
    C10_CUDA_CHECK(cudaEventRecord(e.event, from.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(to.stream(), e.event, 0));
  };
  struct JoinOnThrow {  // the join, on the paths that leave by an exception (errors ignored there)
    const Event& joined;
    cudaStream_t side, current;
    bool done = false;
    ~JoinOnThrow() {
      if (!done && cudaEventRecord(joined.event, side) == cudaSuccess) cudaStreamWaitEvent(current, joined.event, 0);
    }
  } join_on_throw{joined, side.stream(), current.stream()};
  fence(forked, current, side);
  auto result2 = [&] {
    const c10::cuda::CUDAStreamGuard on_side(side);
    auto on_side_pool = second();
    return std::apply(
        [&](const auto&... from) {
          auto allocate = [&](const at::Tensor& t) {
            const c10::cuda::CUDAStreamGuard on_current(current);
            return t.defined() ? at::empty_like(t, at::MemoryFormat::Contiguous) : t;
          };
          auto targets = std::make_tuple(allocate(from)...);
          fence(forked, current, side);  // the copies after the current stream's work so far
          std::apply([&](const auto&... to) { ((to.defined() ? (void)to.copy_(from) : (void)0), ...); }, targets);
          return targets;
        },
        on_side_pool);
  }();
  auto result1 = first();
  fence(joined, side, current);
  join_on_throw.done = true;
  return std::make_pair(std::move(result1), std::move(result2));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> chamfer_cuda(
    const at::Tensor& x, const at::Tensor& y, const c10::optional<at::Tensor>& x_lengths,
    const c10::optional<at::Tensor>& y_lengths, int64_t norm, c10::string_view algorithm) {
  const auto [x_len, y_len] = check_nearest_neighbor_inputs(x, y, x_lengths, y_lengths);
  const Metric metric = metric_from_norm(norm);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1), dim = x.size(2);
  // each direction decides on its own sizes ("grid" forces both); brute force runs both directions
  // in one launch. "auto": a direction the sizes give to the grid is probed per cloud, and the
  // brute-force launch searches what the probes leave to it.
  const bool grid1 = choose_grid(algorithm, B, N, M, dim, 1, &grid_pays_cuda);
  const bool grid2 = choose_grid(algorithm, B, M, N, dim, 1, &grid_pays_cuda);
  const bool probed = grid_may_decline(algorithm);
  if ((grid1 || grid2) && !probed) {
    auto direction = [&](const at::Tensor& q, const at::Tensor& r, const at::Tensor& q_len, const at::Tensor& r_len,
                         bool grid) {
      return grid ? nearest_neighbor_grid_cuda(q, r, q_len, r_len, metric)
                  : nearest_neighbor_direction_cuda(q, r, q_len, r_len, metric, false);
    };
    const auto [first, second] = run_side_by_side([&] { return direction(x, y, x_len, y_len, grid1); },
                                                  [&] { return direction(y, x, y_len, x_len, grid2); });
    return {std::get<0>(first), std::get<0>(second), std::get<1>(first), std::get<1>(second)};
  }
  DirectionTensors dirs[2] = {make_direction_tensors(x, y, x_len, y_len),
                              make_direction_tensors(y, x, y_len, x_len)};
  if (x.size(0) * (x.size(1) + y.size(1)) > 0) {
    const bool probe1 = grid1 && B * N > 0, probe2 = grid2 && B * M > 0;
    if (probe1 && probe2) {
      const auto probed2 = run_side_by_side([&] { attach_grid_probe(dirs[0], metric); return std::tuple<>(); },
                                              [&] {
                                                attach_grid_probe(dirs[1], metric);
                                                return std::make_tuple(dirs[1].grid_choice, dirs[1].grid_dist,
                                                                       dirs[1].grid_idx);
                                              }).second;
      std::tie(dirs[1].grid_choice, dirs[1].grid_dist, dirs[1].grid_idx) = probed2;  // the copies on this stream
    } else if (probe1) {
      attach_grid_probe(dirs[0], metric);
    } else if (probe2) {
      attach_grid_probe(dirs[1], metric);
    }
    nearest_neighbor_cuda_impl(dirs, 2, metric);
  }
  allocate_outputs(dirs[0]);
  allocate_outputs(dirs[1]);
  return {dirs[0].dist, dirs[1].dist, dirs[0].idx, dirs[1].idx};
}

// grad_x[q] = sum_k g[q, k] d'(x[q] - y[idx[q, k]]) for every (query, coordinate), summed in k order
// (K = 1 for nearest_neighbor), d' = 2 diff or sign(diff); with `grad_y_acc` the negative of each
// term is also scattered into the matched reference point with float atomics.
template <typename scalar_t, Metric metric>
__global__ void nearest_neighbor_backward_queries_kernel(
    const scalar_t* grad_dist, const scalar_t* x, const scalar_t* y, const int64_t* idx, int64_t N,
    int64_t M, int64_t K, int64_t dim, int64_t total, scalar_t* grad_x, at::opmath_type<scalar_t>* grad_y_acc) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t q = e / dim, c = e % dim;
    const acc_t xc = static_cast<acc_t>(x[e]);
    acc_t acc = 0;
    bool any = false;  // the first term is taken as is: K = 1 keeps the sign of a zero gradient
    for (int64_t k = 0; k < K; ++k) {
      const int64_t j = idx[q * K + k];
      // j = -1: no neighbour. j >= M only comes from a hand-made idx (checking would cost a device
      // sync): ignored like -1, never read out of bounds (the CPU refuses it).
      if (j < 0 || j >= M) continue;
      const int64_t r = ((q / N) * M + j) * dim + c;
      const acc_t g = static_cast<acc_t>(grad_dist[q * K + k]) * distance_derivative<metric>(xc - static_cast<acc_t>(y[r]));
      acc = any ? acc + g : g;
      any = true;
      if (grad_y_acc != nullptr) gpuAtomicAdd(grad_y_acc + r, -g);
    }
    grad_x[e] = static_cast<scalar_t>(acc);
  }
}

// Deterministic reference gradient: each (reference point, coordinate) sums its matched pairs
// in increasing pair order (see matched_queries_by_reference).
template <typename scalar_t, Metric metric>
__global__ void nearest_neighbor_backward_refs_kernel(const scalar_t* grad_dist, const scalar_t* x,
                                                      const scalar_t* y, const int64_t* order,
                                                      const int64_t* offsets, int64_t K, int64_t dim, int64_t total,
                                                      scalar_t* grad_y) {
  using acc_t = at::opmath_type<scalar_t>;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / dim, c = e % dim;
    const acc_t yr = static_cast<acc_t>(y[e]);
    acc_t acc = 0;
    for (int64_t t = offsets[r]; t < offsets[r + 1]; ++t) {
      const int64_t pair = order[t], q = pair / K;
      acc -= static_cast<acc_t>(grad_dist[pair]) * distance_derivative<metric>(static_cast<acc_t>(x[q * dim + c]) - yr);
    }
    grad_y[e] = static_cast<scalar_t>(acc);
  }
}

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_cuda(const at::Tensor& grad_dist,
                                                                  const at::Tensor& x,
                                                                  const at::Tensor& y,
                                                                  const at::Tensor& idx, int64_t norm) {
  check_nearest_neighbor_backward_inputs(grad_dist, x, y, idx);
  const Metric metric = metric_from_norm(norm);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1), dim = x.size(2);
  const int64_t K = idx.dim() == 3 ? idx.size(2) : 1;
  auto grad_x = at::empty_like(x, at::MemoryFormat::Contiguous);
  if (B * N * K == 0 || M == 0) {
    return {grad_x.zero_(), at::zeros_like(y, at::MemoryFormat::Contiguous)};
  }
  const auto grad_contig = grad_dist.contiguous();
  const auto x_contig = x.contiguous();
  const auto y_contig = y.contiguous();
  const auto idx_contig = idx.contiguous();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  at::Tensor grad_y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "nearest_neighbor_backward_cuda", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const int64_t query_elems = B * N * dim, ref_elems = B * M * dim;
    at::Tensor grad_y_acc;
    if (!deterministic) {
      at::globalContext().alertNotDeterministic("pointops::_nearest_neighbor_backward");
      grad_y_acc = at::zeros({B, M, dim}, y.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
    }
    dispatch_metric(metric, [&](auto metric_tag) {
      constexpr Metric m = decltype(metric_tag)::value;
      nearest_neighbor_backward_queries_kernel<scalar_t, m><<<grid_for(query_elems, kThreads), kThreads, 0, stream>>>(
          grad_contig.data_ptr<scalar_t>(), x_contig.data_ptr<scalar_t>(), y_contig.data_ptr<scalar_t>(),
          idx_contig.data_ptr<int64_t>(), N, M, K, dim, query_elems, grad_x.data_ptr<scalar_t>(),
          deterministic ? nullptr : grad_y_acc.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (!deterministic) {
        grad_y = grad_y_acc.to(y.scalar_type());
        return;
      }
      const auto [order, offsets] = matched_queries_by_reference(idx_contig, M);
      grad_y = at::empty_like(y, at::MemoryFormat::Contiguous);
      nearest_neighbor_backward_refs_kernel<scalar_t, m><<<grid_for(ref_elems, kThreads), kThreads, 0, stream>>>(
          grad_contig.data_ptr<scalar_t>(), x_contig.data_ptr<scalar_t>(), y_contig.data_ptr<scalar_t>(),
          order.data_ptr<int64_t>(), offsets.data_ptr<int64_t>(), K, dim, ref_elems, grad_y.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {grad_x, grad_y};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("nearest_neighbor", &nearest_neighbor_cuda);
  m.impl("chamfer", &chamfer_cuda);
  m.impl("_nearest_neighbor_backward", &nearest_neighbor_backward_cuda);
}

}  // namespace pointops
