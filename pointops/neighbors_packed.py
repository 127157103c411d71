"""Neighbourhoods of packed clouds (torch_cluster / torch_geometric faces): :func:`knn`,
:func:`radius`, :func:`fps` and :func:`knn_interpolate`.

Points of all clouds are stacked in one (N, D) tensor with a ``batch`` vector (N,) int64 naming
each point's cloud, as ``voxelize(batch=...)`` takes them. ``batch`` need not be sorted (torch_cluster
requires it sorted and does not check): the points of a cloud keep their relative order. Omitted,
every point is in cloud 0.

These run on the same kernels as the padded ops of :mod:`pointops.neighbors`, with the same
semantics (exact distances, ties to the smaller index, NaN/Inf points never matched): the clouds are
gathered into a padded batch in one pass over the points (no loop over clouds), searched, and the
answers mapped back to the original indices. That costs memory for the padded batch (clouds x the
largest cloud) and a few device-to-host copies per call (the number of clouds and the largest
cloud, and the data-dependent number of edges), as torch_cluster's own calls do.
"""
import numbers
from typing import Optional, Tuple

import torch
from torch import Tensor

from ._transforms import refuse_under_vmap
from .chamfer import _require_tensors
from .neighbors import _check_count, ball_query, knn_gather, knn_points, sample_farthest_points

__all__ = ["knn", "radius", "fps", "knn_interpolate"]


class _Clouds:
    """Where each point of a packed (N, D) tensor sits in a padded (B, P, D) batch."""

    def __init__(self, batch: Tensor, counts: Tensor, largest: int):
        num_points, device = batch.shape[0], batch.device
        self.num_clouds, self.largest = counts.shape[0], largest
        self.batch, self.counts = batch, counts
        order = torch.argsort(batch, stable=True)  # a cloud's points keep their order
        starts = torch.cumsum(self.counts, 0) - self.counts
        self.slot = torch.empty_like(batch)
        self.slot[order] = torch.arange(num_points, device=device) - starts[batch[order]]
        # original index of each padded slot (-1: padding)
        self.index = torch.full((self.num_clouds, largest), -1, dtype=torch.int64, device=device)
        self.index[batch, self.slot] = torch.arange(num_points, device=device)

    def pad(self, values: Tensor) -> Tensor:
        """(N, F) per-point values -> (B, P, F), zeros in the padding; differentiable."""
        padded = values.new_zeros(self.num_clouds, self.largest, values.shape[1])
        return padded.index_put((self.batch, self.slot), values)

    def unpad(self, padded: Tensor) -> Tensor:
        """(B, P, ...) -> (N, ...): each point's row; differentiable."""
        return padded[self.batch, self.slot]


def _batch_vector(batch, points: Tensor, name: str, points_name: str) -> Tensor:
    if batch is None:
        return torch.zeros(points.shape[0], dtype=torch.int64, device=points.device)
    if not isinstance(batch, Tensor):
        raise TypeError(f"{name} must be a tensor (N,) or None, got {type(batch).__name__}")
    if batch.dtype != torch.int64:
        raise TypeError(f"{name} must be an int64 tensor, got {batch.dtype}")
    if batch.shape != (points.shape[0],):
        raise ValueError(f"{name} must have shape (N,) = ({points.shape[0]},) to match {points_name}, "
                         f"got shape {tuple(batch.shape)}")
    if batch.device != points.device:
        raise ValueError(f"{name} must be on the same device as {points_name} ({points.device}), got {batch.device}")
    return batch


def _clouds(*pairs) -> Tuple["_Clouds", ...]:
    """_Clouds for each (points, batch vector, name), numbered alike: clouds 0 .. max over all."""
    stats = []
    for points, batch, _ in pairs:
        if batch.numel():
            stats += [batch.min(), batch.max()]
    values = torch.stack(stats).tolist() if stats else []  # one host sync for all
    lows, highs = values[0::2], values[1::2]
    for (_, _, name), low in zip([p for p in pairs if p[1].numel()], lows):
        if low < 0:
            raise ValueError(f"{name} must hold cloud numbers >= 0, got {low}")
    num_clouds = max(highs) + 1 if highs else 0
    counts = [torch.zeros(num_clouds, dtype=torch.int64, device=b.device).index_add_(0, b, torch.ones_like(b))
              for _, b, _ in pairs]
    largest = torch.stack([c.max() for c in counts]).tolist() if num_clouds else [0] * len(pairs)
    return tuple(_Clouds(b, c, n) for (_, b, _), c, n in zip(pairs, counts, largest))


