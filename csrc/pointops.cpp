// Every pointops operator schema, in one place so the op surface reads on one screen.
// Implementations register per backend beside their kernels (TORCH_LIBRARY_IMPL in
// csrc/<family>/<family>_{cpu.cpp,cuda.cu}); ops starting with '_' are private (backward passes).
#include <torch/library.h>
#include <torch/extension.h>
#include <torch/version.h>

TORCH_LIBRARY(pointops, m) {
  // ---- Chamfer / nearest neighbour (csrc/chamfer) ----
  // For each point of x (B,N,D) the nearest point of y (B,M,D): squared distance and index.
  m.def("nearest_neighbor(Tensor x, Tensor y, Tensor? x_lengths=None, Tensor? y_lengths=None)"
        " -> (Tensor dist, Tensor idx)");
  // Both directions of the Chamfer distance in one launch.
  m.def("chamfer(Tensor x, Tensor y, Tensor? x_lengths=None, Tensor? y_lengths=None)"
        " -> (Tensor dist1, Tensor dist2, Tensor idx1, Tensor idx2)");
  // Gradient of dist = |x - y[idx]|^2 with respect to x (written directly) and y (scattered).
  m.def("_nearest_neighbor_backward(Tensor grad_dist, Tensor x, Tensor y, Tensor idx)"
        " -> (Tensor grad_x, Tensor grad_y)");

  // ---- Voxelization (csrc/voxelize) ----
  // POINTOPS-VOXELIZE-SCHEMAS-BEGIN
  // POINTOPS-VOXELIZE-SCHEMAS-END
}

// The Python module: build facts only (the ops live in torch.ops.pointops).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("build_info", []() {
    pybind11::dict info;
    info["version"] = POINTOPS_VERSION;
#ifdef POINTOPS_WITH_CUDA
    info["cuda"] = true;
    info["cuda_version"] = POINTOPS_CUDA_VERSION;
#else
    info["cuda"] = false;
    info["cuda_version"] = pybind11::none();
#endif
    info["torch_version"] = TORCH_VERSION;
    return info;
  });
}
