"""Nearest neighbour and Chamfer distance between point clouds (CPU and CUDA).

All functions take batched clouds ``x`` (B, N, D) and ``y`` (B, M, D) of the same floating dtype
(float16, bfloat16, float32, float64; half types compute in float32) on the same device, any
D >= 1. Ragged batches: ``x_lengths`` / ``y_lengths`` (B,) int64 give the number of valid points of
each cloud; points past a cloud's length are padding: never matched, and reported with distance
0 and index -1.

Distances are *squared* Euclidean (``norm=2``, the default) or L1 (``norm=1``: ``sum |x - y|``),
computed per coordinate in the exact ``sum((x - y)^2)`` form, which stays accurate for clouds far
from the origin (LiDAR scale) where ``|x|^2 + |y|^2 - 2 x.y`` does not.
Ties go to the smallest index. A query with no neighbour at a comparable distance (every
distance NaN, e.g. NaN coordinates) gets distance NaN and index -1; a query against an empty
cloud gets distance +inf and index -1. Indices are always in [0, M) or -1.

Search algorithm (``algorithm=``, keyword-only, every search function here and in
:mod:`pointops.neighbors` / :mod:`pointops.chamfer_loss`): ``"brute"`` compares every query with every
reference point; ``"grid"`` (D = 2 and 3 only; other D is refused) buckets the reference cloud into
a uniform grid of occupied cells and searches outward from each query's cell, skipping cells that
are provably farther than the neighbours found. Both return **bit for bit the same** distances and
indices (same distance arithmetic, ties to the smaller index, NaN/Inf handled alike), so gradients
are identical too. ``"auto"`` (default) takes the grid for D = 2, 3 when a cost model of the sizes
says it pays (on the CPU from about N = M = 500 for one neighbour; a handful of queries against a
small cloud stays brute force; on 2 CPU cores a 200k x 200k ``chamfer`` takes ~0.2 s on the grid,
~30 s by brute force). On the CPU the built grid is then probed with a sample of the queries, and
a call whose queries are far from the references (a blob inside a target surface: 2-10x slower
on the grid) goes to brute force instead. On CUDA the sizes come first: M >= 8192 and
B N >= 4096, and B N M >= 1e9 for one neighbour or >= 5e8 for knn with 2 <= K <= 16; one neighbour
(this module's searches, ``chamfer_distance``) also needs M >= 65536 references per cloud, because
queries far from every reference (a generator's output early in training) cost the grid far more
than brute force: measured 0.6x at 128 x 8192^2 for predictions 0.1 off their surfaces. Past those
sizes, the grid is probed on the device with a sample of each cloud's queries (one neighbour, and
knn with K <= 16), and clouds whose queries are far from their references go to brute force, in
the same call and without a host sync (two H200s: a blob inside a sphere 0.91x brute force's speed
at 65536 points, against 0.08x on the grid). K > 16
stays brute force; ``ball_query`` takes the grid for D = 3, K <= 128, M >= 16384, B N >= 65536
(``"grid"`` / ``"brute"`` force either). On an H100 a 1M x 1M ``chamfer`` takes 1.6 ms on the
grid, 574 ms by brute force.
The CUDA grid is built on the device without a host sync; its memory is ~70-100 bytes per
reference point and 24 per query (float32), plus the radix sort's scratch. On the CPU the grid's memory is
O(points) per call, freed on return, however large or sparse the extent: about 50 bytes per
reference point (up to ~110 where cells hold a single point) and 36 per query (float32, D = 3). A cloud whose points crowd into a few cells
(one tight cluster plus far outliers) makes the grid about as slow as brute force.

Gradients flow to ``x`` and ``y`` (not through the indices); for ``norm=1`` the derivative of
``|x - y|`` is ``sign(x - y)``, 0 where a coordinate difference is exactly 0.

Double backward works (gradient penalties, meta-learning): with the indices fixed the gradient
2 (x - y[idx]) (or sign(x - y[idx])) is differentiable in x, y and the incoming gradient.

The Chamfer *loss*, ``chamfer_distance`` / ``ChamferLoss``, lives in :mod:`pointops.chamfer_loss`. On CUDA the gradient of the
reference cloud is scattered with float atomics unless
``torch.use_deterministic_algorithms(True)`` is set, in which case a sort-based path makes it
bitwise repeatable.
"""
import numbers
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ._entry import eager_entry
from ._transforms import _functorch_active

