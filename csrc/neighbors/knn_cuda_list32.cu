// knn_points' register-list kernels for lists of 32 candidates (see knn_cuda_lists.cuh).
#include "neighbors/knn_cuda_lists.cuh"

namespace pointops {
namespace knn_cuda {
POINTOPS_KNN_SPATIAL_SEARCHES(extern, 32)
POINTOPS_KNN_LIST_LENGTH_FLOAT(32)
}  // namespace knn_cuda
}  // namespace pointops
