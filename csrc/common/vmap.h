// vmap batching rules for ops with a leading batch dimension: the vmapped dimension is folded into the
// op's batch, so one call serves every sample (no per-sample fallback). Used by the rules in
// the vmap section of csrc/<family>/<family>_autograd.cpp, registered for the FuncTorchBatched
// dispatch key.
//
// A rule constructs a BatchFold from its tensor arguments first (it excludes the FuncTorchBatched key
// for its lifetime, so the op called inside runs on the unwrapped tensors), returns the plain call
// when none is batched, and otherwise calls the op once on folded inputs and unfolds its outputs.
// The level folded is the innermost vmap level among the arguments: the one being dispatched.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Optional.h>

#include <initializer_list>

namespace pointops {

class BatchFold {
 public:
  explicit BatchFold(std::initializer_list<const at::Tensor*> arguments);

  // Whether any argument is batched (at the level this fold serves), and whether t is.
  bool any_batched() const { return level_ >= 0; }
  bool batched(const at::Tensor& t) const;

  int64_t size() const { return size_; }

  // t's value with the vmapped dimension first: (V, ...); an unbatched t is expanded to V copies.
  at::Tensor front(const at::Tensor& t) const;
  // front(t) with the vmapped dimension merged into the next one: (V * B, ...), t being (B, ...).
  at::Tensor fold(const at::Tensor& t) const;
  c10::optional<at::Tensor> fold(const c10::optional<at::Tensor>& t) const;

  // An output of the op: (V * B, ...) back to a batched (B, ...); (V, ...) to a batched (...).
  at::Tensor unfold(const at::Tensor& out, int64_t batch) const;
  at::Tensor batched_front(const at::Tensor& out) const;
  // An output whose vmapped dimension is `bdim`.
  at::Tensor batched_at(const at::Tensor& out, int64_t bdim) const;

  // The op's own rank check, on t's shape as the op would see it (without the vmapped dimension):
  // folding a tensor of the wrong rank would otherwise reach the op with a confusing shape.
  void require_dim(const at::Tensor& t, int64_t dim, const char* name, const char* layout) const;

  // require_dim of two clouds (B, N, D) and (B, M, D); returns B, their own batch size.
  int64_t require_clouds(const at::Tensor& x, const at::Tensor& y, const char* x_name, const char* y_name) const;

  // The unwrapped value and its vmapped dimension (-1 when t is not batched at this level).
  std::pair<at::Tensor, int64_t> unwrap(const at::Tensor& t) const;

 private:
  c10::impl::ExcludeDispatchKeyGuard guard_;
  int64_t level_ = -1;
  int64_t size_ = 0;
};

// An optional tensor argument as a tensor (undefined when absent), for BatchFold's argument list.
inline const at::Tensor& value_or_undefined(const c10::optional<at::Tensor>& t) {
  static const at::Tensor undefined;
  return t.has_value() ? *t : undefined;
}

// The clear error of ops whose output sizes depend on the values (voxel counts, edge counts):
// vmap cannot batch them.
[[noreturn]] void refuse_vmap(const char* op, const char* instead);

}  // namespace pointops
