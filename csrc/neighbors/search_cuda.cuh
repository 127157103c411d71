// The launch geometry shared by the brute-force neighbour searches (knn_cuda.cu, ball_query_cuda.cu):
// one thread per query, blocks of `threads` queries of one cloud along grid.x, and the reference
// cloud split into `splits` ranges along grid.y when the queries alone cannot fill the GPU.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/cuda_utils.cuh"

namespace pointops {

struct SearchPlan {
  int64_t chunks;     // query blocks per cloud
  int64_t split_len;  // reference points per split (a multiple of the tile)
  int64_t splits;     // >= 1
  dim3 grid;
};

// Splits are chosen so that the grid fills whole waves of `blocks_per_sm` resident blocks per SM
// (a partly filled last wave leaves SMs idle), with as few splits as do that: every split repeats
// the start-up of its candidate lists and adds merge work.
inline SearchPlan plan_search(int64_t B, int64_t N, int64_t M, int threads, int tile, int blocks_per_sm,
                              int64_t max_splits) {
  SearchPlan plan;
  plan.chunks = std::max<int64_t>(1, ceil_div<int64_t>(N, threads));
  const int64_t base = B * plan.chunks;
  const int64_t slots = static_cast<int64_t>(multiprocessor_count()) * std::max(blocks_per_sm, 1);
  const int64_t tiles = std::max<int64_t>(1, ceil_div<int64_t>(M, tile));
  const int64_t limit = std::max<int64_t>(1, std::min({max_splits, tiles, int64_t(65535)}));
  int64_t best = 1;
  double best_efficiency = 0;
  for (int64_t s = 1; s <= limit; ++s) {
    const double waves = static_cast<double>(base * s) / slots;
    const double efficiency = waves < 1 ? waves : waves / std::ceil(waves);
    if (efficiency > best_efficiency + 0.02) {
      best = s;
      best_efficiency = efficiency;
    }
    if (efficiency >= 0.9) break;
  }
  plan.split_len = ceil_div<int64_t>(ceil_div<int64_t>(std::max<int64_t>(M, 1), best), tile) * tile;
  plan.splits = std::max<int64_t>(1, ceil_div<int64_t>(M, plan.split_len));
  TORCH_CHECK(base <= std::numeric_limits<int32_t>::max(), "too many queries for one launch: ", B, " clouds of ", N,
              " points");
  plan.grid = dim3(static_cast<unsigned>(base), static_cast<unsigned>(plan.splits));
  return plan;
}

}  // namespace pointops
