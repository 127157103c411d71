"""Deterministic hash-table voxelization of point clouds (LiDAR scans), on the CPU and CUDA.

Contract shared by every function here (CPU and CUDA give identical outputs):

* Grid. ``point_range = (x_min, y_min, z_min, x_max, y_max, z_max)`` and ``voxel_size = (sx, sy, sz)``
  give ``round((max - min) / size)`` cells per axis. A point's cell is ``floor((p - min) / size)`` per
  axis, computed in float32 for float16 / bfloat16 / float32 points and in float64 for float64
  points. A point whose cell is outside ``[0, cells)`` on any axis (including the rounding edge at
  ``max``), or whose x, y or z is NaN or infinite, is *out of range*: it is in no voxel.
* Order. Voxels are numbered in order of their first point in the input. Each voxel keeps its first
  ``max_points_per_voxel`` points in input order. When there are more than ``max_voxels`` voxels the
  first ``max_voxels`` are kept (over the whole batch when ``batch`` is given).
* Features. ``features`` is the mean of a voxel's kept points: their values converted to
  ``opmath`` (float32 for float16/bfloat16, else the input dtype), summed in input order, divided by
  the count, rounded to the input dtype. Both backends do exactly this, so the results are bitwise equal.
* Batches. ``batch`` is an optional (N,) int64 tensor of per-point cloud indices (any order). Points of
  different clouds never share a voxel, and ``coords`` gains a leading batch column.
* ``point_to_voxel[i]`` is the voxel of point i, or -1 when the point is out of range or its voxel is
  beyond ``max_voxels``. A point left out only because its voxel was full keeps its voxel id (as in
  spconv), so ``(point_to_voxel >= 0).sum() - num_points.sum()`` counts the points dropped by the cap.

The number of voxels V depends on the data. ``voxelize`` and ``voxel_features`` learn it with one
device-to-host sync and return tensors of exactly V rows; under ``torch.compile`` V is an unbacked
symbolic size (``torch.library.get_ctx().new_dynamic_size()`` in the fake kernels), so
``fullgraph=True`` traces through it. ``voxelize(..., padded=True)`` returns ``max_voxels`` rows and
the count as a device tensor instead: no sync and static shapes (CUDA graphs).
"""
from __future__ import annotations

import math
import numbers
import operator
from typing import NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ._entry import eager_entry

__all__ = ["voxelize", "voxel_features", "Voxels", "VoxelFeatures", "Voxelizer"]

FloatSeq = Union[Sequence[float], Tensor]
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT64_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1


class Voxels(NamedTuple):
    """Result of :func:`voxelize`. V = number of voxels (``max_voxels`` when padded), P =
    ``max_points_per_voxel``, F = point columns, N = number of points.

    voxels:         (V, P, F) points dtype; the kept points of each voxel in input order, zero rows after.
    coords:         (V, 3) int32 (z, y, x) cell indices, or (V, 4) (b, z, y, x) with a batch; -1 on padding rows.
    num_points:     (V,) int32, kept points per voxel (<= P); 0 on padding rows.
    features:       (V, F) points dtype, the mean of the kept points; 0 on padding rows.
    point_to_voxel: (N,) int64, the voxel of each point or -1 (out of range, or voxel beyond max_voxels).
    num_voxels:     0-d int64 tensor on the points' device, the number of real rows (padded only, else None).
    """

    voxels: Tensor
    coords: Tensor
    num_points: Tensor
    features: Tensor
    point_to_voxel: Tensor
    num_voxels: Optional[Tensor] = None


# Looked up once and called through their C++ entries (pointops/_entry.py); results built without
# NamedTuple's Python-level __new__ (a small call's host time is mostly this layer).
_VOXELIZE = eager_entry(torch.ops.pointops.voxelize.default)
_VOXELIZE_PADDED = eager_entry(torch.ops.pointops.voxelize_padded.default)
_VOXEL_FEATURES = eager_entry(torch.ops.pointops.voxel_features.default)
_new_tuple = tuple.__new__


class VoxelFeatures(NamedTuple):
    """Result of :func:`voxel_features`: features (V, F) points dtype, coords (V, 3|4) int32,
    num_points (V,) int32 (every in-range point), point_to_voxel (N,) int64 (-1 out of range)."""

    features: Tensor
    coords: Tensor
    num_points: Tensor
    point_to_voxel: Tensor


