// Nearest neighbour / Chamfer on the CPU: the reference implementation, multi-threaded over
// (batch, block of queries), each block streaming the reference cloud in cache-sized tiles.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "chamfer/chamfer.h"
#include "common/cpu_dispatch.h"
#include "grid/grid.h"

namespace pointops {
namespace {

constexpr int64_t kQueryBlock = 32;  // queries held while a reference tile is hot in L1/L2
constexpr int64_t kRefTile = 1024;   // reference points converted to acc_t per tile

template <int D, Metric metric, typename scalar_t>
void nearest_neighbor_cpu_kernel(const scalar_t* x, const scalar_t* y, const int64_t* x_lengths,
                                 const int64_t* y_lengths, int64_t B, int64_t N, int64_t M,
                                 int64_t dim, bool zero_unmatched, scalar_t* dist, int64_t* idx) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t blocks_per_batch = (N + kQueryBlock - 1) / kQueryBlock;
  at::parallel_for(0, B * blocks_per_batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> queries(kQueryBlock * dim), refs(std::min(kRefTile, std::max<int64_t>(M, 1)) * dim);
    acc_t best[kQueryBlock];
    int64_t best_idx[kQueryBlock];
    call_best_isa([&]() POINTOPS_CLONE_BODY {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / blocks_per_batch;
        const int64_t n_valid = x_lengths ? x_lengths[b] : N;
        const int64_t m_valid = y_lengths ? y_lengths[b] : M;
        const int64_t q_begin = (task % blocks_per_batch) * kQueryBlock;
        const int64_t q_end = std::min(q_begin + kQueryBlock, N);
        const int64_t q_valid_end = std::min(q_end, std::max(n_valid, q_begin));
        const int64_t nq = q_valid_end - q_begin;
        for (int64_t i = q_valid_end; i < q_end; ++i) {  // padding: never matched
          dist[b * N + i] = scalar_t(0);
          idx[b * N + i] = -1;
        }
        if (nq == 0) continue;
        const scalar_t* xb = x + (b * N + q_begin) * dim;
        for (int64_t t = 0; t < nq * dim; ++t) queries[t] = static_cast<acc_t>(xb[t]);
        std::fill(best, best + nq, std::numeric_limits<acc_t>::infinity());
        std::fill(best_idx, best_idx + nq, int64_t(-1));
        for (int64_t r_begin = 0; r_begin < m_valid; r_begin += kRefTile) {
          const int64_t nr = std::min(kRefTile, m_valid - r_begin);
          const scalar_t* yb = y + (b * M + r_begin) * dim;
          for (int64_t t = 0; t < nr * dim; ++t) refs[t] = static_cast<acc_t>(yb[t]);
          for (int64_t q = 0; q < nq; ++q) {
            const acc_t* qp = queries.data() + q * dim;
            acc_t bq = best[q];
            int64_t bi = best_idx[q];
            for (int64_t j = 0; j < nr; ++j) {
              const acc_t d = point_distance_any<D, metric>(qp, refs.data() + j * dim, dim);
              // Strict '<' in increasing j: ties keep the smallest index; NaN never wins.
              if (d < bq) {
                bq = d;
                bi = r_begin + j;
              }
            }
            best[q] = bq;
            best_idx[q] = bi;
          }
        }
        for (int64_t q = 0; q < nq; ++q) {
          const int64_t out = b * N + q_begin + q;
          dist[out] = static_cast<scalar_t>(best_idx[q] < 0 ? unmatched_distance<acc_t>(m_valid, zero_unmatched) : best[q]);
          idx[out] = best_idx[q];
        }
      }
    });
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_direction_cpu(const at::Tensor& x, const at::Tensor& y,
                                                                  const at::Tensor& x_lengths,
                                                                  const at::Tensor& y_lengths, Metric metric,
                                                                  bool zero_unmatched) {
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1), dim = x.size(2);
  auto dist = at::empty({B, N}, x.options());
  auto idx = at::empty({B, N}, x.options().dtype(at::kLong));
  if (B * N == 0) return {dist, idx};
  const auto x_contig = x.contiguous();
  const auto y_contig = y.contiguous();
  const int64_t* xl = x_lengths.defined() ? x_lengths.data_ptr<int64_t>() : nullptr;
  const int64_t* yl = y_lengths.defined() ? y_lengths.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "nearest_neighbor_cpu", [&] {
    dispatch_metric(metric, [&](auto metric_tag) {
      dispatch_dim(dim, [&](auto dim_tag) {
        nearest_neighbor_cpu_kernel<decltype(dim_tag)::value, decltype(metric_tag)::value, scalar_t>(
            x_contig.data_ptr<scalar_t>(), y_contig.data_ptr<scalar_t>(), xl, yl, B, N, M, dim, zero_unmatched,
            dist.data_ptr<scalar_t>(), idx.data_ptr<int64_t>());
      });
    });
  });
  return {dist, idx};
}