__all__ = ["nearest_neighbor", "chamfer", "ChamferFunction", "fscore"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ---------------------------------------------------------------- fake kernels (torch.compile)
def _check_shapes(x: Tensor, y: Tensor) -> None:
    """The shape/dtype/device checks of check_nearest_neighbor_inputs, for fake tensors."""
    torch._check(x.dim() == 3, lambda: f"x must be a 3-D tensor (B, N, D), got shape {tuple(x.shape)}")
    torch._check(y.dim() == 3, lambda: f"y must be a 3-D tensor (B, M, D), got shape {tuple(y.shape)}")
    torch._check(x.dtype in _FLOAT_DTYPES, lambda: f"x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    torch._check(y.dtype == x.dtype, lambda: f"y must have the same dtype as x ({x.dtype}), got {y.dtype}")
    torch._check(x.device == y.device, lambda: f"y must be on the same device as x ({x.device}), got {y.device}")
    torch._check(x.shape[0] == y.shape[0], lambda: "x and y must have the same batch size B")
    torch._check(x.shape[2] == y.shape[2], lambda: "x and y must have the same point dimension D")


_ALGORITHMS = ("auto", "brute", "grid")


def _check_algorithm(algorithm: str, dim) -> None:
    """The C++ parse_search_algorithm / grid_supports_dim checks, for fake tensors."""
    torch._check(algorithm in _ALGORITHMS,
                 lambda: f"algorithm must be 'auto', 'brute' or 'grid', got '{algorithm}'")
    torch._check(algorithm != "grid" or dim in (2, 3),
                 lambda: f"algorithm='grid' needs points of dimension 2 or 3, got D = {dim}")


@torch.library.register_fake("pointops::nearest_neighbor")
def _nearest_neighbor_fake(x, y, x_lengths=None, y_lengths=None, norm=2, algorithm="auto"):
    _check_shapes(x, y)
    _check_algorithm(algorithm, x.shape[2])
    B, N = x.shape[0], x.shape[1]
    return x.new_empty(B, N), x.new_empty(B, N, dtype=torch.int64)


@torch.library.register_fake("pointops::chamfer")
def _chamfer_fake(x, y, x_lengths=None, y_lengths=None, norm=2, algorithm="auto"):
    _check_shapes(x, y)
    _check_algorithm(algorithm, x.shape[2])
    B, N, M = x.shape[0], x.shape[1], y.shape[1]
    return (x.new_empty(B, N), y.new_empty(B, M),
            x.new_empty(B, N, dtype=torch.int64), y.new_empty(B, M, dtype=torch.int64))


@torch.library.register_fake("pointops::_nearest_neighbor_backward")
def _nearest_neighbor_backward_fake(grad_dist, x, y, idx, norm=2):
    _check_shapes(x, y)
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        y, memory_format=torch.contiguous_format)


# chamfer_distance's fused pieces (csrc/chamfer/chamfer_loss*.{cpp,cu}), called by its C++ node.
@torch.library.register_fake("pointops::_chamfer_distance_loss")
def _chamfer_distance_loss_fake(dist1, dist2, x_lengths, y_lengths, weights, num_y, point_reduction,
                                batch_reduction, squared):
    torch._check(dist1.dim() == 2, lambda: f"_chamfer_distance_loss: dist1 must be (B, N), got {tuple(dist1.shape)}")
    return dist1.new_empty(()) if batch_reduction is not None else dist1.new_empty(dist1.shape[0])


@torch.library.register_fake("pointops::_chamfer_distance_backward")
def _chamfer_distance_backward_fake(grad, x, y, dist1, idx1, dist2, idx2, x_lengths, y_lengths, weights,
                                    point_reduction, batch_reduction, norm, squared):
    _check_shapes(x, y)
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(
        y, memory_format=torch.contiguous_format)


# ---------------------------------------------------------------- autograd
# nearest_neighbor and chamfer are differentiable in C++ (csrc/chamfer/chamfer_autograd.cpp): a
# Python autograd wrapper would cost more host time than the GPU forward of a typical batch.
def _chamfer_grads(x, y, idx1, idx2, grad_dist1, grad_dist2):
    # dist1 = |x - y[idx1]|^2 feeds x directly and y through the match; dist2 the other way round.
    grad_x1, grad_y1 = _NEAREST_NEIGHBOR_BACKWARD(grad_dist1.contiguous(), x, y, idx1)
    grad_y2, grad_x2 = _NEAREST_NEIGHBOR_BACKWARD(grad_dist2.contiguous(), y, x, idx2)
    return grad_x1 + grad_x2, grad_y1 + grad_y2


# ---------------------------------------------------------------- public API
def _require_tensors(**arguments) -> None:
    """A non-tensor (None, a list) would reach the dispatcher, which cannot even pick a device."""
    for name, value in arguments.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def nearest_neighbor(x: Tensor, y: Tensor, x_lengths: Optional[Tensor] = None,
                     y_lengths: Optional[Tensor] = None, *, norm: int = 2,
                     algorithm: str = "auto") -> Tuple[Tensor, Tensor]:
    """For every point of ``x`` its nearest point in ``y``.

    Args:
        x: (B, N, D) query clouds. y: (B, M, D) reference clouds, same dtype and device.
        x_lengths, y_lengths: optional (B,) int64 numbers of valid points per cloud.
        norm: 2: squared Euclidean distance (default); 1: L1 distance. Any other value is an error.
        algorithm: ``"auto"`` (default), ``"brute"`` or ``"grid"`` (D = 2, 3): the search; every
            choice returns the same result bit for bit (see the module docstring).

    Returns:
        ``(dist, idx)``: ``dist`` (B, N) distance (squared for norm=2), dtype of x; ``idx`` (B, N)
        int64 index into y (smallest on ties; -1 for padding, an empty y, or no comparable
        neighbour). Differentiable in x and y.

    Example:
        >>> dist, idx = pointops.nearest_neighbor(torch.rand(2, 100, 3), torch.rand(2, 80, 3))
    """
    if not (isinstance(x, Tensor) and isinstance(y, Tensor)):
        _require_tensors(x=x, y=y)
    if x_lengths is None and y_lengths is None and norm == 2 and algorithm == "auto":  # each argument costs host time
        return _NEAREST_NEIGHBOR(x, y)
    return _NEAREST_NEIGHBOR(x, y, x_lengths, y_lengths, norm, algorithm)


class ChamferOutput(NamedTuple):
    dist1: Tensor
    dist2: Tensor
    idx1: Tensor
    idx2: Tensor


# The public functions' host time is most of a small call: the op overloads are looked up once and
# called through their C++ entries (pointops/_entry.py), and the result tuple is built without
# NamedTuple's Python-level __new__.
_NEAREST_NEIGHBOR = eager_entry(torch.ops.pointops.nearest_neighbor.default)
_CHAMFER = eager_entry(torch.ops.pointops.chamfer.default)
_NEAREST_NEIGHBOR_BACKWARD = eager_entry(torch.ops.pointops._nearest_neighbor_backward.default)
_new_chamfer_output = tuple.__new__


def chamfer(x: Tensor, y: Tensor, x_lengths: Optional[Tensor] = None,
            y_lengths: Optional[Tensor] = None, *, norm: int = 2, algorithm: str = "auto") -> ChamferOutput:
    """Both directions at once: ``dist1, dist2, idx1, idx2`` (the ``chamfer_3DDist`` contract).

    ``dist1`` (B, N) / ``idx1`` (B, N): for each point of x, its nearest point of y;
    ``dist2`` (B, M) / ``idx2`` (B, M): for each point of y, its nearest point of x.
    Squared distances (L1 with ``norm=1``); semantics and ``algorithm`` as :func:`nearest_neighbor`
    ("auto" decides each direction on its own sizes). Differentiable in x and y.
    """
    if not (isinstance(x, Tensor) and isinstance(y, Tensor)):
        _require_tensors(x=x, y=y)
    if x_lengths is None and y_lengths is None and norm == 2 and algorithm == "auto":  # each argument costs host time
        return _new_chamfer_output(ChamferOutput, _CHAMFER(x, y))
    return _new_chamfer_output(ChamferOutput, _CHAMFER(x, y, x_lengths, y_lengths, norm, algorithm))


class ChamferFunction(torch.autograd.Function):
    """Drop-in for ChamferDistancePytorch's ``chamfer_3DFunction``:
    ``dist1, dist2, idx1, idx2 = ChamferFunction.apply(x, y)`` (indices are int64 here).
    Same kernels and gradients as :func:`chamfer`; an optional third argument is its ``algorithm``
    (``ChamferFunction.apply(x, y, "grid")``). Serves every way PyTorch differentiates: a backward
    (itself differentiable), a ``jvp`` for forward mode, and a vmap rule that folds the vmapped
    dimension into the clouds' batch."""

    generate_vmap_rule = True  # forward, backward and jvp call ops with batching rules of their own

    @staticmethod
    def forward(x, y, algorithm="auto"):
        _require_tensors(x=x, y=y)
        return _CHAMFER(x, y, None, None, 2, algorithm)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y = inputs[0], inputs[1]
        _, _, idx1, idx2 = output
        ctx.save_for_backward(x, y, idx1, idx2)
        ctx.save_for_forward(x, y, idx1, idx2)
        ctx.mark_non_differentiable(idx1, idx2)

    @staticmethod
    def backward(ctx, grad_dist1, grad_dist2, grad_idx1, grad_idx2):
        x, y, idx1, idx2 = ctx.saved_tensors
        return (*_chamfer_grads(x, y, idx1, idx2, grad_dist1, grad_dist2), None)

    @staticmethod
    def jvp(ctx, tangent_x, tangent_y, _tangent_algorithm=None):
        x, y, idx1, idx2 = ctx.saved_tensors
        tangent_x = torch.zeros_like(x) if tangent_x is None else tangent_x
        tangent_y = torch.zeros_like(y) if tangent_y is None else tangent_y
        return (_distance_tangent(x, y, idx1, tangent_x, tangent_y),
                _distance_tangent(y, x, idx2, tangent_y, tangent_x), None, None)


def _distance_tangent(q, r, idx, tangent_q, tangent_r):
    """The tangent of |q - r[idx]|^2 with the indices fixed (0 where idx is -1)."""
    if r.shape[1] == 0:
        return q.new_zeros(idx.shape)
    index = idx.clamp(min=0).unsqueeze(-1).expand(-1, -1, q.shape[-1])
    diff = q - r.gather(1, index)
    d_diff = tangent_q - tangent_r.gather(1, index)
    return torch.where(idx >= 0, (2 * diff * d_diff).sum(-1), 0.0)


def _valid_mask(lengths: Tensor, n: int) -> Tensor:
    """(B, n) True where a point index is below its cloud's length (not padding)."""
    return torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]


