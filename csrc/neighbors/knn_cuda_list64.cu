// knn_points' register-list kernels for lists of 64 candidates (see knn_cuda_lists.cuh).
#include "neighbors/knn_cuda_lists.cuh"

namespace pointops {
namespace knn_cuda {
POINTOPS_KNN_SPATIAL_SEARCHES(extern, 64)
POINTOPS_KNN_LIST_LENGTH_FLOAT(64)
}  // namespace knn_cuda
}  // namespace pointops