def _check_points(x, y, x_name: str = "x", y_name: str = "y") -> None:
    _require_tensors(**{x_name: x, y_name: y})
    for t, name in ((x, x_name), (y, y_name)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor (N, D), got shape {tuple(t.shape)}")
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"{x_name} and {y_name} must have the same point dimension D, got {x_name} "
                         f"{tuple(x.shape)} and {y_name} {tuple(y.shape)}")


def _edges(idx_rows: Tensor, x_clouds: "_Clouds", y_clouds: "_Clouds") -> Tensor:
    """(2, E) edges from (Ny, K) neighbour slots (-1: none): row 0 the y index, row 1 the x index,
    rows ascending and each row's neighbours in the search's order."""
    if x_clouds.largest == 0:  # no x point at all: nothing to index (and nothing was found)
        return torch.empty(2, 0, dtype=torch.int64, device=idx_rows.device)
    cols = x_clouds.index[y_clouds.batch[:, None], idx_rows.clamp(min=0)]
    mask = idx_rows >= 0
    rows = torch.arange(idx_rows.shape[0], device=idx_rows.device)[:, None].expand_as(idx_rows)
    return torch.stack([rows[mask], cols[mask]])


def knn(x: Tensor, y: Tensor, k: int, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None, *,
        algorithm: str = "auto") -> Tensor:
    """For each point of ``y`` the ``k`` nearest points of ``x`` in the same cloud (torch_cluster's
    ``knn``), squared Euclidean distance.

    Returns:
        (2, E) int64 edges: row 0 indexes y (the query), row 1 indexes x (the neighbour). Rows come in
        increasing y order, each y's neighbours nearest first (ties: smaller index). A query whose
        cloud in x has fewer than k points gets fewer edges (no padding).

    ``algorithm`` (keyword-only): :func:`pointops.knn_points`' search choice, ``"auto"``, ``"brute"``
    or ``"grid"`` (D = 2, 3); the same edges either way.
    """
    _check_points(x, y)
    _check_count("k", k)
    refuse_under_vmap("knn", "a cloud with fewer than k points, or with NaN points, has fewer edges; stack the samples "
                      "as more clouds of the batch vectors, or use pointops.knn_points (padded clouds), which vmap batches")
    x_clouds, y_clouds = _clouds((x, _batch_vector(batch_x, x, "batch_x", "x"), "batch_x"),
                                 (y, _batch_vector(batch_y, y, "batch_y", "y"), "batch_y"))
    if x_clouds.num_clouds == 0:
        return torch.empty(2, 0, dtype=torch.int64, device=x.device)
    _, idx, _ = knn_points(y_clouds.pad(y), x_clouds.pad(x), y_clouds.counts, x_clouds.counts, K=k,
                           algorithm=algorithm)
    return _edges(y_clouds.unpad(idx), x_clouds, y_clouds)


def radius(x: Tensor, y: Tensor, r: float, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None,
           max_num_neighbors: int = 32, *, algorithm: str = "auto") -> Tensor:
    """For each point of ``y`` the points of ``x`` in the same cloud whose squared distance is below
    ``r**2``, at most ``max_num_neighbors`` of them: the first ones in x's index order (torch_cluster's
    ``radius`` on CUDA; its CPU version keeps a tree order instead).

    Returns:
        (2, E) int64 edges: row 0 indexes y, row 1 indexes x; rows ascending, each row's neighbours in
        increasing x index.

    ``algorithm`` (keyword-only): :func:`pointops.ball_query`'s search choice, ``"auto"``,
    ``"brute"`` or ``"grid"`` (D = 2, 3); the same edges either way.
    """
    _check_points(x, y)
    _check_count("max_num_neighbors", max_num_neighbors)
    refuse_under_vmap("radius", "stack the samples as more clouds of the batch vectors, or use pointops.ball_query "
                      "(padded clouds), which vmap batches")
    x_clouds, y_clouds = _clouds((x, _batch_vector(batch_x, x, "batch_x", "x"), "batch_x"),
                                 (y, _batch_vector(batch_y, y, "batch_y", "y"), "batch_y"))
    if x_clouds.num_clouds == 0:
        return torch.empty(2, 0, dtype=torch.int64, device=x.device)
    _, idx, _ = ball_query(y_clouds.pad(y), x_clouds.pad(x), y_clouds.counts, x_clouds.counts, K=max_num_neighbors,
                           radius=r, return_nn=False, algorithm=algorithm)
    return _edges(y_clouds.unpad(idx), x_clouds, y_clouds)