def _checking_values() -> bool:
    """Checks that read tensor values cost a host sync and break a torch.compile graph, and vmap
    cannot batch them: eager only, outside torch.func transforms (the kernels still check lengths)."""
    return not (torch.compiler.is_compiling() or _functorch_active())


def _check_fscore_dist(dist, name: str, layout: str) -> None:
    if not isinstance(dist, Tensor):
        raise TypeError(f"fscore: {name} must be a tensor {layout}, got {type(dist).__name__}")
    if dist.dim() != 2:
        raise ValueError(f"fscore: {name} must be a 2-D tensor {layout}, got shape {tuple(dist.shape)}")
    if not dist.dtype.is_floating_point:
        raise TypeError(f"fscore: {name} must be a floating-point tensor of squared distances, got {dist.dtype}")


def _check_fscore_threshold(threshold) -> None:
    # bool is an int subclass, but threshold=True is a mistake, not 1.0. A tensor is refused: checking
    # its value would cost a host sync on every call.
    if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
        raise TypeError(f"fscore: threshold must be a real number (a squared distance), got "
                        f"{type(threshold).__name__} {threshold!r}")
    if not threshold >= 0:  # written so that NaN fails it too
        raise ValueError(f"fscore: threshold must be a non-negative squared distance, got {threshold}")


