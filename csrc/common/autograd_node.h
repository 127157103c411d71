// Autograd nodes made by hand, as ATen's own ops make theirs: the Autograd kernel computes the
// outputs below autograd and attaches a torch::autograd::Node (record_backward) whose apply() is the
// backward, written with ops that are differentiable themselves. Unlike a torch::autograd::Function,
// such a node works at every level of the torch.func transforms (grad, vjp, jacrev, hessian, and
// vmap over them), costs less host time, and is what torch.compile traces like any ATen op.
// (Forward-mode tangents are the other path of common/transforms.h.)
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <type_traits>
#include <utility>

namespace pointops {

// The pointer torch keeps a grad_fn in: std::shared_ptr<Node> up to torch 2.12, c10::intrusive_ptr<Node>
// from 2.13 on. Everything here goes through it, so one source builds against either.
using NodePtr = std::decay_t<decltype(std::declval<const at::Tensor&>().grad_fn())>;

// torch's deleter of shared_ptr nodes (torch::autograd::deleteNode, found by argument-dependent lookup
// so that torches without it, which keep nodes in intrusive_ptrs, never look for it): it frees long
// chains of nodes without recursing.
struct NodeDeleter {
  template <typename N>
  void operator()(N* node) const {
    deleteNode(node);
  }
};

template <typename T, typename... Args>
NodePtr make_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::shared_ptr<T>(new T(std::forward<Args>(args)...), NodeDeleter{});
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

// Whether an op called with these inputs must record a backward: grad mode on and one of them
// requiring grad (at the current level of a torch.func transform, for its wrappers).
inline bool needs_backward(std::initializer_list<const at::Tensor*> inputs) {
  if (!c10::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

// Makes `node` (edges to the inputs that require grad) the grad_fn of the differentiable outputs,
// which become its gradient inputs in order.
template <typename... Inputs>
void record_backward(const NodePtr& node, std::initializer_list<at::Tensor*> outputs, const Inputs&... inputs) {
  node->set_next_edges(torch::autograd::collect_next_edges(inputs...));
  for (at::Tensor* out : outputs) torch::autograd::set_history(*out, node);
}

}  // namespace pointops
