"""``chamfer_distance`` and ``ChamferLoss``: the Chamfer loss, a drop-in for
``pytorch3d.loss.chamfer_distance`` built on the :func:`pointops.nearest_neighbor` kernels.

The contract is PyTorch3D's (its docstring and source are the reference): the same arguments in the
same order, the ``(loss, loss_normals)`` result, the same shapes, the same ``ValueError``
conditions. Weights that sum to zero follow PyTorch3D's rule exactly (see :func:`chamfer_distance`).
Where PyTorch3D has no defined answer (an empty batch, ``point_reduction="max"`` over empty clouds)
pointops gives zeros that keep a gradient path.

The common call (no normals, ``point_reduction`` "mean" or "sum") is one op,
``torch.ops.pointops._chamfer_distance``, with one autograd node: the masks and reductions that
would each cost a Python call, an autograd node and a kernel launch are fused behind it.
"""
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ._entry import eager_entry
from .chamfer import _checking_values, _valid_mask, chamfer, nearest_neighbor

__all__ = ["chamfer_distance", "ChamferLoss"]

_POINT_REDUCTIONS = ("mean", "sum", "max")
_BATCH_REDUCTIONS = ("mean", "sum")
_FUSED_POINT_REDUCTIONS = ("mean", "sum")  # the reductions of the fused op (csrc/chamfer/chamfer_loss.cpp)
_CHAMFER_DISTANCE = eager_entry(torch.ops.pointops._chamfer_distance.default)  # pointops/_entry.py


# ---------------------------------------------------------------- argument checks (PyTorch3D's)
# Value checks (length bounds, negative weights) use chamfer._checking_values: skipped under
# torch.compile, where the kernels still refuse a length outside [0, P] (RuntimeError).
def _validate_reductions(batch_reduction, point_reduction) -> None:
    if batch_reduction is not None and batch_reduction not in _BATCH_REDUCTIONS:
        raise ValueError(f'batch_reduction must be one of ["mean", "sum"] or None, got {batch_reduction!r}')
    if point_reduction is not None and point_reduction not in _POINT_REDUCTIONS:
        raise ValueError(f'point_reduction must be one of ["mean", "sum", "max"] or None, got {point_reduction!r}')
    if point_reduction is None and batch_reduction is not None:
        raise ValueError(f"Batch reduction must be None if point_reduction is None, got batch_reduction="
                         f"{batch_reduction!r}")


def _validate_norm(norm, squared) -> None:
    if isinstance(norm, bool) or norm not in (1, 2):  # True == 1 in Python; a flag is not a norm
        raise ValueError(f"Support for 1 or 2 norm, got norm={norm!r}")
    if not squared and norm != 2:
        raise ValueError(f"squared=False applies to norm=2 only (norm=1 distances are not squared), got norm={norm}")


def _is_pointclouds(obj) -> bool:
    """Duck-typed PyTorch3D ``Pointclouds`` (no dependency on PyTorch3D)."""
    return all(callable(getattr(obj, name, None)) for name in
               ("points_padded", "num_points_per_cloud", "normals_padded"))