def _check_fscore_lengths(lengths, name: str, dist: Tensor, dist_name: str) -> None:
    if lengths is None:
        return
    if not isinstance(lengths, Tensor):
        raise TypeError(f"fscore: {name} must be a tensor (B,) or None, got {type(lengths).__name__}")
    if lengths.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"fscore: {name} must be an int64 (or int32) tensor, got {lengths.dtype}")
    B, N = dist.shape
    if lengths.shape != (B,):
        raise ValueError(f"fscore: {name} must have shape (B,) = ({B},) to match {dist_name}, "
                         f"got shape {tuple(lengths.shape)}")
    if lengths.device != dist.device:
        raise ValueError(f"fscore: {name} must be on the same device as {dist_name} ({dist.device}), "
                         f"got {lengths.device}")
    if lengths.numel() > 0 and _checking_values():
        lo, hi = (int(v) for v in torch.aminmax(lengths))
        if lo < 0 or hi > N:
            raise ValueError(f"fscore: {name} must lie in [0, {N}] (the points per cloud of {dist_name}), "
                             f"got values in [{lo}, {hi}]")


def fscore(dist1: Tensor, dist2: Tensor, threshold: float = 1e-3, x_lengths: Optional[Tensor] = None,
           y_lengths: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """F-score at ``threshold`` from the two Chamfer directions (as ChamferDistancePytorch's).

    ``dist1`` (B, N), ``dist2`` (B, M) are *squared* distances as returned by :func:`chamfer`;
    a point counts as matched when its squared distance is below ``threshold``.
    Returns ``(fscore, precision, recall)``, each (B,) float32: precision = fraction of x matched,
    recall = fraction of y matched, fscore = 2pr / (p + r), 0 where p + r = 0 or a cloud is empty.
    Padded points (beyond ``*_lengths``) are not counted; NaN distances never count as matched.

    Raises:
        TypeError: a non-tensor or non-floating ``dist1`` / ``dist2``, a ``threshold`` that is not
            a real number, ``*_lengths`` that are not int64 / int32 tensors.
        ValueError: ``dist1`` / ``dist2`` not 2-D or with different batch sizes or devices, a
            negative or NaN ``threshold``, ``*_lengths`` not of shape (B,), on another device, or
            (eager only: it reads the values, one host sync) outside [0, N].
    """
    _check_fscore_dist(dist1, "dist1", "(B, N)")
    _check_fscore_dist(dist2, "dist2", "(B, M)")
    if dist2.shape[0] != dist1.shape[0]:
        raise ValueError(f"fscore: dist1 and dist2 must have the same batch size B, got dist1 "
                         f"{tuple(dist1.shape)} and dist2 {tuple(dist2.shape)}")
    if dist2.device != dist1.device:
        raise ValueError(f"fscore: dist2 must be on the same device as dist1 ({dist1.device}), got {dist2.device}")
    _check_fscore_threshold(threshold)
    _check_fscore_lengths(x_lengths, "x_lengths", dist1, "dist1")
    _check_fscore_lengths(y_lengths, "y_lengths", dist2, "dist2")

    def fraction(dist, lengths):
        N = dist.shape[1]
        if lengths is None:  # every point counts: no mask; the same count and division as below
            count = torch.full((dist.shape[0],), float(max(N, 1)), dtype=torch.float32, device=dist.device)
            return (dist < threshold).sum(1).to(torch.float32) / count
        hits = ((dist < threshold) & _valid_mask(lengths, N)).sum(1).to(torch.float32)
        return hits / lengths.clamp(min=1).to(torch.float32)

    precision = fraction(dist1, x_lengths)
    recall = fraction(dist2, y_lengths)
    denom = precision + recall
    # 0 where p + r = 0 (the division's 0/0 there is not selected)
    f = torch.where(denom > 0, 2 * precision * recall / denom, 0.0)
    return f, precision, recall
