// The D = 3 CUDA kernels of the gaussian particle sum (float and double), compiled on their own.
#include "particle_sum/particle_sum_cuda_variants.cuh"

namespace pointops {
namespace particle_sum_cuda {

template void launch_d3<ParticleKernel::Gaussian, float>(const LaunchArgs<float>&, int, bool, bool,
                                                    const at::TensorOptions&, cudaStream_t);
template void launch_d3<ParticleKernel::Gaussian, double>(const LaunchArgs<double>&, int, bool, bool,
                                                     const at::TensorOptions&, cudaStream_t);

}  // namespace particle_sum_cuda
}  // namespace pointops