namespace {

// One direction with the search `algorithm` picks (the grid returns brute force's result bit for bit).
// "auto" (may_decline) lets the grid hand the search back to brute force after probing the data.
std::tuple<at::Tensor, at::Tensor> nearest_neighbor_search_cpu(const at::Tensor& x, const at::Tensor& y,
                                                               const at::Tensor& x_len, const at::Tensor& y_len,
                                                               Metric metric, bool grid, bool may_decline) {
  if (grid) {
    bool declined = false;
    auto [dist, idx] = knn_grid_cpu(x, y, x_len, y_len, /*K=*/1, metric, /*zero_unmatched=*/false,
                                    may_decline ? &declined : nullptr);
    if (!declined) return {dist.squeeze(2), idx.squeeze(2)};
  }
  return nearest_neighbor_direction_cpu(x, y, x_len, y_len, metric, false);
}

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_cpu(const at::Tensor& x, const at::Tensor& y,
                                                        const c10::optional<at::Tensor>& x_lengths,
                                                        const c10::optional<at::Tensor>& y_lengths,
                                                        int64_t norm, c10::string_view algorithm) {
  const auto [x_len, y_len] = check_nearest_neighbor_inputs(x, y, x_lengths, y_lengths);
  const Metric metric = metric_from_norm(norm);
  const bool grid = choose_grid(algorithm, x.size(0), x.size(1), y.size(1), x.size(2), 1, &grid_pays_cpu);
  return nearest_neighbor_search_cpu(x, y, x_len, y_len, metric, grid, grid_may_decline(algorithm));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> chamfer_cpu(
    const at::Tensor& x, const at::Tensor& y, const c10::optional<at::Tensor>& x_lengths,
    const c10::optional<at::Tensor>& y_lengths, int64_t norm, c10::string_view algorithm) {
  const auto [x_len, y_len] = check_nearest_neighbor_inputs(x, y, x_lengths, y_lengths);
  const Metric metric = metric_from_norm(norm);
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1), dim = x.size(2);
  // each direction decides on its own sizes ("grid" forces both)
  const bool grid1 = choose_grid(algorithm, B, N, M, dim, 1, &grid_pays_cpu);
  const bool grid2 = choose_grid(algorithm, B, M, N, dim, 1, &grid_pays_cpu);
  const bool may_decline = grid_may_decline(algorithm);
  auto [dist1, idx1] = nearest_neighbor_search_cpu(x, y, x_len, y_len, metric, grid1, may_decline);
  auto [dist2, idx2] = nearest_neighbor_search_cpu(y, x, y_len, x_len, metric, grid2, may_decline);
  return {dist1, dist2, idx1, idx2};
}

// d/dx |x - y[j]|^2 = 2 (x - y[j]) (L1: sign(x - y[j])) for each of a query's K neighbours j =
// idx[q, k] (K = 1 for nearest_neighbor), summed in k order; the matched reference point gets the
// negative. The reference gradient is gathered per reference point over its matched pairs in
// increasing pair order (counted by the launcher), so it is deterministic and thread-parallel.
template <Metric metric, typename scalar_t>
void nearest_neighbor_backward_cpu_kernel(const scalar_t* grad_dist, const scalar_t* x,
                                          const scalar_t* y, const int64_t* idx,
                                          const int64_t* order, const int64_t* offsets, int64_t B,
                                          int64_t N, int64_t M, int64_t K, int64_t dim, scalar_t* grad_x,
                                          scalar_t* grad_y) {
  using acc_t = at::opmath_type<scalar_t>;
  at::parallel_for(0, B * N, 256, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(dim);
    for (int64_t q = begin; q < end; ++q) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      bool any = false;  // the first term is taken as is: K = 1 keeps the sign of a zero gradient
      for (int64_t k = 0; k < K; ++k) {
        const int64_t j = idx[q * K + k];
        if (j < 0) continue;
        const acc_t g = static_cast<acc_t>(grad_dist[q * K + k]);
        const scalar_t* yr = y + ((q / N) * M + j) * dim;
        for (int64_t c = 0; c < dim; ++c) {
          const acc_t term = g * distance_derivative<metric>(static_cast<acc_t>(x[q * dim + c]) - static_cast<acc_t>(yr[c]));
          acc[c] = any ? acc[c] + term : term;
        }
        any = true;
      }
      for (int64_t c = 0; c < dim; ++c) grad_x[q * dim + c] = static_cast<scalar_t>(acc[c]);
    }
  });
  at::parallel_for(0, B * M, 256, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(dim);
    for (int64_t r = begin; r < end; ++r) {
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t t = offsets[r]; t < offsets[r + 1]; ++t) {
        const int64_t pair = order[t], q = pair / K;
        const acc_t g = static_cast<acc_t>(grad_dist[pair]);
        for (int64_t c = 0; c < dim; ++c) {
          acc[c] -= g * distance_derivative<metric>(static_cast<acc_t>(x[q * dim + c]) -
                                                    static_cast<acc_t>(y[r * dim + c]));
        }
      }
      for (int64_t c = 0; c < dim; ++c) grad_y[r * dim + c] = static_cast<scalar_t>(acc[c]);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> nearest_neighbor_backward_cpu(const at::Tensor& grad_dist,
                                                                 const at::Tensor& x,
                                                                 const at::Tensor& y,
                                                                 const at::Tensor& idx, int64_t norm) {
  check_nearest_neighbor_backward_inputs(grad_dist, x, y, idx);
  const Metric metric = metric_from_norm(norm);
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1), dim = x.size(2);
  const int64_t K = idx.dim() == 3 ? idx.size(2) : 1;
  auto grad_x = at::empty_like(x, at::MemoryFormat::Contiguous);
  auto grad_y = at::empty_like(y, at::MemoryFormat::Contiguous);
  if (B * N * K == 0 || M == 0) {
    grad_x.zero_();
    grad_y.zero_();
    return {grad_x, grad_y};
  }
  const auto grad_contig = grad_dist.contiguous();
  const auto x_contig = x.contiguous();
  const auto y_contig = y.contiguous();
  const auto idx_contig = idx.contiguous();
  // The pairs of each reference point in increasing pair order (the order the CUDA path's stable
  // sort gives), by counting: one pass over idx, no sort and no tensor ops (their host time is most
  // of a small call). The same pass refuses a hand-made index outside [-1, M), which would read past y.
  const int64_t pairs = B * N * K;
  const int64_t* idx_ptr = idx_contig.const_data_ptr<int64_t>();
  std::vector<int64_t> offsets(B * M + 1, 0);
  int64_t lo = idx_ptr[0], hi = idx_ptr[0];
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t j = idx_ptr[p];
    lo = std::min(lo, j);
    hi = std::max(hi, j);
    if (j >= 0 && j < M) ++offsets[(p / (N * K)) * M + j + 1];
  }
  TORCH_CHECK(lo >= -1 && hi < M, "idx must hold indices in [-1, ", M, ") (into y), got values in [", lo, ", ", hi,
              "]");
  for (int64_t r = 0; r < B * M; ++r) offsets[r + 1] += offsets[r];
  std::vector<int64_t> order(offsets[B * M]);
  {
    std::vector<int64_t> cursor(offsets.begin(), offsets.end() - 1);
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t j = idx_ptr[p];
      if (j >= 0) order[cursor[(p / (N * K)) * M + j]++] = p;
    }
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "nearest_neighbor_backward_cpu", [&] {
    dispatch_metric(metric, [&](auto metric_tag) {
      nearest_neighbor_backward_cpu_kernel<decltype(metric_tag)::value, scalar_t>(
          grad_contig.data_ptr<scalar_t>(), x_contig.data_ptr<scalar_t>(), y_contig.data_ptr<scalar_t>(),
          idx_contig.data_ptr<int64_t>(), order.data(), offsets.data(), B, N,
          M, K, dim, grad_x.data_ptr<scalar_t>(), grad_y.data_ptr<scalar_t>());
    });
  });
  return {grad_x, grad_y};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CPU, m) {
  m.impl("nearest_neighbor", &nearest_neighbor_cpu);
  m.impl("chamfer", &chamfer_cpu);
  m.impl("_nearest_neighbor_backward", &nearest_neighbor_backward_cpu);
}

}  // namespace pointops
