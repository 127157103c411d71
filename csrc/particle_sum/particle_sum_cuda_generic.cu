// The any-dimension Gaussian CUDA kernels (float and double), compiled on their own.
#include "particle_sum/particle_sum_cuda_variants.cuh"

namespace pointops {
namespace particle_sum_cuda {

template void launch_generic<float>(const LaunchArgs<float>&, int, bool, const at::TensorOptions&, cudaStream_t);
template void launch_generic<double>(const LaunchArgs<double>&, int, bool, const at::TensorOptions&, cudaStream_t);

}  // namespace particle_sum_cuda
}  // namespace pointops