def fps(x: Tensor, batch: Optional[Tensor] = None, ratio: float = 0.5, random_start: bool = True, *,
        generator: Optional[torch.Generator] = None) -> Tensor:
    """Farthest point sampling of packed clouds (torch_cluster's ``fps``): ``ceil(ratio * n)``
    points from a cloud of n (computed in float32, as torch_cluster does), each cloud starting at a
    random point (``random_start=True``, torch_cluster's default; drawn from ``generator``) or at its
    first point. Semantics otherwise as :func:`pointops.sample_farthest_points`.

    Returns:
        (S,) int64 indices into x: cloud 0's samples in the order taken, then cloud 1's, ...
    """
    _require_tensors(x=x)
    if x.dim() != 2:
        raise ValueError(f"x must be a 2-D tensor (N, D), got shape {tuple(x.shape)}")
    if isinstance(ratio, bool) or not isinstance(ratio, numbers.Real) or not 0 < ratio <= 1:
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    refuse_under_vmap("fps", "clouds with NaN points have fewer samples; stack the samples as more clouds of the batch "
                      "vector, or use pointops.sample_farthest_points (padded clouds), which vmap batches")
    (clouds,) = _clouds((x, _batch_vector(batch, x, "batch", "x"), "batch"))
    if clouds.num_clouds == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    counts = torch.ceil(clouds.counts.to(torch.float32) * torch.tensor(ratio, dtype=torch.float32)).to(torch.int64)
    _, idx = sample_farthest_points(clouds.pad(x), clouds.counts, counts, random_start, generator=generator)
    taken = idx >= 0
    return clouds.index[torch.arange(clouds.num_clouds, device=x.device)[:, None].expand_as(idx)[taken], idx[taken]]


def knn_interpolate(x: Tensor, pos_x: Tensor, pos_y: Tensor, batch_x: Optional[Tensor] = None,
                    batch_y: Optional[Tensor] = None, k: int = 3, num_workers: int = 1) -> Tensor:
    """PointNet++ feature propagation (torch_geometric's ``knn_interpolate``): the features ``x``
    (Nx, F) of the points ``pos_x`` interpolated at ``pos_y`` from each point's ``k`` nearest points of
    ``pos_x`` in its cloud, weighted by inverse squared distance::

        y_i = sum_j w_ij x_j / sum_j w_ij,   w_ij = 1 / max(|pos_y_i - pos_x_j|^2, 1e-16)

    Differentiable in ``x`` and, unlike torch_geometric (which computes the weights under no_grad),
    in ``pos_x`` and ``pos_y``. Half-type inputs compute in float32. A point of ``pos_y`` whose cloud
    in ``pos_x`` is empty gets zeros (torch_geometric: NaN). ``num_workers`` is accepted and ignored.

    Returns:
        (Ny, F) features at ``pos_y``, in x's dtype.
    """
    _check_points(pos_x, pos_y, "pos_x", "pos_y")
    _require_tensors(x=x)
    if x.dim() != 2 or x.shape[0] != pos_x.shape[0]:
        raise ValueError(f"x must be a 2-D tensor (Nx, F) with Nx = {pos_x.shape[0]} (the points of pos_x), "
                         f"got shape {tuple(x.shape)}")
    _check_count("k", k)
    x_clouds, y_clouds = _clouds((pos_x, _batch_vector(batch_x, pos_x, "batch_x", "pos_x"), "batch_x"),
                                 (pos_y, _batch_vector(batch_y, pos_y, "batch_y", "pos_y"), "batch_y"))
    if x_clouds.num_clouds == 0:
        return x.new_zeros(pos_y.shape[0], x.shape[1])
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    dists, idx, _ = knn_points(y_clouds.pad(pos_y), x_clouds.pad(pos_x), y_clouds.counts, x_clouds.counts, K=k)
    weights = (1.0 / dists.to(compute).clamp(min=1e-16)).masked_fill(idx < 0, 0)
    features = knn_gather(x_clouds.pad(x.to(compute)), idx)  # (B, P, k, F), zeros where idx = -1
    total = weights.sum(2, keepdim=True)
    y = (weights.unsqueeze(-1) * features).sum(2) / torch.where(total > 0, total, torch.ones_like(total))
    return y_clouds.unpad(y).to(x.dtype)