def _floats(values: FloatSeq, name: str) -> list[float]:
    """The values of a voxel_size / point_range argument as Python floats. Only the types are
    checked here; the counts and values (finite, positive, min < max) are the C++ op's checks."""
    if (type(values) is tuple or type(values) is list) and all(type(v) is float for v in values):
        return values  # the common case, checked in one pass (this runs on every call)
    if isinstance(values, Tensor):
        if values.dim() != 1:
            raise ValueError(f"voxelize: {name} must be a sequence of floats or a 1-D tensor, got a tensor of shape "
                             f"{tuple(values.shape)}")
        if values.dtype.is_complex or values.dtype == torch.bool:
            raise TypeError(f"voxelize: {name} must hold real numbers, got a {values.dtype} tensor")
        values = values.detach().cpu().tolist()  # a sync when on a GPU; pass sequences in hot loops
    # A string is iterable, but "0.2" or "abc" is a mistake, not a sequence of numbers.
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"voxelize: {name} must be a sequence of floats or a 1-D tensor, got {type(values).__name__}")
    floats = []
    for i, v in enumerate(values):
        # type() first: the abstract-class isinstance is slower, and this runs on every call.
        if type(v) not in (float, int) and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise TypeError(f"voxelize: {name}[{i}] must be a real number, got {type(v).__name__} {v!r}")
        floats.append(float(v))
    return floats


def _int(value, name: str) -> int:
    """An int argument (max_points_per_voxel, max_voxels) as a Python int. Refuses what int() would
    silently truncate or parse (2.7, "5", True); the lower bounds are the C++ op's checks."""
    if isinstance(value, bool):
        raise TypeError(f"voxelize: {name} must be an int, got bool {value!r}")
    try:
        value = operator.index(value)  # int, numpy integers, 0-d integer tensors
    except TypeError:
        raise TypeError(f"voxelize: {name} must be an int, got {type(value).__name__} {value!r}") from None
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:  # the op takes int64
        raise ValueError(f"voxelize: {name} must fit in int64, got {value}")
    return value


def _tensor(value, name: str, layout: str) -> None:
    # None or a list would reach the dispatcher, whose messages ("no fallback function is registered",
    # "tensor does not have a device") do not say which argument is wrong.
    if not isinstance(value, Tensor):
        raise TypeError(f"voxelize: {name} must be a tensor {layout}, got {type(value).__name__}")


