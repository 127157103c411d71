"""Sampling, pooling and interpolation of packed clouds: torch_cluster's :func:`fps` and
:func:`grid_cluster`, torch_geometric's :func:`knn_interpolate`. Packed clouds, the ``batch``
vector and torch_cluster compatibility (signatures, ``torch.jit.script``) as in
:mod:`pointops.neighbors_packed`.
"""
from typing import List, Optional, Union

import torch
from torch import Tensor

from ._transforms import refuse_under_vmap
from .neighbors_packed import (_check_batch, _check_count, _clouds, _lengths, _pad, _points, _to_original,
                               _unpad)

__all__ = ["fps", "grid_cluster", "knn_interpolate"]


def _ptr_batch(ptr: Union[Tensor, List[int]], src: Tensor) -> Tensor:
    """The batch vector of CSR boundaries ``ptr`` (B + 1,): 0 = ptr[0] <= ptr[1] <= ... = N."""
    if isinstance(ptr, list):
        ptr_t = torch.tensor(ptr, dtype=torch.int64, device=src.device)
    else:
        ptr_t = ptr.to(device=src.device, dtype=torch.int64)
    if ptr_t.dim() != 1 or ptr_t.shape[0] < 1:
        raise ValueError(f"ptr must be a 1-D tensor or list of B + 1 boundaries, got shape {list(ptr_t.shape)}")
    counts = ptr_t[1:] - ptr_t[:-1]
    values: List[int] = ptr_t.tolist()
    if values[0] != 0 or values[-1] != src.shape[0] or bool((counts < 0).any()):
        raise ValueError(f"ptr must run from 0 to the number of points ({src.shape[0]}) without decreasing, "
                         f"got {values}")
    return torch.repeat_interleave(torch.arange(counts.shape[0], device=src.device), counts,
                                   output_size=src.shape[0])


def fps(src: Tensor, batch: Optional[Tensor] = None, ratio: Optional[Union[Tensor, float]] = None,
        random_start: bool = True, batch_size: Optional[int] = None,
        ptr: Optional[Union[Tensor, List[int]]] = None, generator: Optional[torch.Generator] = None) -> Tensor:
    """Farthest point sampling of packed clouds (torch_cluster's ``fps``): ``ceil(ratio * n)``
    points of a cloud of n (the product in float32, as torch_cluster's CPU kernel computes it),
    each cloud starting at a uniformly drawn point (``random_start=True``, the default; drawn from
    ``generator``, pointops' extra) or at its first point, then repeatedly the point farthest from
    those taken (squared Euclidean distance; ties: the smaller index).

    Args:
        src: (N, D) points (or (N,)). batch: (N,) cloud numbers, or ``ptr``: the clouds as CSR
            boundaries, a (B + 1,) tensor or list (torch_cluster's ``ptr``; takes precedence).
        ratio: a float in (0, 1] (default 0.5), or a tensor: one ratio () / (1,) or one per cloud (B,).
        batch_size: the number of clouds, when known (saves nothing here; accepted).

    Unlike torch_cluster a point is never taken twice (a cloud with fewer distinct points goes on
    with the duplicates, in index order), points with NaN or infinite coordinates are never taken,
    and distances are exact at any scale (torch_cluster caps them at 5e4).

    Returns:
        (S,) int64 indices into src: cloud 0's samples in the order taken, then cloud 1's, ...
    """
    src = _points(src, "src")
    if not torch.jit.is_scripting():
        if isinstance(ratio, int) and not isinstance(ratio, bool):
            ratio = float(ratio)  # fps(x, ratio=1)
        if ratio is not None and not isinstance(ratio, (float, Tensor)):
            raise TypeError(f"ratio must be a float or a tensor, got {type(ratio).__name__} {repr(ratio)}")
        refuse_under_vmap("fps", "clouds with NaN points have fewer samples; stack the samples as more clouds of the "
                          "batch vector, or use pointops.sample_farthest_points (padded clouds), which vmap batches")
    if ratio is None:
        ratio_t = torch.tensor(0.5, dtype=torch.float32, device=src.device)
    elif isinstance(ratio, float):
        if not (ratio > 0 and ratio <= 1):
            raise ValueError(f"ratio must be a number in (0, 1], got {ratio}")
        ratio_t = torch.tensor(ratio, dtype=torch.float32, device=src.device)
    else:
        ratio_t = ratio.to(src.device)
        if not ratio_t.is_floating_point():
            raise TypeError(f"ratio must be a float or a floating tensor, got {ratio_t.dtype}")
    if src.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=src.device)
    if ptr is not None:
        batch = _ptr_batch(ptr, src)
    _check_batch(batch, src, "batch", "src")
    num_clouds, layouts = _clouds([src], [batch], ["batch"], batch_size)
    c = layouts[0]
    if ratio_t.dim() > 1 or (ratio_t.dim() == 1 and ratio_t.shape[0] != 1 and ratio_t.shape[0] != num_clouds):
        raise ValueError(f"ratio must be a float, a tensor () or (1,), or one ratio per cloud ({num_clouds},), "
                         f"got shape {list(ratio_t.shape)}")
    if ratio_t.dim() > 0 or not isinstance(ratio, float):
        if bool(((ratio_t <= 0) | (ratio_t > 1) | torch.isnan(ratio_t)).any()):
            raise ValueError(f"ratio must hold numbers in (0, 1], got {ratio_t}")
    samples = torch.ceil(c.counts.to(torch.float32) * ratio_t).to(torch.int64)
    start: Optional[Tensor] = None
    if random_start:
        draw_on = src.device
        if not torch.jit.is_scripting():  # TorchScript's Generator has no .device: there it must be src's
            if generator is not None:
                draw_on = generator.device
        uniform = torch.rand(num_clouds, generator=generator, device=draw_on, dtype=torch.float64).to(src.device)
        start = (uniform * c.counts.to(torch.float64)).floor().to(torch.int64)
    max_samples = int(samples.max())
    idx = torch.ops.pointops.sample_farthest_points(_pad(src, c, num_clouds), _lengths(c), samples, max_samples,
                                                    start)
    # (B, S) slots -> indices into src, cloud after cloud; -1 past a cloud's samples
    flat = _to_original(idx, torch.arange(num_clouds, device=src.device), c, num_clouds).reshape(-1)
    return flat[flat >= 0]


