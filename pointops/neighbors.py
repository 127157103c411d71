"""Neighbourhoods of point clouds (CPU and CUDA), with PyTorch3D's contracts:
:func:`knn_points`, :func:`knn_gather`, :func:`ball_query`, :func:`sample_farthest_points`.
The packed (torch_cluster) faces ``knn``, ``radius``, ``fps`` and ``knn_interpolate`` live in
:mod:`pointops.neighbors_packed` and run on the same kernels.

Clouds are batched and padded: ``p1`` (B, N, D) queries, ``p2`` (B, M, D) references, any
floating dtype (float16 and bfloat16 compute in float32), any D >= 1 (2 and 3 compiled specially),
on the same device; ``lengths1`` / ``lengths2`` (B,) int64 give each cloud's valid points (checking
their values costs one device-to-host copy on CUDA; leave them out to keep a call free of host
syncs, e.g. under CUDA graph capture).

Semantics every op here shares:

- **Exact distances.** Squared Euclidean distances in the ``sum((p - q)^2)`` form with fused
  multiply-adds, the same operations as :func:`pointops.nearest_neighbor` (so ``knn_points(K=1)``
  equals it bit for bit where it finds a neighbour), accurate far from the origin where
  ``|p|^2 + |q|^2 - 2 p.q`` is not. CPU and CUDA return identical results, bit for bit.
- **Ties** go to the smaller index, always.
- **No neighbour**: slots past a cloud's neighbours, padded queries, and candidates whose
  distance is NaN or +inf (points with NaN or infinite coordinates are never matched) hold distance
  0 and, as PyTorch3D writes them, index 0 in :func:`knn_points` (code written for PyTorch3D indexes
  with ``idx`` directly) and index -1 in :func:`ball_query` and :func:`sample_farthest_points`
  (PyTorch3D's -1 there). The kernels themselves write -1 (``torch.ops.pointops.knn_points``, and
  :func:`pointops.nearest_neighbor` / :func:`pointops.chamfer`, which keep it), so a caller that
  must tell padding from a real neighbour uses those or ``lengths2``. ``knn_gather`` gives zeros in
  slots past ``lengths`` and for index -1.
- **Gradients** flow to ``p1`` and ``p2`` through the distances (to any order), not through
  the indices.
- **Search** (``algorithm=``, keyword-only on :func:`knn_points` and :func:`ball_query`):
  ``"brute"``, ``"grid"`` (D = 2, 3: a uniform grid of the reference cloud's occupied cells, searched
  outward from each query; ball_query visits only the cells within the radius) or ``"auto"``
  (default: the grid where the sizes say it pays). The grid returns the brute-force result bit for
  bit; see :mod:`pointops.chamfer` for its cost and when "auto" takes it.
"""
import numbers
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from ._entry import eager_entry
from .chamfer import _FLOAT_DTYPES, _check_algorithm, _require_tensors

__all__ = ["KNN", "knn_points", "knn_gather", "ball_query", "sample_farthest_points"]


# ---------------------------------------------------------------- fake kernels (torch.compile)
def _check_pair(p1: Tensor, p2: Tensor) -> None:
    """The shape/dtype/device checks of check_cloud_pair, for fake tensors."""
    torch._check(p1.dim() == 3, lambda: f"p1 must be a 3-D tensor (B, N, D), got shape {tuple(p1.shape)}")
    torch._check(p2.dim() == 3, lambda: f"p2 must be a 3-D tensor (B, M, D), got shape {tuple(p2.shape)}")
    torch._check(p1.dtype in _FLOAT_DTYPES, lambda: f"p1 must be float16, bfloat16, float32 or float64, got {p1.dtype}")
    torch._check(p2.dtype == p1.dtype, lambda: f"p2 must have the same dtype as p1 ({p1.dtype}), got {p2.dtype}")
    torch._check(p1.device == p2.device, lambda: f"p2 must be on the same device as p1 ({p1.device}), got {p2.device}")
    torch._check(p1.shape[0] == p2.shape[0], lambda: "p1 and p2 must have the same batch size B")
    torch._check(p1.shape[2] == p2.shape[2], lambda: "p1 and p2 must have the same point dimension D")


