"""Spatial-grid search (algorithm="grid") against brute force (algorithm="brute"), both
timed in the same run on the same inputs: chamfer (both directions), knn_points, ball_query, on
uniform unit-cube clouds, a real LiDAR scan against itself after a small rigid motion, and an
adversarial cloud (every point in a few cells). Correctness first: the grid result equals brute
force bit for bit (on a sample of the queries where brute force over all of them would take
minutes). CUDA events on the GPU, perf_counter on the CPU; median of repeats. On a shared CPU
machine set OMP_NUM_THREADS=1: two OpenMP threads on a core that another process holds wait in
scheduler slices (~8 ms), which swamps millisecond timings.

    python benchmarks/bench_grid.py              # the target sizes (GPU) or the CPU ones
    python benchmarks/bench_grid.py --crossover  # where "auto" should switch (grid_pays_cpu / _cuda)
"""
import argparse
import math
import os
from pathlib import Path

import torch

import pointops
from common import markdown_table, time_ms

SAMPLE = 2048  # queries checked against brute force when the whole brute-force search is too slow


def uniform(B, N, seed, device, D=3):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(B, N, D, generator=g, device=device)


def clustered(B, N, seed, device):
    """Adversarial: every point but 10 in one cluster 1e-4 wide; the 10 spread over the unit cube
    set the box, so the cell size comes out far larger than the cluster and one cell holds it."""
    p = 0.5 + 1e-4 * uniform(B, N, seed, device)
    p[:, :10] = uniform(B, 10, seed + 100, device)
    return p


def lidar(device):
    """The nuScenes sweep (x, y, z) and the same scan after a 1 degree yaw and a 0.3 m shift; None if absent."""
    import numpy as np
    repo = Path(__file__).resolve().parents[1]  # the data places tests/conftest.py's data_dir looks in
    roots = [os.environ.get("POINTOPS_DATA"), repo.parent / "shared" / "data", repo / ".data"]
    paths = [Path(r) / "lidar" / "ff9eff4389a740848f9a56ad749a4ae8.bin" for r in roots if r]
    path = next((p for p in paths if p.exists()), None)
    if path is None:
        return None
    y = torch.from_numpy(np.fromfile(path, np.float16).reshape(-1, 5)[:, :3].astype(np.float32))
    a = math.radians(1.0)
    rot = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0], [0.0, 0.0, 1.0]])
    x = y @ rot.T + torch.tensor([0.3, -0.1, 0.02])
    return x[None].contiguous().to(device), y[None].contiguous().to(device)


def check_same(got, want):
    for g, w in zip(got, want):
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
        else:
            assert torch.equal(g, w)


def check_chamfer(x, y, full_brute):
    """grid == brute, bitwise: over everything, or (full_brute False) over SAMPLE queries of each direction."""
    grid = pointops.chamfer(x, y, algorithm="grid")
    if full_brute:
        check_same(grid, pointops.chamfer(x, y, algorithm="brute"))
        return
    d1, i1 = pointops.nearest_neighbor(x[:, :SAMPLE], y, algorithm="brute")
    d2, i2 = pointops.nearest_neighbor(y[:, :SAMPLE], x, algorithm="brute")
    check_same((grid.dist1[:, :SAMPLE], grid.idx1[:, :SAMPLE], grid.dist2[:, :SAMPLE], grid.idx2[:, :SAMPLE]),
               (d1, i1, d2, i2))


def timer(cuda):
    def t(fn, slow=False):
        return time_ms(fn, warmup=1 if slow else 3, repeat=3 if slow else 10, cuda=cuda)
    return t


def fmt(ms):
    return f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


def chamfer_rows(cases, device, brute_limit):
    """cases: (label, x, y). Brute force is timed up to brute_limit query x reference pairs; beyond it
    estimated from the largest timed case of the same label prefix by N * M scaling."""
    t = timer(device == "cuda")
    rows, rate = [], None
    for label, x, y in cases:
        pairs = x.shape[0] * x.shape[1] * y.shape[1]
        full = pairs <= brute_limit
        check_chamfer(x, y, full)
        grid_ms = t(lambda: pointops.chamfer(x, y, algorithm="grid"), slow=device == "cpu")
        if full:
            brute_ms = t(lambda: pointops.chamfer(x, y, algorithm="brute"), slow=device == "cpu")
            rate = brute_ms / pairs
            brute = fmt(brute_ms)
        else:
            brute_ms = rate * pairs if rate else float("nan")
            brute = f"~{brute_ms:.0f} (est.)"
        rows.append([label, f"{x.shape[1]} x {y.shape[1]}", brute, fmt(grid_ms), f"{brute_ms / grid_ms:.1f}x"])
    return rows


