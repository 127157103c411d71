// One point of a shared-memory tile of reference points, for the search kernels (chamfer,
// neighbors): D = 3 is padded to 4 so that a float point is one 16-byte shared-memory load.
#pragma once

namespace pointops {

template <int D>
constexpr int padded_dim() {
  return D == 3 ? 4 : D;
}

template <typename acc_t, int D>
struct alignas(sizeof(acc_t) * padded_dim<D>() >= 16 ? 16 : sizeof(acc_t) * padded_dim<D>()) SharedPoint {
  acc_t c[padded_dim<D>()];
};

}  // namespace pointops
