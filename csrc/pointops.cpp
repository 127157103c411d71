// Every pointops operator schema, in one place so the op surface reads on one screen.
// Implementations register per backend beside their kernels (TORCH_LIBRARY_IMPL in
// csrc/<family>/<family>_{cpu.cpp,cuda.cu}); ops starting with '_' are private (backward passes).
#include <torch/library.h>
#include <torch/extension.h>

TORCH_LIBRARY(pointops, m) {
  // ---- Chamfer / nearest neighbour (csrc/chamfer) ----
  // `algorithm` ("auto", "brute" or "grid"; every search op below has it, csrc/grid/grid.h): brute
  // force or the spatial grid (D = 2, 3), which returns bit for bit the same result; "auto" takes
  // the grid where sizes say it pays.
  // For each point of x (B,N,D) the nearest point of y (B,M,D): distance and index. norm = 2: squared
  // Euclidean distance; norm = 1: L1 distance.
  m.def("nearest_neighbor(Tensor x, Tensor y, Tensor? x_lengths=None, Tensor? y_lengths=None, int norm=2, "
        "str algorithm=\"auto\")"
        " -> (Tensor dist, Tensor idx)");
  // Both directions of the Chamfer distance in one launch.
  m.def("chamfer(Tensor x, Tensor y, Tensor? x_lengths=None, Tensor? y_lengths=None, int norm=2, "
        "str algorithm=\"auto\")"
        " -> (Tensor dist1, Tensor dist2, Tensor idx1, Tensor idx2)");
  // Gradient of dist = d(x, y[idx]) with respect to x (written directly) and y (scattered). idx is
  // (B, N) (one neighbour per query) or (B, N, K) (knn_points, ball_query), grad_dist the same shape;
  // idx -1 (no neighbour) contributes nothing.
  // chamfer_distance's loss without normals, point_reduction "mean" or "sum" (pointops/chamfer_loss.py
  // has the contract): the masks and reductions fused behind one autograd node.
  m.def("_chamfer_distance(Tensor x, Tensor y, Tensor? x_lengths, Tensor? y_lengths, Tensor? weights, "
        "str point_reduction, str? batch_reduction, int norm, bool single_directional, bool squared, "
        "str algorithm=\"auto\") -> Tensor");
  // Its pieces as single ops (one launch each on CUDA; csrc/chamfer/chamfer_loss.h has the formula):
  // the reduction of the kernel's distances (dist2 absent: one direction; num_y = y's point count),
  // and the gradient with respect to x and y (dist2 / idx2 absent: one direction).
  m.def("_chamfer_distance_loss(Tensor dist1, Tensor? dist2, Tensor? x_lengths, Tensor? y_lengths, "
        "Tensor? weights, int num_y, str point_reduction, str? batch_reduction, bool squared) -> Tensor");
  m.def("_chamfer_distance_backward(Tensor grad, Tensor x, Tensor y, Tensor dist1, Tensor idx1, Tensor? dist2, "
        "Tensor? idx2, Tensor? x_lengths, Tensor? y_lengths, Tensor? weights, str point_reduction, "
        "str? batch_reduction, int norm, bool squared) -> (Tensor grad_x, Tensor grad_y)");
  m.def("_nearest_neighbor_backward(Tensor grad_dist, Tensor x, Tensor y, Tensor idx, int norm=2)"
        " -> (Tensor grad_x, Tensor grad_y)");

  // ---- Neighbourhoods (csrc/neighbors) ----
  // The K nearest points of p2 (B, M, D) for each point of p1 (B, N, D), sorted by (distance, index):
  // dists (B, N, K) (squared Euclidean for norm = 2, L1 for norm = 1) and idx (B, N, K) int64. Slots
  // without a neighbour (fewer than K valid points in the cloud, padded queries, non-finite distances)
  // hold dist 0 and idx -1. K = 1 is nearest_neighbor's search.
  m.def("knn_points(Tensor p1, Tensor p2, Tensor? lengths1=None, Tensor? lengths2=None, int K=1, int norm=2, "
        "str algorithm=\"auto\")"
        " -> (Tensor dists, Tensor idx)");
  // The first K points of p2 (in index order) whose squared distance to a point of p1 is below
  // radius^2: dists (B, N, K) squared distances, idx (B, N, K); unused slots dist 0, idx -1.
  m.def("ball_query(Tensor p1, Tensor p2, Tensor? lengths1=None, Tensor? lengths2=None, int K=500, "
        "float radius=0.2, str algorithm=\"auto\") -> (Tensor dists, Tensor idx)");
  // Farthest point sampling: idx (B, max_K) int64 into points (B, N, D). Cloud b takes
  // min(K[b], max_K, its finite points) samples (K absent: max_K), starting at start_idx[b] (absent:
  // 0); ties go to the smallest index; -1 past a cloud's samples.
  m.def("sample_farthest_points(Tensor points, Tensor? lengths=None, Tensor? K=None, int max_K=50, "
        "Tensor? start_idx=None) -> Tensor idx");

  // ---- Voxelization (csrc/voxelize) ----
  // POINTOPS-VOXELIZE-SCHEMAS-BEGIN
  // Hard voxelization of (N, F) points into at most max_voxels voxels of at most max_points_per_voxel
  // points, numbered by first appearance. V (number of voxels) is data-dependent: one device-to-host
  // sync. point_range = (x_min, y_min, z_min, x_max, y_max, z_max); voxel_size = (x, y, z).
  m.def("voxelize(Tensor points, Tensor? batch, float[] voxel_size, float[] point_range, "
        "int max_points_per_voxel, int max_voxels)"
        " -> (Tensor voxels, Tensor coords, Tensor num_points, Tensor features, Tensor point_to_voxel)");
  // The same with every voxel output padded to max_voxels rows and the real count in num_voxels
  // (a 0-d int64 tensor): no host sync, static shapes (CUDA graphs, torch.compile).
  m.def("voxelize_padded(Tensor points, Tensor? batch, float[] voxel_size, float[] point_range, "
        "int max_points_per_voxel, int max_voxels)"
        " -> (Tensor voxels, Tensor coords, Tensor num_points, Tensor features, Tensor point_to_voxel, "
        "Tensor num_voxels)");
  // Dynamic voxelization: every in-range point, no caps; reduce is "mean", "sum" or "max".
  m.def("voxel_features(Tensor points, Tensor? batch, float[] voxel_size, float[] point_range, "
        "str reduce=\"mean\") -> (Tensor features, Tensor coords, Tensor num_points, Tensor point_to_voxel)");
  // Gradient of voxel_features' features with respect to points.
  m.def("_voxel_features_backward(Tensor grad_features, Tensor points, Tensor point_to_voxel, "
        "Tensor num_points, Tensor features, str reduce) -> Tensor grad_points");
  // POINTOPS-VOXELIZE-SCHEMAS-END

  // ---- Particle sums (csrc/particle_sum) ----
  // f_i = sum_j g(|x_i - y_j|) c_j for targets (M, D) or (B, M, D), sources (N, D) or (B, N, D),
  // weights (N,) / (N, C) or (B, N) / (B, N, C); kernel "gaussian" (sigma), "laplace" or
  // "helmholtz" (wavenumber). Complex output for complex weights or helmholtz.
  m.def("particle_sum(Tensor targets, Tensor sources, Tensor weights, str kernel=\"gaussian\", "
        "float? sigma=None, float? wavenumber=None) -> Tensor");
  // The sums and the first moments sum_j h(r_ij) c_j (x_i - y_j), h = g'(r) / r, from the same
  // pair values: moments have the sums' shape plus a trailing D. The pieces of the gradients.
  m.def("_particle_sum_moments(Tensor targets, Tensor sources, Tensor weights, str kernel, "
        "float? sigma=None, float? wavenumber=None) -> (Tensor sums, Tensor moments)");

  // ---- Strided tensor kernels (csrc/strided; design notes at the top of strided/strided.h) ----
  // Any strided view (permuted, stepped, offset, expanded) is read in place. fn names: see the header.
  // The *_out ops write `out` (any non-overlapping strided tensor of the result's shape) and return
  // nothing, which torch.compile functionalizes; pointops/strided.py returns out to the caller.
  m.def("strided_map(Tensor x, str fn) -> Tensor");
  m.def("strided_map_out(Tensor x, str fn, Tensor(a!) out) -> ()");
  // a and b broadcast as in torch and share one dtype.
  m.def("strided_zip(Tensor a, Tensor b, str fn) -> Tensor");
  m.def("strided_zip_out(Tensor a, Tensor b, str fn, Tensor(a!) out) -> ()");
  // fn "sum", "prod", "max", "min" over dim (None or [] = every dim, as torch.sum); deterministic.
  m.def("strided_reduce(Tensor x, int[1]? dim=None, str fn=\"sum\", bool keepdim=False) -> Tensor");
  // (..., n, k) @ (..., k, m), batch dims broadcast; float32 in IEEE float32 (no TF32).
  m.def("strided_matmul(Tensor a, Tensor b) -> Tensor");
}

// The Python module: build facts only (the ops live in torch.ops.pointops).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("build_info", []() {
    pybind11::dict info;
    info["version"] = POINTOPS_VERSION;
#ifdef POINTOPS_WITH_CUDA
    info["cuda"] = true;
    info["cuda_version"] = POINTOPS_CUDA_VERSION;
    info["cuda_archs"] = POINTOPS_CUDA_ARCHS;  // comma-separated nvcc targets, e.g. "sm_90,compute_90"
#else
    info["cuda"] = false;
    info["cuda_version"] = pybind11::none();
    info["cuda_archs"] = "";
#endif
    // torch.__version__ of the build (with its local tag, e.g. 2.13.0+cu130); the headers' own
    // TORCH_VERSION has no tag.
    info["torch_version"] = POINTOPS_TORCH_VERSION;
    return info;
  });
}