def run(quick: bool = False, device: str = None) -> str:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    sizes = ([4000, 20000] if quick else [20000, 50000, 200000]) if cpu else \
        ([100000] if quick else [100000, 1000000])
    cases = [("uniform", uniform(1, n, 1, device), uniform(1, n, 2, device)) for n in sizes]
    n_adv = sizes[0]
    cases.append(("one cluster + 10 outliers", clustered(1, n_adv, 3, device), clustered(1, n_adv, 4, device)))
    scan = lidar(device)
    if scan is not None and not quick:
        cases.append(("nuScenes sweep vs moved", *scan))
    brute_limit = 3e9 if cpu else 2e12
    rows = chamfer_rows(cases, device, brute_limit)
    header = ["chamfer (both directions)", "N x M", "brute ms", "grid ms", "speed-up"]
    text = ("## Spatial grid vs brute force\n\nfloat32, D = 3, one cloud per batch; `algorithm=` "
            "forced; grid == brute checked bitwise first (on 2048 sampled queries per direction where brute "
            "force is estimated). The grid time includes its builds and the query sort.\n\n")
    text += markdown_table(header, rows)

    t = timer(not cpu)
    n = 20000 if cpu else (100000 if quick else 1000000)
    p1, p2 = uniform(1, n, 5, device), uniform(1, n, 6, device)
    check_same(pointops.knn_points(p1[:, :SAMPLE], p2, K=16, algorithm="grid")[:2],
               pointops.knn_points(p1[:, :SAMPLE], p2, K=16, algorithm="brute")[:2])
    knn_rows = [["knn_points K=16", f"{n} x {n}",
                 fmt(t(lambda: pointops.knn_points(p1, p2, K=16, algorithm="brute"), slow=cpu)),
                 fmt(t(lambda: pointops.knn_points(p1, p2, K=16, algorithm="grid"), slow=cpu))]]
    B, n = (2, 4096) if cpu or quick else (8, 16384)
    q, r = uniform(B, n, 7, device), uniform(B, n, 8, device)
    check_same(pointops.ball_query(q, r, K=64, radius=0.1, algorithm="grid")[:2],
               pointops.ball_query(q, r, K=64, radius=0.1, algorithm="brute")[:2])
    knn_rows.append([f"ball_query K=64 r=0.1, B={B}", f"{n} x {n}",
                     fmt(t(lambda: pointops.ball_query(q, r, K=64, radius=0.1, return_nn=False, algorithm="brute"))),
                     fmt(t(lambda: pointops.ball_query(q, r, K=64, radius=0.1, return_nn=False, algorithm="grid")))])
    text += "\n\n" + markdown_table(["op", "N x M", "brute ms", "grid ms"], knn_rows)
    return text


def crossover(device, Ks=(1, 16)) -> str:
    """brute vs grid over N = M for K in Ks (knn_points; K = 1 is the nearest-neighbour search):
    where grid_pays_* should switch."""
    t = timer(device == "cuda")
    rows = []
    for K in Ks:
        for n in [250, 500, 1000, 2000, 4000, 8000, 16000]:
            for queries in (n, max(16, n // 16)):
                p1, p2 = uniform(1, queries, 9, device), uniform(1, n, 10, device)
                check_same(pointops.knn_points(p1, p2, K=K, algorithm="grid")[:2],
                           pointops.knn_points(p1, p2, K=K, algorithm="brute")[:2])
                brute = t(lambda: pointops.knn_points(p1, p2, K=K, algorithm="brute"))
                grid = t(lambda: pointops.knn_points(p1, p2, K=K, algorithm="grid"))
                auto = t(lambda: pointops.knn_points(p1, p2, K=K))
                rows.append([K, queries, n, f"{brute:.3f}", f"{grid:.3f}", f"{auto:.3f}", f"{brute / grid:.2f}"])
    return markdown_table(["K", "N (queries)", "M (refs)", "brute ms", "grid ms", "auto ms", "brute / grid"], rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--crossover", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="time the CPU even where a GPU is present")
    args = parser.parse_args()
    if args.crossover:
        print(crossover("cpu" if args.cpu or not torch.cuda.is_available() else "cuda"))
    else:
        print(run(quick=args.quick, device="cpu" if args.cpu else None))