@torch.library.register_fake("pointops::knn_points")
def _knn_points_fake(p1, p2, lengths1=None, lengths2=None, K=1, norm=2, algorithm="auto"):
    _check_pair(p1, p2)
    _check_algorithm(algorithm, p1.shape[2])
    torch._check(K >= 1, lambda: f"K must be at least 1, got {K}")
    return p1.new_empty(p1.shape[0], p1.shape[1], K), p1.new_empty(p1.shape[0], p1.shape[1], K, dtype=torch.int64)


@torch.library.register_fake("pointops::ball_query")
def _ball_query_fake(p1, p2, lengths1=None, lengths2=None, K=500, radius=0.2, algorithm="auto"):
    _check_pair(p1, p2)
    _check_algorithm(algorithm, p1.shape[2])
    torch._check(K >= 1, lambda: f"K must be at least 1, got {K}")
    return p1.new_empty(p1.shape[0], p1.shape[1], K), p1.new_empty(p1.shape[0], p1.shape[1], K, dtype=torch.int64)


@torch.library.register_fake("pointops::sample_farthest_points")
def _sample_farthest_points_fake(points, lengths=None, K=None, max_K=50, start_idx=None):
    torch._check(points.dim() == 3, lambda: f"points must be a 3-D tensor (B, N, D), got shape {tuple(points.shape)}")
    torch._check(max_K >= 0, lambda: f"max_K must be >= 0, got {max_K}")
    return points.new_empty(points.shape[0], max_K, dtype=torch.int64)


# ---------------------------------------------------------------- PyTorch3D-compatible API
class KNN(NamedTuple):
    """What knn_points and ball_query return (PyTorch3D's field names and order)."""
    dists: Tensor
    idx: Tensor
    knn: Optional[Tensor]


# Looked up once and called through their C++ entries (pointops/_entry.py): a small call's host time.
_KNN_POINTS = eager_entry(torch.ops.pointops.knn_points.default)
_BALL_QUERY = eager_entry(torch.ops.pointops.ball_query.default)
_SAMPLE_FARTHEST_POINTS = eager_entry(torch.ops.pointops.sample_farthest_points.default)


def _check_pytorch3d_pair(p1, p2) -> None:
    """PyTorch3D's own ValueErrors, with what was given."""
    _require_tensors(p1=p1, p2=p2)
    if p1.dim() == 3 and p2.dim() == 3:
        if p1.shape[0] != p2.shape[0]:
            raise ValueError(f"pts1 and pts2 must have the same batch dimension, got p1 {tuple(p1.shape)} and "
                             f"p2 {tuple(p2.shape)}")
        if p1.shape[2] != p2.shape[2]:
            raise ValueError(f"pts1 and pts2 must have the same point dimension, got p1 {tuple(p1.shape)} and "
                             f"p2 {tuple(p2.shape)}")


def _check_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def knn_points(p1: Tensor, p2: Tensor, lengths1: Optional[Tensor] = None, lengths2: Optional[Tensor] = None,
               norm: int = 2, K: int = 1, version: int = -1, return_nn: bool = False,
               return_sorted: bool = True, *, algorithm: str = "auto") -> KNN:
    """The K nearest points of ``p2`` for every point of ``p1`` (PyTorch3D's ``knn_points``).

    Args:
        p1: (B, N, D) query clouds. p2: (B, M, D) reference clouds, same dtype and device.
        lengths1, lengths2: optional (B,) int64 numbers of valid points per cloud.
        norm: 2 for squared Euclidean distances, 1 for L1 distances (``sum |p - q|``).
        K: neighbours per query, any K >= 1 (K larger than a cloud leaves the extra slots empty).
            K = 1 is :func:`pointops.nearest_neighbor`'s search; 2..64 keep their candidates in
            registers on CUDA; larger K sorts whole rows of distances (slower).
        version: accepted for PyTorch3D compatibility and ignored (one kernel family serves all).
        return_nn: also return the neighbours' coordinates, ``knn_gather(p2, idx, lengths2)``.
        return_sorted: True (default): nearest first, ties by index. False: PyTorch3D's "no
            particular order"; here the same neighbours farthest first (the padding stays last),
            a deterministic order that code asking for unsorted neighbours cannot mistake for
            sorted ones (PyTorch3D's own tests check that it is not).
        algorithm: pointops only, keyword-only: ``"auto"`` (default), ``"brute"`` or ``"grid"``
            (D = 2, 3); the same result bit for bit either way.

    Returns:
        ``KNN(dists, idx, knn)``: ``dists`` (B, N, K) in p1's dtype, ascending; ``idx`` (B, N, K)
        int64 into p2; where there is no neighbour (K past the cloud's size, a padded query, only
        non-finite candidates) PyTorch3D's padding: index 0, distance 0, and zeros in ``knn``
        (B, N, K, D), which is None unless ``return_nn``. Differentiable in p1 and p2 through
        ``dists`` (and ``knn``).

    Raises:
        ValueError: p1 and p2 with different batch sizes or point dimensions (PyTorch3D's messages),
            ``norm`` other than 1 or 2, K < 1. TypeError: non-tensor clouds, a non-integer K.
        RuntimeError: wrong ranks, dtypes or devices, lengths outside [0, size].
    """
    _check_pytorch3d_pair(p1, p2)
    if norm not in (1, 2):
        raise ValueError(f"Support for 1 or 2 norm: norm must be 1 or 2, got {norm!r}")
    _check_count("K", K)
    dists, idx = _KNN_POINTS(p1, p2, lengths1, lengths2, K, norm, algorithm)  # -1: no neighbour
    if not return_sorted and K > 1:  # reverse each query's found neighbours (a prefix of its row)
        slot = torch.arange(K, device=idx.device)
        found = (idx >= 0).sum(-1, keepdim=True)
        order = torch.where(slot < found, found - 1 - slot, slot)
        dists, idx = dists.gather(-1, order), idx.gather(-1, order)
    nn = knn_gather(p2, idx, lengths2) if return_nn else None  # zeros there, before the -1 becomes 0
    return KNN(dists, idx.clamp(min=0), nn)


