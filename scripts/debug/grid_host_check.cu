// The CUDA grid search's logic (csrc/grid/grid_cuda.cuh) run on the CPU, bit for bit against a
// brute-force scan, on a machine without a GPU. The device build (bounds, keys, radix sort, hash
// inserts) is emulated on the host with the header's own functions (make_grid_params,
// point_sort_key, the key layout, linear probing from fmix64); every query is then searched with
// knn_search_query / ball_search_query, the exact functions the kernels call. What this does not
// check: the kernels' atomics, reductions and the cub sort (standard pieces), and device rounding
// (point_distance is one fma per term on both sides, as chamfer.h guarantees).
//
//   scripts/debug/grid_host_check.sh [cases] [seed] [-v]   random cases (default 3000), bit for bit
//   scripts/debug/grid_host_check.sh model D N M K knn|ball [radius] [points_per_cell]
//       one uniform unit-cube cloud pair (float): the grid's shape and the work per query (cells
//       enumerated, hash lookups, distances, rings / passes), 500 queries checked against brute force
//   scripts/debug/grid_host_check.sh scan FILE FLOATS_PER_POINT[h] [points_per_cell,...]
//       a real scan (headerless float32, or float16 with 'h'; x y z first) against itself after grid_cuda_check.py's rigid
//       motion, K = 1 both directions: the work per query and the host search time for each cell rule;
//       SCAN_TAIL=1 also searches every query and prints the tail (per query and per warp of 32
//       sorted queries), what a launch of about one wave waits for
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// Work counters of the searches (host pass only).
struct Stats {
  int64_t cells = 0, lookups = 0, points = 0, rings = 0;
};
static Stats g_stats;
#if !defined(__CUDA_ARCH__)
#define POINTOPS_GRID_COUNT(counter) (++g_stats.counter)
#define POINTOPS_GRID_COUNT_ADD(counter, amount) (g_stats.counter += (amount))
#else
#define POINTOPS_GRID_COUNT(counter)
#define POINTOPS_GRID_COUNT_ADD(counter, amount)
#endif

#include "grid/grid_cuda.cuh"
#include "neighbors/neighbors.h"

using namespace pointops;
using namespace pointops::grid_cuda;

