"""Direct particle (kernel) sums on the CPU and CUDA: f(x_i) = sum_j g(x_i, y_j) c_j.

The M x N interaction matrix is never formed, forward or backward: every pass streams the
sources past the targets and keeps O(M + N) memory.

Kernels (r = |x - y|, Euclidean):

* ``"gaussian"``: g = exp(-r^2 / (2 sigma^2)), any dimension D >= 1; ``sigma`` > 0 required.
* ``"laplace"``: g = 1 / (4 pi r), D = 3 (the free-space Green's function of -Laplacian).
* ``"helmholtz"``: g = exp(i k r) / (4 pi r), D = 3, real wavenumber ``k``; the output is complex.

For the two singular kernels a term whose pair is coincident is dropped (the self-interaction of
a particle with itself). "Coincident" means r^2 below the smallest normal number of the compute
type: 1.2e-38 in float32 (so pairs closer than about 1e-19 count as coincident), 2.2e-308 in
float64.

Shapes: targets (M, D), sources (N, D), weights (N,) or (N, C) -> output (M,) or (M, C); or with a
leading batch dimension on all three: (B, M, D), (B, N, D), (B, N) or (B, N, C) -> (B, M) or
(B, M, C). Batches are independent sums.

Dtypes: targets and sources share a real dtype among float16, bfloat16, float32 and float64 (the
half types are computed in float32 and rounded once at the end). Weights have that dtype, or are
complex: complex64 with float32 coordinates, complex128 with float64. The output is complex when
the weights are complex or the kernel is helmholtz (complex64 for float16/bfloat16/float32
coordinates, complex128 for float64), else it has the coordinates' dtype.

Accuracy (tested, relative l2 error against a float64 direct sum of the same input values):

* float32: within 1e-6 for N up to 10^6 and weights of mixed sign. Blocks of 64 terms are
  summed in float32 and the block sums added in float64 (a plain float32 running sum of 10^6
  terms loses ~1e-5). Distances use the exact differences x - y, never |x|^2 + |y|^2 - 2 x.y.
  The CUDA kernels use the hardware exp2 / rsqrt approximations (about 2 ulp), far below that
  bound.
* helmholtz in float32: within 1e-5 for k r up to 100. The phase is computed in turns,
  u = r k / (2 pi) with k / (2 pi) split into two floats, and reduced exactly to a fraction of a
  turn before the sine and cosine, so the phase error is the rounding of r times k r (about
  1e-7 k r radians); the reduction needs |k r| < 2^22 * 2 pi (about 2.6e7), beyond which a float32
  phase has no correct digits anyway. float64 uses the full-precision sincos.
* float64: within 1e-12.
* float16 / bfloat16: the float32 result rounded once to the half type (2^-11 / 2^-8).
* gradients in float32: within 1e-5 (helmholtz 1e-4) of float64 autograd.

Determinism: no float atomics; the same inputs on the same machine give bitwise the same output
on every run (the CPU's work split does not depend on the thread count). CPU and CUDA agree to
the accuracy above, not bit for bit; the CPU kernels are compiled for AVX-512, AVX2 and the
baseline x86-64 and pick one at run time, so two different CPUs may differ in the last bits.

Gradients flow to targets, sources and weights (not to ``sigma`` / ``wavenumber``, which are
Python floats). Complex gradients follow PyTorch's convention (the conjugate Wirtinger
derivative). Every backward pass is itself a fused O(M N) sum:

* weights: grad_c_j = sum_i conj(g_ij) G_i, a particle sum with targets and sources swapped;
* targets: grad_x_i = Re sum_c conj(G_i^c) m_i^c, where m_i^c = sum_j h(r_ij) c_j^c (x_i - y_j)
  with h = g'(r) / r is computed *in the forward pass*, alongside f, when targets require grad;
* sources: grad_y_j = Re sum_c c_j^c sum_i h(r_ij) conj(G_i^c) (y_j - x_i), computed in the same
  swapped pass as the weights' gradient.

Second derivatives (``create_graph=True``: gradient penalties, Hessian-vector products): for the
gaussian every one, since h = -g / sigma^2 makes the moments two more gaussian sums,
-(x_i sum_j g_ij c_j - sum_j g_ij c_j y_j) / sigma^2, computed (only when a graph is created) with
the coordinates shifted so the sources' mean is at the origin: the subtraction then loses about
log10(cloud radius / sigma) digits, not log10(|x| / sigma). For laplace and helmholtz, derivatives
of the weights' gradient work (it is a particle sum); differentiating the targets' or sources'
gradient raises a RuntimeError (it needs the derivative of g'(r)/r, a kernel pointops does not
have yet), never a silent zero.

Empty inputs: M = 0 gives an empty output; N = 0 gives zeros; C = 0 gives an (M, 0) output.
Non-finite inputs propagate as in IEEE arithmetic (a NaN coordinate or weight makes every sum it
enters NaN).
"""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch
from torch import Tensor, nn