def _unpack_cloud(points, lengths: Optional[Tensor], normals: Optional[Tensor], name: str):
    """(padded points, lengths or None, normals or None), as PyTorch3D's _handle_pointcloud_input.
    A ``Pointclouds`` object supplies its own lengths and normals (the arguments are ignored, as in
    PyTorch3D). ``lengths`` None means every cloud is full: the kernels then need no lengths."""
    if not torch.is_tensor(points):
        if _is_pointclouds(points):
            return points.points_padded(), points.num_points_per_cloud(), points.normals_padded()
        raise ValueError("The input pointclouds should be either Pointclouds objects or torch.Tensor of shape "
                         f"(minibatch, num_points, 3); {name} is a {type(points).__name__}")
    if points.ndim != 3:
        raise ValueError(f"Expected points to be of shape (N, P, D); {name} has shape {tuple(points.shape)}")
    if lengths is not None:
        if not torch.is_tensor(lengths) or lengths.ndim != 1 or lengths.shape[0] != points.shape[0]:
            got = tuple(lengths.shape) if torch.is_tensor(lengths) else type(lengths).__name__
            raise ValueError(f"Expected lengths to be of shape (N,) = ({points.shape[0]},); {name}_lengths is {got}")
        if lengths.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"Expected lengths to be an int64 (or int32) tensor; {name}_lengths is {lengths.dtype}")
    if normals is not None and (not torch.is_tensor(normals) or normals.shape != points.shape):
        got = tuple(normals.shape) if torch.is_tensor(normals) else type(normals).__name__
        raise ValueError(f"Expected normals to be of shape (N, P, 3) like the points; {name}_normals is {got}, "
                         f"{name} is {tuple(points.shape)}")
    if normals is not None and not normals.is_floating_point():
        raise ValueError(f"Expected normals to be a floating-point tensor; {name}_normals is {normals.dtype}")
    return points, lengths, normals


def _check_length_values(clouds) -> None:
    """Every length in [0, P]: one host sync for both clouds' lengths (the kernels check again, in
    C++, and raise RuntimeError; PyTorch3D's callers expect ValueError)."""
    given = [(name, points, lengths) for name, points, lengths in clouds if lengths is not None and lengths.numel() > 0]
    if not given or not _checking_values():
        return
    bounds = torch.stack([torch.stack(torch.aminmax(lengths)).to(torch.int64) for _, _, lengths in given]).tolist()
    for (name, points, _), (lo, hi) in zip(given, bounds):
        if hi > points.shape[1]:
            raise ValueError(f"A length value was too long: {name}_lengths has {hi} but {name} has "
                             f"{points.shape[1]} points per cloud")
        if lo < 0:
            raise ValueError(f"A length value was negative: {name}_lengths has {lo}")


def _validate_weights(weights: Tensor, x: Tensor) -> bool:
    """PyTorch3D's weights checks; True when the weights sum to 0 (PyTorch3D's early return). The
    values are read with one host sync, in eager mode only."""
    if not torch.is_tensor(weights) or weights.shape != (x.shape[0],):
        got = tuple(weights.shape) if torch.is_tensor(weights) else type(weights).__name__
        raise ValueError(f"weights must be of shape (N,) = ({x.shape[0]},), got {got}")
    if not weights.is_floating_point():
        raise ValueError(f"weights must be a floating-point tensor, got {weights.dtype}")
    if not _checking_values():
        return False
    if weights.numel() == 0:
        return True  # PyTorch3D: an empty sum is 0
    low, total = torch.stack([weights.detach().min(), weights.detach().sum()]).tolist()
    if low < 0:
        raise ValueError(f"weights cannot be negative, got a minimum of {low}")
    return total == 0


def _zero_weights_result(x: Tensor, y: Tensor, weights: Tensor, batch_reduction, point_reduction,
                         single_directional: bool):
    """PyTorch3D's answer for weights that sum to 0 (pytorch3d/loss/chamfer.py returns it before the
    search): per direction ``(p.sum((1, 2)) * weights.view(N, 1)) * 0`` from the direction's own
    points p -- summed to a scalar with a batch reduction, else of shape (N, N) -- for the loss and,
    as a separate tensor, for loss_normals, with or without normals. The directions combine as the
    loss does (a pair when point_reduction is None). Only each cloud's first coordinate enters the
    sum here: the same zeros, shapes, dtypes and gradient path (zeros for every point and weight)
    at a cost that does not grow with the clouds; a NaN elsewhere in the points does not turn them
    into NaN as PyTorch3D's full sum would."""
    w = weights.view(-1, 1)

    def zero(points):
        z = points[:, :1, :1].sum((1, 2)) * w
        return z.sum() * 0.0 if batch_reduction is not None else z * 0.0

    if single_directional:
        return zero(x), zero(x)
    if point_reduction is None:
        return (zero(x), zero(y)), (zero(x), zero(y))
    return zero(x) + zero(y), zero(x) + zero(y)


