"""``python -m pointops demo``: one module per op family, each generating its own data, printing
results and timings and (with matplotlib) saving a picture.

* :mod:`.chamfer`: fit a point cloud to another by gradient descent on the Chamfer distance; then
  an exact Chamfer between two large uniform clouds (1M x 1M on CUDA, 100k x 100k on the CPU) by
  the spatial-grid search, timed against brute force and checked against it bit for bit.
* :mod:`.voxelize`: voxelize a ray-cast LiDAR street scan.
* :mod:`.particle_sum`: the Gaussian field of 50 particles on three planes through the unit cube,
  against the torch chunked way (cdist + exp + matmul).
* :mod:`.strided`: a small MLP written only with pointops.strided ops on non-contiguous views,
  checked against torch, with this machine's matmul and bandwidth figures.
* :mod:`.neighbors`: a PointNet++ set-abstraction step (farthest point sampling, ball query,
  grouping) and feature propagation (knn_interpolate), against the same job in plain torch.
"""
from __future__ import annotations

import pathlib

import torch

from .chamfer import demo_chamfer, demo_large_chamfer
from .neighbors import demo_neighbors
from .particle_sum import demo_particle_sum
from .strided import demo_strided
from .voxelize import demo_voxelize

__all__ = ["run_demo", "demo_chamfer", "demo_large_chamfer", "demo_voxelize", "demo_particle_sum", "demo_strided",
           "demo_neighbors"]


def run_demo(device: torch.device | str, outdir: pathlib.Path | str | None = None, steps: int = 200,
             points: int = 8192) -> None:
    """Run the demos in order on `device`; pictures go to `outdir` (None: no pictures).
    `steps` and `points` size the Chamfer fit (the large Chamfer has its own, per-device size)."""
    device = torch.device(device)
    outdir = None if outdir is None else pathlib.Path(outdir)
    demo_chamfer(device, outdir, steps=steps, points=points)
    demo_large_chamfer(device)
    demo_voxelize(device, outdir)
    demo_particle_sum(device, outdir)
    demo_strided(device, outdir)
    if device.type == "cuda":
        demo_neighbors(device, outdir)
    else:  # the torch way's farthest-point loop is slow on a small CPU: a smaller job
        demo_neighbors(device, outdir, batch=4, points=8192, centres=512)
