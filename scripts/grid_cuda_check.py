"""The CUDA grid search (algorithm="grid", csrc/grid/grid_search_cuda.cu) against brute force, bit for
bit, then timed with CUDA events. Needs pointops built with CUDA and a GPU.

    python scripts/grid_cuda_check.py              # the checks, then the timings
    python scripts/grid_cuda_check.py check [N]    # N random cases (default 300) + the fixed ones
    python scripts/grid_cuda_check.py time         # the issue's targets, real scans, adversarial
    python scripts/grid_cuda_check.py probe        # "auto" with the far-query probe vs brute / grid (PROBE_CHAINS)
    python scripts/grid_cuda_check.py probe-lists  # the same for knn_points K > 1 (LIST_KS, LIST_FACTORS)
    python scripts/grid_cuda_check.py tune         # crowding target (TUNE_CROWDING), then `ball` (TUNE_BALL=0: not)
    python scripts/grid_cuda_check.py ball         # the ball query: its kernels, cell edge (TUNE_EDGES), grid vs
                                                   # brute over sizes (BALL_ROW_ONLY=1: the issue's row only)
    python scripts/grid_cuda_check.py chamfer      # the chamfer rows of `time`, three rounds (an A/B of builds)

A mismatch prints the case (shape, sizes, dtype, seed) and the first differing rows; rerun it alone
with `check` and the same seed. The real scans are read from ../shared/data/lidar or .data/lidar.
"""
import contextlib
import math
import os
import sys
import time
from pathlib import Path

import torch

import pointops  # noqa: F401  (registers torch.ops.pointops)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from common import time_ms  # noqa: E402  (benchmarks/common.py)

ops = torch.ops.pointops
DEV = "cuda"
INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}
SHAPES = ["uniform", "clusters", "equal", "line", "plane", "lattice", "mixed", "slab", "lidar"]
FAILURES = []


# ---------------------------------------------------------------------------------------------
# inputs

def cloud(shape, B, n, D, g, scale=1.0, offset=0.0):
    """(B, n, D) float64 points of a named shape."""
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if shape == "uniform":
        p = u(B, n, D)
    elif shape == "clusters":  # many points per cell
        centers = u(B, 3, D)
        pick = torch.randint(0, 3, (B, n), generator=g)
        p = torch.gather(centers, 1, pick[..., None].expand(B, n, D)) + 1e-3 * torch.randn(B, n, D, generator=g,
                                                                                           dtype=torch.float64)
    elif shape == "equal":
        p = u(B, 1, D).expand(B, n, D).clone()
    elif shape == "line":
        p = u(B, 1, D) + u(B, n, 1) * torch.randn(B, 1, D, generator=g, dtype=torch.float64)
    elif shape == "plane":
        p = u(B, n, D)
        p[..., -1] = 0.5
    elif shape == "lattice":  # exact ties everywhere
        p = torch.randint(0, 5, (B, n, D), generator=g).double() / 4
    elif shape == "mixed":
        p = torch.where(u(B, n, 1) < 0.5, u(B, n, D), u(B, 1, D) + 1e-4 * torch.randn(B, n, D, generator=g,
                                                                                     dtype=torch.float64))
    elif shape == "slab":  # nearly a plane
        p = u(B, n, D)
        p[..., -1] = 0.5 + 1e-7 * torch.randn(B, n, generator=g, dtype=torch.float64)
    elif shape == "lidar":  # rings on a ground plane plus walls, ~100 m
        r = 5 + 95 * u(B, n) ** 2
        th = 2 * math.pi * u(B, n)
        p = torch.stack([r * th.cos(), r * th.sin(), -1.7 + 0.05 * torch.randn(B, n, generator=g,
                                                                               dtype=torch.float64)], -1)[..., :D]
    else:
        raise ValueError(shape)
    return offset + scale * p


def poison(p, g, rate=0.03):
    """NaN / +inf / -inf in a few coordinates."""
    mask = torch.rand(p.shape, generator=g) < rate
    vals = torch.tensor([math.nan, math.inf, -math.inf], dtype=p.dtype)[torch.randint(0, 3, p.shape, generator=g)]
    return torch.where(mask, vals, p)


