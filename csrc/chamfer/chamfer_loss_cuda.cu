// chamfer_distance's loss reduction and backward on CUDA, one launch each: at training
// sizes the step is bound by host time per launch, and the torch-op composition these replace
// issued ~5 launches for the reduction and ~10 for the backward (scales, two backward ops with
// their zero fills, two in-place adds).
//
// The reduction runs in one block: one warp per (cloud, direction) row sums its distances in
// double in a fixed lane order, the rows are then summed by a fixed tree: deterministic, and the
// distances are read once (a 1M-point cloud costs tens of microseconds, beside a search of
// milliseconds). The backward scatters both directions' terms with float atomics (as
// _nearest_neighbor_backward's default path does); under torch.use_deterministic_algorithms the
// autograd node takes the sort-based ops instead and never calls this.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/Atomic.cuh>
#include <torch/library.h>

#include <cmath>

#include "chamfer/chamfer.h"
#include "chamfer/chamfer_loss.h"
#include "common/cuda_utils.cuh"

namespace pointops {
namespace {

constexpr int kLossThreads = 1024;
constexpr int kBackwardThreads = 256;

template <typename scalar_t>
struct LossArgs {
  const scalar_t* dist[2];  // (B, n) per direction, contiguous
  DirectionFactors factors[2];
  int dirs;
  int64_t B;
  const double* weights;  // (B,) or nullptr
  BatchReduction batch;
  bool squared;
};

// Sum of `value` over the block, the same tree on every call. All threads must call it.
__device__ double block_sum(double value, double* shared) {
  value = warp_sum(value);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : 0.0;
  value = warp_sum(value);
  return value;  // every thread holds the total
}

// The batch reduction's divisor: B, or the weights' sum when positive (PyTorch3D: 1 when it is 0,
// every term being 0 already), for "mean"; 1 otherwise.
__device__ double batch_divisor(BatchReduction batch, const double* weights, int64_t B, double* shared) {
  if (batch != BatchReduction::Mean || B == 0) return 1.0;
  if (weights == nullptr) return static_cast<double>(B);
  double part = 0;
  for (int64_t b = threadIdx.x; b < B; b += blockDim.x) part += weights[b];
  const double total = block_sum(part, shared);
  return total > 0 ? total : 1.0;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kLossThreads) chamfer_distance_loss_kernel(LossArgs<scalar_t> a, double* rows,
                                                                             scalar_t* out) {
  __shared__ double shared[kLossThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t row = warp; row < a.B * a.dirs; row += warps) {
    const int64_t b = row / a.dirs;
    const int dir = static_cast<int>(row % a.dirs);
    const DirectionFactors& f = a.factors[dir];
    double sum = 0;
    if (!f.partner_empty(b)) {  // otherwise the distances are +inf, and the direction adds 0
      const scalar_t* d = a.dist[dir] + b * f.n;
      for (int64_t i = lane; i < f.n; i += 32) {  // padding holds 0
        const double di = static_cast<double>(d[i]);
        sum += a.squared ? di : ::sqrt(di);
      }
    }
    sum = warp_sum(sum);
    if (lane == 0) {
      const double weight = a.weights != nullptr ? a.weights[b] : 1.0;
      rows[row] = f.partner_empty(b) ? 0.0 : sum * weight * f.inverse_count(b);
    }
  }
  __syncthreads();  // rows[] (global memory) written by this block is visible to it after the barrier
  auto cloud_value = [&](int64_t b) { return a.dirs == 2 ? rows[2 * b] + rows[2 * b + 1] : rows[b]; };
  if (a.batch == BatchReduction::None) {
    for (int64_t b = threadIdx.x; b < a.B; b += blockDim.x) out[b] = static_cast<scalar_t>(cloud_value(b));
    return;
  }
  double part = 0;
  for (int64_t b = threadIdx.x; b < a.B; b += blockDim.x) part += cloud_value(b);
  const double total = block_sum(part, shared);
  const double divisor = batch_divisor(a.batch, a.weights, a.B, shared);
  if (threadIdx.x == 0) out[0] = static_cast<scalar_t>(total / divisor);
}

template <typename scalar_t>
struct BackwardArgs {
  const scalar_t* grad;  // (B,) without a batch reduction, else one value
  const scalar_t* points[2];  // x (B, N, D), y (B, M, D)
  const scalar_t* dist[2];    // per direction: dist[0] (B, N) queries of x, dist[1] (B, M) queries of y
  const int64_t* idx[2];
  DirectionFactors factors[2];
  int dirs;
  int64_t B, dim;
  const double* weights;
  BatchReduction batch;
  bool squared;
};

// Element e of direction 0 is (query point of x, coordinate), then those of direction 1 (queries
// of y). Each adds its term to its own point's gradient and subtracts it from its neighbour's.
template <typename scalar_t, Metric metric>
__global__ void __launch_bounds__(kBackwardThreads)
    chamfer_distance_backward_kernel(BackwardArgs<scalar_t> a, int64_t total0, int64_t total,
                                     at::opmath_type<scalar_t>* grad_x, at::opmath_type<scalar_t>* grad_y) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ double shared[kBackwardThreads / 32];
  const double divisor = batch_divisor(a.batch, a.weights, a.B, shared);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int dir = e < total0 ? 0 : 1;
    const DirectionFactors& f = a.factors[dir];
    const int64_t local = dir == 0 ? e : e - total0;
    const int64_t query = local / a.dim, c = local % a.dim;  // query = b * n + i
    const int64_t b = query / f.n;
    const int64_t j = a.idx[dir][query];
    // -1: padding, an empty partner, or no comparable neighbour. j >= partner_n only comes from a
    // hand-made idx: ignored, never read out of bounds.
    if (j < 0 || j >= f.partner_n) continue;
    double g = (a.batch == BatchReduction::None ? static_cast<double>(a.grad[b]) : static_cast<double>(a.grad[0]) / divisor) *
               f.inverse_count(b);
    if (a.weights != nullptr) g *= a.weights[b];
    if (!a.squared) {  // d sqrt(d) / dd = 1 / (2 sqrt(d)) where d > 0; 1 at d = 0 (its 2 (x - y) is 0)
      const double d = static_cast<double>(a.dist[dir][query]);
      if (d > 0) g *= 0.5 / ::sqrt(d);
    }
    const int64_t own = query * a.dim + c, partner = (b * f.partner_n + j) * a.dim + c;
    const acc_t diff = static_cast<acc_t>(a.points[dir][own]) - static_cast<acc_t>(a.points[1 - dir][partner]);
    const acc_t term = static_cast<acc_t>(g) * distance_derivative<metric>(diff);
    acc_t* own_grad = dir == 0 ? grad_x : grad_y;
    acc_t* partner_grad = dir == 0 ? grad_y : grad_x;
    gpuAtomicAdd(own_grad + own, term);
    gpuAtomicAdd(partner_grad + partner, -term);
  }
}

