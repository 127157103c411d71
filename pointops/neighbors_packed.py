"""Neighbourhoods of packed clouds, torch_cluster's face: :func:`knn`, :func:`knn_graph`,
:func:`radius`, :func:`radius_graph`, :func:`nearest` (and :func:`fps`, :func:`grid_cluster` in
:mod:`pointops.sampling_packed`; :func:`knn_interpolate`, torch_geometric's, there too).

Signature for signature torch_cluster 1.6.3's functions (defaults, argument order, dtypes, edge
order, ``flow``, ``loop``, ``cosine``; ``num_workers`` is accepted and has nothing to do), so
``import pointops as torch_cluster`` is the only change code written for torch_cluster needs.
Every function is ``torch.jit.script``-able (PyG scripts models that call them) and runs under
``torch.compile`` (the host reads below break the graph, as torch_cluster's own do). pointops'
extra, the search choice ``algorithm`` (``"auto"``, ``"brute"`` or ``"grid"`` for D = 2, 3; the
same edges either way), is a defaulted positional argument after torch_cluster's.

Points of all clouds are stacked in one (N, D) tensor (a 1-D tensor is N points of D = 1) with a
``batch`` vector (N,) int64 naming each point's cloud. torch_cluster requires ``batch`` sorted
(and its knn / radius return wrong edges, silently, when it is not); here an unsorted ``batch`` is
fine: the points of a cloud keep their relative order. Omitted, every point is in cloud 0.

These run on the kernels of the padded ops of :mod:`pointops.neighbors` with their semantics:
exact distances, ties to the smaller index, NaN/Inf points never matched, identical results on
CPU and CUDA (torch_cluster's CPU search is a k-d tree with its own order of ties and of the
capped radius neighbours; here both devices return what torch_cluster's CUDA kernels return). The
clouds are gathered into a padded batch in one pass (no loop over clouds), searched, and the
answers mapped back: memory for clouds x the largest cloud, and two or three device-to-host reads
per call (cloud numbers and sizes, the data-dependent number of edges), as torch_cluster's own.
"""
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ._transforms import refuse_under_vmap

__all__ = ["knn", "knn_graph", "radius", "radius_graph", "nearest"]