def random_case(seed):
    g = torch.Generator().manual_seed(seed)
    pick = lambda xs: xs[torch.randint(0, len(xs), (1,), generator=g).item()]  # noqa: E731
    chance = lambda p: torch.rand(1, generator=g).item() < p  # noqa: E731
    D = pick([2, 3])
    B = pick([1, 1, 2, 4])
    N = pick([0, 1, 7, 100, 1000, 5000, 20000])
    M = pick([0, 1, 5, 100, 1000, 5000, 20000])
    dtype = pick([torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16])
    shape_q = pick(SHAPES)
    shape_r = shape_q if chance(0.7) else pick(SHAPES)
    far = chance(0.2) and dtype in (torch.float32, torch.float64)
    scale = 10.0 ** pick([0, 0, 0, -6, 3]) if dtype in (torch.float32, torch.float64) else 1.0
    offset = (1e5 if dtype == torch.float32 else 1e9) * pick([1, -1]) if far else 0.0
    shift = pick([0.0, 0.0, 0.3, -1.5]) * scale
    q = cloud(shape_q, B, N, D, g, scale, offset + shift)
    r = q.clone() if chance(0.05) and N > 0 else cloud(shape_r, B, M, D, g, scale, offset)
    M = r.shape[1]
    if chance(0.15):
        q, r = poison(q, g), poison(r, g)
    l1 = l2 = None
    if chance(0.3) and B > 0:
        l1 = torch.randint(0, N + 1, (B,), generator=g)
        l2 = torch.randint(0, M + 1, (B,), generator=g)
        if chance(0.2):
            l2[0] = 0
    q, r = q.to(dtype), r.to(dtype)
    if chance(0.2):  # non-contiguous inputs
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        r = r.transpose(1, 2).contiguous().transpose(1, 2)
    K = pick([1, 1, 2, 3, 8, 16, 17, 33, 64])
    Kb = pick([1, 5, 16, 64, 65, 100, 500])
    radius = scale * 10 ** (torch.rand(1, generator=g).item() * 2.5 - 2)
    norm = pick([1, 2])
    desc = (f"seed={seed} D={D} B={B} N={N} M={M} {str(dtype)[6:]} shapes={shape_q}/{shape_r} far={far} "
            f"scale={scale:g} shift={shift:g} ragged={l1 is not None} K={K} Kb={Kb} radius={radius:.3g} norm={norm}")
    to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
    return desc, to(q), to(r), to(l1), to(l2), K, Kb, radius, norm


# ---------------------------------------------------------------------------------------------
# comparison