// grad_x and grad_y set to 0 in one launch (the backward kernel then adds into both): two
// at::zeros would be two dispatched fills in a host-bound step. They stay two allocations:
// one op's outputs must not alias (its schema says so, and opcheck checks it).
template <typename acc_t>
__global__ void __launch_bounds__(kBackwardThreads)
    zero_two_kernel(acc_t* first, int64_t first_count, acc_t* second, int64_t second_count) {
  const int64_t total = first_count + second_count;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (e < first_count) {
      first[e] = acc_t(0);
    } else {
      second[e - first_count] = acc_t(0);
    }
  }
}

at::Tensor int64_lengths(const c10::optional<at::Tensor>& lengths) {
  if (!lengths.has_value() || !lengths->defined()) return at::Tensor();
  return lengths->to(at::kLong).contiguous();
}

at::Tensor double_weights(const c10::optional<at::Tensor>& weights) {
  if (!weights.has_value() || !weights->defined()) return at::Tensor();
  return weights->to(at::kDouble).contiguous();
}

const int64_t* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<int64_t>() : nullptr; }

at::Tensor chamfer_distance_loss_cuda(const at::Tensor& dist1, const c10::optional<at::Tensor>& dist2,
                                      const c10::optional<at::Tensor>& x_lengths,
                                      const c10::optional<at::Tensor>& y_lengths,
                                      const c10::optional<at::Tensor>& weights, int64_t num_y,
                                      c10::string_view point_reduction,
                                      c10::optional<c10::string_view> batch_reduction, bool squared) {
  const bool mean = parse_point_mean(point_reduction);
  const BatchReduction batch = parse_batch_reduction(batch_reduction);
  const bool both = dist2.has_value() && dist2->defined();
  check_chamfer_distance_loss_shapes(dist1, dist2, num_y);
  const int64_t B = dist1.size(0), N = dist1.size(1);
  const c10::cuda::CUDAGuard guard(dist1.device());
  at::Tensor out = batch == BatchReduction::None ? at::empty({B}, dist1.options()) : at::empty({}, dist1.options());
  if (B == 0) return batch == BatchReduction::None ? out : out.zero_();  // an empty mean is the empty sum, 0
  const at::Tensor xl = int64_lengths(x_lengths), yl = int64_lengths(y_lengths), w = double_weights(weights);
  const at::Tensor d1 = dist1.contiguous();
  const at::Tensor d2 = both ? dist2->contiguous() : at::Tensor();
  at::Tensor rows = at::empty({B * (both ? 2 : 1)}, dist1.options().dtype(at::kDouble));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dist1.scalar_type(), "chamfer_distance_loss_cuda", [&] {
    LossArgs<scalar_t> a{};
    a.dist[0] = d1.data_ptr<scalar_t>();
    a.factors[0] = DirectionFactors{data_or_null(xl), data_or_null(yl), N, num_y, mean};
    a.dirs = 1;
    if (both) {
      a.dist[1] = d2.data_ptr<scalar_t>();
      a.factors[1] = DirectionFactors{data_or_null(yl), data_or_null(xl), num_y, N, mean};
      a.dirs = 2;
    }
    a.B = B;
    a.weights = w.defined() ? w.data_ptr<double>() : nullptr;
    a.batch = batch;
    a.squared = squared;
    chamfer_distance_loss_kernel<scalar_t><<<1, kLossThreads, 0, stream>>>(a, rows.data_ptr<double>(),
                                                                           out.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> chamfer_distance_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& y, const at::Tensor& dist1, const at::Tensor& idx1,
    const c10::optional<at::Tensor>& dist2, const c10::optional<at::Tensor>& idx2,
    const c10::optional<at::Tensor>& x_lengths, const c10::optional<at::Tensor>& y_lengths,
    const c10::optional<at::Tensor>& weights, c10::string_view point_reduction,
    c10::optional<c10::string_view> batch_reduction, int64_t norm, bool squared) {
  const bool mean = parse_point_mean(point_reduction);
  const BatchReduction batch = parse_batch_reduction(batch_reduction);
  const Metric metric = metric_from_norm(norm);
  const bool both = dist2.has_value() && dist2->defined();
  check_chamfer_distance_backward_shapes(grad, x, y, dist1, idx1, dist2, idx2, batch);
  const int64_t B = x.size(0), N = x.size(1), M = y.size(1), dim = x.size(2);
  const c10::cuda::CUDAGuard guard(x.device());
  const auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t x_elems = B * N * dim, y_elems = B * M * dim;
  at::Tensor grad_x = at::empty({B, N, dim}, x.options().dtype(acc_type));
  at::Tensor grad_y = at::empty({B, M, dim}, y.options().dtype(acc_type));
  if (x_elems + y_elems > 0) {
    AT_DISPATCH_FLOATING_TYPES(acc_type, "chamfer_distance_backward_zero", [&] {
      zero_two_kernel<scalar_t><<<grid_for(x_elems + y_elems, kBackwardThreads), kBackwardThreads, 0,
                                  c10::cuda::getCurrentCUDAStream()>>>(grad_x.data_ptr<scalar_t>(), x_elems,
                                                                       grad_y.data_ptr<scalar_t>(), y_elems);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  const int64_t total0 = x_elems, total = total0 + (both ? y_elems : 0);
  if (total > 0 && N > 0 && M > 0) {
    at::globalContext().alertNotDeterministic("pointops::_chamfer_distance_backward");
    const at::Tensor xl = int64_lengths(x_lengths), yl = int64_lengths(y_lengths), w = double_weights(weights);
    const at::Tensor xc = x.contiguous(), yc = y.contiguous(), gc = grad.contiguous(), d1 = dist1.contiguous(),
                     i1 = idx1.contiguous();
    const at::Tensor d2 = both ? dist2->contiguous() : at::Tensor(), i2 = both ? idx2->contiguous() : at::Tensor();
    const auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "chamfer_distance_backward_cuda", [&] {
      using acc_t = at::opmath_type<scalar_t>;
      BackwardArgs<scalar_t> a{};
      a.grad = gc.data_ptr<scalar_t>();
      a.points[0] = xc.data_ptr<scalar_t>();
      a.points[1] = yc.data_ptr<scalar_t>();
      a.dist[0] = d1.data_ptr<scalar_t>();
      a.idx[0] = i1.data_ptr<int64_t>();
      a.factors[0] = DirectionFactors{data_or_null(xl), data_or_null(yl), N, M, mean};
      a.dirs = 1;
      if (both) {
        a.dist[1] = d2.data_ptr<scalar_t>();
        a.idx[1] = i2.data_ptr<int64_t>();
        a.factors[1] = DirectionFactors{data_or_null(yl), data_or_null(xl), M, N, mean};
        a.dirs = 2;
      }
      a.B = B;
      a.dim = dim;
      a.weights = w.defined() ? w.data_ptr<double>() : nullptr;
      a.batch = batch;
      a.squared = squared;
      dispatch_metric(metric, [&](auto metric_tag) {
        chamfer_distance_backward_kernel<scalar_t, decltype(metric_tag)::value>
            <<<grid_for(total, kBackwardThreads), kBackwardThreads, 0, stream>>>(
                a, total0, total, grad_x.data_ptr<acc_t>(), grad_y.data_ptr<acc_t>());
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  // float32 / float64: the accumulators are the results (Tensor::to returns them as they are)
  return {grad_x.to(x.scalar_type()), grad_y.to(y.scalar_type())};
}

}  // namespace

TORCH_LIBRARY_IMPL(pointops, CUDA, m) {
  m.impl("_chamfer_distance_loss", &chamfer_distance_loss_cuda);
  m.impl("_chamfer_distance_backward", &chamfer_distance_backward_cuda);
}

}  // namespace pointops
