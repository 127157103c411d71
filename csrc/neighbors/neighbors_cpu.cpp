// knn_points and ball_query on the CPU: the reference implementations, multi-threaded over (batch,
// block of queries), each block streaming the reference cloud in tiles as the nearest-neighbour
// kernel does. Distances are the fused forms of chamfer.h, so the results equal the CUDA kernels'
// bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "common/cpu_dispatch.h"
#include "grid/grid.h"
#include "neighbors/neighbors.h"

namespace pointops {
namespace {

constexpr int64_t kQueryBlock = 32;  // queries held while a reference tile is hot in cache
constexpr int64_t kRefTile = 1024;   // reference points converted to acc_t per tile

// What one task (a block of queries of one cloud) works on.
struct QueryBlock {
  int64_t b, q_begin, q_end, q_valid_end, m_valid;
};

QueryBlock query_block(int64_t task, int64_t blocks_per_batch, int64_t N, int64_t M, const int64_t* lengths1,
                       const int64_t* lengths2) {
  QueryBlock blk;
  blk.b = task / blocks_per_batch;
  const int64_t n_valid = lengths1 ? lengths1[blk.b] : N;
  blk.m_valid = lengths2 ? lengths2[blk.b] : M;
  blk.q_begin = (task % blocks_per_batch) * kQueryBlock;
  blk.q_end = std::min(blk.q_begin + kQueryBlock, N);
  blk.q_valid_end = std::min(blk.q_end, std::max(n_valid, blk.q_begin));
  return blk;
}

// Rows [from, to) of a (B, N, K) output get no neighbour: distance 0, index -1.
template <typename scalar_t>
void write_empty_rows(scalar_t* dists, int64_t* idx, int64_t row_from, int64_t row_to, int64_t K) {
  std::fill(dists + row_from * K, dists + row_to * K, scalar_t(0));
  std::fill(idx + row_from * K, idx + row_to * K, int64_t(-1));
}

// A tile of reference points converted to acc_t and stored coordinate-major (tile[c * kRefTile + j])
// so that the distance loop below runs across points in vector lanes.
template <typename scalar_t, typename acc_t>
void load_tile(const scalar_t* points, int64_t count, int64_t dim, acc_t* tile) {
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t c = 0; c < dim; ++c) tile[c * kRefTile + j] = static_cast<acc_t>(points[j * dim + c]);
  }
}

// out[j] = distance(query, tile point j) for j < count, with point_distance's operations in its
// order (bit for bit the same value), vectorised across j.
template <int D, Metric metric, typename acc_t>
C10_ALWAYS_INLINE void tile_distances(const acc_t* query, const acc_t* __restrict tile, int64_t count, int64_t dim,
                                      acc_t* __restrict out) {
  if constexpr (D > 0) {
    for (int64_t j = 0; j < count; ++j) {
      acc_t d = coordinate_term<metric>(query[0] - tile[j]);
#pragma GCC unroll 4
      for (int c = 1; c < D; ++c) d = add_coordinate_term<metric>(query[c] - tile[c * kRefTile + j], d);
      out[j] = d;
    }
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = coordinate_term<metric>(query[0] - tile[j]);
    for (int64_t c = 1; c < dim; ++c) {
      const acc_t* __restrict coordinate = tile + c * kRefTile;
      for (int64_t j = 0; j < count; ++j) out[j] = add_coordinate_term<metric>(query[c] - coordinate[j], out[j]);
    }
  }
}

// Whether any of values[0, count) is below `bound` (NaN is not): a branch-free pass the compiler
// vectorises, so that the scalar scan behind it runs only for the rare blocks holding a candidate.
constexpr int64_t kScanBlock = 16;
template <typename acc_t>
C10_ALWAYS_INLINE bool any_below(const acc_t* __restrict values, int64_t count, acc_t bound) {
  int below = 0;
  for (int64_t j = 0; j < count; ++j) below |= values[j] < bound;
  return below != 0;
}