# ---------------------------------------------------------------- per-point terms
def _partner_empty(partner_lengths: Optional[Tensor], partner_size: int, batch: int, device) -> Optional[Tensor]:
    """(B, 1) True where the searched cloud has no points; None when no cloud can be empty."""
    if partner_lengths is not None:
        return (partner_lengths == 0)[:, None]
    if partner_size == 0:
        return torch.ones(batch, 1, dtype=torch.bool, device=device)
    return None


def _sqrt_zero_grad_at_zero(d: Tensor) -> Tensor:
    # sqrt'(0) is infinite; a point sitting exactly on its neighbour gets gradient 0 instead of NaN.
    positive = d > 0
    return torch.where(positive, torch.where(positive, d, torch.ones_like(d)).sqrt(), d)


def _normal_term(normals: Tensor, partner_normals: Tensor, idx: Tensor, abs_cosine: bool) -> Tensor:
    """1 - cos (or 1 - |cos|) between each point's normal and its nearest neighbour's, (B, N).
    Points with no neighbour (idx -1) get NaN here; the caller zeroes padding and empty partners,
    so what stays NaN is a point whose distances were all NaN: never a made-up number."""
    B, N, D = normals.shape
    if partner_normals.shape[1] > 0:
        near = partner_normals.gather(1, idx.clamp(min=0)[..., None].expand(B, N, D))
    else:
        near = normals.new_zeros(B, N, D)
    cos = F.cosine_similarity(normals, near, dim=2, eps=1e-6)  # PyTorch3D's eps: same values
    term = 1 - (cos.abs() if abs_cosine else cos)
    return torch.where(idx >= 0, term, torch.full_like(term, float("nan")))


def _direction_terms(dist: Tensor, idx: Tensor, lengths: Optional[Tensor], partner_lengths: Optional[Tensor],
                     partner_size: int, normals: Optional[Tensor], partner_normals: Optional[Tensor],
                     weights: Optional[Tensor], squared: bool, abs_cosine: bool):
    """Per-point distance and normal terms of one direction, (B, N): padding and points whose
    partner cloud is empty contribute 0, then each cloud's terms are scaled by its weight."""
    B, N = dist.shape
    empty = _partner_empty(partner_lengths, partner_size, B, dist.device)
    if empty is not None:  # the kernel's +inf (distance to an empty set) becomes PyTorch3D's 0
        dist = dist.masked_fill(empty, 0.0)
    if not squared:
        dist = _sqrt_zero_grad_at_zero(dist)
    normal = None
    if normals is not None and partner_normals is not None:
        normal = _normal_term(normals, partner_normals, idx, abs_cosine)
        if lengths is not None:
            normal = normal.masked_fill(~_valid_mask(lengths, N), 0.0)
        if empty is not None:
            normal = normal.masked_fill(empty, 0.0)
    if weights is not None:
        w = weights[:, None].to(dist.dtype)
        dist = dist * w
        normal = None if normal is None else normal * w
    return dist, normal


def _reduce_points(terms: Tensor, lengths: Optional[Tensor], reduction: str) -> Tensor:
    """(B, N) -> (B,). Padded terms are 0 and distances are >= 0, so "max" over the padded row is
    the max over the valid points (0 for an empty cloud). An empty mean is 0, never 0/0."""
    if reduction == "max":
        return terms.amax(1) if terms.shape[1] > 0 else terms.sum(1)
    if reduction == "mean" and lengths is not None:
        return terms.sum(1) / lengths.clamp(min=1).to(terms.dtype)
    if reduction == "mean" and terms.shape[1] > 0:
        return terms.mean(1)  # one op: host time matters at small sizes
    return terms.sum(1)  # "sum", or the mean of an empty row: 0


