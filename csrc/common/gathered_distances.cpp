#include "common/gathered_distances.h"

#include "common/transforms.h"

namespace pointops {

at::Tensor gathered_distances(const at::Tensor& q, const at::Tensor& r, const at::Tensor& idx, int64_t norm) {
  const auto dtype = q.scalar_type();
  const auto compute = dtype == at::kHalf || dtype == at::kBFloat16 ? at::kFloat : dtype;
  if (r.size(1) == 0 || idx.numel() == 0) return at::zeros(idx.sizes(), q.options().dtype(compute));
  const int64_t B = q.size(0), D = q.size(2);
  auto pair_shape = idx.sizes().vec();  // (B, N) or (B, N, K), then D
  pair_shape.push_back(D);
  const at::Tensor index = idx.clamp_min(0).reshape({B, -1, 1}).expand({B, -1, D});
  const at::Tensor neighbours = r.to(compute).gather(1, index).view(pair_shape);
  const at::Tensor queries = idx.dim() == 3 ? q.to(compute).unsqueeze(2) : q.to(compute);
  const at::Tensor diff = queries - neighbours;
  const at::Tensor d = norm == 1 ? diff.abs().sum(-1) : (diff * diff).sum(-1);
  return at::where(idx >= 0, d, at::zeros({}, d.options()));
}

at::Tensor distances_with_derivatives(const at::Tensor& dist, const at::Tensor& q, const at::Tensor& r,
                                      const at::Tensor& idx, int64_t norm) {
  return with_derivatives_of(dist, gathered_distances(q, r, idx, norm));
}

}  // namespace pointops