// Each query keeps its L = min(K, M) best candidates sorted by (distance, index). References are
// visited in increasing index order and a candidate enters only when strictly closer than the L-th
// best, after any equal ones: ties keep the smaller index; NaN and +inf distances never enter. Row
// slots past L (K larger than the cloud) stay empty.
template <int D, Metric metric, typename scalar_t>
void knn_cpu_kernel(const scalar_t* p1, const scalar_t* p2, const int64_t* lengths1, const int64_t* lengths2,
                    int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K, scalar_t* dists, int64_t* idx) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t blocks_per_batch = (N + kQueryBlock - 1) / kQueryBlock;
  const int64_t L = std::min(K, M);
  at::parallel_for(0, B * blocks_per_batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> queries(kQueryBlock * dim), refs(kRefTile * dim), dist(kRefTile), best(kQueryBlock * L);
    std::vector<int64_t> best_idx(kQueryBlock * L);
    call_best_isa([&]() POINTOPS_CLONE_BODY {
      for (int64_t task = begin; task < end; ++task) {
        const QueryBlock blk = query_block(task, blocks_per_batch, N, M, lengths1, lengths2);
        const int64_t row0 = blk.b * N, nq = blk.q_valid_end - blk.q_begin;
        write_empty_rows(dists, idx, row0 + blk.q_valid_end, row0 + blk.q_end, K);  // padding
        if (nq == 0) continue;
        const scalar_t* pb = p1 + (row0 + blk.q_begin) * dim;
        for (int64_t t = 0; t < nq * dim; ++t) queries[t] = static_cast<acc_t>(pb[t]);
        std::fill(best.begin(), best.begin() + nq * L, std::numeric_limits<acc_t>::infinity());
        std::fill(best_idx.begin(), best_idx.begin() + nq * L, int64_t(-1));
        for (int64_t r_begin = 0; r_begin < blk.m_valid; r_begin += kRefTile) {
          const int64_t nr = std::min(kRefTile, blk.m_valid - r_begin);
          load_tile(p2 + (blk.b * M + r_begin) * dim, nr, dim, refs.data());
          for (int64_t q = 0; q < nq; ++q) {
            tile_distances<D, metric>(queries.data() + q * dim, refs.data(), nr, dim, dist.data());
            acc_t* bd = best.data() + q * L;
            int64_t* bi = best_idx.data() + q * L;
            acc_t kth = bd[L - 1];
            for (int64_t j0 = 0; j0 < nr; j0 += kScanBlock) {
              const int64_t j1 = std::min(j0 + kScanBlock, nr);
              if (!any_below(dist.data() + j0, j1 - j0, kth)) continue;  // the common case, vectorised
              for (int64_t j = j0; j < j1; ++j) {
                const acc_t d = dist[j];
                if (d < kth) {  // shift the larger entries up (not equal ones: they keep precedence)
                  int64_t pos = L - 1;
                  for (; pos > 0 && d < bd[pos - 1]; --pos) {
                    bd[pos] = bd[pos - 1];
                    bi[pos] = bi[pos - 1];
                  }
                  bd[pos] = d;
                  bi[pos] = r_begin + j;
                  kth = bd[L - 1];
                }
              }
            }
          }
        }
        for (int64_t q = 0; q < nq; ++q) {
          const int64_t out = (row0 + blk.q_begin + q) * K;
          for (int64_t k = 0; k < K; ++k) {
            const int64_t j = k < L ? best_idx[q * L + k] : -1;
            dists[out + k] = static_cast<scalar_t>(j < 0 ? acc_t(0) : best[q * L + k]);
            idx[out + k] = j;
          }
        }
      }
    });
  });
}

// The first K references (in index order) with distance < radius^2; the rest of the row is empty.
template <int D, typename scalar_t>
void ball_query_cpu_kernel(const scalar_t* p1, const scalar_t* p2, const int64_t* lengths1, const int64_t* lengths2,
                           int64_t B, int64_t N, int64_t M, int64_t dim, int64_t K, double radius, scalar_t* dists,
                           int64_t* idx) {
  using acc_t = at::opmath_type<scalar_t>;
  const acc_t r2 = squared_radius<acc_t>(radius);
  const int64_t blocks_per_batch = (N + kQueryBlock - 1) / kQueryBlock;
  at::parallel_for(0, B * blocks_per_batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> queries(kQueryBlock * dim), refs(kRefTile * dim), dist(kRefTile);
    int64_t found[kQueryBlock];
    call_best_isa([&]() POINTOPS_CLONE_BODY {
      for (int64_t task = begin; task < end; ++task) {
        const QueryBlock blk = query_block(task, blocks_per_batch, N, M, lengths1, lengths2);
        const int64_t row0 = blk.b * N, nq = blk.q_valid_end - blk.q_begin;
        write_empty_rows(dists, idx, row0 + blk.q_valid_end, row0 + blk.q_end, K);
        if (nq == 0) continue;
        const scalar_t* pb = p1 + (row0 + blk.q_begin) * dim;
        for (int64_t t = 0; t < nq * dim; ++t) queries[t] = static_cast<acc_t>(pb[t]);
        std::fill(found, found + nq, int64_t(0));
        int64_t open = nq;  // queries still short of K neighbours
        for (int64_t r_begin = 0; r_begin < blk.m_valid && open > 0; r_begin += kRefTile) {
          const int64_t nr = std::min(kRefTile, blk.m_valid - r_begin);
          load_tile(p2 + (blk.b * M + r_begin) * dim, nr, dim, refs.data());
          for (int64_t q = 0; q < nq; ++q) {
            if (found[q] == K) continue;
            tile_distances<D, Metric::kSquaredL2>(queries.data() + q * dim, refs.data(), nr, dim, dist.data());
            const int64_t out = (row0 + blk.q_begin + q) * K;
            for (int64_t j0 = 0; j0 < nr && found[q] < K; j0 += kScanBlock) {
              const int64_t j1 = std::min(j0 + kScanBlock, nr);
              if (!any_below(dist.data() + j0, j1 - j0, r2)) continue;
              for (int64_t j = j0; j < j1; ++j) {
                if (dist[j] < r2) {
                  dists[out + found[q]] = static_cast<scalar_t>(dist[j]);
                  idx[out + found[q]] = r_begin + j;
                  if (++found[q] == K) {
                    --open;
                    break;
                  }
                }
              }
            }
          }
        }
        for (int64_t q = 0; q < nq; ++q) {
          const int64_t out = (row0 + blk.q_begin + q) * K;
          std::fill(dists + out + found[q], dists + out + K, scalar_t(0));
          std::fill(idx + out + found[q], idx + out + K, int64_t(-1));
        }
      }
    });
  });
}