def grid_cluster(pos: Tensor, size: Tensor, start: Optional[Tensor] = None, end: Optional[Tensor] = None) -> Tensor:
    """Voxel grid pooling (torch_cluster's ``grid_cluster``): the number of the cell of a grid of
    ``size`` (D,) cells, from ``start`` (default: the points' minimum) to ``end`` (default: their
    maximum), that holds each point: ``c_d = trunc((pos_d - start_d) / size_d)``, numbered
    ``sum_d c_d * prod_{e<d} (trunc((end_e - start_e) / size_e) + 1)``. The same ATen operations as
    torch_cluster's CPU kernel, so the same numbers for every dtype (integers too).

    Returns:
        (N,) int64 cell numbers (not compacted: :func:`pointops.voxelize` numbers occupied voxels).
    """
    pos = pos.view(pos.shape[0], -1) if pos.dim() != 2 else pos
    if size.numel() != pos.shape[1]:
        raise ValueError(f"size must have one entry per dimension ({pos.shape[1]}), got {size.numel()}")
    if pos.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=pos.device)
    start_t = pos.min(0)[0] if start is None else start
    end_t = pos.max(0)[0] if end is None else end
    if start_t.numel() != pos.shape[1] or end_t.numel() != pos.shape[1]:
        raise ValueError(f"start and end must have one entry per dimension ({pos.shape[1]}), got "
                         f"{start_t.numel()} and {end_t.numel()}")
    num_voxels = (end_t - start_t).true_divide(size).to(torch.int64) + 1
    num_voxels = torch.cat([torch.ones(1, dtype=torch.int64, device=pos.device), num_voxels.cumprod(0)])[:size.numel()]
    cells = (pos - start_t.view(1, -1)).true_divide(size.view(1, -1)).to(torch.int64)
    return (cells * num_voxels.view(1, -1)).sum(1)


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
    pos_x, pos_y = _points(pos_x, "pos_x"), _points(pos_y, "pos_y")
    if pos_x.shape[1] != pos_y.shape[1]:
        raise ValueError(f"pos_x and pos_y must have the same point dimension D, got pos_x {list(pos_x.shape)} "
                         f"and pos_y {list(pos_y.shape)}")
    if x.dim() != 2 or x.shape[0] != pos_x.shape[0]:
        raise ValueError(f"x must be a 2-D tensor (Nx, F) with Nx = {pos_x.shape[0]} (the points of pos_x), "
                         f"got shape {list(x.shape)}")
    _check_count("k", k)
    _check_batch(batch_x, pos_x, "batch_x", "pos_x")
    _check_batch(batch_y, pos_y, "batch_y", "pos_y")
    num_clouds, layouts = _clouds([pos_x, pos_y], [batch_x, batch_y], ["batch_x", "batch_y"], None)
    cx, cy = layouts[0], layouts[1]
    if cx.largest == 0 or pos_y.shape[0] == 0:  # no point of pos_x at all, or nothing to interpolate at
        return x.new_zeros(pos_y.shape[0], x.shape[1])
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    dists, idx = torch.ops.pointops.knn_points(_pad(pos_y, cy, num_clouds), _pad(pos_x, cx, num_clouds),
                                               _lengths(cy), _lengths(cx), k, 2, "auto")
    dists, idx = _unpad(dists, cy), _to_original(_unpad(idx, cy), cy.batch, cx, num_clouds)  # (Ny, k)
    weights = (1.0 / dists.to(compute).clamp(min=1e-16)).masked_fill(idx < 0, 0.0)
    features = x.to(compute)[idx.clamp(min=0)].masked_fill((idx < 0)[..., None], 0.0)  # (Ny, k, F)
    total = weights.sum(1, keepdim=True)
    y = (weights.unsqueeze(-1) * features).sum(1) / torch.where(total > 0, total, torch.ones_like(total))
    return y.to(x.dtype)