namespace {

int bit_width(uint64_t v) {
  int bits = 0;
  for (; v != 0; v >>= 1) ++bits;
  return bits;
}

template <typename acc_t, int D>
struct HostGrid {
  std::vector<GridParams> grids;
  std::vector<CellSlot> table;
  std::vector<GridPoint<acc_t, D>> points;
  std::vector<int32_t> order;
  uint64_t mask = 0;
  int log2_cells = 0;
  int64_t max_run = 0;
};

template <typename acc_t, int D>
HostGrid<acc_t, D> build(const std::vector<acc_t>& q, const std::vector<acc_t>& r, const std::vector<int64_t>& len1,
                         const std::vector<int64_t>& len2, int64_t B, int64_t N, int64_t M, BuildConfig cfg) {
  HostGrid<acc_t, D> g;
  g.log2_cells = cfg.log2_cells;
  g.grids.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    double lo[3] = {INFINITY, INFINITY, INFINITY}, hi[3] = {-INFINITY, -INFINITY, -INFINITY};
    int64_t count = 0;
    const int64_t m_valid = len2.empty() ? M : len2[b];
    for (int64_t j = 0; j < m_valid; ++j) {
      const acc_t* p = r.data() + (b * M + j) * D;
      if (!finite_point<acc_t, D>(p)) continue;
      ++count;
      for (int a = 0; a < D; ++a) {
        lo[a] = std::fmin(lo[a], static_cast<double>(p[a]));
        hi[a] = std::fmax(hi[a], static_cast<double>(p[a]));
      }
    }
    g.grids[b] = make_grid_params<D>(lo, hi, count, cfg);
  }
  const int query_bit = bit_width(static_cast<uint64_t>(B)) + cfg.log2_cells;
  const int64_t total = B * (M + N);
  std::vector<uint64_t> keys(total);
  for (int64_t e = 0; e < total; ++e) {
    const bool is_ref = e < B * M;
    const int64_t f = is_ref ? e : e - B * M, size = is_ref ? M : N, b = f / size, i = f - b * size;
    const auto& lengths = is_ref ? len2 : len1;
    const acc_t* p = (is_ref ? r.data() : q.data()) + f * D;
    const uint64_t key = point_sort_key<acc_t, D>(p, b, i, lengths.empty() ? size : lengths[b], B, g.grids[b],
                                                  cfg.log2_cells);
    keys[e] = is_ref ? key : (key | (1ull << query_bit));
  }
  g.order.resize(total);
  std::iota(g.order.begin(), g.order.end(), 0);
  std::stable_sort(g.order.begin(), g.order.end(), [&](int32_t x, int32_t y) { return keys[x] < keys[y]; });
  int64_t capacity = 64;
  while (capacity < 2 * std::max<int64_t>(B * M, 1)) capacity <<= 1;
  g.mask = static_cast<uint64_t>(capacity - 1);
  g.table.assign(capacity, CellSlot{kEmptyKey, -7, -7});
  g.points.resize(B * M);
  const uint64_t invalid = static_cast<uint64_t>(B) << cfg.log2_cells;
  for (int64_t s = 0; s < B * M; ++s) {
    const uint64_t key = keys[g.order[s]];
    if (key >= invalid) continue;
    const int64_t v = g.order[s], b = v / M;
    for (int a = 0; a < D; ++a) g.points[s].c[a] = r[v * D + a];
    g.points[s].idx = static_cast<int32_t>(v - b * M);
    if (s > 0 && keys[g.order[s - 1]] == key) continue;
    int64_t end = s + 1;
    while (end < B * M && keys[g.order[end]] == key) ++end;
    g.max_run = std::max(g.max_run, end - s);
    uint64_t h = fmix64(key) & g.mask;
    while (g.table[h].key != kEmptyKey) h = (h + 1) & g.mask;
    g.table[h] = CellSlot{key, static_cast<int32_t>(s), static_cast<int32_t>(end)};
  }
  return g;
}