from ._entry import eager_entry
from ._particle_sum_function import ParticleSumFunction
from ._transforms import transform_active

__all__ = ["particle_sum", "ParticleSum", "KERNELS"]

KERNELS = ("gaussian", "laplace", "helmholtz")
_REAL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Looked up once and called through its C++ entry (pointops/_entry.py): a small call's host time.
_PARTICLE_SUM = eager_entry(torch.ops.pointops.particle_sum.default)


def _unknown_kernel(kernel) -> str:
    return f"kernel must be one of {', '.join(repr(k) for k in KERNELS)}, got {kernel!r}"


def _check_tensors(targets, sources, weights) -> None:
    # None reaches the op as an undefined tensor, whose messages ("tensor does not have a device",
    # "got shape [0]") do not say what is wrong; a list gets the dispatcher's RuntimeError.
    if isinstance(targets, Tensor) and isinstance(sources, Tensor) and isinstance(weights, Tensor):
        return  # the common case first: three isinstance calls per particle_sum call
    for value, name, layout in ((targets, "targets", "(M, D) or (B, M, D)"), (sources, "sources", "(N, D) or (B, N, D)"),
                                (weights, "weights", "(N,), (N, C), (B, N) or (B, N, C)")):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a tensor {layout}, got {type(value).__name__}")


