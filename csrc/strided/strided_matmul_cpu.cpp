// Strided matmul on the CPU: C (..., n, m) = A (..., n, k) @ B (..., k, m), batch dims broadcast.
//
// Blocked as the classic GEMM: a task owns a kMC x kNC tile of C of one batch entry and walks K in
// blocks of kKC. Per K block it packs its A rows and B columns into contiguous micro-panels, reading
// the operands through their own strides (a transposed or stepped view costs only the packing,
// O(1/kMC) of the work), widening half types to float. A register-blocked kMR x kNR micro-kernel
// then accumulates into a float (float64 for double) tile of C, which is rounded once into C at the
// end. float32 stays IEEE float32 (plain multiply-adds, never TF32-like shortcuts); every C element
// is summed in the same order whatever the thread count (deterministic). The micro-kernel is
// compiled for AVX2 + FMA and the baseline ISA and chosen at run time, like particle_sum.
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "common/cpu_dispatch.h"
#include "strided/strided_entries.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define POINTOPS_MATMUL_X86 1
#endif

namespace pointops {
namespace strided {
namespace {

constexpr int64_t kMR = 6;     // rows of C per micro-kernel
constexpr int64_t kMC = 96;    // rows of C per task (a multiple of kMR)
constexpr int64_t kKC = 256;   // K per packed block
constexpr int64_t kNC = 256;   // columns of C per task (a multiple of kNR)

// 256-bit vectors of A as GCC vector extensions (two SSE registers each on the baseline ISA).
template <typename A>
struct Vec256 {
  typedef A type __attribute__((vector_size(32)));
};

template <typename A>
constexpr int64_t micro_cols() { return 2 * 32 / static_cast<int64_t>(sizeof(A)); }  // two vectors per row

// c tile (kMR x NR, row stride ldc) += a panel (kc x kMR) * b panel (kc x NR); the kMR x 2
// accumulator vectors stay in registers.
template <typename A>
inline __attribute__((always_inline)) void micro_kernel(int64_t kc, const A* __restrict ap, const A* __restrict bp,
                                                        A* __restrict c, int64_t ldc) {
  using V = typename Vec256<A>::type;
  constexpr int64_t W = 32 / sizeof(A);
  V acc[kMR][2];
  for (int64_t i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = V{};
  for (int64_t p = 0; p < kc; ++p) {
    V b0, b1;
    std::memcpy(&b0, bp + p * 2 * W, sizeof(V));
    std::memcpy(&b1, bp + p * 2 * W + W, sizeof(V));
    for (int64_t i = 0; i < kMR; ++i) {
      const V a = V{} + ap[p * kMR + i];  // broadcast
      acc[i][0] += a * b0;
      acc[i][1] += a * b1;
    }
  }
  for (int64_t i = 0; i < kMR; ++i) {
    V c0, c1;
    std::memcpy(&c0, c + i * ldc, sizeof(V));
    std::memcpy(&c1, c + i * ldc + W, sizeof(V));
    c0 += acc[i][0];
    c1 += acc[i][1];
    std::memcpy(c + i * ldc, &c0, sizeof(V));
    std::memcpy(c + i * ldc + W, &c1, sizeof(V));
  }
}

template <typename A>
inline __attribute__((always_inline)) void tile_product(int64_t mc, int64_t nc, int64_t kc, const A* apack,
                                                        const A* bpack, A* ctile, int64_t ldc) {
  constexpr int64_t NR = micro_cols<A>();
  for (int64_t jr = 0; jr < nc; jr += NR)
    for (int64_t ir = 0; ir < mc; ir += kMR) micro_kernel<A>(kc, apack + ir * kc, bpack + jr * kc, ctile + ir * ldc + jr, ldc);
}

#ifdef POINTOPS_MATMUL_X86
template <typename A>
__attribute__((target("avx2,fma"))) void tile_product_avx2(int64_t mc, int64_t nc, int64_t kc, const A* apack,
                                                           const A* bpack, A* ctile, int64_t ldc) {
  tile_product<A>(mc, nc, kc, apack, bpack, ctile, ldc);
}
#endif

template <typename A>
void tile_product_dispatch(int64_t mc, int64_t nc, int64_t kc, const A* apack, const A* bpack, A* ctile,
                           int64_t ldc) {
#ifdef POINTOPS_MATMUL_X86
  if (cpu_has_avx2_fma()) return tile_product_avx2<A>(mc, nc, kc, apack, bpack, ctile, ldc);
#endif
  tile_product<A>(mc, nc, kc, apack, bpack, ctile, ldc);
}

// One (batch entry, tile) task: C[i0:i0+mc, j0:j0+nc] of the matrices at a, b, c.
template <typename T>
void matmul_tile(const MatmulCall& mc_, const T* a, const T* b, T* c, int64_t i0, int64_t j0,
                 std::vector<at::opmath_type<T>>& buf) {
  using A = at::opmath_type<T>;
  constexpr int64_t NR = micro_cols<A>();
  const int64_t mc = std::min(kMC, mc_.n - i0), nc = std::min(kNC, mc_.m - j0);
  const int64_t mc_pad = (mc + kMR - 1) / kMR * kMR, nc_pad = (nc + NR - 1) / NR * NR;
  const int64_t kc_max = std::min(kKC, mc_.k);
  // Sized by this tile, not by the largest one: a small product must not allocate and clear the
  // ~450 KB of a full tile's panels on every call (most of a 2 x 2 product's host time). The
  // packed panels are written before they are read; only the accumulators start at 0. The
  // accumulator tile's row stride (nc_pad) changes where sums live, not their order.
  const int64_t ldc = nc_pad;
  const size_t need = static_cast<size_t>(mc_pad * kc_max + kc_max * nc_pad + mc_pad * ldc);
  if (buf.size() < need) buf.resize(need);
  A* apack = buf.data();
  A* bpack = apack + mc_pad * kc_max;
  A* ctile = bpack + kc_max * nc_pad;
  std::fill(ctile, ctile + mc_pad * ldc, A(0));
  for (int64_t p0 = 0; p0 < mc_.k; p0 += kKC) {
    const int64_t kc = std::min(kKC, mc_.k - p0);
    // A panel ir: [p][i] for rows ir..ir+kMR (zero rows beyond mc)
    for (int64_t ir = 0; ir < mc_pad; ir += kMR)
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t i = 0; i < kMR; ++i) {
          const int64_t row = ir + i;
          apack[ir * kc + p * kMR + i] =
              row < mc ? static_cast<A>(a[(i0 + row) * mc_.as0 + (p0 + p) * mc_.as1]) : A(0);
        }
    // B panel jr: [p][j] for columns jr..jr+NR (zero columns beyond nc)
    for (int64_t jr = 0; jr < nc_pad; jr += NR)
      for (int64_t p = 0; p < kc; ++p) {
        const T* brow = b + (p0 + p) * mc_.bs0;
        for (int64_t j = 0; j < NR; ++j) {
          const int64_t col = jr + j;
          bpack[jr * kc + p * NR + j] = col < nc ? static_cast<A>(brow[(j0 + col) * mc_.bs1]) : A(0);
        }
      }
    tile_product_dispatch<A>(mc_pad, nc_pad, kc, apack, bpack, ctile, ldc);
  }
  for (int64_t i = 0; i < mc; ++i)
    for (int64_t j = 0; j < nc; ++j) c[(i0 + i) * mc_.cs0 + (j0 + j) * mc_.cs1] = static_cast<T>(ctile[i * ldc + j]);
}

void matmul_into_cpu(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, const StridedLayout<3>& L,
                     const MatmulCall& call) {
  const int64_t row_tiles = (call.n + kMC - 1) / kMC, col_tiles = (call.m + kNC - 1) / kNC;
  const int64_t tiles = row_tiles * col_tiles;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "strided_matmul_cpu", [&] {
    const scalar_t* pa = a.const_data_ptr<scalar_t>();
    const scalar_t* pb = b.const_data_ptr<scalar_t>();
    scalar_t* pc = c.data_ptr<scalar_t>();
    at::parallel_for(0, L.numel() * tiles, 1, [&](int64_t begin, int64_t end) {
      std::vector<at::opmath_type<scalar_t>> buf;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t entry = t / tiles, tile = t % tiles;
        for_each_run(L, entry, entry + 1, [&](const std::array<int64_t, 3>& off, int64_t) {
          matmul_tile<scalar_t>(call, pa + off[1], pb + off[2], pc + off[0], (tile / col_tiles) * kMC,
                                (tile % col_tiles) * kNC, buf);
        });
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CPU, m) { m.impl("strided_matmul", &matmul_entry<matmul_into_cpu>); }

}  // namespace strided
}  // namespace pointops