def _flag(value, name: str) -> bool:
    if not isinstance(value, bool):  # padded="no" would be truthy
        raise TypeError(f"voxelize: {name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check_python_arguments(points, batch, voxel_size, point_range) -> tuple[list[float], list[float]]:
    _tensor(points, "points", "(N, F)")
    if batch is not None:
        _tensor(batch, "batch", "(N,) int64 or None")
    return _floats(voxel_size, "voxel_size"), _floats(point_range, "point_range")


_ONLY_FLOAT = {float}


# The last (voxel_size, point_range) pair of tuples that passed _plain_arguments, held so that their
# identities cannot be reused: a tuple of floats cannot change, so the same two objects pass again.
_last_plain = ((), ())


def _plain_arguments(points, batch, voxel_size, point_range) -> bool:
    """True for the common call (tensors, sequences of Python floats), which the op takes as is.
    One set over both sequences: the per-argument checks above cost more than the op's binding
    on a small call, whose cost is its host time; anything else takes them. A training loop passes
    the same two tuples every call (Voxelizer does): those are recognised by identity, without the
    set."""
    global _last_plain
    if voxel_size is _last_plain[0] and point_range is _last_plain[1]:
        return isinstance(points, Tensor) and (batch is None or isinstance(batch, Tensor))
    try:
        plain = ((type(voxel_size) is list or type(voxel_size) is tuple)
                 and (type(point_range) is list or type(point_range) is tuple)
                 and {*map(type, voxel_size), *map(type, point_range)} == _ONLY_FLOAT
                 and isinstance(points, Tensor) and (batch is None or isinstance(batch, Tensor)))
    except TypeError:
        return False
    if plain and type(voxel_size) is tuple and type(point_range) is tuple:
        _last_plain = (voxel_size, point_range)
    return plain


def voxelize(points: Tensor, voxel_size: FloatSeq, point_range: FloatSeq, max_points_per_voxel: int,
             max_voxels: int, *, batch: Optional[Tensor] = None, padded: bool = False) -> Voxels:
    """Hard voxelization: group points into voxels of at most ``max_points_per_voxel`` points.

    Args:
        points: (N, F) float16 / bfloat16 / float32 / float64, F >= 3, columns x, y, z first (any
            other columns, e.g. intensity, are carried along into ``voxels`` and ``features``). Any
            strides (non-contiguous inputs are copied once).
        voxel_size: (sx, sy, sz), positive. A sequence or a 1-D tensor.
        point_range: (x_min, y_min, z_min, x_max, y_max, z_max), min < max.
        max_points_per_voxel: P >= 1; each voxel keeps its first P points in input order.
        max_voxels: >= 1; the first ``max_voxels`` voxels (in order of first point) are kept.
        batch: optional (N,) int64 cloud index per point, need not be sorted, values in
            [0, 2^31 - 1] (and small enough that the 64-bit cell key fits).
        padded: return ``max_voxels`` rows plus ``num_voxels`` (no host sync, static shapes). A
            bad batch index then cannot raise; such points are treated as out of range.

    Returns:
        :class:`Voxels` (see the module docstring for the exact contract).

    Raises:
        TypeError: ``points`` or ``batch`` not a tensor, ``voxel_size`` / ``point_range`` not a
            sequence of real numbers (or a real 1-D tensor), caps that are not ints (2.5, "5" and
            True are refused, not truncated), ``padded`` not a bool.
        ValueError: a ``voxel_size`` / ``point_range`` tensor that is not 1-D, a cap beyond int64.
        RuntimeError: non-floating or wrongly shaped points, F < 3, a bad batch tensor (dtype, shape,
            device, or, unless padded, an index outside the valid range), the wrong number of
            voxel_size / point_range values, non-positive or non-finite voxel size, min >= max,
            caps < 1, or a grid whose flattened cell key would overflow int64.

    Differentiable in ``points`` through ``voxels`` (each kept point's gradient is its slot's) and
    ``features`` (each kept point gets 1 / count of its voxel's gradient), in every mode (backward,
    forward mode, torch.func; not vmap: V depends on the values). The assignment to voxels is
    piecewise constant and has no gradient; dropped points get 0.
    """
    if _plain_arguments(points, batch, voxel_size, point_range):
        vs, pr = voxel_size, point_range
    else:
        vs, pr = _check_python_arguments(points, batch, voxel_size, point_range)
    if not (type(max_points_per_voxel) is int and type(max_voxels) is int and max_points_per_voxel <= _INT64_MAX
            and max_voxels <= _INT64_MAX):  # plain ints in range (the lower bounds are the op's checks)
        max_points_per_voxel = _int(max_points_per_voxel, "max_points_per_voxel")
        max_voxels = _int(max_voxels, "max_voxels")
    if padded is not False and _flag(padded, "padded"):
        return _new_tuple(Voxels, _VOXELIZE_PADDED(points, batch, vs, pr, max_points_per_voxel, max_voxels))
    return _new_tuple(Voxels, _VOXELIZE(points, batch, vs, pr, max_points_per_voxel, max_voxels) + (None,))


def voxel_features(points: Tensor, voxel_size: FloatSeq, point_range: FloatSeq, reduce: str = "mean", *,
                   batch: Optional[Tensor] = None) -> VoxelFeatures:
    """Dynamic voxelization: reduce *every* in-range point of each voxel (no caps).

    Args:
        points, voxel_size, point_range, batch: as in :func:`voxelize`.
        reduce: "mean", "sum" (opmath sum in input order, then divided by the count for "mean") or
            "max" (per column; NaN propagates).

    Returns:
        :class:`VoxelFeatures`: features (V, F), coords (V, 3|4) int32, num_points (V,) int32,
        point_to_voxel (N,) int64. Voxels are numbered by first appearance, as in :func:`voxelize`.

    Differentiable in ``points`` (all F columns): the gradient of a voxel's feature goes to each of
    its points (sum), divided by the count (mean), or for "max" to the first point in input order
    that attains the maximum of that column. The cell assignment itself is piecewise constant and
    has no gradient. Double backward works for all three reductions (the backward is linear in the
    features' gradient; its derivative in the points is 0 almost everywhere).

    Raises:
        As :func:`voxelize` for the shared arguments; RuntimeError for an unknown ``reduce``.
    """
    if _plain_arguments(points, batch, voxel_size, point_range):
        vs, pr = voxel_size, point_range
    else:
        vs, pr = _check_python_arguments(points, batch, voxel_size, point_range)
    return VoxelFeatures(*_VOXEL_FEATURES(points, batch, vs, pr, reduce))


class Voxelizer(nn.Module):
    """Holds the voxelization parameters; ``forward(points, batch=None)`` calls :func:`voxelize`.
    The parameters are checked at construction, with :func:`voxelize`'s errors.

    Example::

        vox = Voxelizer([0.075, 0.075, 0.2], [-54, -54, -5, 54, 54, 3], max_points_per_voxel=10,
                        max_voxels=160_000)
        out = vox(points)           # Voxels(voxels, coords, num_points, features, point_to_voxel, None)
    """

    def __init__(self, voxel_size: FloatSeq, point_range: FloatSeq, max_points_per_voxel: int, max_voxels: int,
                 padded: bool = False):
        super().__init__()
        self.voxel_size = tuple(_floats(voxel_size, "voxel_size"))
        self.point_range = tuple(_floats(point_range, "point_range"))
        self.max_points_per_voxel = _int(max_points_per_voxel, "max_points_per_voxel")
        self.max_voxels = _int(max_voxels, "max_voxels")
        self.padded = _flag(padded, "padded")
        # Fail at construction, not at the first batch.
        _check_grid(list(self.voxel_size), list(self.point_range))
        _check_caps(self.max_points_per_voxel, self.max_voxels)

    @property
    def grid_size(self) -> tuple[int, int, int]:
        """Cells along (x, y, z)."""
        return tuple(_check_grid(list(self.voxel_size), list(self.point_range)))

    def forward(self, points: Tensor, batch: Optional[Tensor] = None) -> Voxels:
        return voxelize(points, self.voxel_size, self.point_range, self.max_points_per_voxel, self.max_voxels,
                        batch=batch, padded=self.padded)

    def extra_repr(self) -> str:
        return (f"voxel_size={self.voxel_size}, point_range={self.point_range}, grid_size={self.grid_size}, "
                f"max_points_per_voxel={self.max_points_per_voxel}, max_voxels={self.max_voxels}, "
                f"padded={self.padded}")


# ---- Fake (meta) kernels: shapes only, mirroring the C++ check_voxelize_inputs ----

def _check_grid(voxel_size: list[float], point_range: list[float]) -> list[int]:
    if len(voxel_size) != 3:
        raise RuntimeError(f"voxelize: voxel_size must have 3 values (x, y, z), got {len(voxel_size)}")
    if len(point_range) != 6:
        raise RuntimeError("voxelize: point_range must have 6 values (x_min, y_min, z_min, x_max, y_max, z_max), "
                           f"got {len(point_range)}")
    dims, cells = [], 1
    for k, axis in enumerate("xyz"):
        size, lo, hi = voxel_size[k], point_range[k], point_range[k + 3]
        if not (math.isfinite(size) and size > 0):
            raise RuntimeError(f"voxelize: voxel_size must be positive and finite, got {size} for {axis}")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise RuntimeError(f"voxelize: point_range must have min < max (both finite), got min {lo} >= max {hi} "
                               f"for {axis}")
        ratio = (hi - lo) / size  # > 0 here; round half away from zero, as C++ std::round
        if math.isinf(ratio):  # a subnormal size, or max - min overflowing: floor() would raise OverflowError
            raise RuntimeError(f"voxelize: the grid has inf cells along {axis}; coordinates are int32, so at most "
                               "2^31 - 1")
        n = math.floor(ratio)
        n += 1 if ratio - n >= 0.5 else 0  # exact: ratio - floor(ratio) has no rounding error
        if n < 1:
            raise RuntimeError(f"voxelize: the grid has no cells along {axis}")
        if n > _INT32_MAX:
            raise RuntimeError(f"voxelize: the grid has {n} cells along {axis}; coordinates are int32")
        cells *= n
        dims.append(n)
    if cells > _INT64_MAX:
        raise RuntimeError(f"voxelize: the grid is too large: {dims[0]} x {dims[1]} x {dims[2]} (x, y, z) cells "
                           "would overflow the 64-bit flattened cell key")
    return dims


def _check_inputs(points: Tensor, batch: Optional[Tensor], voxel_size, point_range) -> None:
    if points.dtype not in _FLOAT_DTYPES:
        raise RuntimeError(f"voxelize: points must be float16, bfloat16, float32 or float64, got {points.dtype}")
    if points.dim() != 2:
        raise RuntimeError(f"voxelize: points must be a 2-D tensor (N, F), got shape {tuple(points.shape)}")
    if points.shape[1] < 3:
        raise RuntimeError(f"voxelize: points must have F >= 3 columns (x, y, z first), got shape {tuple(points.shape)}")
    if batch is not None:
        if batch.dtype != torch.int64:
            raise RuntimeError(f"voxelize: batch must be an int64 tensor, got {batch.dtype}")
        if batch.dim() != 1 or batch.shape[0] != points.shape[0]:
            raise RuntimeError(f"voxelize: batch must have shape (N,) to match points, got shape {tuple(batch.shape)}")
        if batch.device != points.device:
            raise RuntimeError(f"voxelize: batch must be on the same device as points ({points.device}), "
                               f"got {batch.device}")
    _check_grid(list(voxel_size), list(point_range))


def _check_caps(max_points_per_voxel: int, max_voxels: int) -> None:
    if max_points_per_voxel < 1:
        raise RuntimeError(f"voxelize: max_points_per_voxel must be >= 1, got {max_points_per_voxel}")
    if max_voxels < 1:
        raise RuntimeError(f"voxelize: max_voxels must be >= 1, got {max_voxels}")


def _voxel_outputs(points, batch, num_voxels, max_points_per_voxel):
    f = points.shape[1]
    cols = 3 if batch is None else 4
    return (points.new_empty((num_voxels, max_points_per_voxel, f)),
            points.new_empty((num_voxels, cols), dtype=torch.int32),
            points.new_empty((num_voxels,), dtype=torch.int32),
            points.new_empty((num_voxels, f)),
            points.new_empty((points.shape[0],), dtype=torch.int64))


@torch.library.register_fake("pointops::voxelize")
def _voxelize_fake(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels):
    _check_inputs(points, batch, voxel_size, point_range)
    _check_caps(max_points_per_voxel, max_voxels)
    # V is data-dependent: an unbacked symbolic size, 0 <= V <= min(N, max_voxels).
    num_voxels = torch.library.get_ctx().new_dynamic_size()
    return _voxel_outputs(points, batch, num_voxels, max_points_per_voxel)


@torch.library.register_fake("pointops::voxelize_padded")
def _voxelize_padded_fake(points, batch, voxel_size, point_range, max_points_per_voxel, max_voxels):
    _check_inputs(points, batch, voxel_size, point_range)
    _check_caps(max_points_per_voxel, max_voxels)
    return _voxel_outputs(points, batch, max_voxels, max_points_per_voxel) + (
        points.new_empty((), dtype=torch.int64),)


@torch.library.register_fake("pointops::voxel_features")
def _voxel_features_fake(points, batch, voxel_size, point_range, reduce="mean"):
    _check_inputs(points, batch, voxel_size, point_range)
    if reduce not in ("mean", "sum", "max"):
        raise RuntimeError(f"voxel_features: reduce must be 'mean', 'sum' or 'max', got '{reduce}'")
    num_voxels = torch.library.get_ctx().new_dynamic_size()  # data-dependent, 0 <= V <= N
    f, cols = points.shape[1], 3 if batch is None else 4
    return (points.new_empty((num_voxels, f)), points.new_empty((num_voxels, cols), dtype=torch.int32),
            points.new_empty((num_voxels,), dtype=torch.int32), points.new_empty((points.shape[0],), dtype=torch.int64))


@torch.library.register_fake("pointops::_voxel_features_backward")
def _voxel_features_backward_fake(grad_features, points, point_to_voxel, num_points, features, reduce):
    torch._check(grad_features.shape == features.shape, lambda: "grad_features must match features")
    return torch.empty_like(points, memory_format=torch.contiguous_format)

# Autograd (voxel_features' backward, and the derivatives of voxelize's voxels and features) is C++:
# csrc/voxelize/voxelize_autograd.cpp.
