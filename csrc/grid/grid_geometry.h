// The cell arithmetic of the CPU grid search (grid_search_cpu.cpp): which cell a point falls in,
// and lower bounds on the gap between a query and any point of a cell, conservative against
// the rounding of both. Plain host C++ (no CUDA), all in double.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>

namespace pointops {
namespace grid_detail {

// Cells per axis stay below 2^20, so a key c0 + n0 (c1 + n1 c2) stays below 2^60.
constexpr int64_t kMaxCellsPerAxis = int64_t(1) << 20;
// Extents at or below this (double inputs only) are treated as flat: 1/h must stay finite.
constexpr double kTinyExtent = 1e-200;

// An acc_t <= x (x >= 0, a lower bound in double), close to it: a lower bound stays one after the
// conversion to the compute type. double: x itself. float: x lowered by 2^-22 relative before the
// conversion, whose rounding (at most 2^-24 relative for a normal float) cannot bring it back
// above x; below the smallest normal float (rounding is absolute there) the bound is 0.
template <typename acc_t>
inline acc_t round_down(double x) {
  if constexpr (sizeof(acc_t) == sizeof(double)) {
    return x;
  } else {
    if (x < static_cast<double>(std::numeric_limits<acc_t>::min())) return acc_t(0);
    if (x >= static_cast<double>(std::numeric_limits<acc_t>::max())) return std::numeric_limits<acc_t>::max();
    return static_cast<acc_t>(x * (1.0 - 0x1p-22));
  }
}

// A lower bound on a real difference whose computed value (one rounding, relative error at most
// 2^-53) is `computed`; 0 for a non-positive one.
inline double shrink(double computed) { return computed > 0 ? computed * (1.0 - 1e-14) : 0.0; }

struct GridGeometry {
  int dim = 0;
  double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};  // the box of the points (exact: a min and a max)
  double h = 1, inv_h = 1;                      // cell edge (cubic cells)
  int64_t n[3] = {1, 1, 1};                     // cells per axis; 1: the axis is not divided
  double slack[3] = {0, 0, 0};                  // how far a point may lie outside its nominal cell

  // The cell of coordinate v on axis a, clamped into the grid (queries outside the box too).
  int64_t axis_cell(int a, double v) const {
    if (n[a] == 1) return 0;
    const double t = (v - lo[a]) * inv_h;
    if (!(t > 0)) return 0;
    if (t >= static_cast<double>(n[a] - 1)) return n[a] - 1;
    return static_cast<int64_t>(t);  // floor, t > 0
  }

  template <int D>
  std::array<int64_t, D> cell_of(const double* v) const {
    std::array<int64_t, D> c;
    for (int a = 0; a < D; ++a) c[a] = axis_cell(a, v[a]);
    return c;
  }

  int64_t key(const int64_t* c) const {
    int64_t k = c[dim - 1];
    for (int a = dim - 2; a >= 0; --a) k = k * n[a] + c[a];
    return k;
  }

  // The key of cell c + o with o[0] taken as 0 (the cells along axis 0 follow as key + o[0]).
  template <int D>
  int64_t key_of_offsets(const int64_t* c, const int64_t* o) const {
    int64_t k = c[D - 1] + o[D - 1];
    for (int a = D - 2; a >= 1; --a) k = k * n[a] + c[a] + o[a];
    return k * n[0] + c[0];
  }

  // Bounds of every point assigned to cell c of axis a: the nominal [lo + c h, lo + (c + 1) h]
  // widened by `slack` (the assignment's rounding and this formula's own); the outer cells end at
  // the box, which holds every point exactly.
  double cell_lo(int a, int64_t c) const { return c == 0 ? lo[a] : lo[a] + static_cast<double>(c) * h - slack[a]; }
  double cell_hi(int a, int64_t c) const {
    return c == n[a] - 1 ? hi[a] : lo[a] + static_cast<double>(c + 1) * h + slack[a];
  }

  // Lower bounds on |v - p[a]| for the points p of cell c, and of the whole box.
  double cell_gap(int a, int64_t c, double v) const { return shrink(std::max(cell_lo(a, c) - v, v - cell_hi(a, c))); }
  double box_gap(int a, double v) const { return shrink(std::max(lo[a] - v, v - hi[a])); }
};

// The edge of cubic cells holding `per_cell` of `count` points on average, were they spread
// uniformly over the box: h^d = volume / (count / per_cell), over the d axes that are not flat. An
// axis narrower than h is taken as flat (a plane in 3-D is gridded in 2-D, a line in 1-D, all
// points equal in one cell: +inf), which only makes h larger, so a few passes settle it. Computed in
// logarithms: extents of 1e-30 or 1e30 neither underflow nor overflow.
inline double volume_edge(int dim, const double* extent, int64_t count, double per_cell) {
  bool active[3];
  for (int a = 0; a < dim; ++a) active[a] = std::isfinite(extent[a]) && extent[a] > kTinyExtent;
  const double log_cells = std::log(std::max(1.0, static_cast<double>(count) / per_cell));
  double h = std::numeric_limits<double>::infinity();
  for (int pass = 0; pass < dim; ++pass) {
    double log_volume = 0;
    int d = 0;
    for (int a = 0; a < dim; ++a) {
      if (active[a]) {
        log_volume += std::log(extent[a]);
        ++d;
      }
    }
    if (d == 0) return std::numeric_limits<double>::infinity();
    h = std::exp((log_volume - log_cells) / d);
    bool dropped = false;
    for (int a = 0; a < dim; ++a) {
      if (active[a] && extent[a] < h) {
        active[a] = false;
        dropped = true;
      }
    }
    if (!dropped) break;
  }
  return h;
}

// The smallest edge allowed: min_edge (ball_query: the radius), at most kMaxCellsPerAxis cells on
// the widest axis, and 1/h finite.
inline double edge_floor(int dim, const double* extent, double min_edge) {
  double widest = 0;
  for (int a = 0; a < dim; ++a) {
    if (std::isfinite(extent[a])) widest = std::max(widest, extent[a]);
  }
  return std::max({min_edge, widest / static_cast<double>(kMaxCellsPerAxis - 1), kTinyExtent});
}

// The grid of cubic cells of edge h (+inf: one cell) over the box [lo, hi].
inline GridGeometry make_geometry(int dim, const double* lo, const double* hi, double h) {
  GridGeometry g;
  g.dim = dim;
  for (int a = 0; a < dim; ++a) {
    g.lo[a] = lo[a];
    g.hi[a] = hi[a];
  }
  if (!std::isfinite(h)) return g;  // one cell
  g.h = h;
  g.inv_h = 1.0 / h;
  for (int a = 0; a < dim; ++a) {
    const double extent = hi[a] - lo[a];  // +inf for a box wider than the double range: that axis stays whole
    if (!(std::isfinite(extent) && extent > kTinyExtent)) continue;
    g.n[a] = std::min<int64_t>(static_cast<int64_t>(extent / h) + 1, kMaxCellsPerAxis);
    // axis_cell's (v - lo) * inv_h carries a relative error of ~3 * 2^-53 of (c + 1) h, cell_lo's
    // and cell_hi's own sums ~2 * 2^-53 of |lo| + n h: 1e-12 of both is thousands of times that.
    g.slack[a] = 1e-12 * (std::fabs(lo[a]) + std::fabs(hi[a]) + static_cast<double>(g.n[a]) * h);
  }
  return g;
}

}  // namespace grid_detail
}  // namespace pointops
