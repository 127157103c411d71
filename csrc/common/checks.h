// Input checks shared by every op family. Messages name the argument, what it is and what was
// expected, so a user can fix the call without reading our code.
#pragma once

#include <ATen/ATen.h>

namespace pointops {

inline void check_floating_point(const at::Tensor& t, const char* name) {
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              name, " must be float16, bfloat16, float32 or float64, got ", dtype);
}

inline void check_dim(const at::Tensor& t, int64_t dim, const char* name, const char* layout) {
  TORCH_CHECK(t.dim() == dim, name, " must be a ", dim, "-D tensor ", layout, ", got shape ", t.sizes());
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* name,
                              const char* ref_name) {
  TORCH_CHECK(t.device() == ref.device(), name, " must be on the same device as ", ref_name, " (",
              ref.device(), "), got ", t.device());
}

inline void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* name,
                             const char* ref_name) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), name, " must have the same dtype as ", ref_name,
              " (", ref.scalar_type(), "), got ", t.scalar_type());
}

}  // namespace pointops