// The brute-force answers (the CUDA brute-force kernels' contract), one valid query at a time:
// the K best (distance, index) of its cloud, NaN / +inf never listed.
template <typename acc_t, int D, Metric metric>
void brute_knn_row(const acc_t* query, const acc_t* refs, int64_t m_valid, int64_t K, bool zero_unmatched,
                   acc_t* dist, int64_t* idx) {
  std::vector<std::pair<acc_t, int64_t>> cand;
  for (int64_t j = 0; j < m_valid; ++j) {
    const acc_t d = point_distance<D, metric>(query, refs + j * D);
    if (d < std::numeric_limits<acc_t>::infinity()) cand.push_back({d, j});
  }
  std::stable_sort(cand.begin(), cand.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  for (int64_t k = 0; k < K; ++k) {
    dist[k] = k < static_cast<int64_t>(cand.size()) ? cand[k].first : acc_t(0);
    idx[k] = k < static_cast<int64_t>(cand.size()) ? cand[k].second : -1;
  }
  if (K == 1 && cand.empty()) dist[0] = unmatched_distance<acc_t>(m_valid, zero_unmatched);
}

// The first K references in index order with distance < r2.
template <typename acc_t, int D>
void brute_ball_row(const acc_t* query, const acc_t* refs, int64_t m_valid, int64_t K, acc_t r2, acc_t* dist,
                    int64_t* idx) {
  int64_t found = 0;
  for (int64_t j = 0; j < m_valid && found < K; ++j) {
    const acc_t d = point_distance<D, Metric::kSquaredL2>(query, refs + j * D);
    if (d < r2) {
      dist[found] = d;
      idx[found] = j;
      ++found;
    }
  }
  for (; found < K; ++found) {
    dist[found] = acc_t(0);
    idx[found] = -1;
  }
}

template <typename acc_t, int D, Metric metric>
void brute_knn(const std::vector<acc_t>& q, const std::vector<acc_t>& r, const std::vector<int64_t>& len1,
               const std::vector<int64_t>& len2, int64_t B, int64_t N, int64_t M, int64_t K, bool zero_unmatched,
               std::vector<acc_t>& dist, std::vector<int64_t>& idx) {
  dist.assign(B * N * K, acc_t(0));
  idx.assign(B * N * K, -1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n_valid = len1.empty() ? N : len1[b], m_valid = len2.empty() ? M : len2[b];
    for (int64_t i = 0; i < n_valid; ++i) {
      const int64_t row = (b * N + i) * K;
      brute_knn_row<acc_t, D, metric>(q.data() + (b * N + i) * D, r.data() + b * M * D, m_valid, K, zero_unmatched,
                                      dist.data() + row, idx.data() + row);
    }
  }
}

template <typename acc_t, int D>
void brute_ball(const std::vector<acc_t>& q, const std::vector<acc_t>& r, const std::vector<int64_t>& len1,
                const std::vector<int64_t>& len2, int64_t B, int64_t N, int64_t M, int64_t K, acc_t r2,
                std::vector<acc_t>& dist, std::vector<int64_t>& idx) {
  dist.assign(B * N * K, acc_t(0));
  idx.assign(B * N * K, -1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n_valid = len1.empty() ? N : len1[b], m_valid = len2.empty() ? M : len2[b];
    for (int64_t i = 0; i < n_valid; ++i) {
      const int64_t row = (b * N + i) * K;
      brute_ball_row<acc_t, D>(q.data() + (b * N + i) * D, r.data() + b * M * D, m_valid, K, r2, dist.data() + row,
                               idx.data() + row);
    }
  }
}

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  double uniform(double lo = 0, double hi = 1) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  double normal() { return std::normal_distribution<double>(0, 1)(gen); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
  bool chance(double p) { return uniform() < p; }
};

// One cloud's coordinates in a named shape.
template <typename acc_t, int D>
void fill_cloud(Rng& rng, int shape, double offset, double scale, int64_t count, acc_t* out) {
  const int centers = 1 + static_cast<int>(rng.integer(0, 3));
  double center[4][3];
  for (auto& c : center) {
    for (double& x : c) x = rng.uniform();
  }
  const double dir[3] = {rng.normal(), rng.normal(), rng.normal()};
  for (int64_t j = 0; j < count; ++j) {
    double p[3] = {0, 0, 0};
    switch (shape) {
      case 0:  // uniform
        for (double& x : p) x = rng.uniform();
        break;
      case 1: {  // clusters (many points per cell)
        const auto& c = center[rng.integer(0, centers - 1)];
        for (int a = 0; a < 3; ++a) p[a] = c[a] + 1e-3 * rng.normal();
        break;
      }
      case 2:  // all equal
        for (int a = 0; a < 3; ++a) p[a] = center[0][a];
        break;
      case 3: {  // a line
        const double t = rng.uniform();
        for (int a = 0; a < 3; ++a) p[a] = center[0][a] + t * dir[a];
        break;
      }
      case 4:  // a plane (z constant)
        p[0] = rng.uniform(), p[1] = rng.uniform(), p[2] = 0.5;
        break;
      case 5:  // a small integer lattice: many exact ties
        for (double& x : p) x = static_cast<double>(rng.integer(0, 4)) / 4;
        break;
      case 6:  // mixed: uniform plus a dense cluster
        if (rng.chance(0.5)) {
          for (double& x : p) x = rng.uniform();
        } else {
          for (int a = 0; a < 3; ++a) p[a] = center[0][a] + 1e-4 * rng.normal();
        }
        break;
      default:  // a thin slab (nearly a plane)
        p[0] = rng.uniform(), p[1] = rng.uniform(), p[2] = 0.5 + 1e-7 * rng.normal();
        break;
    }
    for (int a = 0; a < D; ++a) out[j * D + a] = static_cast<acc_t>(offset + scale * p[a]);
  }
}

template <typename acc_t>
void poison(Rng& rng, acc_t* p, int64_t count, int D, double rate) {
  for (int64_t j = 0; j < count; ++j) {
    if (!rng.chance(rate)) continue;
    const int a = static_cast<int>(rng.integer(0, D - 1));
    const int kind = static_cast<int>(rng.integer(0, 2));
    p[j * D + a] = kind == 0 ? std::numeric_limits<acc_t>::quiet_NaN()
                             : (kind == 1 ? std::numeric_limits<acc_t>::infinity()
                                          : -std::numeric_limits<acc_t>::infinity());
  }
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The kernels' arguments over a host-built grid (zero_unmatched and r2 left to the caller).
template <typename acc_t, int D>
SearchArgs<acc_t, D> host_search_args(const HostGrid<acc_t, D>& grid, const std::vector<acc_t>& q,
                                      const std::vector<acc_t>& r, const std::vector<int64_t>& len1,
                                      const std::vector<int64_t>& len2, int64_t B, int64_t N, int64_t M, int64_t K,
                                      std::vector<acc_t>& dist, std::vector<int64_t>& idx) {
  SearchArgs<acc_t, D> a{};
  a.queries = q.data();
  a.refs = r.data();
  a.lengths1 = len1.empty() ? nullptr : len1.data();
  a.lengths2 = len2.empty() ? nullptr : len2.data();
  a.B = B, a.N = N, a.M = M, a.K = K;
  a.grids = grid.grids.data();
  a.table = grid.table.data();
  a.mask = grid.mask;
  a.points = grid.points.data();
  a.order = grid.order.data();
  a.log2_cells = grid.log2_cells;
  a.dists = dist.data();
  a.idx = idx.data();
  return a;
}

int64_t g_failures = 0;
int64_t g_cases = 0;

template <typename acc_t, int D, Metric metric, int KP>
void run_knn(const SearchArgs<acc_t, D>& a) {
  for (int64_t t = 0; t < a.B * a.N; ++t) knn_search_query<acc_t, D, metric, KP>(a, t);
}
template <typename acc_t, int D, int KP>
void run_ball(const SearchArgs<acc_t, D>& a) {
  for (int64_t t = 0; t < a.B * a.N; ++t) ball_search_query<acc_t, D, KP>(a, t);
}

template <typename acc_t, int D>
void one_case(Rng& rng, int64_t case_id, bool verbose) {
  const int64_t B = rng.integer(1, 3);
  const int64_t N = rng.chance(0.1) ? rng.integer(0, 3) : rng.integer(1, 700);
  int64_t M = rng.chance(0.1) ? rng.integer(0, 3) : rng.integer(1, 900);
  const int shape_q = static_cast<int>(rng.integer(0, 7));
  const int shape_r = rng.chance(0.7) ? shape_q : static_cast<int>(rng.integer(0, 7));
  const bool far = rng.chance(0.2);
  const double scale = rng.chance(0.1) ? std::pow(10.0, static_cast<double>(rng.integer(-20, 20))) : 1.0;
  const double offset = far ? (sizeof(acc_t) == 4 ? 1e5 : 1e9) * (rng.chance(0.5) ? 1 : -1) : 0.0;
  const double q_shift = rng.chance(0.3) ? rng.uniform(-2, 2) * scale : 0.0;  // queries partly outside the grid
  std::vector<acc_t> q(B * N * D), r(B * M * D);
  for (int64_t b = 0; b < B; ++b) {
    fill_cloud<acc_t, D>(rng, shape_q, offset + q_shift, scale, N, q.data() + b * N * D);
    fill_cloud<acc_t, D>(rng, shape_r, offset, scale, M, r.data() + b * M * D);
  }
  if (rng.chance(0.15)) {
    poison(rng, q.data(), B * N, D, 0.05);
    poison(rng, r.data(), B * M, D, 0.05);
  }
  if (rng.chance(0.05)) {  // a cloud against itself: every query has a neighbour at distance 0
    r = q;
    M = N;
  }
  std::vector<int64_t> len1, len2;
  if (rng.chance(0.3)) {
    for (int64_t b = 0; b < B; ++b) {
      len1.push_back(rng.integer(0, N));
      len2.push_back(rng.chance(0.2) ? 0 : rng.integer(0, M));
    }
  }
  const bool ball = rng.chance(0.35);
  const int64_t K = ball ? (rng.chance(0.2) ? rng.integer(65, 200) : rng.integer(1, 64))
                         : (rng.chance(0.3) ? 1 : (rng.chance(0.15) ? rng.integer(65, 150) : rng.integer(2, 64)));
  const Metric metric = (!ball && rng.chance(0.4)) ? Metric::kL1 : Metric::kSquaredL2;
  const bool zero_unmatched = rng.chance(0.5);
  const double radius = scale * std::pow(10.0, rng.uniform(-3, 0.3));
  BuildConfig cfg{};
  cfg.points_per_cell = rng.chance(0.3) ? std::pow(10.0, rng.uniform(-1.5, 2)) : (K == 1 ? 2.0 : double(K));
  cfg.min_cell = ball ? radius : 0.0;
  cfg.log2_cells = rng.chance(0.15) ? static_cast<int>(rng.integer(6, 12))
                                    : bit_width(static_cast<uint64_t>(std::max<int64_t>(8 * M, 64)) - 1);

  const auto grid = build<acc_t, D>(q, r, len1, len2, B, N, M, cfg);
  std::vector<acc_t> dist(B * N * K, acc_t(-12345));
  std::vector<int64_t> idx(B * N * K, -12345);
  auto a = host_search_args<acc_t, D>(grid, q, r, len1, len2, B, N, M, K, dist, idx);
  a.zero_unmatched = zero_unmatched;
  a.r2 = squared_radius<acc_t>(radius);
  std::vector<acc_t> want_dist;
  std::vector<int64_t> want_idx;
  if (ball) {
    if (K <= 8) run_ball<acc_t, D, 8>(a);
    else if (K <= 16) run_ball<acc_t, D, 16>(a);
    else if (K <= 32) run_ball<acc_t, D, 32>(a);
    else run_ball<acc_t, D, 64>(a);
    brute_ball<acc_t, D>(q, r, len1, len2, B, N, M, K, a.r2, want_dist, want_idx);
  } else {
    dispatch_metric(metric, [&](auto tag) {
      constexpr Metric m = decltype(tag)::value;
      if (K == 1) run_knn<acc_t, D, m, 1>(a);
      else if (K <= 8) run_knn<acc_t, D, m, 8>(a);
      else if (K <= 16) run_knn<acc_t, D, m, 16>(a);
      else if (K <= 32) run_knn<acc_t, D, m, 32>(a);
      else run_knn<acc_t, D, m, 64>(a);
      brute_knn<acc_t, D, m>(q, r, len1, len2, B, N, M, K, zero_unmatched, want_dist, want_idx);
    });
  }
  ++g_cases;
  const bool ok = same_bits(dist, want_dist) && want_idx == idx;
  if (!ok || verbose) {
    const auto& g0 = grid.grids[0];
    std::printf("%s case %" PRId64 ": %s %s D=%d B=%" PRId64 " N=%" PRId64 " M=%" PRId64 " K=%" PRId64
                " metric=%d shapes=%d/%d far=%d scale=%g shift=%g ragged=%d radius=%g rho=%g log2=%d dims=%d,%d,%d "
                "h=%g max_run=%" PRId64 "\n",
                ok ? "ok" : "MISMATCH", case_id, sizeof(acc_t) == 4 ? "float" : "double", ball ? "ball" : "knn", D, B,
                N, M, K, static_cast<int>(metric), shape_q, shape_r, far, scale, q_shift, !len1.empty(), radius,
                cfg.points_per_cell, cfg.log2_cells, g0.dims[0], g0.dims[1], g0.dims[2], g0.h[0], grid.max_run);
  }
  if (!ok) {
    ++g_failures;
    int shown = 0;
    for (int64_t e = 0; e < B * N * K && shown < 5; ++e) {
      if (std::memcmp(&dist[e], &want_dist[e], sizeof(acc_t)) != 0 || idx[e] != want_idx[e]) {
        std::printf("   row %" PRId64 " slot %" PRId64 ": grid (%.9g, %" PRId64 ") brute (%.9g, %" PRId64 ")\n",
                    e / K, e % K, static_cast<double>(dist[e]), idx[e], static_cast<double>(want_dist[e]),
                    want_idx[e]);
        ++shown;
      }
    }
  }
}

// One uniform unit-cube pair: the grid's shape and the work per query, a sample checked.
template <int D>
int model(int64_t N, int64_t M, int64_t K, bool ball, double radius, double rho) {
  using acc_t = float;
  Rng rng(42);
  std::vector<acc_t> q(N * D), r(M * D);
  for (auto& x : q) x = static_cast<acc_t>(rng.uniform());
  for (auto& x : r) x = static_cast<acc_t>(rng.uniform());
  BuildConfig cfg{};
  cfg.points_per_cell = rho > 0 ? rho : (ball ? 2.0 : (K == 1 ? 2.0 : double(K)));
  cfg.min_cell = ball ? radius : 0.0;
  cfg.log2_cells = bit_width(static_cast<uint64_t>(std::max<int64_t>(8 * M, 64)) - 1);
  const auto grid = build<acc_t, D>(q, r, {}, {}, 1, N, M, cfg);
  int64_t occupied = 0;
  for (const auto& slot : grid.table) occupied += slot.key != kEmptyKey;
  std::vector<acc_t> dist(N * K);
  std::vector<int64_t> idx(N * K);
  auto a = host_search_args<acc_t, D>(grid, q, r, {}, {}, 1, N, M, K, dist, idx);
  a.zero_unmatched = true;
  a.r2 = squared_radius<acc_t>(radius);
  g_stats = Stats{};
  if (ball) {
    if (K <= 8) run_ball<acc_t, D, 8>(a);
    else if (K <= 16) run_ball<acc_t, D, 16>(a);
    else if (K <= 32) run_ball<acc_t, D, 32>(a);
    else run_ball<acc_t, D, 64>(a);
  } else {
    if (K == 1) run_knn<acc_t, D, Metric::kSquaredL2, 1>(a);
    else if (K <= 8) run_knn<acc_t, D, Metric::kSquaredL2, 8>(a);
    else if (K <= 16) run_knn<acc_t, D, Metric::kSquaredL2, 16>(a);
    else if (K <= 32) run_knn<acc_t, D, Metric::kSquaredL2, 32>(a);
    else run_knn<acc_t, D, Metric::kSquaredL2, 64>(a);
  }
  const auto& g = grid.grids[0];
  const double n = static_cast<double>(N);
  std::printf("model D=%d N=%" PRId64 " M=%" PRId64 " K=%" PRId64 " %s radius=%g rho=%g: dims %d x %d x %d, h %.4g, "
              "%" PRId64 " occupied cells, largest run %" PRId64 "\n",
              D, N, M, K, ball ? "ball" : "knn", radius, cfg.points_per_cell, g.dims[0], g.dims[1], g.dims[2], g.h[0],
              occupied, grid.max_run);
  std::printf("per query: %.2f cells enumerated, %.2f hash lookups, %.1f distances, %.2f %s\n", g_stats.cells / n,
              g_stats.lookups / n, g_stats.points / n, g_stats.rings / n, ball ? "passes" : "rings");
  int64_t bad = 0;
  std::vector<acc_t> want_dist(K);
  std::vector<int64_t> want_idx(K);
  for (int s = 0; s < 500 && s < N; ++s) {
    const int64_t i = rng.integer(0, N - 1);
    if (ball) {
      brute_ball_row<acc_t, D>(q.data() + i * D, r.data(), M, K, a.r2, want_dist.data(), want_idx.data());
    } else {
      brute_knn_row<acc_t, D, Metric::kSquaredL2>(q.data() + i * D, r.data(), M, K, true, want_dist.data(),
                                                  want_idx.data());
    }
    bad += std::memcmp(want_dist.data(), dist.data() + i * K, K * sizeof(acc_t)) != 0 ||
           !std::equal(want_idx.begin(), want_idx.end(), idx.begin() + i * K);
  }
  std::printf("checked 500 queries against brute force: %" PRId64 " mismatches\n", bad);
  return bad == 0 ? 0 : 1;
}

// Every kScanSample-th query in sorted (cell) order is searched: a spatially even sample; the host
// time is scaled back to all queries.
constexpr int64_t kScanSample = 16;
int g_extra_key_bits = std::getenv("EXTRA_KEY_BITS") ? std::atoi(std::getenv("EXTRA_KEY_BITS")) : 0;

// A real scan against its moved copy (grid_cuda_check.py's rigid_motion: 0.02 rad about z, then
// (0.3, -0.1, 0.02)), K = 1 both directions, for each points-per-cell value.
int scan_model(const char* path, int stride, bool half, const std::vector<double>& rhos) {
  using acc_t = float;
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot open %s\n", path);
    return 2;
  }
  std::vector<float> raw;
  if (half) {  // IEEE binary16 (the nuScenes sweep)
    uint16_t buf[4096];
    size_t got;
    while ((got = std::fread(buf, sizeof(uint16_t), 4096, f)) > 0) {
      for (size_t k = 0; k < got; ++k) {
        const int exponent = (buf[k] >> 10) & 31, mantissa = buf[k] & 1023;
        const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
                                 : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                                  : std::ldexp(1024 + mantissa, exponent - 25);
        raw.push_back(static_cast<float>((buf[k] >> 15) ? -magnitude : magnitude));
      }
    }
  } else {
    float buf[4096];
    size_t got;
    while ((got = std::fread(buf, sizeof(float), 4096, f)) > 0) raw.insert(raw.end(), buf, buf + got);
  }
  std::fclose(f);
  const int64_t M = static_cast<int64_t>(raw.size()) / stride;
  std::vector<acc_t> r(M * 3), q(M * 3);
  const double c = std::cos(0.02), s = std::sin(0.02);
  for (int64_t i = 0; i < M; ++i) {
    const double x = raw[i * stride], y = raw[i * stride + 1], z = raw[i * stride + 2];
    r[i * 3] = static_cast<acc_t>(x), r[i * 3 + 1] = static_cast<acc_t>(y), r[i * 3 + 2] = static_cast<acc_t>(z);
    q[i * 3] = static_cast<acc_t>(c * x - s * y + 0.3);
    q[i * 3 + 1] = static_cast<acc_t>(s * x + c * y - 0.1);
    q[i * 3 + 2] = static_cast<acc_t>(z + 0.02);
  }
  std::printf("scan %s: %" PRId64 " points\n", path, M);
  for (const double rho : rhos) {
    Stats total{};
    double seconds = 0;
    int64_t occupied = 0, max_run = 0;
    double h = 0, crowding = 0;  // sum over cells of run^2: / points = the mean run a point sits in
    for (int dir = 0; dir < 2; ++dir) {
      const auto& qq = dir == 0 ? q : r;
      const auto& rr = dir == 0 ? r : q;
      BuildConfig cfg{};
      cfg.points_per_cell = rho;
      cfg.min_cell = 0;
      cfg.log2_cells = bit_width(static_cast<uint64_t>(std::max<int64_t>(8 * M, 64)) - 1) + g_extra_key_bits;
      const auto grid = build<acc_t, 3>(qq, rr, {}, {}, 1, M, M, cfg);
      for (const auto& slot : grid.table) {
        if (slot.key == kEmptyKey) continue;
        ++occupied;
        crowding += static_cast<double>(slot.end - slot.start) * (slot.end - slot.start);
      }
      max_run = std::max(max_run, grid.max_run);
      h = grid.grids[0].h[0];
      std::vector<acc_t> dist(M);
      std::vector<int64_t> idx(M);
      auto a = host_search_args<acc_t, 3>(grid, qq, rr, {}, {}, 1, M, M, 1, dist, idx);
      a.zero_unmatched = true;
      g_stats = Stats{};
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t t = 0; t < M; t += kScanSample) knn_search_query<acc_t, 3, Metric::kSquaredL2, 1>(a, t);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (std::getenv("SCAN_TAIL") != nullptr) {  // every query: the tail a latency-bound launch waits for
        const Stats before = g_stats;
        std::vector<int64_t> distances(M), lookups(M), work(M), warp_max;
        for (int64_t t = 0; t < M; ++t) {
          const int64_t p0 = g_stats.points, l0 = g_stats.lookups;
          knn_search_query<acc_t, 3, Metric::kSquaredL2, 1>(a, t);
          distances[t] = g_stats.points - p0;
          lookups[t] = g_stats.lookups - l0;
          work[t] = distances[t] + 4 * lookups[t];
        }
        const int64_t worst = std::max_element(work.begin(), work.end()) - work.begin();
        std::printf("  dir %d slowest query: %" PRId64 " distances, %" PRId64 " lookups\n", dir, distances[worst],
                    lookups[worst]);
        for (int64_t w = 0; w < M; w += 32)
          warp_max.push_back(*std::max_element(work.begin() + w, work.begin() + std::min(M, w + 32)));
        std::vector<int64_t> sorted = work;
        std::sort(sorted.begin(), sorted.end());
        std::sort(warp_max.begin(), warp_max.end());
        const double mean = std::accumulate(work.begin(), work.end(), 0.0) / M;
        std::printf("  dir %d work per query (distances + 4 x lookups): mean %.0f, p99 %" PRId64 ", p99.9 %" PRId64
                    ", max %" PRId64 "; per warp of 32 sorted queries, max lane: median %" PRId64 ", p99 %" PRId64
                    ", max %" PRId64 "\n", dir, mean, sorted[M * 99 / 100], sorted[M * 999 / 1000], sorted[M - 1],
                    warp_max[warp_max.size() / 2], warp_max[warp_max.size() * 99 / 100], warp_max.back());
        g_stats = before;
      }
      total.cells += g_stats.cells, total.lookups += g_stats.lookups, total.points += g_stats.points;
      total.rings += g_stats.rings;
    }
    const double n = 2.0 * ((M + kScanSample - 1) / kScanSample);
    std::printf("rho %8.3g: h %.4g, occupied %" PRId64 " (both grids), crowding %.1f, largest run %" PRId64
                "; per query %.1f cells, %.1f lookups, %.1f distances, %.2f rings; host search %.1f ms (all queries, estimated)\n",
                rho, h, occupied, crowding / (2.0 * M), max_run, total.cells / n, total.lookups / n, total.points / n, total.rings / n,
                seconds * 1e3 * kScanSample);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 3 && std::string(argv[1]) == "scan") {
    std::vector<double> rhos;
    const char* list = argc > 4 ? argv[4] : "2";
    for (const char* p = list; *p;) {
      rhos.push_back(std::atof(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    return scan_model(argv[2], std::atoi(argv[3]), std::string(argv[3]).back() == 'h', rhos);
  }
  if (argc > 1 && std::string(argv[1]) == "model") {
    if (argc < 7) {
      std::fprintf(stderr, "usage: model D N M K knn|ball [radius] [points_per_cell]\n");
      return 2;
    }
    const int D = std::atoi(argv[2]);
    const int64_t N = std::atoll(argv[3]), M = std::atoll(argv[4]), K = std::atoll(argv[5]);
    const bool ball = std::string(argv[6]) == "ball";
    const double radius = argc > 7 ? std::atof(argv[7]) : 0.1;
    const double rho = argc > 8 ? std::atof(argv[8]) : 0.0;
    return D == 2 ? model<2>(N, M, K, ball, radius, rho) : model<3>(N, M, K, ball, radius, rho);
  }
  const int64_t cases = argc > 1 ? std::atoll(argv[1]) : 3000;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const bool verbose = argc > 3 && std::string(argv[3]) == "-v";
  Rng rng(seed);
  for (int64_t c = 0; c < cases; ++c) {
    switch (c % 4) {
      case 0: one_case<float, 3>(rng, c, verbose); break;
      case 1: one_case<float, 2>(rng, c, verbose); break;
      case 2: one_case<double, 3>(rng, c, verbose); break;
      default: one_case<double, 2>(rng, c, verbose); break;
    }
  }
  std::printf("grid_host_check: %" PRId64 " cases, %" PRId64 " mismatches\n", g_cases, g_failures);
  return g_failures == 0 ? 0 : 1;
}
