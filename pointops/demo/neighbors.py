"""Demo: a PointNet++ set-abstraction step (farthest point sampling -> ball query -> grouping) and a
feature-propagation step (knn_interpolate) on generated clouds, timed against the same job written
with plain torch (a farthest-point loop, cdist masks, gathers), and checked against it.
"""
from __future__ import annotations

import pathlib

import torch

from ..neighbors import ball_query, knn_gather, sample_farthest_points
from ..sampling_packed import knn_interpolate
from ._common import time_ms


def _clouds(batch: int, points: int, device: torch.device) -> torch.Tensor:
    """Points on the surfaces of a few random boxes per cloud (a scene-like, uneven density)."""
    g = torch.Generator().manual_seed(7)
    centres = torch.rand(batch, 6, 1, 3, generator=g) * 2 - 1
    sizes = torch.rand(batch, 6, 1, 3, generator=g) * 0.4 + 0.1
    u = torch.rand(batch, 6, points // 6, 3, generator=g) * 2 - 1
    face = torch.randint(0, 3, (batch, 6, points // 6, 1), generator=g)
    sign = torch.randint(0, 2, (batch, 6, points // 6, 1), generator=g) * 2 - 1
    u = u.scatter(3, face, sign.float())  # one coordinate on a face of the cube
    return (centres + sizes * u).reshape(batch, -1, 3).to(device)


def _torch_set_abstraction(points, centres_k, K, radius):
    """The same job with torch ops: a farthest-point loop, a cdist mask keeping the first K points
    inside the radius in index order, a gather."""
    B, N, _ = points.shape
    idx = torch.zeros(B, centres_k, dtype=torch.int64, device=points.device)
    mind = torch.full((B, N), float("inf"), device=points.device)
    rows = torch.arange(B, device=points.device)
    for k in range(1, centres_k):
        mind = torch.minimum(mind, ((points - points[rows, idx[:, k - 1]][:, None]) ** 2).sum(-1))
        idx[:, k] = mind.argmax(1)
    centres = points[rows[:, None], idx]
    inside = torch.cdist(centres, points).pow(2) < radius * radius
    order = torch.where(inside, torch.arange(N, device=points.device), N)
    first = order.topk(K, dim=2, largest=False).values.sort(dim=2).values
    neighbours = torch.where(first < N, first, -1)
    groups = points[rows[:, None, None], neighbours.clamp(min=0)] * (neighbours >= 0)[..., None]
    return idx, neighbours, groups - centres[:, :, None]


def demo_neighbors(device: torch.device, outdir: pathlib.Path | None, batch: int = 8, points: int = 16384,
                   centres: int = 1024, K: int = 32, radius: float = 0.1) -> None:
    device = torch.device(device)
    cloud = _clouds(batch, points, device)
    print(f"[neighbors] set abstraction on {batch} clouds of {cloud.shape[1]} points: farthest point sampling to "
          f"{centres} centres, ball query (K={K}, r={radius}), grouping; then feature propagation back")

    def pointops_way():
        centres_xyz, idx = sample_farthest_points(cloud, K=centres)
        _, neighbours, groups = ball_query(centres_xyz, cloud, K=K, radius=radius)
        return idx, neighbours, groups - centres_xyz[:, :, None]

    (idx, neighbours, groups), t_ours = time_ms(pointops_way, device, repeat=5, per_call=True)
    (ref_idx, ref_neighbours, ref_groups), t_torch = time_ms(
        lambda: _torch_set_abstraction(cloud, centres, K, radius), device, repeat=2, per_call=True)
    same_centres = torch.equal(idx, ref_idx)
    # The torch mask uses cdist's matrix-product form: a point on the sphere may fall on either side.
    agree = (neighbours == ref_neighbours).double().mean().item()
    filled = (neighbours >= 0).sum(-1).double().mean().item()
    print(f"[neighbors] pointops {t_ours:8.2f} ms   torch {t_torch:8.2f} ms   ({t_torch / t_ours:.0f}x); "
          f"same centres as torch: {same_centres}; same neighbours: {100 * agree:.3f}%; "
          f"{filled:.1f} of {K} neighbours per centre on average")

    # Feature propagation: per-centre features (here the mean offset of each group) back to all points.
    features = groups.sum(2) / (neighbours >= 0).sum(-1, keepdim=True).clamp(min=1)
    centres_xyz = knn_gather(cloud, idx[:, :, None])[:, :, 0]
    rows = torch.arange(batch, device=device)
    batch_x = rows.repeat_interleave(centres)
    batch_y = rows.repeat_interleave(cloud.shape[1])
    args = (features.reshape(-1, 3), centres_xyz.reshape(-1, 3), cloud.reshape(-1, 3), batch_x, batch_y)
    upsampled, t_up = time_ms(lambda: knn_interpolate(*args, k=3), device, repeat=5, per_call=True)
    print(f"[neighbors] knn_interpolate of {centres} centres back to {cloud.shape[1]} points per cloud (k=3): "
          f"{t_up:.2f} ms; output {tuple(upsampled.shape)}, finite: {bool(torch.isfinite(upsampled).all())}")