def _parameter(value, name: str) -> Optional[float]:
    """sigma / wavenumber as a float (None stays None). A bool is refused: sigma=True is a mistake."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number or None, got {type(value).__name__} {value!r}")
    return float(value)


def _check_parameters(kernel: str, sigma: Optional[float], wavenumber: Optional[float]) -> None:
    """The C++ op's kernel-parameter checks (check_kernel_parameters), for ParticleSum's
    constructor, so a bad module fails where it is built rather than at its first call."""
    if kernel == "gaussian":
        if sigma is None:
            raise ValueError("the gaussian kernel needs sigma (its width), got none")
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be finite and > 0, got {sigma}")
    elif sigma is not None:
        raise ValueError(f"sigma applies to the gaussian kernel only, got sigma={sigma} with kernel {kernel!r}")
    if kernel == "helmholtz":
        if wavenumber is None:
            raise ValueError("the helmholtz kernel needs wavenumber (k), got none")
        if not math.isfinite(wavenumber):
            raise ValueError(f"wavenumber must be finite, got {wavenumber}")
    elif wavenumber is not None:
        raise ValueError(f"wavenumber applies to the helmholtz kernel only, got wavenumber={wavenumber} "
                         f"with kernel {kernel!r}")


def particle_sum(targets: Tensor, sources: Tensor, weights: Tensor, kernel: str = "gaussian", *,
                 sigma: Optional[float] = None, wavenumber: Optional[float] = None) -> Tensor:
    """f(x_i) = sum_j g(x_i, y_j) c_j for every target x_i, without forming the M x N matrix.

    Args:
        targets: (M, D) or (B, M, D) evaluation points x_i; float16, bfloat16, float32 or float64.
        sources: (N, D) or (B, N, D) source points y_j, same dtype, device and batch as targets.
        weights: (N,) / (N, C) (or (B, N) / (B, N, C)) source strengths c_j: the coordinates'
            dtype, or complex64 (float32 coordinates) / complex128 (float64 coordinates).
        kernel: "gaussian" (exp(-r^2 / (2 sigma^2)), any D), "laplace" (1 / (4 pi r), D = 3) or
            "helmholtz" (exp(i k r) / (4 pi r), D = 3, complex output).
        sigma: the Gaussian's width, finite and > 0; required by "gaussian", refused otherwise.
        wavenumber: k, a finite real number; required by "helmholtz", refused otherwise.

    Returns:
        (M,) / (M, C) (or (B, M) / (B, M, C)): real with the coordinates' dtype, or complex when
        the weights are complex or the kernel is helmholtz (see the module docstring).

    Coincident pairs are dropped for "laplace" and "helmholtz" (r^2 below the compute type's
    smallest normal number). Differentiable in targets, sources and weights; deterministic.
    float32 accuracy: relative l2 error <= 1e-6 against a float64 direct sum (1e-5 for helmholtz
    with k r <= 100); float64: 1e-12. See the module docstring for the details.

    Raises:
        TypeError: targets, sources or weights not a tensor.
        RuntimeError: an unknown kernel, a missing / non-positive / NaN sigma, a missing or
            non-finite wavenumber, D != 3 for laplace or helmholtz, mismatched shapes, batch,
            dtype or device, integer tensors.

    Example:
        >>> x, y, c = torch.rand(1000, 3), torch.rand(5000, 3), torch.randn(5000)
        >>> f = pointops.particle_sum(x, y, c, "gaussian", sigma=0.1)      # (1000,)
    """
    _check_tensors(targets, sources, weights)
    if transform_active():  # forward mode and torch.func: pointops/_particle_sum_function.py
        return ParticleSumFunction.apply(targets, sources, weights, kernel, sigma, wavenumber)
    return _PARTICLE_SUM(targets, sources, weights, kernel, sigma, wavenumber)


class ParticleSum(nn.Module):
    """:func:`particle_sum` with the kernel and its parameter held by the module.

    ``ParticleSum("gaussian", sigma=0.1)(targets, sources, weights)``. The kernel and its
    parameter are checked at construction: ValueError for an unknown kernel or a missing, refused or
    out-of-range sigma / wavenumber, TypeError for a parameter that is not a real number.
    """

    def __init__(self, kernel: str = "gaussian", *, sigma: Optional[float] = None,
                 wavenumber: Optional[float] = None):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(_unknown_kernel(kernel))
        self.kernel = kernel
        self.sigma = _parameter(sigma, "sigma")
        self.wavenumber = _parameter(wavenumber, "wavenumber")
        _check_parameters(kernel, self.sigma, self.wavenumber)

    def forward(self, targets: Tensor, sources: Tensor, weights: Tensor) -> Tensor:
        return particle_sum(targets, sources, weights, self.kernel, sigma=self.sigma, wavenumber=self.wavenumber)

    def extra_repr(self) -> str:
        params = [f"{self.kernel!r}"]
        if self.sigma is not None:
            params.append(f"sigma={self.sigma}")
        if self.wavenumber is not None:
            params.append(f"wavenumber={self.wavenumber}")
        return ", ".join(params)


# ---------------------------------------------------------------- fake kernels (torch.compile)
def _check_fake(targets, sources, weights, kernel, sigma, wavenumber):
    """The checks of check_particle_sum_inputs (csrc/particle_sum/particle_sum_checks.cpp) that
    shapes and dtypes allow, for fake tensors. Returns (sums shape, output dtype, D)."""
    torch._check(kernel in KERNELS, lambda: _unknown_kernel(kernel))
    torch._check(targets.dim() in (2, 3),
                 lambda: f"targets must be a 2-D (M, D) or 3-D (B, M, D) tensor, got shape {tuple(targets.shape)}")
    rank = targets.dim()
    torch._check(sources.dim() == rank, lambda: f"sources must have the same rank as targets, got {tuple(sources.shape)}")
    torch._check(targets.dtype in _REAL_DTYPES,
                 lambda: f"targets must be float16, bfloat16, float32 or float64, got {targets.dtype}")
    torch._check(sources.dtype == targets.dtype,
                 lambda: f"sources must have the same dtype as targets ({targets.dtype}), got {sources.dtype}")
    batched = rank == 3
    M, D = targets.shape[-2], targets.shape[-1]
    torch._check(sources.shape[-1] == D, lambda: "sources and targets must have the same dimension D")
    torch._check(weights.dim() in (rank - 1, rank), lambda: f"weights have the wrong rank: {tuple(weights.shape)}")
    vector = weights.dim() == rank - 1
    complex_out = weights.dtype.is_complex or kernel == "helmholtz"
    shape = ([targets.shape[0]] if batched else []) + [M] + ([] if vector else [weights.shape[-1]])
    return shape, _output_dtype(targets.dtype, complex_out), D


def _output_dtype(coords_dtype, complex_out):
    if not complex_out:
        return coords_dtype
    return torch.complex128 if coords_dtype == torch.float64 else torch.complex64


@torch.library.register_fake("pointops::particle_sum")
def _particle_sum_fake(targets, sources, weights, kernel="gaussian", sigma=None, wavenumber=None):
    shape, dtype, _ = _check_fake(targets, sources, weights, kernel, sigma, wavenumber)
    return targets.new_empty(shape, dtype=dtype)


@torch.library.register_fake("pointops::_particle_sum_moments")
def _particle_sum_moments_fake(targets, sources, weights, kernel, sigma=None, wavenumber=None):
    shape, dtype, D = _check_fake(targets, sources, weights, kernel, sigma, wavenumber)
    return targets.new_empty(shape, dtype=dtype), targets.new_empty(shape + [D], dtype=dtype)
