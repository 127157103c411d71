// The spatial-grid search of grid_search_cuda.cu: the cell arithmetic, the key layout,
// the skip tests and the per-query searches, as __host__ __device__ code. The CUDA kernels call
// these functions; compiled for the host, the very same functions run on the CPU (a harness kept in
// the repository's history emulates the build on the host and searches every query by a loop)
// against a brute-force scan, so the logic can be checked bit for bit on a machine without a GPU.
//
// Why a cell can be skipped (exactness): cells are assigned in double (floor((x - lo) * (1 / h)),
// clamped into the grid), and a cell's box is taken as [lo + k h - slack, lo + (k + 1) h + slack],
// the first and last cells of an axis unbounded outwards (clamping puts every point beyond the grid
// there). slack (1e-12 of the coordinates' scale) is far above the double rounding of the
// assignment and of the box arithmetic, so every point of a cell lies in its box. The lower bound
// of a query's distance to a box is computed in double and rounded once to the compute type; a cell
// is skipped only when that bound is >= min_prunable and provably_farther (spatial_order_cuda.cuh:
// bound (1 - margin) > threshold) than the K-th best (knn) or r2 (ball): the computed distance of
// every point in it is then strictly above the threshold (a few ulps of rounding in point_distance,
// one in the bound's conversion: far below the margin), so it could neither win nor tie.
// min_prunable keeps the bounds out of the subnormal range, where the relative-error argument
// fails.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "chamfer/chamfer.h"
#include "common/hash_table.h"
#include "neighbors/spatial_order_cuda.cuh"

#if defined(__CUDACC__)
#define POINTOPS_GRID_HD __host__ __device__ __forceinline__
#else
#define POINTOPS_GRID_HD inline
#endif

// Work counters for a host check of these functions (its harness defines this before including the
// header); nothing in the library.
#ifndef POINTOPS_GRID_COUNT
#define POINTOPS_GRID_COUNT(counter)
#define POINTOPS_GRID_COUNT_ADD(counter, amount)
#endif

