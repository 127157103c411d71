// Farthest point sampling on the CPU: the reference implementation. Each cloud is converted once
// to the compute type, coordinate-major, so that the per-sample pass (distance to the newest sample,
// running minimum, argmax) runs across points in vector lanes. Many clouds run one per thread; a
// large cloud splits every pass into chunks across threads, whose bests are combined in chunk order.
// Distances are chamfer.h's fused forms, so the samples equal the CUDA kernel's bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/cpu_dispatch.h"
#include "neighbors/neighbors.h"

namespace pointops {
namespace {

constexpr int64_t kBlock = 256;              // distances computed together into a stack buffer
constexpr int64_t kChunk = 16 * kBlock;      // points per parallel work item, each with its own best
constexpr int64_t kParallelPoints = 1 << 15; // below this, forking threads every pass costs more than it saves

// A candidate for the next sample: the largest running minimum distance (mind) and its index;
// idx -1 (mind -1) when there is none.
template <typename acc_t>
struct Candidate {
  acc_t mind;
  int64_t idx;
};

// What cloud b asks for: its points, how many samples at most (K < 0 counts as 0), and where the
// search for a finite start point begins (start_idx modulo n, as Python's %).
struct CloudRequest {
  int64_t n, samples, start;
};

CloudRequest cloud_request(int64_t b, int64_t N, int64_t max_K, const int64_t* lengths, const int64_t* K,
                           const int64_t* start_idx) {
  const int64_t n = lengths ? lengths[b] : N;
  const int64_t samples = n == 0 ? 0 : (K ? std::min(std::max<int64_t>(K[b], 0), max_K) : max_K);
  const int64_t start = start_idx && n > 0 ? ((start_idx[b] % n) + n) % n : 0;
  return {n, samples, start};
}

// out[j] = point_distance<D, kSquaredL2>(point first + j, sel) for j < count: the same operations
// in the same order (bit for bit the same value), with coordinate c of point p at coords[c * n + p].
template <int D, typename acc_t>
C10_ALWAYS_INLINE void block_distances(const acc_t* __restrict coords, int64_t n, int64_t dim, const acc_t* sel,
                                       int64_t first, int64_t count, acc_t* __restrict out) {
  constexpr Metric kL2 = Metric::kSquaredL2;
  const acc_t* __restrict x0 = coords + first;
  if constexpr (D > 0) {
    acc_t s[D];
    for (int c = 0; c < D; ++c) s[c] = sel[c];
    for (int64_t j = 0; j < count; ++j) {
      acc_t d = coordinate_term<kL2>(x0[j] - s[0]);
#pragma GCC unroll 4
      for (int c = 1; c < D; ++c) d = add_coordinate_term<kL2>(x0[c * n + j] - s[c], d);
      out[j] = d;
    }
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = coordinate_term<kL2>(x0[j] - sel[0]);
    for (int64_t c = 1; c < dim; ++c) {
      const acc_t* __restrict xc = x0 + c * n;
      const acc_t sc = sel[c];
      for (int64_t j = 0; j < count; ++j) out[j] = add_coordinate_term<kL2>(xc[j] - sc, out[j]);
    }
  }
}

// Lowers mind[begin, end) to the distances to `sel` and returns the best candidate among them.
// Selected and non-finite points hold mind -1, which no distance lowers (NaN compares false), so
// they are never candidates. A block's maximum is a vector reduction (exact in any order: mind is
// never NaN), and only a block that beats the best so far is scanned for the first index holding
// it: ties keep the smallest index.
template <int D, typename acc_t>
C10_ALWAYS_INLINE Candidate<acc_t> update_range(const acc_t* coords, int64_t n, int64_t dim, const acc_t* sel,
                                                acc_t* mind, int64_t begin, int64_t end) {
  Candidate<acc_t> best{acc_t(-1), -1};
  alignas(64) acc_t dist[kBlock];
  for (int64_t j0 = begin; j0 < end; j0 += kBlock) {
    const int64_t count = std::min(kBlock, end - j0);
    block_distances<D>(coords, n, dim, sel, j0, count, dist);
    acc_t* __restrict m = mind + j0;
    acc_t block_max = acc_t(-1);
#pragma omp simd reduction(max : block_max)
    for (int64_t j = 0; j < count; ++j) {
      const acc_t v = dist[j] < m[j] ? dist[j] : m[j];
      m[j] = v;
      block_max = v > block_max ? v : block_max;
    }
    if (block_max > best.mind) {
      int64_t k = 0;
      while (m[k] != block_max) ++k;
      best = {block_max, j0 + k};
    }
  }
  return best;
}

// Samples one cloud into out[0, max_K). `coords` and `mind` are the caller's scratch (reused
// across clouds); every pass is split into kChunk-point items across threads when called outside
// a parallel region and the cloud is large enough, and runs inline otherwise.
template <int D, typename scalar_t>
void sample_cloud(const scalar_t* points, int64_t dim, const CloudRequest& req, int64_t max_K, int64_t* out,
                  std::vector<at::opmath_type<scalar_t>>& coords, std::vector<at::opmath_type<scalar_t>>& mind) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t n = req.n;
  int64_t taken = 0;
  if (req.samples > 0) {
    coords.resize(n * dim);
    mind.resize(n);
    for (int64_t p = 0; p < n; ++p) {
      bool finite = true;
      for (int64_t c = 0; c < dim; ++c) {
        const acc_t v = static_cast<acc_t>(points[p * dim + c]);
        coords[c * n + p] = v;
        finite = finite && std::isfinite(v);
      }
      mind[p] = finite ? std::numeric_limits<acc_t>::infinity() : acc_t(-1);
    }
    // The start: the first finite point at or after req.start, cyclically.
    int64_t selected = -1;
    for (int64_t q = 0; q < n && selected < 0; ++q) {
      const int64_t p = req.start + q < n ? req.start + q : req.start + q - n;
      if (mind[p] >= 0) selected = p;
    }
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<Candidate<acc_t>> chunk_best(chunks);
    std::vector<acc_t> sel(dim);
    while (selected >= 0) {
      out[taken++] = selected;
      mind[selected] = acc_t(-1);
      if (taken == req.samples) break;
      for (int64_t c = 0; c < dim; ++c) sel[c] = coords[c * n + selected];
      at::parallel_for(0, chunks, kParallelPoints / kChunk, [&](int64_t c_begin, int64_t c_end) {
        call_best_isa([&]() POINTOPS_CLONE_BODY {
          for (int64_t c = c_begin; c < c_end; ++c) {
            chunk_best[c] = update_range<D>(coords.data(), n, dim, sel.data(), mind.data(), c * kChunk,
                                            std::min(n, (c + 1) * kChunk));
          }
        });
      });
      Candidate<acc_t> best{acc_t(-1), -1};
      for (const auto& cand : chunk_best) {
        if (cand.mind > best.mind) best = cand;  // strict, in chunk order: ties keep the smaller index
      }
      selected = best.idx;  // -1: every finite point is taken
    }
  }
  std::fill(out + taken, out + max_K, int64_t(-1));
}

template <int D, typename scalar_t>
void farthest_points_cpu_kernel(const scalar_t* points, const int64_t* lengths, const int64_t* K,
                                const int64_t* start_idx, int64_t B, int64_t N, int64_t dim, int64_t max_K,
                                int64_t* out) {
  using acc_t = at::opmath_type<scalar_t>;
  auto run = [&](int64_t b_begin, int64_t b_end) {
    std::vector<acc_t> coords, mind;
    for (int64_t b = b_begin; b < b_end; ++b) {
      const CloudRequest req = cloud_request(b, N, max_K, lengths, K, start_idx);
      sample_cloud<D>(points + b * N * dim, dim, req, max_K, out + b * max_K, coords, mind);
    }
  };
  // Few large clouds: one after the other, each pass split across threads. Otherwise a cloud per
  // thread (the passes inside then run inline).
  if (N >= kParallelPoints && B < at::get_num_threads()) {
    run(0, B);
  } else {
    at::parallel_for(0, B, 1, run);
  }
}

at::Tensor sample_farthest_points_cpu(const at::Tensor& points, const c10::optional<at::Tensor>& lengths,
                                      const c10::optional<at::Tensor>& K, int64_t max_K,
                                      const c10::optional<at::Tensor>& start_idx) {
  const auto [lengths_checked, K_checked, start_checked] =
      check_farthest_point_inputs(points, lengths, K, max_K, start_idx);
  const int64_t B = points.size(0), N = points.size(1), dim = points.size(2);
  auto idx = at::empty({B, max_K}, points.options().dtype(at::kLong));
  if (idx.numel() == 0) return idx;
  if (N == 0) return idx.fill_(-1);
  const auto points_contig = points.contiguous();
  const int64_t* lengths_ptr = lengths_checked.defined() ? lengths_checked.data_ptr<int64_t>() : nullptr;
  const int64_t* K_ptr = K_checked.defined() ? K_checked.data_ptr<int64_t>() : nullptr;
  const int64_t* start_ptr = start_checked.defined() ? start_checked.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, points.scalar_type(), "sample_farthest_points_cpu", [&] {
    dispatch_dim(dim, [&](auto dim_tag) {
      farthest_points_cpu_kernel<decltype(dim_tag)::value, scalar_t>(points_contig.data_ptr<scalar_t>(), lengths_ptr,
                                                                      K_ptr, start_ptr, B, N, dim, max_K,
                                                                      idx.data_ptr<int64_t>());
    });
  });
  return idx;
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CPU, m) { m.impl("sample_farthest_points", &sample_farthest_points_cpu); }

}  // namespace pointops