def knn_gather(x: Tensor, idx: Tensor, lengths: Optional[Tensor] = None) -> Tensor:
    """``x[b, idx[b, i, k]]`` for every (b, i, k): (B, L, K, U) from x (B, M, U) and idx (B, L, K).

    As PyTorch3D's ``knn_gather``: slots k >= ``lengths[b]`` (the cloud had fewer than K points)
    are zeros. Indices outside [0, M) (-1 from ball_query or the kernels) give zeros too, so it
    serves ball_query's padding as well (PyTorch3D needs its ``masked_gather`` there). No host
    sync. Differentiable in x; the backward is torch's indexed accumulation (deterministic under
    ``torch.use_deterministic_algorithms(True)``).
    """
    _require_tensors(x=x, idx=idx)
    if x.dim() != 3 or idx.dim() != 3:
        raise ValueError(f"knn_gather: x must be (B, M, U) and idx (B, L, K), got x {tuple(x.shape)} and idx "
                         f"{tuple(idx.shape)}")
    if x.shape[0] != idx.shape[0]:
        raise ValueError(f"x and idx must have same batch dimension, got x {tuple(x.shape)} and idx {tuple(idx.shape)}")
    if idx.dtype != torch.int64:
        raise TypeError(f"knn_gather: idx must be int64, got {idx.dtype}")
    B, M, U = x.shape
    K = idx.shape[2]
    if M == 0:
        return x.new_zeros(*idx.shape, U)
    valid = (idx >= 0) & (idx < M)
    if lengths is not None:
        valid = valid & (torch.arange(K, device=idx.device) < lengths.to(idx.device)[:, None, None])
    flat = (idx.clamp(0, M - 1) + torch.arange(B, device=idx.device)[:, None, None] * M).flatten()
    gathered = x.reshape(B * M, U)[flat].view(*idx.shape, U)
    return gathered.masked_fill(~valid.unsqueeze(-1), 0)  # not a product: 0 * NaN would be NaN