def _reduce_batch(loss: Tensor, weights: Optional[Tensor], reduction: Optional[str]) -> Tensor:
    if reduction is None:
        return loss
    if reduction == "mean" and weights is not None:
        weight_sum = weights.sum().to(loss.dtype)
        # All-zero weights: every term is already 0; dividing by 1 keeps the zero and its gradient path.
        return loss.sum() / torch.where(weight_sum > 0, weight_sum, torch.ones_like(weight_sum))
    if reduction == "mean" and loss.shape[0] > 0:
        return loss.mean()
    return loss.sum()  # "sum", or the mean of an empty batch: 0


# ---------------------------------------------------------------- public API
def chamfer_distance(x, y, x_lengths: Optional[Tensor] = None, y_lengths: Optional[Tensor] = None,
                     x_normals: Optional[Tensor] = None, y_normals: Optional[Tensor] = None,
                     weights: Optional[Tensor] = None, batch_reduction: Optional[str] = "mean",
                     point_reduction: Optional[str] = "mean", norm: int = 2, single_directional: bool = False,
                     abs_cosine: bool = True, *, squared: bool = True, algorithm: str = "auto"):
    """Chamfer distance between two batches of point clouds: ``pytorch3d.loss.chamfer_distance``'s
    contract, on pointops' kernels (CPU and CUDA, exact distances, deterministic option).

    loss_b = reduce_i d(x_i, NN_y(x_i)) + reduce_j d(y_j, NN_x(y_j))   (the first term only if
    ``single_directional``); with ``point_reduction="max"`` the two directions combine as
    ``maximum(max_x, max_y)``: the (squared) Hausdorff distance.

    Args:
        x: (N, P1, D) tensor, or an object with PyTorch3D's ``Pointclouds`` methods
            (``points_padded()``, ``num_points_per_cloud()``, ``normals_padded()``), which then also
            supplies the lengths and normals.
        y: (N, P2, D) tensor or ``Pointclouds``-like object; same dtype and device as x.
        x_lengths, y_lengths: optional (N,) int64 numbers of valid points per cloud; points past a
            cloud's length are padding and contribute nothing.
        x_normals, y_normals: optional (N, P1, D) / (N, P2, D) normals. With both given,
            ``loss_normals`` is the reduced ``1 - |cos|`` (``1 - cos`` if not ``abs_cosine``)
            between each point's normal and the normal of its nearest neighbour (gathered by the
            same index the distance uses); gradients reach the normals (not through the index).
        weights: optional (N,) non-negative per-cloud weights: each cloud's terms are scaled by its
            weight, and ``batch_reduction="mean"`` divides by the weights' sum. Weights that sum to
            0 give PyTorch3D's answer: ``loss`` and ``loss_normals`` are both zeros computed from
            the points and weights (PyTorch3D's ``(p.sum((1, 2)) * weights.view(N, 1)) * 0`` per
            direction, with only the clouds' first coordinates summed), so they
            require grad when the points do, even without normals; shape () with a batch
            reduction, (N, N) (PyTorch3D's broadcast) without one; a pair of them when
            ``point_reduction`` is None. Checking the weights' values costs one host sync (eager
            only: under torch.compile neither the sign check nor this rule applies).
        batch_reduction: "mean", "sum" or None (a (N,) result).
        point_reduction: "mean" (over each cloud's valid points), "sum", "max", or None (the
            per-point terms; batch_reduction must then be None).
        norm: 2: squared Euclidean distances; 1: L1 distances sum |x - y| (in the search too).
        single_directional: only the x -> y term.
        abs_cosine: ``1 - |cos|`` (normals' orientation ignored) rather than ``1 - cos``.
        squared: pointops only, keyword-only: with ``norm=2``, False uses Euclidean (not squared)
            distances (gradient 0 where a point sits exactly on its neighbour).
        algorithm: pointops only, keyword-only: the nearest-neighbour search, ``"auto"`` (default),
            ``"brute"`` or ``"grid"`` (D = 2, 3; see :mod:`pointops.chamfer`). Every choice gives the
            same loss and the same gradients bit for bit.

    Returns:
        ``(loss, loss_normals)``. ``loss`` is a scalar (``batch_reduction`` "mean"/"sum") or (N,).
        With ``point_reduction=None``: ``loss`` is the pair of per-point terms ``((N, P1), (N, P2))``,
        or one (N, P1) tensor if ``single_directional``; padded points hold 0.
        ``loss_normals`` has the same structure, or is None without both normals (all-zero
        weights: see ``weights``).

    Host syncs and CUDA graphs: with no lengths and no weights nothing here reads a tensor's values
    on the host, so the call (forward and backward) can be captured in a CUDA graph. Lengths cost
    one sync (their bounds are checked, in Python for PyTorch3D's ValueError and in the kernels'
    launcher), weights one (their sign and PyTorch3D's all-zero rule): neither can be captured.

    Empty clouds, as in PyTorch3D: a direction whose searched cloud is empty contributes 0 (and so
    does an empty cloud's own direction: an empty mean is 0, never 0/0). ``nearest_neighbor`` keeps
    the honest answer at its level: distance +inf and index -1.

    Raises:
        ValueError: PyTorch3D's conditions: an input of the wrong rank or type, lengths of the wrong
            shape or with a value larger than the cloud (or negative), y's batch or point dimension
            unlike x's, normals unlike their points, unknown reductions, ``norm`` other than 1 or 2,
            normals with ``point_reduction="max"``, weights of the wrong shape or negative, and
            (pointops) ``squared=False`` with ``norm=1``. Dtype and device mismatches (lengths on
            another device included, as PyTorch3D's own tensor ops refuse them) are refused by the
            kernels (RuntimeError). Under torch.compile the checks that read tensor values
            (length bounds, negative weights) are skipped; the kernels still refuse bad lengths.

    Example:
        >>> loss, _ = pointops.chamfer_distance(x, y)                       # PyTorch3D's call
        >>> loss, loss_normals = pointops.chamfer_distance(x, y, x_normals=nx, y_normals=ny)
        >>> hausdorff, _ = pointops.chamfer_distance(x, y, point_reduction="max")
    """
    # The common call (two padded tensors, nothing optional): the checks of the general path below,
    # inline; on small clouds its function calls cost half as much as the op itself.
    if (x_lengths is None and y_lengths is None and x_normals is None and y_normals is None and weights is None
            and (point_reduction == "mean" or point_reduction == "sum")
            and (batch_reduction == "mean" or batch_reduction is None or batch_reduction == "sum")
            and type(norm) is int and (norm == 2 or (norm == 1 and squared))
            and isinstance(x, Tensor) and isinstance(y, Tensor) and x.ndim == 3 and y.ndim == 3
            and x.shape[0] == y.shape[0] and x.shape[2] == y.shape[2]):
        return _CHAMFER_DISTANCE(x, y, None, None, None, point_reduction, batch_reduction, norm, single_directional,
                                 squared, algorithm), None
    _validate_reductions(batch_reduction, point_reduction)
    _validate_norm(norm, squared)
    if point_reduction == "max" and (x_normals is not None or y_normals is not None):
        raise ValueError('Normals must be None if point_reduction is "max"')
    x, x_lengths, x_normals = _unpack_cloud(x, x_lengths, x_normals, "x")
    y, y_lengths, y_normals = _unpack_cloud(y, y_lengths, y_normals, "y")
    if point_reduction == "max" and x_normals is not None and y_normals is not None:
        raise ValueError('Normals must be None if point_reduction is "max" (the point clouds carry normals)')
    _check_length_values([("x", x, x_lengths), ("y", y, y_lengths)])
    N, P1, D = x.shape
    if y.shape[0] != N or y.shape[2] != D:
        raise ValueError(f"y does not have the correct shape: x is {tuple(x.shape)}, so y must be "
                         f"({N}, P2, {D}), got {tuple(y.shape)}")
    if weights is not None and _validate_weights(weights, x):
        return _zero_weights_result(x, y, weights, batch_reduction, point_reduction, single_directional)
    if (point_reduction in _FUSED_POINT_REDUCTIONS and (x_normals is None or y_normals is None)
            and (weights is None or not weights.requires_grad)):
        return _CHAMFER_DISTANCE(x, y, x_lengths, y_lengths, weights, point_reduction, batch_reduction, norm,
                                 single_directional, squared, algorithm), None

    if single_directional:
        dist_x, idx_x = nearest_neighbor(x, y, x_lengths, y_lengths, norm=norm, algorithm=algorithm)
    else:
        dist_x, dist_y, idx_x, idx_y = chamfer(x, y, x_lengths, y_lengths, norm=norm, algorithm=algorithm)
    cham_x, normal_x = _direction_terms(dist_x, idx_x, x_lengths, y_lengths, y.shape[1], x_normals, y_normals,
                                        weights, squared, abs_cosine)
    if not single_directional:
        cham_y, normal_y = _direction_terms(dist_y, idx_y, y_lengths, x_lengths, P1, y_normals, x_normals,
                                            weights, squared, abs_cosine)

    if point_reduction is None:
        if single_directional:
            return cham_x, normal_x
        return (cham_x, cham_y), (None if normal_x is None else (normal_x, normal_y))

    loss = _reduce_points(cham_x, x_lengths, point_reduction)
    loss_normals = None if normal_x is None else _reduce_points(normal_x, x_lengths, point_reduction)
    if not single_directional:
        loss_y = _reduce_points(cham_y, y_lengths, point_reduction)
        if point_reduction == "max":
            loss = torch.maximum(loss, loss_y)
        else:
            loss = loss + loss_y
            if loss_normals is not None:
                loss_normals = loss_normals + _reduce_points(normal_y, y_lengths, point_reduction)
    loss = _reduce_batch(loss, weights, batch_reduction)
    if loss_normals is not None:
        loss_normals = _reduce_batch(loss_normals, weights, batch_reduction)
    return loss, loss_normals


