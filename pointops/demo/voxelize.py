"""Demo: ray-cast a LiDAR scan of a small street scene, voxelize it, print counts and timings,
and (with matplotlib) save a bird's-eye view of the occupied voxels. Generates its own data."""
from __future__ import annotations

import math
import pathlib

import torch

from ..voxelize import voxel_features, voxelize
from ._common import pyplot, save_figure, time_ms

POINT_RANGE = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]
SENSOR_HEIGHT = 1.8


def _street_boxes() -> torch.Tensor:
    """Axis-aligned boxes (x0, y0, z0, x1, y1, z1) in the sensor frame: two rows of buildings along
    the street, parked cars, a truck, poles."""
    ground = -SENSOR_HEIGHT
    boxes = []
    for x in range(-60, 60, 14):  # buildings, 12 m deep, with gaps between them
        boxes.append([x, 11.0, ground, x + 11, 23.0, ground + 9 + (x % 5)])
        boxes.append([x + 5, -24.0, ground, x + 16, -12.0, ground + 7 + (x % 3)])
    for x in (-30.0, -21.0, -9.0, 4.0, 15.0, 27.0, 38.0):  # parked cars on both sides
        boxes.append([x, 6.5, ground, x + 4.5, 8.4, ground + 1.5])
        boxes.append([x + 3, -8.2, ground, x + 7.5, -6.3, ground + 1.5])
    boxes.append([8.0, -2.8, ground, 16.0, -0.3, ground + 3.6])  # a truck in the other lane
    for x in range(-48, 48, 12):  # street-light poles
        boxes.append([x, 9.6, ground, x + 0.3, 9.9, ground + 6])
    return torch.tensor(boxes, dtype=torch.float64)


def lidar_scan(beams: int = 64, azimuth_steps: int = 2048, seed: int = 0) -> torch.Tensor:
    """(N, 4) float32 points x, y, z, intensity from a spinning `beams`-beam sensor at the origin.

    Each ray hits the nearest of the ground plane and the boxes (slab test), within 100 m; rays
    that hit nothing (the sky) return no point. 2 cm range noise, intensity by surface type.
    """
    g = torch.Generator().manual_seed(seed)
    elevation = torch.deg2rad(torch.linspace(-25.0, 3.0, beams, dtype=torch.float64))
    azimuth = torch.linspace(0, 2 * math.pi, azimuth_steps + 1, dtype=torch.float64)[:-1]
    el, az = torch.meshgrid(elevation, azimuth, indexing="ij")
    dirs = torch.stack([el.cos() * az.cos(), el.cos() * az.sin(), el.sin()], -1).reshape(-1, 3)
    inv = 1.0 / torch.where(dirs.abs() < 1e-12, torch.full_like(dirs, 1e-12), dirs)

    t_ground = torch.where(dirs[:, 2] < 0, -SENSOR_HEIGHT / dirs[:, 2], torch.full_like(dirs[:, 2], math.inf))
    boxes = _street_boxes()
    t0 = (boxes[None, :, :3] - 0.0) * inv[:, None, :]  # (rays, boxes, 3)
    t1 = (boxes[None, :, 3:] - 0.0) * inv[:, None, :]
    t_near = torch.minimum(t0, t1).amax(-1)
    t_far = torch.maximum(t0, t1).amin(-1)
    hit = (t_near <= t_far) & (t_near > 0)
    t_box = torch.where(hit, t_near, torch.full_like(t_near, math.inf)).amin(-1)
    t = torch.minimum(t_ground, t_box)
    keep = t < 100.0
    t = t[keep] + torch.randn(int(keep.sum()), generator=g, dtype=torch.float64) * 0.02
    xyz = dirs[keep] * t[:, None]
    on_ground = (t_ground[keep] <= t_box[keep])
    intensity = torch.where(on_ground, 0.15, 0.6) + torch.rand(xyz.shape[0], generator=g, dtype=torch.float64) * 0.2
    return torch.cat([xyz, intensity[:, None]], 1).float()


def demo_voxelize(device: torch.device, outdir: pathlib.Path | None) -> None:
    device = torch.device(device)
    points = lidar_scan().to(device)
    print(f"[voxelize] ray-cast street scan: {points.shape[0]:,} points (64 beams x 2048 azimuths) on {device}")
    for voxel_size in ([0.2, 0.2, 0.2], [0.075, 0.075, 0.2]):
        out, ms = time_ms(lambda: voxelize(points, voxel_size, POINT_RANGE, 10, 160_000), device)
        _, ms_padded = time_ms(lambda: voxelize(points, voxel_size, POINT_RANGE, 10, 160_000, padded=True), device)
        in_range = int((out.point_to_voxel >= 0).sum())
        print(f"[voxelize] voxel {voxel_size}: {out.voxels.shape[0]:,} voxels, {in_range:,} points in range, "
              f"{int(out.num_points.sum()):,} kept (<= 10 per voxel), largest voxel "
              f"{int(torch.bincount(out.point_to_voxel[out.point_to_voxel >= 0]).max())} points; "
              f"{ms:.3f} ms (padded, no sync: {ms_padded:.3f} ms)")
    dyn, ms = time_ms(lambda: voxel_features(points, [0.2, 0.2, 0.2], POINT_RANGE, "max"), device)
    print(f"[voxelize] voxel_features(max), 0.2 m: {dyn.features.shape[0]:,} voxels in {ms:.3f} ms")
    again = voxelize(points, [0.2, 0.2, 0.2], POINT_RANGE, 10, 160_000)
    first = voxelize(points, [0.2, 0.2, 0.2], POINT_RANGE, 10, 160_000)
    same = all(torch.equal(a, b) for a, b in zip(first[:5], again[:5]))
    print(f"[voxelize] two runs bitwise identical: {same}")

    if outdir is None:
        return
    path = pathlib.Path(outdir) / "voxelize_bev.png"
    plt = pyplot("[voxelize]", path)
    if plt is None:
        return
    coords = dyn.coords.cpu()  # (z, y, x) cells of every occupied 0.2 m voxel
    top = dyn.features[:, 2].float().cpu()  # highest point of the voxel (max reduction of z)
    x = coords[:, 2].float() * 0.2 + POINT_RANGE[0] + 0.1
    y = coords[:, 1].float() * 0.2 + POINT_RANGE[1] + 0.1
    order = torch.argsort(top)  # tall voxels drawn last, on top
    fig, ax = plt.subplots(figsize=(9, 9), dpi=120)
    sc = ax.scatter(x[order], y[order], c=top[order], s=1.0, marker="s", cmap="viridis", linewidths=0)
    ax.set_aspect("equal")
    ax.set_xlim(POINT_RANGE[0], POINT_RANGE[3])
    ax.set_ylim(POINT_RANGE[1], POINT_RANGE[4])
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(f"occupied 0.2 m voxels (bird's-eye view), {coords.shape[0]:,} voxels")
    fig.colorbar(sc, ax=ax, shrink=0.8, label="highest point in voxel, z (m)")
    save_figure(fig, path, "[voxelize]", bbox_inches="tight")