namespace pointops {
namespace grid_cuda {

constexpr int32_t kMaxCellsPerAxis = 1 << 20;
constexpr int kMaxGridK = 64;  // the longest register list (larger K: passes of 64)
// The extent (any unit) above which a cloud is one cell: the cell arithmetic would overflow.
constexpr double kMaxExtent = 1e300;
// Relative size of the slack added around every cell box (see the header comment).
constexpr double kSlackScale = 1e-12;
// Relative growth of a reach (the distance from a query beyond which nothing can be a candidate),
// far above the rounding of computing it, so that a cell outside the reach box is provably farther.
constexpr double kReachMargin = 1e-5;

// Bounds below this are never used to skip (subnormal distances have no relative accuracy).
template <typename acc_t>
POINTOPS_GRID_HD constexpr double min_prunable() {
  return sizeof(acc_t) == 8 ? 1e-290 : 1e-30;
}

template <typename T>
POINTOPS_GRID_HD bool grid_isfinite(T x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

POINTOPS_GRID_HD int32_t imin(int32_t a, int32_t b) { return a < b ? a : b; }
POINTOPS_GRID_HD int32_t imax(int32_t a, int32_t b) { return a > b ? a : b; }

// ---------------------------------------------------------------------------------------------
// The grid of one cloud

// Cells are numbered in bricks of 4 x 4 x 4 (3-D) or 8 x 8 (2-D) cells, Morton order inside a
// brick, bricks in row-major order: sorting by this number keeps a warp's queries (32 consecutive
// sorted queries) in a compact block of cells, and a cell's neighbours near it in memory.
template <int D>
constexpr int brick_bits() {
  return D == 3 ? 2 : 3;
}
constexpr int kBrickCellBits = 6;  // 64 cells per brick either way

// Axes >= D are one cell (lo 0, h 1). An empty grid (count 0) is one cell with no points.
struct GridParams {
  double lo[3];       // the cell origin (the minimum of the finite valid references)
  double h[3];        // the cell size per axis
  double inv_h[3];    // 1 / h: cells are assigned by a multiplication (its rounding is far below slack)
  double slack;       // the absolute slack around every cell box
  int32_t dims[3];    // cells per axis (1 for an axis thinner than a cell, and for axes >= D)
  int32_t bricks[3];  // bricks per axis: ceil(dims / brick edge)
  int32_t count;      // finite valid references; 0: the grid is empty
  int32_t pad;
};

struct BuildConfig {
  double points_per_cell;  // the density rule's target points per cell (> 0)
  double min_cell;         // a lower bound on the cell size (ball query: the radius), >= 0 (+inf: one cell)
  int log2_cells;          // key space of one cloud: 2^log2_cells cells (bricks padded)
  double h_scale = 1.0;    // the density rule's cell size times this (the crowding refinement: < 1)
};

// One reference in sorted order: coordinates and original index in one (D = 3 float: 16-byte) load.
template <typename acc_t, int D>
struct alignas(16) GridPoint {
  acc_t c[D];
  int32_t idx;
};

// A hash table slot: cell key -> the cell's run [start, end) of sorted references.
struct alignas(16) CellSlot {
  unsigned long long key;  // kEmptyKey: free
  int32_t start, end;
};
constexpr unsigned long long kEmptyKey = ~0ull;

// floor(u) clamped into [0, dims - 1]; NaN goes to 0 (fmax returns the number), +-inf to the ends.
POINTOPS_GRID_HD int32_t clamp_cell(double u, int32_t dims) {
  return static_cast<int32_t>(::fmin(::fmax(::floor(u), 0.0), static_cast<double>(dims - 1)));
}

template <typename acc_t, int D>
POINTOPS_GRID_HD void point_cell(const GridParams& g, const acc_t* p, int32_t (&k)[3]) {
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    k[a] = a < D ? clamp_cell((static_cast<double>(p[a]) - g.lo[a]) * g.inv_h[a], g.dims[a]) : 0;
  }
}

// The key of cell k of cloud b: b above log2_cells bits of (brick, Morton position in the brick).
template <int D>
POINTOPS_GRID_HD uint64_t cell_key(const GridParams& g, int64_t b, const int32_t (&k)[3], int log2_cells) {
  constexpr int bits = brick_bits<D>();
  constexpr int32_t mask = (1 << bits) - 1;
  uint32_t within = 0;
#pragma unroll
  for (int bit = 0; bit < bits; ++bit) {
#pragma unroll
    for (int a = 0; a < D; ++a) within |= static_cast<uint32_t>(((k[a] & mask) >> bit) & 1) << (bit * D + a);
  }
  const int64_t bx = k[0] >> bits, by = k[1] >> bits, bz = D == 3 ? (k[2] >> bits) : 0;
  const int64_t brick = bx + static_cast<int64_t>(g.bricks[0]) * (by + static_cast<int64_t>(g.bricks[1]) * bz);
  return (static_cast<uint64_t>(b) << log2_cells) | (static_cast<uint64_t>(brick) << kBrickCellBits) | within;
}

template <typename acc_t, int D>
POINTOPS_GRID_HD bool finite_point(const acc_t* p) {
  bool finite = true;
#pragma unroll
  for (int a = 0; a < D; ++a) finite = finite && grid_isfinite(p[a]);
  return finite;
}

// The sort key of point f (flat index b * size + i) of a cloud with `valid` points per cloud:
// its cell key in its cloud's reference grid (clamped into it), or B << log2_cells (after every
// cloud's cells) when it is padded or non-finite.
template <typename acc_t, int D>
POINTOPS_GRID_HD uint64_t point_sort_key(const acc_t* p, int64_t b, int64_t i, int64_t valid, int64_t B,
                                         const GridParams& g, int log2_cells) {
  if (i < valid && finite_point<acc_t, D>(p)) {
    int32_t k[3];
    point_cell<acc_t, D>(g, p, k);
    return cell_key<D>(g, b, k, log2_cells);
  }
  return static_cast<uint64_t>(B) << log2_cells;
}

// Builds the parameters of one cloud from the bounds of its `count` finite valid references.
// Cell size: h = (V rho / count)^(1 / d) over the axes of nonzero extent, where an axis thinner
// than h counts as flat (one cell) and h is recomputed without it (a cloud on a plane or a line
// gets 2-D or 1-D cells, not millions of empty slices); then h is scaled by h_scale and kept
// >= min_cell; per axis at most
// kMaxCellsPerAxis cells; and h grows until the padded cell count fits the key space.
template <int D>
POINTOPS_GRID_HD GridParams make_grid_params(const double* lo, const double* hi, int64_t count,
                                             const BuildConfig& cfg) {
  GridParams g;
  for (int a = 0; a < 3; ++a) {
    g.lo[a] = 0;
    g.h[a] = 1;
    g.inv_h[a] = 1;
    g.dims[a] = 1;
    g.bricks[a] = 1;
  }
  g.slack = 0;
  g.count = static_cast<int32_t>(count);
  g.pad = 0;
  if (count <= 0) return g;
  double ext[3] = {0, 0, 0};
  bool sane = true;
  for (int a = 0; a < D; ++a) {
    ext[a] = hi[a] - lo[a];
    sane = sane && grid_isfinite(lo[a]) && grid_isfinite(ext[a]) && ext[a] >= 0 && ext[a] <= kMaxExtent;
  }
  if (!sane) return g;  // one cell: every query scans the cloud (still exact)
  for (int a = 0; a < D; ++a) g.lo[a] = lo[a];

  bool active[3] = {false, false, false};
  for (int a = 0; a < D; ++a) active[a] = ext[a] > 0;
  double h = 0;
  for (int iter = 0; iter < D; ++iter) {
    int n_active = 0;
    double log_volume = 0;
    for (int a = 0; a < D; ++a) {
      if (active[a]) {
        ++n_active;
        log_volume += ::log(ext[a]);
      }
    }
    if (n_active == 0) break;
    h = ::exp((log_volume + ::log(cfg.points_per_cell / static_cast<double>(count))) / n_active);
    bool removed = false;
    for (int a = 0; a < D; ++a) {
      if (active[a] && ext[a] < h) {
        active[a] = false;
        removed = true;
      }
    }
    if (!removed) break;
  }
  h = ::fmax(h * cfg.h_scale, cfg.min_cell);
  if (!(h > 0) || !grid_isfinite(h)) return g;  // one point (or all equal), or an infinite radius: one cell

  const double key_space = ::ldexp(1.0, cfg.log2_cells);
  constexpr int edge = 1 << brick_bits<D>();
  for (int attempt = 0; attempt < 200; ++attempt) {
    double cells = 1;
    double ha[3], na[3];
    for (int a = 0; a < D; ++a) {
      ha[a] = ::fmax(h, ext[a] / (kMaxCellsPerAxis - 1));
      na[a] = ::fmin(::floor(ext[a] / ha[a]) + 1, static_cast<double>(kMaxCellsPerAxis));
      cells *= ::ceil(na[a] / edge) * edge;
    }
    if (cells <= key_space) {
      double scale = 0;
      for (int a = 0; a < D; ++a) {
        g.h[a] = ha[a];
        g.inv_h[a] = 1.0 / ha[a];
        g.dims[a] = static_cast<int32_t>(na[a]);
        g.bricks[a] = static_cast<int32_t>(::ceil(na[a] / edge));
        scale = ::fmax(scale, ::fabs(lo[a]) + ext[a] + ha[a]);
      }
      g.slack = kSlackScale * scale;
      return g;
    }
    h *= ::fmax(1.01, ::pow(cells / key_space, 1.0 / D));
  }
  for (int a = 0; a < D; ++a) g.lo[a] = 0;  // not reached in practice: one cell
  return g;
}

// ---------------------------------------------------------------------------------------------
// Skip tests

// Whether every point of a cell whose distance lower bound is `bound` has a computed distance
// strictly above `threshold`.
template <typename acc_t>
POINTOPS_GRID_HD bool prunable(acc_t bound, acc_t threshold) {
  return static_cast<double>(bound) >= min_prunable<acc_t>() && provably_farther(bound, threshold);
}

// A lower bound on the distance from q to any point of cell k, in double, rounded once to acc_t.
template <typename acc_t, int D, Metric metric>
POINTOPS_GRID_HD acc_t cell_bound(const GridParams& g, const acc_t* q, const int32_t (&k)[3]) {
  double bound = 0;
#pragma unroll
  for (int a = 0; a < D; ++a) {
    const double x = static_cast<double>(q[a]);
    double gap = 0;
    if (k[a] > 0) gap = ::fmax(gap, (g.lo[a] + k[a] * g.h[a] - g.slack) - x);
    if (k[a] < g.dims[a] - 1) gap = ::fmax(gap, x - (g.lo[a] + (k[a] + 1) * g.h[a] + g.slack));
    bound += metric == Metric::kL1 ? gap : gap * gap;
  }
  return static_cast<acc_t>(bound);
}

// The distance beyond which nothing can be a candidate, grown by kReachMargin (+inf while the
// threshold is +inf): a point whose gap to q on some axis exceeds it has a computed distance above
// the threshold and above min_prunable, so it cannot enter.
template <typename acc_t, Metric metric>
POINTOPS_GRID_HD double reach_of(acc_t threshold) {
  if (!(threshold < std::numeric_limits<acc_t>::infinity())) return INFINITY;
  const double t = ::fmax(static_cast<double>(threshold), min_prunable<acc_t>());
  return (metric == Metric::kL1 ? t : ::sqrt(t)) * (1.0 + kReachMargin);
}

// The box of cells [lo, hi] (per axis, clamped into the grid) outside which every cell is more than
// `reach` away from q on some axis. A cell k > hi[a] (hi[a] < dims - 1) has k > (q + reach + 2 slack
// - lo) / h, so its box starts above q + reach; symmetrically below. (The rounding of (x - lo) *
// inv_h, a few ulps of the cell count, is far below one slack.) q's own (clamped) cell is inside.
template <typename acc_t, int D>
POINTOPS_GRID_HD void reach_box(const GridParams& g, const acc_t* q, double reach, int32_t (&lo)[3],
                                int32_t (&hi)[3]) {
#pragma unroll
  for (int a = 0; a < 3; ++a) {
    if (a < D) {
      const double x = static_cast<double>(q[a]), pad = reach + 2 * g.slack;
      lo[a] = clamp_cell((x - pad - g.lo[a]) * g.inv_h[a], g.dims[a]);
      hi[a] = clamp_cell((x + pad - g.lo[a]) * g.inv_h[a], g.dims[a]);
    } else {
      lo[a] = 0;
      hi[a] = 0;
    }
  }
}

// Calls visit(x, y, z) for every cell at Chebyshev distance exactly r from c inside the box [lo, hi]
// (c lies in the box). Axis 2 is a single cell for D = 2.
template <typename Visit>
POINTOPS_GRID_HD void for_each_ring_cell(const int32_t (&c)[3], int32_t r, const int32_t (&lo)[3],
                                         const int32_t (&hi)[3], Visit&& visit) {
  const int32_t z0 = imax(c[2] - r, lo[2]), z1 = imin(c[2] + r, hi[2]);
  const int32_t y0 = imax(c[1] - r, lo[1]), y1 = imin(c[1] + r, hi[1]);
  const int32_t x0 = imax(c[0] - r, lo[0]), x1 = imin(c[0] + r, hi[0]);
  for (int32_t z = z0; z <= z1; ++z) {
    const bool z_face = z == c[2] - r || z == c[2] + r;
    for (int32_t y = y0; y <= y1; ++y) {
      if (z_face || y == c[1] - r || y == c[1] + r) {
        for (int32_t x = x0; x <= x1; ++x) visit(x, y, z);
      } else {  // r > 0 here: only the two x faces
        if (c[0] - r >= lo[0]) visit(c[0] - r, y, z);
        if (c[0] + r <= hi[0]) visit(c[0] + r, y, z);
      }
    }
  }
}

// Whether the cells within Chebyshev distance r of c cover the box [lo, hi].
POINTOPS_GRID_HD bool box_covered(const int32_t (&c)[3], int32_t r, const int32_t (&lo)[3], const int32_t (&hi)[3]) {
  return c[0] - r <= lo[0] && c[0] + r >= hi[0] && c[1] - r <= lo[1] && c[1] + r >= hi[1] && c[2] - r <= lo[2] &&
         c[2] + r >= hi[2];
}

// ---------------------------------------------------------------------------------------------
// Candidate lists (register arrays: every index is a compile-time constant after unrolling)

// (d, j) comes before (e, f): by distance, then by index (knn_cuda_lists.cuh's precedes<true>). An
// empty slot is (+inf, -1): +inf and NaN never precede anything; a sentinel (-inf) is never preceded.
template <typename acc_t>
POINTOPS_GRID_HD bool precedes(acc_t d, int32_t j, acc_t e, int32_t f) {
  return d < e || (d == e && j < f);
}

// Inserts (d, j) into a list sorted by (distance, index), given that it precedes the last entry,
// which drops out (knn_cuda_lists.cuh's insert_sorted, host-callable).
template <int KP, typename acc_t>
POINTOPS_GRID_HD void insert_by_distance(acc_t (&dist)[KP], int32_t (&idx)[KP], acc_t d, int32_t j) {
#pragma unroll
  for (int k = KP - 1; k > 0; --k) {
    const bool shift = precedes(d, j, dist[k - 1], idx[k - 1]);
    const bool place = !shift && precedes(d, j, dist[k], idx[k]);
    dist[k] = shift ? dist[k - 1] : (place ? d : dist[k]);
    idx[k] = shift ? idx[k - 1] : (place ? j : idx[k]);
  }
  if (precedes(d, j, dist[0], idx[0])) {
    dist[0] = d;
    idx[0] = j;
  }
}

// Inserts (j, d) into a list sorted by index, given that j is below the last index, which drops out.
template <int KP, typename acc_t>
POINTOPS_GRID_HD void insert_by_index(int32_t (&idx)[KP], acc_t (&dist)[KP], int32_t j, acc_t d) {
#pragma unroll
  for (int k = KP - 1; k > 0; --k) {
    const bool shift = j < idx[k - 1];
    const bool place = !shift && j < idx[k];
    idx[k] = shift ? idx[k - 1] : (place ? j : idx[k]);
    dist[k] = shift ? dist[k - 1] : (place ? d : dist[k]);
  }
  if (j < idx[0]) {
    idx[0] = j;
    dist[0] = d;
  }
}

// ---------------------------------------------------------------------------------------------
// The searches

template <typename acc_t, int D>
struct SearchArgs {
  const acc_t* queries;        // (B, N, D) contiguous
  const acc_t* refs;           // (B, M, D) contiguous, in index order (the warp ball query's fallback scan)
  const int64_t* lengths1;     // (B,) or nullptr
  const int64_t* lengths2;
  int64_t B, N, M, K;
  const GridParams* grids;     // (B,)
  const CellSlot* table;
  uint64_t mask;               // table capacity - 1 (a power of two minus one)
  const GridPoint<acc_t, D>* points;  // (B M) in sorted order (valid references first)
  const int32_t* order;        // sorted flat indices; the queries' from position B M
  int log2_cells;
  bool zero_unmatched;         // knn K = 1: a valid query without a neighbour reports 0, not +inf / NaN
  const uint8_t* use_grid;     // (B,) or nullptr: knn searches only the clouds marked 1 (the probe's
                               // choice; brute force writes the others' results)
  acc_t r2;                    // ball query: squared_radius(radius)
  uint32_t* ball_list_count;   // ball query, grid_ball_tile_cuda.cuh: the work list's length - 1
  int32_t* ball_list;          // (B N) sorted query positions left to the warp per query
  int ball_min_group;          // the smallest group of queries that shares a list
  int ball_tile_log2_words;    // log2 of the bitmap's words per lane (tile_log2_words_per_lane(M))
  acc_t* dists;                // (B, N, K)
  int64_t* idx;                // (B, N, K)
};

// The run [start, end) of cell `key`, or an empty run. Linear probing from fmix64(key), bounded by
// the capacity.
POINTOPS_GRID_HD void find_cell(const CellSlot* table, uint64_t mask, uint64_t key, int32_t* start, int32_t* end) {
  uint64_t h = fmix64(key) & mask;
  for (uint64_t probe = 0; probe <= mask; ++probe) {
#if defined(__CUDA_ARCH__)
    const ulonglong2 slot = __ldg(reinterpret_cast<const ulonglong2*>(table + h));  // key, (start, end)
    const unsigned long long slot_key = slot.x, slot_run = slot.y;
#else
    const unsigned long long slot_key = table[h].key;
    const unsigned long long slot_run = static_cast<uint32_t>(table[h].start) |
                                        (static_cast<unsigned long long>(static_cast<uint32_t>(table[h].end)) << 32);
#endif
    if (slot_key == key) {
      *start = static_cast<int32_t>(slot_run & 0xffffffffull);
      *end = static_cast<int32_t>(slot_run >> 32);
      return;
    }
    if (slot_key == kEmptyKey) break;
    h = (h + 1) & mask;
  }
  *start = 0;
  *end = 0;
}

// The flat index b N + i of the query searched at sorted position t.
template <typename acc_t, int D>
POINTOPS_GRID_HD int64_t sorted_query(const SearchArgs<acc_t, D>& a, int64_t t) {
  return static_cast<int64_t>(a.order[a.B * a.M + t]) - a.B * a.M;
}

// Points of a long run the knn search loads at once (see knn_search_query). Measured on an H100
// (benchmarks/RESULTS.md, spatial grid section): 8 for K = 1 took the KITTI search kernel
// from 0.76 to 0.43 ms; batches for K > 1 gained nothing on uniform clouds and cost K = 64 about a
// third, so they keep 1.
template <int KP>
POINTOPS_GRID_HD constexpr int knn_load_batch() {
  return KP == 1 ? 8 : 1;
}

// knn for the query at sorted position t: visit its cell (clamped into the grid), then Chebyshev
// rings r = 1, 2, ... Once the K-th best is known, only the cells of the reach box can still hold a
// candidate: the rings are cut to it, and the search ends once they cover it (or the grid). K = 1
// (KP = 1) keeps one candidate; otherwise a list of KP candidates sorted by (distance, index) whose
// first KP - want slots hold sentinels (-inf) that nothing precedes, so that the last slot is the
// want-th best and the threshold of every test. K > KP: passes of KP, each taking the best
// candidates that come after the last one written in (distance, index) order.
template <typename acc_t, int D, Metric metric, int KP>
POINTOPS_GRID_HD void knn_search_query(const SearchArgs<acc_t, D>& a, int64_t t) {
  const int64_t e = sorted_query(a, t), b = e / a.N, i = e - b * a.N;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  acc_t* out_dist = a.dists + e * a.K;
  int64_t* out_idx = a.idx + e * a.K;
  int64_t written = 0;
  if (i < n_valid) {
    constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();
    acc_t q[D];
#pragma unroll
    for (int c = 0; c < D; ++c) q[c] = a.queries[e * D + c];
    const GridParams& g = a.grids[b];
    const bool searchable = finite_point<acc_t, D>(q) && g.count > 0;
    // Later passes take only candidates after (floor_dist, floor_idx), the last one written.
    acc_t floor_dist = -kInf;
    int32_t floor_idx = -1;
    while (written < a.K) {
      const int64_t want = a.K - written < KP ? a.K - written : KP;
      const int64_t sentinels = KP - want;
      acc_t best[KP];
      int32_t best_idx[KP];
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        best[k] = k < sentinels ? -kInf : kInf;
        best_idx[k] = -1;
      }
      if (searchable) {
        int32_t c[3], lo[3], hi[3];
        point_cell<acc_t, D>(g, q, c);
        reach_box<acc_t, D>(g, q, INFINITY, lo, hi);
        auto visit = [&](int32_t x, int32_t y, int32_t z) {
          const int32_t k[3] = {x, y, z};
          POINTOPS_GRID_COUNT(cells);
          if (prunable(cell_bound<acc_t, D, metric>(g, q, k), best[KP - 1])) return;
          POINTOPS_GRID_COUNT(lookups);
          int32_t start, end;
          find_cell(a.table, a.mask, cell_key<D>(g, b, k, a.log2_cells), &start, &end);
          // A crowded cell (LiDAR near the sensor, a cluster) makes a long run: a serial chain of
          // load-then-compare steps, and a launch of about one wave lasts about as long as its
          // longest chains. K = 1 takes such runs kBatch points at a time, every load
          // issued before the first is used, then the points one by one in run order (the same
          // comparisons as the plain loop). Short runs, and longer lists (whose registers are
          // taken), keep the plain loop: batching them measured slower on uniform clouds.
          constexpr int kBatch = knn_load_batch<KP>();
          int32_t s = start;
          bool done = false;
          auto take = [&](const GridPoint<acc_t, D>& p) {
            // A run is in index order and no distance is below 0: once the last slot holds 0, the
            // rest of the run can only tie it with a larger index (duplicates, one-cell clouds).
            if (best[KP - 1] == acc_t(0) && p.idx > best_idx[KP - 1]) {
              done = true;
              return;
            }
            POINTOPS_GRID_COUNT(points);
            const acc_t d = point_distance<D, metric>(q, p.c);
            if (precedes(d, p.idx, best[KP - 1], best_idx[KP - 1]) &&
                (written == 0 || precedes(floor_dist, floor_idx, d, p.idx))) {
              if constexpr (KP == 1) {
                best[0] = d;
                best_idx[0] = p.idx;
              } else {
                insert_by_distance<KP>(best, best_idx, d, p.idx);
              }
            }
          };
          if constexpr (kBatch > 1) {
            for (; s + kBatch <= end && !done; s += kBatch) {
              GridPoint<acc_t, D> batch[kBatch];
#pragma unroll
              for (int j = 0; j < kBatch; ++j) batch[j] = a.points[s + j];
#pragma unroll
              for (int j = 0; j < kBatch; ++j) {
                if (!done) take(batch[j]);
              }
            }
          }
          for (; s < end && !done; ++s) take(a.points[s]);
        };
        for (int32_t r = 0;; ++r) {
          POINTOPS_GRID_COUNT(rings);
          for_each_ring_cell(c, r, lo, hi, visit);
          reach_box<acc_t, D>(g, q, reach_of<acc_t, metric>(best[KP - 1]), lo, hi);  // only ever shrinks
          if (box_covered(c, r, lo, hi)) break;
        }
      }
      int64_t found = 0;
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        if (k >= sentinels && best_idx[k] >= 0) {
          out_dist[written + found] = best[k];
          out_idx[written + found] = best_idx[k];
          floor_dist = best[k];
          floor_idx = best_idx[k];
          ++found;
        }
      }
      written += found;
      if (found < want) break;  // no candidate left
    }
    if (KP == 1 && written == 0) {  // nearest_neighbor's answer for a query without a neighbour
      const int64_t m_valid = a.lengths2 ? a.lengths2[b] : a.M;
      out_dist[0] = unmatched_distance<acc_t>(m_valid, a.zero_unmatched);
      out_idx[0] = -1;
      written = 1;
    }
  }
  for (int64_t k = written; k < a.K; ++k) {  // padded queries, slots without a neighbour
    out_dist[k] = acc_t(0);
    out_idx[k] = -1;
  }
}

