// vmap batching rules of particle_sum and its moments op (common/vmap.h): the vmapped dimension
// becomes the sums' batch, (V, M, D) for unbatched sums and (V * B, M, D) for batched ones: one
// call for every sample.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "common/vmap.h"

namespace pointops {
namespace {

using OptionalDouble = c10::optional<double>;

// The operands as the op takes them for all samples at once, and how to give the outputs back.
struct FoldedSums {
  at::Tensor targets, sources, weights;
  int64_t batch;  // B for batched sums; -1 when each sample is an unbatched sum

  FoldedSums(const BatchFold& f, const at::Tensor& t, const at::Tensor& s, const at::Tensor& w) {
    const int64_t rank = f.front(t).dim() - 1;
    TORCH_CHECK(rank == 2 || rank == 3, "targets must be a 2-D (M, D) or 3-D (B, M, D) tensor (each vmapped "
                "sample), got ", rank, " dims");
    f.require_dim(s, rank, "sources", rank == 2 ? "(N, D)" : "(B, N, D)");
    batch = rank == 3 ? f.front(t).size(1) : -1;
    targets = rank == 3 ? f.fold(t) : f.front(t);
    sources = rank == 3 ? f.fold(s) : f.front(s);
    weights = rank == 3 ? f.fold(w) : f.front(w);
  }

  at::Tensor unfold(const BatchFold& f, const at::Tensor& out) const {
    return batch >= 0 ? f.unfold(out, batch) : f.batched_front(out);
  }
};

at::Tensor particle_sum_batched(const at::Tensor& targets, const at::Tensor& sources, const at::Tensor& weights,
                                c10::string_view kernel, OptionalDouble sigma, OptionalDouble wavenumber) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::particle_sum", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                               c10::string_view, OptionalDouble, OptionalDouble)>();
  const BatchFold f({&targets, &sources, &weights});
  if (!f.any_batched()) return op.call(targets, sources, weights, kernel, sigma, wavenumber);
  const FoldedSums folded(f, targets, sources, weights);
  return folded.unfold(f, op.call(folded.targets, folded.sources, folded.weights, kernel, sigma, wavenumber));
}

std::tuple<at::Tensor, at::Tensor> particle_sum_moments_batched(const at::Tensor& targets, const at::Tensor& sources,
                                                                const at::Tensor& weights, c10::string_view kernel,
                                                                OptionalDouble sigma, OptionalDouble wavenumber) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pointops::_particle_sum_moments", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                       const at::Tensor&, c10::string_view,
                                                                       OptionalDouble, OptionalDouble)>();
  const BatchFold f({&targets, &sources, &weights});
  if (!f.any_batched()) return op.call(targets, sources, weights, kernel, sigma, wavenumber);
  const FoldedSums folded(f, targets, sources, weights);
  auto [sums, moments] = op.call(folded.targets, folded.sources, folded.weights, kernel, sigma, wavenumber);
  return {folded.unfold(f, sums), folded.unfold(f, moments)};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, FuncTorchBatched, m) {
  m.impl("particle_sum", &particle_sum_batched);
  m.impl("_particle_sum_moments", &particle_sum_moments_batched);
}

}  // namespace pointops
