"""Demo: fit one point cloud to another by gradient descent on the Chamfer distance, then an exact
Chamfer between two large clouds by the spatial-grid search, timed against brute force.

Generates its own data (a trefoil-knot tube as the target, a Gaussian blob as the start; uniform
points in the unit cube for the large Chamfer), prints the loss curve and per-step time, and with
matplotlib saves a before/after picture.
"""
from __future__ import annotations

import math
import pathlib
import time

import torch

from ..chamfer import chamfer, fscore
from ..chamfer_loss import chamfer_distance
from ._common import pyplot, save_figure, sync, time_ms


def trefoil_tube(n: int, seed: int = 0, radius: float = 0.25) -> torch.Tensor:
    """(n, 3) points on a tube of `radius` around a trefoil knot, scaled to about [-1, 1]^3."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g, dtype=torch.float64) * 2 * math.pi
    phi = torch.rand(n, generator=g, dtype=torch.float64) * 2 * math.pi
    curve = torch.stack([torch.sin(t) + 2 * torch.sin(2 * t), torch.cos(t) - 2 * torch.cos(2 * t), -torch.sin(3 * t)], 1)
    tangent = torch.stack([torch.cos(t) + 4 * torch.cos(2 * t), -torch.sin(t) + 4 * torch.sin(2 * t), -3 * torch.cos(3 * t)], 1)
    tangent = tangent / tangent.norm(dim=1, keepdim=True)
    normal = torch.linalg.cross(tangent, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64).expand_as(tangent))
    normal = normal / normal.norm(dim=1, keepdim=True)
    binormal = torch.linalg.cross(tangent, normal)
    points = curve + radius * (torch.cos(phi)[:, None] * normal + torch.sin(phi)[:, None] * binormal)
    return (points / 3.0).float()


def demo_chamfer(device: torch.device, outdir: pathlib.Path | None, steps: int = 200, points: int = 8192,
                 batch: int = 4) -> None:
    device = torch.device(device)
    print(f"[chamfer] fit {batch} clouds of {points} points by {steps} Adam steps on {device}")
    target = torch.stack([trefoil_tube(points, seed=s) for s in range(batch)]).to(device)
    g = torch.Generator().manual_seed(123)
    source = (0.3 * torch.randn(batch, points, 3, generator=g)).to(device).requires_grad_()
    start = source.detach().clone()
    optimizer = torch.optim.Adam([source], lr=0.02)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    step_times = []
    for step in range(steps + 1):
        sync(device)
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss, _ = chamfer_distance(source, target)
        if step < steps:
            loss.backward()
            optimizer.step()
            scheduler.step()
        sync(device)
        step_times.append(time.perf_counter() - t0)
        if step % max(1, steps // 10) == 0 or step == steps:
            print(f"[chamfer] step {step:4d}  chamfer {loss.item():.6f}  step time {1e3 * step_times[-1]:7.2f} ms")
    with torch.no_grad():
        dist1, dist2, _, _ = chamfer(source, target)
        f, p, r = fscore(dist1, dist2, threshold=0.02**2)
    warm = sorted(step_times[5:]) or step_times
    print(f"[chamfer] median step (forward + backward + Adam): {1e3 * warm[len(warm) // 2]:.2f} ms; "
          f"F-score@2cm {f.mean():.3f} (precision {p.mean():.3f}, recall {r.mean():.3f})")
    if outdir is not None:
        path = pathlib.Path(outdir) / "chamfer_fit.png"
        _save_picture(start[0].cpu(), source.detach()[0].cpu(), target[0].cpu(), path)


def demo_large_chamfer(device: torch.device, points: int | None = None, subset: int = 20_000) -> None:
    """Exact Chamfer (both directions) between two uniform clouds of `points` points (default:
    1,000,000 on CUDA, 100,000 on the CPU): ``chamfer(x, y, algorithm="grid")`` against
    ``algorithm="brute"``, checked bit for bit. On the CPU brute force is timed on the first `subset`
    queries of x against all of y and scaled by points / subset (both directions' cost is linear in
    the size of x), which keeps the demo short; the check then covers that subset."""
    device = torch.device(device)
    if points is None:
        points = 1_000_000 if device.type == "cuda" else 100_000
    g = torch.Generator().manual_seed(2024)
    x = torch.rand(1, points, 3, generator=g).to(device)
    y = torch.rand(1, points, 3, generator=g).to(device)
    print(f"[large chamfer] exact Chamfer, both directions, between two uniform clouds of {points:,} points in "
          f"the unit cube on {device}: spatial grid (algorithm=\"grid\") against brute force (algorithm=\"brute\")")
    repeat = 10 if device.type == "cuda" else 5
    grid, t_grid = time_ms(lambda: chamfer(x, y, algorithm="grid"), device, repeat=repeat, per_call=True)
    sampled = device.type != "cuda" and subset < points
    if not sampled:
        brute, t_brute = time_ms(lambda: chamfer(x, y, algorithm="brute"), device, repeat=3, per_call=True)
        same = all(torch.equal(a, b) for a, b in zip(grid, brute))
        how, checked = "median of 3", f"all {points:,} points of both clouds"
    else:
        x_part = x[:, :subset]
        sync(device)
        t0 = time.perf_counter()
        brute = chamfer(x_part, y, algorithm="brute")
        sync(device)
        t_part = 1e3 * (time.perf_counter() - t0)
        t_brute = t_part * points / subset
        # the full grid search's rows for x's first `subset` points, and the grid on the same
        # (subset, y) pair in both directions, against brute force
        same = (torch.equal(grid.dist1[:, :subset], brute.dist1) and torch.equal(grid.idx1[:, :subset], brute.idx1)
                and all(torch.equal(a, b) for a, b in zip(chamfer(x_part, y, algorithm="grid"), brute)))
        how = (f"estimated: {t_part:,.0f} ms for the first {subset:,} of x's {points:,} points against all of y, "
               f"scaled by {points:,} / {subset:,}")
        checked = f"x's first {subset:,} points against y, and y against those points"
    print(f"[large chamfer] grid {t_grid:.2f} ms (median of {repeat}); brute force {t_brute:,.2f} ms ({how}); "
          f"speed-up {t_brute / t_grid:.0f}x")
    print(f"[large chamfer] grid equals brute force bit for bit (torch.equal on dist and idx, {checked}): {same}")


def _save_picture(start, fitted, target, path: pathlib.Path) -> None:
    plt = pyplot("[chamfer]", path)
    if plt is None:
        return
    fig = plt.figure(figsize=(12, 4))
    for i, (title, cloud) in enumerate([("start", start), ("after fitting", fitted), ("target", target)]):
        ax = fig.add_subplot(1, 3, i + 1, projection="3d")
        ax.scatter(cloud[:, 0], cloud[:, 1], cloud[:, 2], s=0.5, c=cloud[:, 2], cmap="viridis")
        ax.set_title(title)
        ax.set_xlim(-1.1, 1.1), ax.set_ylim(-1.1, 1.1), ax.set_zlim(-1.1, 1.1)
        ax.set_axis_off()
    fig.tight_layout()
    save_figure(fig, path, "[chamfer]", dpi=110)