def same(got, want):
    """'bits' (identical), 'zero-sign' (equal values, a signed zero differs), or False."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if not got.dtype.is_floating_point:
        return "bits" if torch.equal(got, want) else False
    if torch.equal(got.contiguous().view(INT_VIEW[got.dtype]), want.contiguous().view(INT_VIEW[want.dtype])):
        return "bits"
    both_nan = got.isnan() & want.isnan()
    return "zero-sign" if bool(((got == want) | both_nan).all()) else False


def check(desc, op, got, want, names):
    for g_, w_, name in zip(got, want, names):
        verdict = same(g_, w_)
        if verdict == "bits":
            continue
        if verdict == "zero-sign":
            print(f"  note: {op} {name}: equal values, a zero's sign differs ({desc})")
            continue
        FAILURES.append(f"{op} {name}: {desc}")
        print(f"MISMATCH {op} {name}: {desc}")
        if g_.shape == w_.shape:
            bad = (g_ != w_) & ~(g_.isnan() & w_.isnan()) if g_.dtype.is_floating_point else g_ != w_
            rows = bad.reshape(-1, bad.shape[-1]).any(-1).nonzero().flatten()[:3].tolist()
            for row in rows:
                print(f"   row {row}: grid {g_.reshape(-1, g_.shape[-1])[row][:8].tolist()}")
                print(f"   {' ' * len(str(row))}     brute {w_.reshape(-1, w_.shape[-1])[row][:8].tolist()}")
        else:
            print(f"   shapes {tuple(g_.shape)} vs {tuple(w_.shape)}")
        return False
    return True


def run_case(desc, q, r, l1, l2, K, Kb, radius, norm):
    a = ops.nearest_neighbor(q, r, l1, l2, norm=norm, algorithm="grid")
    b = ops.nearest_neighbor(q, r, l1, l2, norm=norm, algorithm="brute")
    check(desc, "nearest_neighbor", a, b, ["dist", "idx"])
    a = ops.chamfer(q, r, l1, l2, norm=norm, algorithm="grid")
    b = ops.chamfer(q, r, l1, l2, norm=norm, algorithm="brute")
    check(desc, "chamfer", a, b, ["dist1", "dist2", "idx1", "idx2"])
    for k in sorted({1, K}):
        a = ops.knn_points(q, r, l1, l2, K=k, norm=norm, algorithm="grid")
        b = ops.knn_points(q, r, l1, l2, K=k, norm=norm, algorithm="brute")
        check(desc + f" [knn K={k}]", "knn_points", a, b, ["dists", "idx"])
    a = ops.ball_query(q, r, l1, l2, K=Kb, radius=radius, algorithm="grid")
    b = ops.ball_query(q, r, l1, l2, K=Kb, radius=radius, algorithm="brute")
    check(desc, "ball_query", a, b, ["dists", "idx"])


def fixed_cases():
    """Named cases the random ones may miss."""
    g = torch.Generator().manual_seed(7)
    out = []
    u = lambda *s: torch.rand(*s, generator=g)  # noqa: E731
    # all points equal (ties everywhere, one cell); a query far outside the grid
    p = torch.full((1, 3000, 3), 0.25)
    out.append(("all equal", p, p.clone(), None, None))
    out.append(("far queries", u(1, 500, 3) + 50.0, u(1, 4000, 3), None, None))
    out.append(("offset clouds", u(1, 2000, 3) + torch.tensor([2.0, 0, 0]), u(1, 3000, 3), None, None))
    # LiDAR coordinates (1e5 m away) with 0.1 m structure
    base = torch.tensor([1e5, -2e5, 30.0])
    out.append(("far from origin", base + 0.1 * torch.randn(1, 4000, 3, generator=g),
                base + 0.1 * torch.randn(1, 5000, 3, generator=g), None, None))
    # a cloud against itself (distance 0 for every query) and duplicates
    p = u(2, 3000, 3)
    p[:, 1000:2000] = p[:, :1000]
    out.append(("self with duplicates", p, p.clone(), None, None))
    # empty reference clouds and padded queries
    out.append(("ragged with empty", u(3, 400, 3), u(3, 600, 3), torch.tensor([400, 0, 17]),
                torch.tensor([0, 600, 5])))
    # a single reference point, every query a tie-free match
    out.append(("one reference", u(1, 1000, 2), u(1, 1, 2), None, None))
    # NaN / inf everywhere in one cloud
    p = u(1, 2000, 3)
    p[0, ::3, 0] = math.nan
    p[0, 1::3, 1] = math.inf
    out.append(("non-finite", p, p.flip(1).clone(), None, None))
    # float16: coarse coordinates, many exact ties
    out.append(("half lattice", u(2, 3000, 3).half(), u(2, 4000, 3).half(), None, None))
    out.append(("bf16", u(2, 3000, 3).bfloat16(), u(2, 4000, 3).bfloat16(), None, None))
    # 2-D clouds
    out.append(("2d line", torch.stack([u(1, 3000), torch.zeros(1, 3000)], -1),
                torch.stack([u(1, 3000), torch.zeros(1, 3000)], -1), None, None))
    return out


def run_checks(n_random):
    print(f"== checks: fixed cases, then {n_random} random ones (grid vs brute, bit for bit)")
    for name, q, r, l1, l2 in fixed_cases():
        for K, Kb, radius, norm in [(1, 64, 0.1, 2), (16, 500, 0.05, 1), (64, 7, 1e9, 2), (8, 16, 0.2, 2)]:
            desc = f"fixed '{name}' {str(q.dtype)[6:]} {tuple(q.shape)} {tuple(r.shape)} K={K} Kb={Kb} r={radius}"
            to = lambda t: None if t is None else t.to(DEV)  # noqa: E731
            run_case(desc, to(q), to(r), to(l1), to(l2), K, Kb, radius, norm)
    for seed in range(n_random):
        run_case(*random_case(seed))
    # a side stream: the launchers must follow the current stream
    desc, q, r, l1, l2, K, Kb, radius, norm = random_case(12345)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        a = ops.knn_points(q, r, l1, l2, K=K, norm=norm, algorithm="grid")
    s.synchronize()
    check(desc + " [side stream]", "knn_points", a, ops.knn_points(q, r, l1, l2, K=K, norm=norm, algorithm="brute"),
          ["dists", "idx"])
    torch.cuda.synchronize()
    print(f"checks: {len(FAILURES)} mismatches")


# ---------------------------------------------------------------------------------------------
# timings

def timed(fn, repeat=10, warmup=2):
    """Median milliseconds over `repeat` calls: the benchmarks' CUDA-event timer."""
    return time_ms(fn, warmup, repeat, cuda=True)


ROWS = []


def row(name, grid_ms, brute_ms=None, target=None, verified=None):
    speed = f"{brute_ms / grid_ms:7.1f}x" if brute_ms else "        "
    status = "" if verified is None else ("bitwise ok" if verified else "MISMATCH")
    line = (f"{name:54s} grid {grid_ms:9.3f} ms   brute {brute_ms if brute_ms else float('nan'):9.3f} ms {speed}"
            f"  {'target ' + target if target else ''}  {status}")
    ROWS.append(line)
    print(line, flush=True)


def verify(a, b):
    return all(same(x, y) for x, y in zip(a, b))