# ---------------------------------------------------------------- packed <-> padded
def _points(x: Tensor, name: str) -> Tensor:
    """torch_cluster's (N,) -> (N, 1); anything but 1-D or 2-D is an error."""
    if not torch.jit.is_scripting():
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 1:
        return x.view(-1, 1)
    if x.dim() != 2:
        raise ValueError(f"{name} must be a tensor (N, D) or (N,), got shape {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    return x


def _check_batch(batch: Optional[Tensor], points: Tensor, name: str, points_name: str) -> None:
    if batch is None:
        return
    if not torch.jit.is_scripting():
        if not isinstance(batch, Tensor):
            raise TypeError(f"{name} must be a tensor (N,) or None, got {type(batch).__name__}")
    if batch.dtype != torch.int64:
        raise TypeError(f"{name} must be an int64 tensor, got {batch.dtype}")
    if batch.dim() != 1 or batch.shape[0] != points.shape[0]:
        raise ValueError(f"{name} must have shape (N,) = ({points.shape[0]},) to match {points_name}, "
                         f"got shape {list(batch.shape)}")
    if batch.device != points.device:
        raise ValueError(f"{name} must be on the same device as {points_name} ({points.device}), got {batch.device}")


class _Clouds(NamedTuple):
    """Where each point of a packed (N, D) tensor sits in a padded (B, P, D) batch."""
    batch: Tensor  # (N,) cloud of each point
    slot: Tensor  # (N,) position in its cloud (the points of a cloud keep their order)
    starts: Tensor  # (B,) index of each cloud's first point when the batch is sorted
    counts: Tensor  # (B,) points per cloud
    largest: int  # P
    ordered: bool  # batch sorted: a cloud's points are contiguous, from starts[b]
    regular: bool  # sorted and every cloud of P points: the padded batch is a view


def _clouds(points: List[Tensor], batches: List[Optional[Tensor]], names: List[str],
            batch_size: Optional[int]) -> Tuple[int, List[_Clouds]]:
    """The layout of each (points, batch) of a call, clouds numbered 0 .. max over all batch vectors
    (at least batch_size). Two host reads for all (cloud numbers and order, then the sizes), none
    when every batch is None."""
    given: List[Tensor] = []
    for b in batches:
        if b is not None and b.shape[0] > 0:
            given.append(torch.stack([b.min(), b.max(), (b[1:] < b[:-1]).any().to(torch.int64)]))
    stats: List[List[int]] = torch.stack(given).tolist() if len(given) > 0 else []
    num_clouds = 1 if batch_size is None else batch_size
    j = 0
    for i in range(len(batches)):
        b = batches[i]
        if b is not None and b.shape[0] > 0:
            if stats[j][0] < 0:
                raise ValueError(f"{names[i]} must hold cloud numbers >= 0, got {stats[j][0]}")
            num_clouds = max(num_clouds, stats[j][1] + 1)
            j += 1
    # Cloud sizes from each (sorted) batch vector's boundaries: a binary search per cloud, where a
    # scatter-add of ones would serialise on the few counters (0.3 ms for 262k points on an H200).
    bounds = torch.arange(num_clouds + 1, device=points[0].device)
    sorted_batches: List[Optional[Tensor]] = []
    counts: List[Tensor] = []
    j = 0
    for i in range(len(batches)):
        b, n, device = batches[i], points[i].shape[0], points[i].device
        if b is not None and n > 0:
            order: Optional[Tensor] = None
            if stats[j][2] != 0:
                order = torch.argsort(b, stable=True)  # stable: a cloud's points keep their order
                ptr = torch.searchsorted(b[order], bounds.to(device))
            else:
                ptr = torch.searchsorted(b, bounds.to(device))
            sorted_batches.append(order)
            counts.append(ptr[1:] - ptr[:-1])
            j += 1
        else:
            sorted_batches.append(None)
            counts.append(torch.zeros(num_clouds, dtype=torch.int64, device=device).index_fill_(
                0, torch.zeros(1, dtype=torch.int64, device=device), n))
    largest: List[int] = torch.stack([c.max() for c in counts]).tolist() if len(given) > 0 else [
        p.shape[0] for p in points]
    layouts: List[_Clouds] = []
    for i in range(len(batches)):
        n, device = points[i].shape[0], points[i].device
        starts = torch.cumsum(counts[i], 0) - counts[i]
        b = batches[i]
        if b is not None and n > 0:
            order = sorted_batches[i]
            if order is None:
                slot = torch.arange(n, device=device) - starts[b]
            else:
                slot = torch.empty_like(b).index_put_((order,), torch.arange(n, device=device) - starts[b[order]])
            ordered = order is None
            layouts.append(_Clouds(b, slot, starts, counts[i], largest[i], ordered,
                                   ordered and n == num_clouds * largest[i]))
        else:
            layouts.append(_Clouds(torch.zeros(n, dtype=torch.int64, device=device), torch.arange(n, device=device),
                                   starts, counts[i], largest[i], True, num_clouds == 1))
    return num_clouds, layouts


def _pad(values: Tensor, c: _Clouds, num_clouds: int) -> Tensor:
    """(N, F) per-point values -> (B, P, F), zeros in the padding; differentiable."""
    if c.regular:
        return values.view(num_clouds, c.largest, values.shape[1])
    padded = values.new_zeros(num_clouds, c.largest, values.shape[1])
    return padded.index_put((c.batch, c.slot), values)


def _unpad(padded: Tensor, c: _Clouds) -> Tensor:
    """(B, P, ...) -> (N, ...): each point's row; differentiable."""
    if c.regular:
        return padded.flatten(0, 1)
    return padded[c.batch, c.slot]


def _original_index(c: _Clouds, num_clouds: int) -> Tensor:
    """(B, P) original index of each padded slot, -1 in the padding."""
    index = torch.full((num_clouds, c.largest), -1, dtype=torch.int64, device=c.batch.device)
    return index.index_put((c.batch, c.slot), torch.arange(c.batch.shape[0], device=c.batch.device))


def _to_original(idx: Tensor, rows_cloud: Tensor, c: _Clouds, num_clouds: int) -> Tensor:
    """(R, K) slots in the clouds of c (-1: none) of rows in clouds rows_cloud (R,) -> indices
    into c's packed points, -1 kept."""
    if c.ordered:
        return torch.where(idx >= 0, c.starts[rows_cloud][:, None] + idx, idx)
    return torch.where(idx >= 0, _original_index(c, num_clouds)[rows_cloud[:, None], idx.clamp(min=0)], idx)


def _compact(cols: Tensor) -> Tensor:
    """(Ny, K) neighbour indices (-1: none) -> (2, E) edges, row 0 the query, in row order; one
    host read (the number of edges)."""
    flat = cols.reshape(-1)
    at = torch.nonzero(flat >= 0).squeeze(1)
    return torch.stack([torch.div(at, cols.shape[1], rounding_mode="floor"), flat[at]])


def _empty_edges(x: Tensor) -> Tensor:
    return torch.empty(2, 0, dtype=torch.int64, device=x.device)


def _check_count(name: str, value: int) -> None:
    if not torch.jit.is_scripting():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {repr(value)}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def _check_pair(x: Tensor, y: Tensor) -> None:
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must have the same point dimension D, got x {list(x.shape)} and y {list(y.shape)}")
    if x.dtype != y.dtype or x.device != y.device:
        raise ValueError(f"x and y must have the same dtype and device, got x {x.dtype} on {x.device} and "
                         f"y {y.dtype} on {y.device}")


def _prepare(x: Tensor, y: Tensor, batch_x: Optional[Tensor], batch_y: Optional[Tensor],
             batch_size: Optional[int], op: str) -> Tuple[int, _Clouds, _Clouds]:
    if not torch.jit.is_scripting():
        refuse_under_vmap(op, "the number of edges depends on the values; stack the samples as more clouds of the "
                          "batch vectors, or use the padded ops (knn_points, ball_query), which vmap batches")
    _check_batch(batch_x, x, "batch_x", "x")
    _check_batch(batch_y, y, "batch_y", "y")
    num_clouds, layouts = _clouds([x, y], [batch_x, batch_y], ["batch_x", "batch_y"], batch_size)
    return num_clouds, layouts[0], layouts[1]


def _lengths(c: _Clouds) -> Optional[Tensor]:
    """The search's lengths: none for a regular layout (every cloud full: no host check)."""
    return None if c.regular else c.counts


def _knn_cols(x: Tensor, y: Tensor, k: int, batch_x: Optional[Tensor], batch_y: Optional[Tensor], cosine: bool,
              batch_size: Optional[int], algorithm: str) -> Tensor:
    """(Ny, k) indices into x of each point of y's nearest points of its cloud, -1 for none."""
    if cosine:
        x = torch.nn.functional.normalize(x.to(torch.float64), dim=1, eps=0.0)  # 0 / 0: NaN, never matched
        y = torch.nn.functional.normalize(y.to(torch.float64), dim=1, eps=0.0)
    num_clouds, cx, cy = _prepare(x, y, batch_x, batch_y, batch_size, "knn")
    if cx.largest == 0:
        return torch.full((y.shape[0], k), -1, dtype=torch.int64, device=y.device)
    _, idx = torch.ops.pointops.knn_points(_pad(y, cy, num_clouds), _pad(x, cx, num_clouds), _lengths(cy),
                                           _lengths(cx), k, 2, algorithm)
    return _to_original(_unpad(idx, cy), cy.batch, cx, num_clouds)


def _radius_cols(x: Tensor, y: Tensor, r: float, batch_x: Optional[Tensor], batch_y: Optional[Tensor],
                 max_num_neighbors: int, batch_size: Optional[int], ignore_same_index: bool, algorithm: str) -> Tensor:
    """(Ny, max_num_neighbors (+ 1)) indices into x within r of each point of y, -1 for none."""
    num_clouds, cx, cy = _prepare(x, y, batch_x, batch_y, batch_size, "radius")
    if cx.largest == 0:
        return torch.full((y.shape[0], max_num_neighbors), -1, dtype=torch.int64, device=y.device)
    width = max_num_neighbors + 1 if ignore_same_index else max_num_neighbors
    _, idx = torch.ops.pointops.ball_query(_pad(y, cy, num_clouds), _pad(x, cx, num_clouds), _lengths(cy),
                                           _lengths(cx), width, float(r), algorithm)
    cols = _to_original(_unpad(idx, cy), cy.batch, cx, num_clouds)
    if ignore_same_index:  # the first max_num_neighbors others, in index order
        own = cols == torch.arange(cols.shape[0], device=cols.device)[:, None]
        # a row without the point itself may hold max_num_neighbors + 1 others: the last one goes
        last = torch.where(own.any(1), cols[:, max_num_neighbors], -1)
        cols = torch.cat([cols[:, :max_num_neighbors], last[:, None]], 1).masked_fill(own, -1)
    return cols


def _check_flow(flow: str) -> None:
    if flow != "source_to_target" and flow != "target_to_source":
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got '{flow}'")


# ---------------------------------------------------------------- torch_cluster's functions
def knn(x: Tensor, y: Tensor, k: int, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None,
        cosine: bool = False, num_workers: int = 1, batch_size: Optional[int] = None,
        algorithm: str = "auto") -> Tensor:
    """For each point of ``y`` the ``k`` nearest points of ``x`` in the same cloud (torch_cluster's
    ``knn``): squared Euclidean distance, or with ``cosine=True`` the cosine distance
    ``1 - x.y / (|x| |y|)``, on the CPU too (torch_cluster: CUDA only), ranked exactly: the points
    are normalised and searched in float64, where the squared distance of unit vectors,
    ``2 - 2 cos``, orders them as the cosine distance does. A zero vector has no direction: it is
    never a neighbour and has none.

    Returns:
        (2, E) int64 edges: row 0 indexes y (the query), row 1 indexes x (the neighbour). Rows come in
        increasing y order, each y's neighbours nearest first (ties: smaller index). A query whose
        cloud in x has fewer than k points gets fewer edges. Any k >= 1 (torch_cluster's CUDA: k <= 100).
    """
    if x.numel() == 0 or y.numel() == 0:
        return _empty_edges(x)
    x, y = _points(x, "x"), _points(y, "y")
    _check_pair(x, y)
    _check_count("k", k)
    return _compact(_knn_cols(x, y, k, batch_x, batch_y, cosine, batch_size, algorithm))


def knn_graph(x: Tensor, k: int, batch: Optional[Tensor] = None, loop: bool = False,
              flow: str = "source_to_target", cosine: bool = False, num_workers: int = 1,
              batch_size: Optional[int] = None, algorithm: str = "auto") -> Tensor:
    """The k-nearest-neighbour graph of the points ``x`` (torch_cluster's ``knn_graph``): each
    point's ``k`` nearest points of its cloud, as torch_cluster computes it: ``k + 1`` neighbours
    when ``loop`` is False, then the self edges dropped (so a point with more than ``k`` exact
    duplicates of smaller index keeps ``k + 1`` edges, as in torch_cluster).

    Returns:
        (2, E) int64 edges. ``flow="source_to_target"`` (default): row 0 the neighbour, row 1 the
        point (messages flow from the neighbours to the point); ``"target_to_source"``: swapped.
    """
    _check_flow(flow)
    if x.numel() == 0:
        return _empty_edges(x)
    x = _points(x, "x")
    _check_count("k", k)
    cols = _knn_cols(x, x, k if loop else k + 1, batch, batch, cosine, batch_size, algorithm)
    if not loop:
        cols = cols.masked_fill(cols == torch.arange(cols.shape[0], device=cols.device)[:, None], -1)
    edges = _compact(cols)  # row 0 the point, row 1 its neighbour
    return edges.flip(0) if flow == "source_to_target" else edges


def radius(x: Tensor, y: Tensor, r: float, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None,
           max_num_neighbors: int = 32, num_workers: int = 1, batch_size: Optional[int] = None,
           ignore_same_index: bool = False, algorithm: str = "auto") -> Tensor:
    """For each point of ``y`` the points of ``x`` in the same cloud whose squared distance is below
    ``r**2`` (torch_cluster's ``radius``), at most ``max_num_neighbors`` of them: the first ones in
    x's index order, as torch_cluster's CUDA kernel keeps them (its docstring says "picked randomly";
    its CPU k-d tree keeps another subset). ``ignore_same_index``: a point of y never has the point
    of x with its own index as a neighbour (``x`` and ``y`` the same points), and that point does not
    count towards ``max_num_neighbors``.

    Returns:
        (2, E) int64 edges: row 0 indexes y, row 1 indexes x; rows ascending, each row's neighbours in
        increasing x index.
    """
    if x.numel() == 0 or y.numel() == 0:
        return _empty_edges(x)
    x, y = _points(x, "x"), _points(y, "y")
    _check_pair(x, y)
    _check_count("max_num_neighbors", max_num_neighbors)
    _check_radius(r)
    return _compact(_radius_cols(x, y, r, batch_x, batch_y, max_num_neighbors, batch_size, ignore_same_index,
                                 algorithm))


def radius_graph(x: Tensor, r: float, batch: Optional[Tensor] = None, loop: bool = False,
                 max_num_neighbors: int = 32, flow: str = "source_to_target", num_workers: int = 1,
                 batch_size: Optional[int] = None, algorithm: str = "auto") -> Tensor:
    """The graph of the points of ``x`` closer than ``r`` within a cloud (torch_cluster's
    ``radius_graph``): :func:`radius` of ``x`` with itself, the point itself left out unless
    ``loop``, at most ``max_num_neighbors`` neighbours per point (the first in index order).

    Returns:
        (2, E) int64 edges, ``flow`` as :func:`knn_graph`.
    """
    _check_flow(flow)
    if x.numel() == 0:
        return _empty_edges(x)
    x = _points(x, "x")
    _check_count("max_num_neighbors", max_num_neighbors)
    _check_radius(r)
    edges = _compact(_radius_cols(x, x, r, batch, batch, max_num_neighbors, batch_size, not loop, algorithm))
    return edges.flip(0) if flow == "source_to_target" else edges


def _check_radius(r: float) -> None:
    if not r > 0 or r == float("inf"):  # NaN fails too
        raise ValueError(f"r (the radius) must be a finite number > 0, got {r}")


def _check_sorted(batch: Optional[Tensor], name: str) -> None:
    if batch is not None and batch.shape[0] > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError(f"'{name}' is not sorted")


def nearest(x: Tensor, y: Tensor, batch_x: Optional[Tensor] = None, batch_y: Optional[Tensor] = None) -> Tensor:
    """For each point of ``x`` the index of its nearest point of ``y`` in the same cloud
    (torch_cluster's ``nearest``): squared Euclidean distance, ties to the smaller index. As
    torch_cluster, ``batch_x`` and ``batch_y`` must be sorted and every cloud with points in x must
    have points in y (ValueError otherwise, with torch_cluster's messages). A point of x with NaN or
    infinite coordinates, or whose cloud's points of y are all non-finite, gets -1.

    Returns:
        (Nx,) int64 indices into y.
    """
    if not torch.jit.is_scripting():
        refuse_under_vmap("nearest", "stack the samples as more clouds of the batch vectors, or use "
                          "pointops.nearest_neighbor (padded clouds), which vmap batches")
    x, y = _points(x, "x"), _points(y, "y")
    _check_pair(x, y)
    _check_sorted(batch_x, "batch_x")
    _check_sorted(batch_y, "batch_y")
    if x.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    _check_batch(batch_x, x, "batch_x", "x")
    _check_batch(batch_y, y, "batch_y", "y")
    num_clouds, layouts = _clouds([x, y], [batch_x, batch_y], ["batch_x", "batch_y"], None)
    cx, cy = layouts[0], layouts[1]
    if bool(((cx.counts > 0) & (cy.counts == 0)).any()):
        raise ValueError("Some batch indices occur in 'batch_x' that do not occur in 'batch_y'")
    _, idx = torch.ops.pointops.knn_points(_pad(x, cx, num_clouds), _pad(y, cy, num_clouds), _lengths(cx),
                                           _lengths(cy), 1, 2, "auto")
    return _to_original(_unpad(idx, cx), cx.batch, cy, num_clouds)[:, 0]
