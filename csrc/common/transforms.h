// Derivatives under torch.func and forward-mode AD, and vmap batching rules (README "Derivatives").
//
// Each differentiable op has two autograd paths, chosen per call in its Autograd kernel:
// * plain reverse mode: a C++ torch::autograd::Function with a fused backward op (the fast path,
//   and what torch.compile traces);
// * everything else -- forward mode (torch.autograd.forward_ad, torch.func.jvp / jacfwd) and the
//   torch.func transforms that track gradients (grad, vjp, jacrev, hessian): the kernel computes the
//   values below autograd, and the derivatives come from an ATen formula of the same quantity
//   (with_derivatives_of). functorch refuses a C++ autograd::Function and forward mode ignores one,
//   so neither ever sees one: every transform, nested to any depth, differentiates the ATen formula.
// vmap goes through a batching rule per op (csrc/<family>/<family>_autograd.cpp) that folds the vmapped
// dimension into the op's own batch: one call for every sample, no per-sample loop.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <initializer_list>

namespace pointops {

// The dispatch keys below autograd, for an Autograd kernel's redispatch: the values without a graph.
inline c10::DispatchKeySet below_autograd(c10::DispatchKeySet ks) { return ks & c10::after_ADInplaceOrView_keyset; }

// True when t is differentiated in a way a C++ autograd::Function cannot serve: it carries a
// forward-mode tangent (torch.autograd.forward_ad, torch.func.jvp and jacfwd), or a torch.func
// transform that tracks gradients (grad, vjp, jacrev, hessian: they wrap their inputs in a
// FuncTorchGradWrapper) differentiates it at the current level. A wrapper that this level does not
// differentiate (a detached one, an argument not in argnums) takes the plain path: the levels below
// see the op and differentiate it themselves.
inline bool differentiated_by_transform(const at::Tensor& t) {
  if (!t.defined()) return false;
  if (t._fw_grad(/*level=*/0).defined()) return true;
  return t.key_set().has(c10::DispatchKey::FuncTorchGradWrapper) && t.requires_grad() && c10::GradMode::is_enabled();
}

// True when t carries a forward-mode tangent (torch.autograd.forward_ad, torch.func.jvp, jacfwd).
inline bool has_forward_grad(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }

inline bool any_has_forward_grad(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors)
    if (has_forward_grad(*t)) return true;
  return false;
}

inline bool any_differentiated_by_transform(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors)
    if (differentiated_by_transform(*t)) return true;
  return false;
}

// a + b for two fresh gradient terms: in place into a in plain autograd; a new tensor under a
// torch.func transform or vmap (a backward run under vmap -- jacrev, gradcheck's batched gradients,
// whose vmap is torch's legacy one -- may batch b but not a, which no in-place op can hold).
inline at::Tensor add_gradients(at::Tensor& a, const at::Tensor& b) {
  const c10::DispatchKeySet transformed({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::Batched,
                                         c10::DispatchKey::FuncTorchGradWrapper});
  if (a.key_set().has_any(transformed) || b.key_set().has_any(transformed)) return a + b;
  return a.add_(b);
}

// t.detach() (undefined stays undefined). A detach removes the tangents and gradients of every
// transform level at once, so an op called on detached inputs returns values no level
// differentiates: what with_derivatives_of needs.
inline at::Tensor detached(const at::Tensor& t) { return t.defined() ? t.detach() : t; }

// `value` (an op's exact output, computed from detached() inputs) with the derivatives of `formula`,
// the same quantity written with differentiable ATen ops: value + (formula - formula.detach()), in
// value's dtype. The difference is exactly 0 wherever formula is finite, so the value stays the
// kernel's bit for bit, while every level of every transform differentiates the formula (and only
// the formula: the value must carry no derivative of its own, at any level). Where the formula is
// inf or NaN, the result is the formula itself.
at::Tensor with_derivatives_of(const at::Tensor& value, const at::Tensor& formula);

// Refuses an op for which a transform or forward-mode AD has no formula: a clear error instead of
// a silently missing tangent or a functorch internal error. `how` says what to call instead.
[[noreturn]] void refuse_transform(const char* op, const char* how);

}  // namespace pointops
