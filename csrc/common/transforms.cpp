// Transform support shared by every family: common/transforms.h, common/vmap.h and
// common/gathered_distances.h (one translation unit: each costs ~20 s of a CPU build in headers alone).
#include "common/transforms.h"

#include <ATen/functorch/BatchedTensorImpl.h>

#include "common/gathered_distances.h"
#include "common/vmap.h"

namespace pointops {

at::Tensor with_derivatives_of(const at::Tensor& value, const at::Tensor& formula) {
  const at::Tensor zero_with_derivatives = (formula - formula.detach()).to(value.scalar_type());
  // Where the formula is not finite (log(0), a NaN input) the difference would be NaN, not 0: there
  // the formula itself is the value (the ops' semantics are the formula's, and inf and NaN are the
  // same in every implementation), with its own derivative.
  return at::where(at::isfinite(formula), value + zero_with_derivatives, formula.to(value.scalar_type()));
}

void refuse_transform(const char* op, const char* how) {
  TORCH_CHECK(false, "pointops::", op, ": this entry point has no forward-mode or torch.func derivative; ", how);
}

BatchFold::BatchFold(std::initializer_list<const at::Tensor*> arguments) : guard_(c10::DispatchKey::FuncTorchBatched) {
  // The dispatched level is the innermost (highest) vmap level wrapping an argument: the levels
  // above it were unwrapped before this rule ran.
  for (const at::Tensor* t : arguments) {
    const auto* impl = t->defined() ? at::functorch::maybeGetBatchedImpl(*t) : nullptr;
    if (impl != nullptr && impl->level() > level_) {
      level_ = impl->level();
      size_ = impl->value().size(impl->bdim());
    }
  }
}

std::pair<at::Tensor, int64_t> BatchFold::unwrap(const at::Tensor& t) const {
  if (t.defined()) {
    if (const auto* impl = at::functorch::maybeGetBatchedImpl(t); impl != nullptr && impl->level() == level_) {
      return {impl->value(), impl->bdim()};
    }
  }
  return {t, -1};
}

bool BatchFold::batched(const at::Tensor& t) const { return unwrap(t).second >= 0; }

void BatchFold::require_dim(const at::Tensor& t, int64_t dim, const char* name, const char* layout) const {
  auto [value, bdim] = unwrap(t);
  std::vector<int64_t> shape = value.sizes().vec();
  if (bdim >= 0) shape.erase(shape.begin() + bdim);
  TORCH_CHECK(static_cast<int64_t>(shape.size()) == dim, name, " must be a ", dim, "-D tensor ", layout,
              " (each vmapped sample), got shape ", at::IntArrayRef(shape));
}

int64_t BatchFold::require_clouds(const at::Tensor& x, const at::Tensor& y, const char* x_name,
                                  const char* y_name) const {
  require_dim(x, 3, x_name, "(B, N, D)");
  require_dim(y, 3, y_name, "(B, M, D)");
  return front(x).size(1);
}

at::Tensor BatchFold::front(const at::Tensor& t) const {
  auto [value, bdim] = unwrap(t);
  if (bdim >= 0) return value.movedim(bdim, 0);
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), value.sizes().begin(), value.sizes().end());
  return value.unsqueeze(0).expand(shape);
}

at::Tensor BatchFold::fold(const at::Tensor& t) const {
  if (!t.defined()) return t;
  return front(t).flatten(0, 1);
}

c10::optional<at::Tensor> BatchFold::fold(const c10::optional<at::Tensor>& t) const {
  if (!t.has_value() || !t->defined()) return t;
  return fold(*t);
}

at::Tensor BatchFold::unfold(const at::Tensor& out, int64_t batch) const {
  return batched_front(out.unflatten(0, {size_, batch}));
}

at::Tensor BatchFold::batched_front(const at::Tensor& out) const { return batched_at(out, 0); }

at::Tensor BatchFold::batched_at(const at::Tensor& out, int64_t bdim) const {
  return at::functorch::makeBatched(out, bdim, level_);
}

void refuse_vmap(const char* op, const char* instead) {
  TORCH_CHECK(false, "pointops::", op, " cannot run under torch.vmap: the size of its output depends on the values "
              "of its inputs, which vmap cannot batch; ", instead);
}

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