class ChamferLoss(torch.nn.Module):
    """:func:`chamfer_distance` as a module, with the same (keyword) arguments and the same
    ``(loss, loss_normals)`` result::

        criterion = pointops.ChamferLoss(point_reduction="sum")
        loss, _ = criterion(x, y, x_lengths, y_lengths)
    """

    # Keyword-only: the order changed to PyTorch3D's (batch_reduction first), and a positional call
    # written for the old order must fail loudly rather than swap the two reductions.
    def __init__(self, *, batch_reduction: Optional[str] = "mean", point_reduction: Optional[str] = "mean",
                 norm: int = 2, single_directional: bool = False, abs_cosine: bool = True,
                 squared: bool = True, algorithm: str = "auto"):
        super().__init__()
        _validate_reductions(batch_reduction, point_reduction)
        _validate_norm(norm, squared)
        self.batch_reduction = batch_reduction
        self.point_reduction = point_reduction
        self.norm = norm
        self.single_directional = single_directional
        self.abs_cosine = abs_cosine
        self.squared = squared
        self.algorithm = algorithm

    def forward(self, x, y, x_lengths: Optional[Tensor] = None, y_lengths: Optional[Tensor] = None,
                x_normals: Optional[Tensor] = None, y_normals: Optional[Tensor] = None,
                weights: Optional[Tensor] = None) -> Tuple[Union[Tensor, tuple], Optional[Union[Tensor, tuple]]]:
        return chamfer_distance(x, y, x_lengths, y_lengths, x_normals, y_normals, weights,
                                batch_reduction=self.batch_reduction, point_reduction=self.point_reduction,
                                norm=self.norm, single_directional=self.single_directional,
                                abs_cosine=self.abs_cosine, squared=self.squared, algorithm=self.algorithm)

    def extra_repr(self) -> str:
        return (f"batch_reduction={self.batch_reduction!r}, point_reduction={self.point_reduction!r}, "
                f"norm={self.norm}, single_directional={self.single_directional}, "
                f"abs_cosine={self.abs_cosine}, squared={self.squared}, algorithm={self.algorithm!r}")