def lidar_scans():
    root = REPO.parent / "shared" / "data" / "lidar"
    if not root.exists():  # the GPU machine: the git-ignored copy carried with the tree
        root = REPO / ".data" / "lidar"
    scans = {}
    kitti = root / "0000000000.bin"
    if kitti.exists():
        import numpy as np
        scans["KITTI frame"] = torch.from_numpy(np.fromfile(kitti, np.float32).reshape(-1, 4)[:, :3].copy())
    nus = root / "ff9eff4389a740848f9a56ad749a4ae8.bin"
    if nus.exists():
        import numpy as np
        points = np.fromfile(nus, np.float16).reshape(-1, 5)[:, :3].astype(np.float32)
        scans["nuScenes sweep"] = torch.from_numpy(points)
    return scans


def rigid_motion(p, angle=0.02, t=(0.3, -0.1, 0.02)):
    c, s = math.cos(angle), math.sin(angle)
    R = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=p.dtype, device=p.device)
    return p @ R.T + torch.tensor(t, dtype=p.dtype, device=p.device)


def run_timings():
    print("== timings (CUDA events, median)", torch.cuda.get_device_name(), "torch", torch.__version__)
    g = torch.Generator(device=DEV).manual_seed(0)
    u = lambda *s: torch.rand(*s, generator=g, device=DEV)  # noqa: E731

    x, y = u(1, 1 << 20, 3), u(1, 1 << 20, 3)
    grid = lambda: ops.chamfer(x, y, algorithm="grid")  # noqa: E731
    brute = lambda: ops.chamfer(x, y, algorithm="brute")  # noqa: E731
    row("chamfer 1M x 1M uniform D=3 (both directions)", timed(grid), timed(brute, repeat=2, warmup=1), "<= 20 ms",
        verify(grid(), brute()))
    grid = lambda: ops.knn_points(x, y, K=1, algorithm="grid")  # noqa: E731
    row("knn_points K=1 1M x 1M (one direction, build included)", timed(grid))
    grid = lambda: ops.knn_points(x, y, K=16, algorithm="grid")  # noqa: E731
    brute = lambda: ops.knn_points(x, y, K=16, algorithm="brute")  # noqa: E731
    row("knn_points K=16 1M x 1M", timed(grid), timed(brute, repeat=1, warmup=0), "<= 60 ms", verify(grid(), brute()))
    auto = lambda: ops.knn_points(x, y, K=16)  # noqa: E731  (the far-query probe, then the grid)
    row("knn_points K=16 1M x 1M, algorithm auto", timed(auto), None, "<= 60 ms", verify(auto(), grid()))

    p1, p2 = u(8, 16384, 3), u(8, 16384, 3)
    grid = lambda: ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="grid")  # noqa: E731
    brute = lambda: ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="brute")  # noqa: E731
    row("ball_query K=64 r=0.1 8 x 16384^2", timed(grid, repeat=50), timed(brute), "<= 0.3 ms", verify(grid(), brute()))
    grid = lambda: ops.ball_query(p1, p2, K=500, radius=0.2, algorithm="grid")  # noqa: E731
    brute = lambda: ops.ball_query(p1, p2, K=500, radius=0.2, algorithm="brute")  # noqa: E731
    row("ball_query K=500 r=0.2 8 x 16384^2 (passes of 64)", timed(grid), timed(brute), None, verify(grid(), brute()))
    p1, p2 = u(8, 8192, 3), u(8, 8192, 3)
    for K in (8, 16, 32, 64):
        grid = lambda: ops.knn_points(p1, p2, K=K, algorithm="grid")  # noqa: E731
        brute = lambda: ops.knn_points(p1, p2, K=K, algorithm="brute")  # noqa: E731
        row(f"knn_points K={K} 8 x 8192^2", timed(grid), timed(brute), None, verify(grid(), brute()))

    for name, scan in lidar_scans().items():
        a = scan[None].to(DEV)
        b = rigid_motion(a)
        grid = lambda: ops.chamfer(a, b, algorithm="grid")  # noqa: E731
        brute = lambda: ops.chamfer(a, b, algorithm="brute")  # noqa: E731
        # 40 warm-up calls: a version that took a pool stream per call ran its first ~30 calls slower
        row(f"chamfer {name} ({a.shape[1]} pts) vs moved copy", timed(grid, repeat=20, warmup=40),
            timed(brute, repeat=3), ">= 10x brute",
            verify(grid(), brute()))

    # adversarial: all points in a few tight clusters far apart (a few cells hold everything)
    centers = torch.tensor([[0.0, 0, 0], [100, 0, 0], [0, 100, 0], [0, 0, 100]], device=DEV)
    pick = torch.randint(0, 4, (1, 1 << 18), generator=g, device=DEV)
    xa = centers[pick] + 1e-3 * torch.randn(1, 1 << 18, 3, generator=g, device=DEV)
    ya = centers[torch.randint(0, 4, (1, 1 << 18), generator=g, device=DEV)] + 1e-3 * torch.randn(
        1, 1 << 18, 3, generator=g, device=DEV)
    grid = lambda: ops.chamfer(xa, ya, algorithm="grid")  # noqa: E731
    brute = lambda: ops.chamfer(xa, ya, algorithm="brute")  # noqa: E731
    row("adversarial: 256k x 256k in 4 tight clusters", timed(grid, repeat=3), timed(brute, repeat=3), "<= 1.3x brute",
        verify(grid(), brute()))
    xd = torch.full((1, 1 << 17, 3), 0.5, device=DEV)
    grid = lambda: ops.chamfer(xd, xd, algorithm="grid")  # noqa: E731
    brute = lambda: ops.chamfer(xd, xd, algorithm="brute")  # noqa: E731
    row("adversarial: 128k x 128k all equal", timed(grid, repeat=3), timed(brute, repeat=3), None,
        verify(grid(), brute()))
    print("\n".join(["", "summary:"] + ROWS))