std::tuple<at::Tensor, at::Tensor> knn_points_cpu(const at::Tensor& p1, const at::Tensor& p2,
                                                  const c10::optional<at::Tensor>& lengths1,
                                                  const c10::optional<at::Tensor>& lengths2, int64_t K, int64_t norm,
                                                  c10::string_view algorithm) {
  const auto [len1, len2] = check_knn_inputs(p1, p2, lengths1, lengths2, K, norm);
  const Metric metric = metric_from_norm(norm);
  if (choose_grid(algorithm, p1.size(0), p1.size(1), p2.size(1), p1.size(2), K, &grid_pays_cpu)) {
    // "auto": the grid may hand the search back after probing the data (far queries)
    bool declined = false;
    auto [dists, idx] = knn_grid_cpu(p1, p2, len1, len2, K, metric, /*zero_unmatched=*/true,
                                     grid_may_decline(algorithm) ? &declined : nullptr);
    if (!declined) return {dists, idx};
  }
  if (K == 1) {  // the nearest-neighbour search itself: knn_points(K=1) is nearest_neighbor bit for bit
    auto [dist, idx] = nearest_neighbor_direction_cpu(p1, p2, len1, len2, metric, /*zero_unmatched=*/true);
    return {dist.unsqueeze(2), idx.unsqueeze(2)};
  }
  const int64_t B = p1.size(0), N = p1.size(1), M = p2.size(1), dim = p1.size(2);
  auto dists = at::empty({B, N, K}, p1.options());
  auto idx = at::empty({B, N, K}, p1.options().dtype(at::kLong));
  if (B * N == 0) return {dists, idx};
  if (M == 0) return {dists.zero_(), idx.fill_(-1)};
  const auto q = p1.contiguous(), r = p2.contiguous();
  const int64_t* l1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
  const int64_t* l2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p1.scalar_type(), "knn_points_cpu", [&] {
    dispatch_metric(metric, [&](auto metric_tag) {
      dispatch_dim(dim, [&](auto dim_tag) {
        knn_cpu_kernel<decltype(dim_tag)::value, decltype(metric_tag)::value, scalar_t>(
            q.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(), l1, l2, B, N, M, dim, K, dists.data_ptr<scalar_t>(),
            idx.data_ptr<int64_t>());
      });
    });
  });
  return {dists, idx};
}

std::tuple<at::Tensor, at::Tensor> ball_query_cpu(const at::Tensor& p1, const at::Tensor& p2,
                                                  const c10::optional<at::Tensor>& lengths1,
                                                  const c10::optional<at::Tensor>& lengths2, int64_t K, double radius,
                                                  c10::string_view algorithm) {
  const auto [len1, len2] = check_ball_query_inputs(p1, p2, lengths1, lengths2, K, radius);
  // K here only caps the output: neither search's cost grows with it (brute force scans until K
  // are found, the grid keeps its candidates in a buffer), so "auto" decides as for one neighbour.
  if (choose_grid(algorithm, p1.size(0), p1.size(1), p2.size(1), p1.size(2), 1, &grid_pays_cpu)) {
    return ball_query_grid_cpu(p1, p2, len1, len2, K, radius);
  }
  const int64_t B = p1.size(0), N = p1.size(1), M = p2.size(1), dim = p1.size(2);
  auto dists = at::empty({B, N, K}, p1.options());
  auto idx = at::empty({B, N, K}, p1.options().dtype(at::kLong));
  if (B * N == 0) return {dists, idx};
  const auto q = p1.contiguous(), r = p2.contiguous();
  const int64_t* l1 = len1.defined() ? len1.data_ptr<int64_t>() : nullptr;
  const int64_t* l2 = len2.defined() ? len2.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p1.scalar_type(), "ball_query_cpu", [&] {
    dispatch_dim(dim, [&](auto dim_tag) {
      ball_query_cpu_kernel<decltype(dim_tag)::value, scalar_t>(q.data_ptr<scalar_t>(), r.data_ptr<scalar_t>(), l1,
                                                                l2, B, N, M, dim, K, radius,
                                                                dists.data_ptr<scalar_t>(), idx.data_ptr<int64_t>());
    });
  });
  return {dists, idx};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CPU, m) {
  m.impl("knn_points", &knn_points_cpu);
  m.impl("ball_query", &ball_query_cpu);
}

}  // namespace pointops
