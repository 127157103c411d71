// voxelize and voxelize_padded have no derivative (voxel_features is the differentiable one): at the
// Autograd key they fall through to the backend, so their outputs carry no gradient, as documented.
// Without a kernel there, every call went through autograd's boxed not-implemented fallback, which
// marks outputs of inputs that require grad with a node that fails on backward, and costs ~0.5 us of
// a small call's host time (issue 19).
#include <torch/library.h>

TORCH_LIBRARY_IMPL(pointops, Autograd, m) {
  m.impl("voxelize", torch::CppFunction::makeFallthrough());
  m.impl("voxelize_padded", torch::CppFunction::makeFallthrough());
}