def ddp_shapes(count, points, seed=0):
    """examples/ddp_chamfer.py's training data (spheres and tori, points on their surfaces)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_chamfer", REPO / "examples" / "ddp_chamfer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_shapes(count, points, torch.Generator().manual_seed(seed), torch.float32)[1]


def probe_cases(g):
    """(label, x queries, y references) for the far-query probe: near and far clouds, and a batch
    whose first half is near and second half a blob at the origin (one probe choice per cloud)."""
    for kind, noise in (("uniform", 0.01), ("surface", 0.01), ("surface", 0.1), ("blob", 0.05), ("half blob", 0.05)):
        for B, n in ((64, 8192), (8, 8192), (16, 4096), (4, 16384), (1, 65536), (1, 262144), (1, 1 << 20)):
            if n == 1 << 20 and kind not in ("uniform", "blob"):
                continue
            y = torch.rand(B, n, 3, generator=g, device=DEV) if kind == "uniform" else ddp_shapes(B, n, B * n).to(DEV)
            x = noise * torch.randn(y.shape, generator=g, device=DEV) + (0 if kind == "blob" else y)
            if kind == "half blob":
                x[B // 2:] = noise * torch.randn(x[B // 2:].shape, generator=g, device=DEV)
            yield f"{kind} {noise:g}", B, n, x, y


def run_probe():
    """"auto" with the far-query probe against brute force and the forced grid (chamfer, both
    directions), with the K = 1 size thresholds lowered so that every case is probed, over values of
    the latency bound's cost (POINTOPS_GRID_PROBE_CHAIN; PROBE_CHAINS, comma-separated); each auto
    result checked against brute force bit for bit. POINTOPS_GRID_PROBE_DEBUG prints the probe's
    estimates (stderr) for one call per case."""
    print("== probe: chamfer (both directions) brute / grid / probed auto", torch.cuda.get_device_name())
    g = torch.Generator(device=DEV).manual_seed(5)
    os.environ["POINTOPS_GRID_NEAREST_MIN_REFS"] = os.environ.get("PROBE_MIN_REFS", "4096")
    os.environ["POINTOPS_GRID_NEAREST_MIN_PAIRS"] = os.environ.get("PROBE_MIN_PAIRS", "1e7")
    chains = os.environ.get("PROBE_CHAINS", "").split(",") if os.environ.get("PROBE_CHAINS") else [None]
    for label, B, n, x, y in probe_cases(g):
        big = B * n >= 1 << 20
        want = ops.chamfer(x, y, algorithm="brute")
        tb = timed(lambda: ops.chamfer(x, y, algorithm="brute"), repeat=2 if big else 5, warmup=1)
        far = "blob" in label or "0.1" in label
        tg = float("nan") if (big and far) else timed(lambda: ops.chamfer(x, y, algorithm="grid"), repeat=3, warmup=1)
        print(f"PROBE {label:13s} B={B:3d} n={n:7d}: brute {tb:9.3f} ms | grid {tg:9.3f} ms ({tb / tg:6.2f}x)", end="",
              flush=True)
        for chain in chains:
            if chain is not None:
                os.environ["POINTOPS_GRID_PROBE_CHAIN"] = chain
            os.environ["POINTOPS_GRID_PROBE_DEBUG"] = "1"
            got = ops.chamfer(x, y, algorithm="auto")
            torch.cuda.synchronize()
            os.environ.pop("POINTOPS_GRID_PROBE_DEBUG")
            ok = verify(got, want)
            FAILURES.extend([] if ok else [f"probe {label} {B} {n} chain {chain}"])
            ta = timed(lambda: ops.chamfer(x, y, algorithm="auto"), repeat=3 if big else 5, warmup=1)
            print(f" | auto[{chain or 'default'}] {ta:9.3f} ms ({tb / ta:6.2f}x){'' if ok else ' MISMATCH'}", end="",
                  flush=True)
        print(flush=True)
        os.environ.pop("POINTOPS_GRID_PROBE_CHAIN", None)
    for key in ("POINTOPS_GRID_NEAREST_MIN_REFS", "POINTOPS_GRID_NEAREST_MIN_PAIRS"):
        os.environ.pop(key)


def run_probe_lists():
    """knn_points with K > 1: "auto" (the far-query probe, each cloud to the grid or to brute force)
    against brute force and the forced grid, over values of the lists' factor on the grid's estimate
    (POINTOPS_GRID_PROBE_LIST_FACTOR; LIST_FACTORS, comma-separated, default: the compiled one) for
    each K of LIST_KS (default 8,16,32); every auto result checked against brute force bit for bit.
    First the brute-force pair cost itself: knn_points brute force at K = 1 and each K."""
    ks = [int(k) for k in os.environ.get("LIST_KS", "8,16,32").split(",")]
    factors = os.environ.get("LIST_FACTORS", "").split(",") if os.environ.get("LIST_FACTORS") else [None]
    print("== probe-lists: knn_points brute / grid / probed auto", torch.cuda.get_device_name(), flush=True)
    g = torch.Generator(device=DEV).manual_seed(7)
    for B, n in ((8, 8192), (1, 65536)):
        x, y = torch.rand(B, n, 3, generator=g, device=DEV), torch.rand(B, n, 3, generator=g, device=DEV)
        times = {K: timed(lambda: ops.knn_points(x, y, None, None, K, 2, "brute")) for K in [1] + ks}
        print(f"PAIRCOST uniform B={B} n={n}: " + ", ".join(
            f"K={K} {t:.3f} ms ({t / times[1]:.2f}x K=1)" for K, t in times.items()), flush=True)
    for K in ks:
        for label, B, n, x, y in probe_cases(g):
            if n > 262144 or (B, n) == (16, 4096):
                continue
            big = B * n >= 1 << 18
            knn = lambda a: ops.knn_points(x, y, None, None, K, 2, a)[:2]  # noqa: E731
            want = knn("brute")
            tb = timed(lambda: knn("brute"), repeat=3 if big else 5, warmup=1)
            far = "blob" in label or "0.1" in label
            tg = float("nan") if (big and far) else timed(lambda: knn("grid"), repeat=3, warmup=1)
            print(f"LISTS K={K:2d} {label:13s} B={B:3d} n={n:7d}: brute {tb:9.3f} ms | grid {tg:9.3f} ms "
                  f"({tb / tg:6.2f}x)", end="", flush=True)
            for factor in factors:
                if factor is not None:
                    os.environ["POINTOPS_GRID_PROBE_LIST_FACTOR"] = factor
                ok = verify(knn("auto"), want)
                FAILURES.extend([] if ok else [f"probe-lists K={K} {label} {B} {n} factor {factor}"])
                ta = timed(lambda: knn("auto"), repeat=3 if big else 5, warmup=1)
                print(f" | auto[{factor or 'default'}] {ta:9.3f} ms ({tb / ta:6.2f}x){'' if ok else ' MISMATCH'}",
                      end="", flush=True)
            print(flush=True)
            os.environ.pop("POINTOPS_GRID_PROBE_LIST_FACTOR", None)


def run_tune():
    """The knobs of the cell-size rules, each result checked against brute force: the crowding
    target (POINTOPS_GRID_CROWDING; the values from TUNE_CROWDING, comma-separated) on the real
    scans and the uniform cloud, the ball query's cell edge in radii (POINTOPS_GRID_BALL_CELL), and
    ball_query grid vs brute over radii and sizes (the data for grid_pays_cuda's ball rule; skipped
    with TUNE_BALL=0; TUNE_EDGES picks the cell edges)."""
    print("== tune", torch.cuda.get_device_name(), "torch", torch.__version__)
    g = torch.Generator(device=DEV).manual_seed(3)
    clouds = {name: (scan[None].to(DEV), rigid_motion(scan[None].to(DEV))) for name, scan in lidar_scans().items()}
    clouds["uniform 1M"] = (torch.rand(1, 1 << 20, 3, generator=g, device=DEV),
                            torch.rand(1, 1 << 20, 3, generator=g, device=DEV))
    for name, (a, b) in clouds.items():
        want = ops.chamfer(a, b, algorithm="brute")
        tb = timed(lambda: ops.chamfer(a, b, algorithm="brute"), repeat=3, warmup=1)
        want16 = ops.knn_points(a, b, K=16, algorithm="brute") if a.shape[1] < 400000 else None
        for target in [int(v) for v in os.environ.get("TUNE_CROWDING", "0,4,8,16,24,48,96").split(",")]:
            os.environ["POINTOPS_GRID_CROWDING"] = str(target)
            ok = verify(ops.chamfer(a, b, algorithm="grid"), want)
            t = timed(lambda: ops.chamfer(a, b, algorithm="grid"))
            line = f"crowding {target:3d} {name:16s} chamfer {t:8.3f} ms (brute {tb:8.3f}: {tb / t:6.1f}x) {ok}"
            if want16 is not None:
                ok16 = verify(ops.knn_points(a, b, K=16, algorithm="grid")[:2], want16[:2])
                t16 = timed(lambda: ops.knn_points(a, b, K=16, algorithm="grid"))
                line += f"; knn K=16 {t16:8.3f} ms {ok16}"
                FAILURES.extend([] if ok16 else [line])
            FAILURES.extend([] if ok else [line])
            print(line, flush=True)
    os.environ.pop("POINTOPS_GRID_CROWDING", None)

    if os.environ.get("TUNE_BALL", "1") != "0":
        run_ball(g)


@contextlib.contextmanager
def env_set(name, value):
    """Environment variable `name` set to `value` inside the block, restored after it."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def warp_per_query():
    """The ball query's warp per query without the shared lists (POINTOPS_GRID_BALL_TILES=0)."""
    return env_set("POINTOPS_GRID_BALL_TILES", "0")