def ball_query(p1: Tensor, p2: Tensor, lengths1: Optional[Tensor] = None, lengths2: Optional[Tensor] = None,
               K: int = 500, radius: float = 0.2, return_nn: bool = True, *, algorithm: str = "auto") -> KNN:
    """The first K points of ``p2`` within ``radius`` of every point of ``p1`` (PyTorch3D's
    ``ball_query``).

    A point is within the ball when its squared distance is strictly below ``radius**2`` (squared
    in double precision, rounded once to the compute type). Neighbours come in index order (the
    first K found scanning p2), not sorted by distance. ``algorithm`` (keyword-only): ``"auto"``,
    ``"brute"`` or ``"grid"`` (D = 2, 3: only the cells within the radius are visited), as
    :func:`knn_points`; the same result bit for bit either way.

    Returns:
        ``KNN(dists, idx, knn)``: ``dists`` (B, N, K) squared distances, ``idx`` (B, N, K) int64,
        -1 and 0 in unused slots; ``knn`` (B, N, K, D) the neighbours' coordinates (zeros in unused
        slots) when ``return_nn``, else None. Differentiable in p1 and p2 through ``dists`` and ``knn``.

    Raises:
        ValueError: PyTorch3D's shape errors, K < 1, a radius that is not a finite number > 0.
        RuntimeError: as :func:`knn_points`; on CUDA, points of more than 2048 float32 coordinates.
    """
    _check_pytorch3d_pair(p1, p2)
    _check_count("K", K)
    if isinstance(radius, bool) or not isinstance(radius, numbers.Real):
        raise TypeError(f"radius must be a real number, got {type(radius).__name__} {radius!r}")
    if not (radius > 0 and radius < float("inf")):  # NaN fails too
        raise ValueError(f"radius must be a finite number > 0, got {radius}")
    dists, idx = _BALL_QUERY(p1, p2, lengths1, lengths2, K, float(radius), algorithm)
    nn = knn_gather(p2, idx) if return_nn else None
    return KNN(dists, idx, nn)


def sample_farthest_points(points: Tensor, lengths: Optional[Tensor] = None, K: Union[int, list, Tensor] = 50,
                           random_start_point: bool = False, *,
                           generator: Optional[torch.Generator] = None) -> Tuple[Tensor, Tensor]:
    """Farthest point sampling (PyTorch3D's ``sample_farthest_points``).

    Each cloud starts at its point 0 (or, with ``random_start_point``, at a uniformly drawn point,
    drawn from ``generator`` if given) and then repeatedly takes the point whose squared distance to
    the points taken so far is largest. Ties go to the smallest index, so the result is a pure
    function of the input (and the generator's state).

    Unlike PyTorch3D, a point is never taken twice: a cloud with fewer distinct points than K goes
    on with the duplicates (distance 0) in index order, and its samples stop, padded with -1, only
    when its points run out. Points with NaN or infinite coordinates are never taken. A start point
    that is not finite is replaced by the first finite point after it.

    Args:
        points: (B, N, D) clouds, any floating dtype (half types compute in float32), any D >= 1.
        lengths: optional (B,) int64 valid points per cloud.
        K: samples per cloud: an int, or a list / (B,) tensor of per-cloud counts (its maximum is
            read on the host: one device-to-host copy).
        random_start_point: start each cloud at a random point instead of point 0.
        generator: the torch.Generator the start points are drawn from (on any device).

    Returns:
        ``(selected_points, indices)``: (B, max K, D) coordinates (zeros in unused slots) and
        (B, max K) int64 indices, -1 past each cloud's samples. ``selected_points`` is
        differentiable in ``points``.
    """
    _require_tensors(points=points)
    if points.dim() != 3:
        raise ValueError(f"points must be a 3-D tensor (B, N, D), got shape {tuple(points.shape)}")
    B, N = points.shape[0], points.shape[1]
    if lengths is not None and (not isinstance(lengths, Tensor) or lengths.shape != (B,)):
        raise ValueError(f"points and lengths must have same batch dimension: lengths must be a tensor of shape "
                         f"({B},), got {tuple(lengths.shape) if isinstance(lengths, Tensor) else type(lengths).__name__}")
    if isinstance(K, numbers.Integral) and not isinstance(K, bool):
        if K < 0:
            raise ValueError(f"K must be >= 0, got {K}")
        per_cloud, max_K = None, int(K)
    else:
        per_cloud = torch.as_tensor(K, dtype=torch.int64, device=points.device)
        if per_cloud.shape != (B,):
            raise ValueError(f"K and points must have the same batch dimension: K must have shape ({B},), got "
                             f"{tuple(per_cloud.shape)}")
        max_K = int(per_cloud.max()) if B > 0 else 0  # the output width: one host sync
        if B > 0 and int(per_cloud.min()) < 0:
            raise ValueError(f"K must hold counts >= 0, got {per_cloud.tolist()}")
    start = None
    if random_start_point:
        device = generator.device if generator is not None else points.device
        uniform = torch.rand(B, generator=generator, device=device, dtype=torch.float64).to(points.device)
        sizes = lengths if lengths is not None else torch.full((B,), N, device=points.device)
        start = (uniform * sizes.to(torch.float64)).floor().to(torch.int64)
    idx = _SAMPLE_FARTHEST_POINTS(points, lengths, per_cloud, max_K, start)
    return knn_gather(points, idx[:, :, None])[:, :, 0], idx