// Ball query for the query at sorted position t: the cells of the radius's reach box; the K
// smallest indices with distance < r2 in a register list sorted by index (the first KP - want slots
// hold the sentinel index -1, empty slots INT32_MAX). A cell's run is in index order (stable sort),
// so a run is left as soon as its index reaches the list's last. K > KP: passes of KP, each taking
// the smallest indices above the last one written.
template <typename acc_t, int D, int KP>
POINTOPS_GRID_HD void ball_search_query(const SearchArgs<acc_t, D>& a, int64_t t) {
  const int64_t e = sorted_query(a, t), b = e / a.N, i = e - b * a.N;
  const int64_t n_valid = a.lengths1 ? a.lengths1[b] : a.N;
  acc_t* out_dist = a.dists + e * a.K;
  int64_t* out_idx = a.idx + e * a.K;
  int64_t written = 0;
  acc_t q[D];
#pragma unroll
  for (int c = 0; c < D; ++c) q[c] = i < n_valid ? a.queries[e * D + c] : acc_t(0);
  const GridParams& g = a.grids[b];
  if (i < n_valid && finite_point<acc_t, D>(q) && g.count > 0) {
    constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
    int32_t lo[3], hi[3];
    reach_box<acc_t, D>(g, q, reach_of<acc_t, Metric::kSquaredL2>(a.r2), lo, hi);
    int32_t above = -1;  // this pass takes indices > above
    while (written < a.K) {
      POINTOPS_GRID_COUNT(rings);
      const int64_t want = a.K - written < KP ? a.K - written : KP;
      const int64_t sentinels = KP - want;
      int32_t idx[KP];
      acc_t dist[KP];
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        idx[k] = k < sentinels ? -1 : kNone;
        dist[k] = acc_t(0);
      }
      for (int32_t z = lo[2]; z <= hi[2]; ++z) {
        for (int32_t y = lo[1]; y <= hi[1]; ++y) {
          for (int32_t x = lo[0]; x <= hi[0]; ++x) {
            const int32_t k[3] = {x, y, z};
            POINTOPS_GRID_COUNT(cells);
            if (prunable(cell_bound<acc_t, D, Metric::kSquaredL2>(g, q, k), a.r2)) continue;
            POINTOPS_GRID_COUNT(lookups);
            int32_t start, end;
            find_cell(a.table, a.mask, cell_key<D>(g, b, k, a.log2_cells), &start, &end);
            if (above >= 0) {  // a later pass: skip the run's indices <= above
              int32_t h = end;
              while (start < h) {
                const int32_t mid = start + (h - start) / 2;
                if (a.points[mid].idx <= above) start = mid + 1; else h = mid;
              }
            }
            for (int32_t s = start; s < end; ++s) {
              const GridPoint<acc_t, D> p = a.points[s];
              if (p.idx >= idx[KP - 1]) break;  // the rest of the run comes later in index order
              POINTOPS_GRID_COUNT(points);
              const acc_t d = point_distance<D, Metric::kSquaredL2>(q, p.c);
              if (d < a.r2) insert_by_index<KP>(idx, dist, p.idx, d);
            }
          }
        }
      }
      int64_t found = 0;
#pragma unroll
      for (int k = 0; k < KP; ++k) {
        if (k >= sentinels && idx[k] != kNone) {
          out_dist[written + found] = dist[k];
          out_idx[written + found] = idx[k];
          above = idx[k];
          ++found;
        }
      }
      written += found;
      if (found < want) break;  // no candidate left
    }
  }
  for (int64_t k = written; k < a.K; ++k) {
    out_dist[k] = acc_t(0);
    out_idx[k] = -1;
  }
}

}  // namespace grid_cuda
}  // namespace pointops