def host_us(fn, calls=20):
    """Host microseconds per call of fn, the GPU kept busy meanwhile (torch.cuda._sleep), so that the
    calls only enqueue: the host's share of a call, apart from the GPU's. Few calls per round: a
    grid call enqueues ~15 operations, and a full launch queue (~1000 entries) would block the host."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(15):
        torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU time: nothing below waits for the device
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def run_ball(g=None):
    """ball_query on the grid: the issue's case under torch.profiler (time per kernel), the cell
    edge in radii (POINTOPS_GRID_BALL_CELL; TUNE_EDGES), then grid vs brute over radii and sizes
    (the data of ball_grid_pays_cuda), every result checked against brute force. BALL_ROW_ONLY=1 stops
    after the issue's row."""
    if g is None:
        print("== ball", torch.cuda.get_device_name(), "torch", torch.__version__)
        g = torch.Generator(device=DEV).manual_seed(3)
    p1, p2 = torch.rand(8, 16384, 3, generator=g, device=DEV), torch.rand(8, 16384, 3, generator=g, device=DEV)
    call = lambda: ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="grid")  # noqa: E731
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)
    brute = lambda: ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="brute")  # noqa: E731
    want = brute()[:2]
    for _ in range(3):  # three rounds: the spread of the row
        row("ball_query K=64 r=0.1 8 x 16384^2", timed(call, repeat=50), timed(brute), "<= 0.3 ms",
            verify(call()[:2], want))
        with warp_per_query():  # the same row without the shared lists, same run
            row("  the same, POINTOPS_GRID_BALL_TILES=0 (warp per query)", timed(call, repeat=50), None, None,
                verify(call()[:2], want))
        with env_set("POINTOPS_GRID_BLOCK_SORT", "0"):  # the lists over the device-wide radix sort
            row("  the same, POINTOPS_GRID_BLOCK_SORT=0 (device-wide sort)", timed(call, repeat=50), None, None,
                verify(call()[:2], want))
    with env_set("POINTOPS_GRID_BLOCK_SORT", "0"):
        print(f"host us per call (GPU busy), device-wide sort: {host_us(call):.1f}", flush=True)
    print(f"host us per call (GPU busy): grid {host_us(call):.1f}, brute {host_us(brute):.1f}", flush=True)
    # Where the host's time goes: the CUDA runtime calls (launches, memsets, queries) against the
    # rest, self CPU time over 20 calls with the GPU kept busy (the calls only enqueue).
    torch.cuda._sleep(int(2e8))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            call()
    torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16), flush=True)
    if os.environ.get("BALL_ROW_ONLY") == "1":  # the row alone (a short device step)
        return
    for edge in [float(v) for v in os.environ.get("TUNE_EDGES", "0.5,0.7,1.0,1.4,2.0").split(",")]:
        os.environ["POINTOPS_GRID_BALL_CELL"] = str(edge)
        ok = verify(ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="grid")[:2], want)
        t = timed(lambda: ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="grid"), repeat=30)
        FAILURES.extend([] if ok else [f"ball edge {edge}"])
        print(f"ball cell edge {edge:4.2f} radii: K=64 r=0.1 8 x 16384^2 {t:8.3f} ms {ok}", flush=True)
    os.environ.pop("POINTOPS_GRID_BALL_CELL", None)

    print("== ball_query grid vs brute (uniform unit cube, float32, D=3)")
    # many small clouds too (PyG's batches: 64 x 4096, radius_graph's K = max_num_neighbors + 1 = 33):
    # one grid build serves the whole batch, so the crossover may follow the pairs, not the cloud size
    for B, n in ((1, 4096), (8, 4096), (32, 2048), (16, 4096), (64, 4096), (64, 2048), (256, 1024), (8, 16384),
                 (1, 65536), (1, 262144)):
        p1, p2 = torch.rand(B, n, 3, generator=g, device=DEV), torch.rand(B, n, 3, generator=g, device=DEV)
        for K in (16, 33, 64):
            for radius in (0.02, 0.05, 0.1, 0.2, 0.4, 1.0):
                grid = lambda: ops.ball_query(p1, p2, K=K, radius=radius, algorithm="grid")  # noqa: E731
                brute = lambda: ops.ball_query(p1, p2, K=K, radius=radius, algorithm="brute")  # noqa: E731
                ok = verify(grid()[:2], brute()[:2])
                tg, tbr = timed(grid), timed(brute, repeat=5)
                with warp_per_query():
                    ok = ok and verify(grid()[:2], brute()[:2])
                    tw = timed(grid)
                FAILURES.extend([] if ok else [f"ball {B} {n} {K} {radius}"])
                print(f"B={B:2d} n={n:6d} K={K:2d} r={radius:4.2f}: grid {tg:8.3f} ms  brute {tbr:8.3f} ms "
                      f"({tbr / tg:6.2f}x)  warp per query {tw:8.3f} ms ({tbr / tw:6.2f}x) {ok}", flush=True)


def run_chamfer_rounds():
    """The chamfer rows of `time` (uniform 1M x 1M, the real scans against their moved copies, and two
    small uniform batches), three rounds of 20 calls each: an A/B of one search change across two
    builds on one machine (RESULTS: the K = 1 run batches), every grid result checked bitwise against
    brute force first."""
    print("== chamfer rounds", torch.cuda.get_device_name(), "torch", torch.__version__)
    g = torch.Generator(device=DEV).manual_seed(0)
    x, y = torch.rand(1, 1 << 20, 3, generator=g, device=DEV), torch.rand(1, 1 << 20, 3, generator=g, device=DEV)
    scans = lidar_scans()
    if not scans:
        print("WARNING: no LiDAR scans found (../shared/data/lidar or .data/lidar): uniform only", flush=True)
    cases = [("uniform 1M x 1M", x, y)] + [(name, s[None].to(DEV), rigid_motion(s[None].to(DEV)))
                                           for name, s in scans.items()]
    cases += [(f"uniform {B} x {n}^2", torch.rand(B, n, 3, generator=g, device=DEV),
               torch.rand(B, n, 3, generator=g, device=DEV)) for B, n in ((8, 8192), (1, 65536))]
    for name, a, b in cases:
        grid = lambda: ops.chamfer(a, b, algorithm="grid")  # noqa: E731
        brute = lambda: ops.chamfer(a, b, algorithm="brute")  # noqa: E731
        ok = verify(grid(), brute())
        FAILURES.extend([] if ok else [f"chamfer {name}"])
        rounds = [timed(grid, repeat=20, warmup=3) for _ in range(3)]
        brute_ms = timed(brute, repeat=3, warmup=1) if a.shape[1] < (1 << 20) else float("nan")
        print(f"chamfer {name}: grid {' / '.join(f'{r:.3f}' for r in rounds)} ms, brute {brute_ms:.3f} ms "
              f"({brute_ms / sorted(rounds)[1]:.1f}x the median), {'bitwise ok' if ok else 'MISMATCH'}", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    modes = {"time": run_timings, "probe": run_probe, "probe-lists": run_probe_lists, "tune": run_tune,
             "ball": run_ball, "chamfer": run_chamfer_rounds}
    if what not in ("all", "check", *modes):
        sys.exit(__doc__)
    if what in ("all", "check"):
        run_checks(int(sys.argv[2]) if what == "check" and len(sys.argv) > 2 else 300)
    if what != "check":
        modes["time" if what == "all" else what]()
    sys.exit(1 if FAILURES else 0)
