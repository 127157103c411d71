"""Neighbourhood ops: knn_points, ball_query, sample_farthest_points against torch and PyTorch3D.

Baselines in the same process: torch (cdist + topk / masks / a farthest-point loop, query-chunked
to fit) always, and PyTorch3D's own CUDA kernels built from its published sources when they are in
the git-ignored .peers/ folder (benchmarks/peers.py; never vendored). Correctness first: pointops
against a float64 brute force on sampled queries, and index agreement with PyTorch3D where the two
contracts coincide. CUDA events, warm-up, median of repeats.
"""
import time

import torch

import pointops
from common import markdown_table, time_ms
from peers import load_pytorch3d, pytorch3d_ball_query, pytorch3d_fps, pytorch3d_knn

CHUNK_BYTES = 2 << 30  # the torch baselines materialise (queries x M) distances in chunks of this


def cloud(B, N, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(B, N, 3, generator=g, device=device)


def torch_knn(p1, p2, K):
    """The torch way: squared cdist and topk(K, largest=False), query-chunked."""
    B, N, M = p1.shape[0], p1.shape[1], p2.shape[1]
    chunk = max(1, min(N, CHUNK_BYTES // max(1, B * M * 4)))
    dists, idxs = [], []
    for s in range(0, N, chunk):
        d, i = torch.cdist(p1[:, s:s + chunk], p2).pow_(2).topk(K, dim=2, largest=False)
        dists.append(d)
        idxs.append(i)
    return torch.cat(dists, 1), torch.cat(idxs, 1)


def torch_ball_query(p1, p2, K, radius):
    """The torch way: squared cdist, mask, the first K indices inside (index order), query-chunked."""
    B, N, M = p1.shape[0], p1.shape[1], p2.shape[1]
    chunk = max(1, min(N, CHUNK_BYTES // max(1, B * M * 8)))
    out = []
    for s in range(0, N, chunk):
        inside = torch.cdist(p1[:, s:s + chunk], p2).pow_(2) < radius * radius
        order = torch.where(inside, torch.arange(M, device=p1.device), M)
        first = order.topk(K, dim=2, largest=False).values.sort(dim=2).values
        out.append(torch.where(first < M, first, -1))
    return torch.cat(out, 1)


def torch_fps(points, K):
    """The torch way: a loop of K - 1 (distance, minimum, argmax) steps over the whole batch."""
    B, N, _ = points.shape
    idx = torch.zeros(B, K, dtype=torch.int64, device=points.device)
    mind = torch.full((B, N), float("inf"), device=points.device)
    batch = torch.arange(B, device=points.device)
    for k in range(1, K):
        selected = points[batch, idx[:, k - 1]]
        mind = torch.minimum(mind, ((points - selected[:, None]) ** 2).sum(-1))
        idx[:, k] = mind.argmax(1)
    return idx


def knn_oracle_agreement(p1, p2, idx, K, samples=256):
    """Fraction of sampled queries whose pointops neighbour distances equal (to float32 rounding)
    a float64 brute force's K smallest, and the largest relative distance error."""
    g = torch.Generator().manual_seed(0)
    B, N = p1.shape[0], p1.shape[1]
    bs = torch.randint(0, B, (samples,), generator=g).tolist()
    qs = torch.randint(0, N, (samples,), generator=g).tolist()
    worst = 0.0
    for b, q in zip(bs, qs):
        ref = ((p2[b].double() - p1[b, q].double()) ** 2).sum(-1).sort().values[:K]
        got = ((p2[b, idx[b, q]].double() - p1[b, q].double()) ** 2).sum(-1)
        worst = max(worst, ((got - ref).abs() / ref.clamp(min=1e-30)).max().item())
    return worst


def timed(fn, budget_ms=3000.0):
    """time_ms with as many repeats as fit a budget: a call longer than the budget runs twice (the
    first is the warm-up), a short one up to 30 times after 3 warm-ups."""
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    once = (time.perf_counter() - start) * 1e3
    repeat = int(max(1, min(30, budget_ms / max(once, 1e-3))))
    return time_ms(fn, warmup=0 if once > budget_ms else 3, repeat=repeat)


def knn_section(quick, device, p3d):
    B, N = (2, 2048) if quick else ((8, 4096) if device == "cpu" else (8, 8192))
    p1, p2 = cloud(B, N, 1, device), cloud(B, N, 2, device)
    rows = []
    for K in (1, 16, 32, 64, 128) if device == "cuda" else (1, 16):
        dists, idx, _ = pointops.knn_points(p1, p2, K=K)
        err = knn_oracle_agreement(p1, p2, idx, K)
        t = timed(lambda: pointops.knn_points(p1, p2, K=K))
        t_torch = timed(lambda: torch_knn(p1, p2, K))
        row = [f"{B}x{N}x{N}", K, f"{t:.3f}", f"{B * N * N / (t * 1e-3):.2e}", f"{t_torch:.3f}",
               f"{t_torch / t:.1f}x", f"{err:.1e}"]
        if p3d is not None:
            ref_idx, ref_dists = pytorch3d_knn(p3d, p1, p2, K)
            agree = (ref_idx == idx).double().mean().item()
            t_p3d = timed(lambda: pytorch3d_knn(p3d, p1, p2, K))
            row += [f"{t_p3d:.3f}", f"{t_p3d / t:.1f}x", f"{100 * agree:.2f}%"]
        rows.append(row)
    header = ["B x N x M", "K", "pointops ms", "pairs/s", "torch ms", "vs torch", "index check: max rel excess over f64 top-K"]
    if p3d is not None:
        header += ["PyTorch3D ms", "vs PyTorch3D", "same idx as PyTorch3D"]
    text = ("## knn_points\n\nUnit-cube clouds, float32, D = 3. torch: `cdist(p1, p2).pow(2).topk(K, largest=False)`, "
            "query-chunked. PyTorch3D: its knn CUDA kernel plus its Python sort, as `knn_points` runs it. pairs/s = "
            "B N M / time. max rel err: pointops' K distances against a float64 brute force on 256 sampled queries. "
            "Index agreement with PyTorch3D is below 100% only where distances tie to float32 rounding (its sort is "
            "not stable; its distances are not fused multiply-adds).\n\n")
    text += markdown_table(header, rows)
    if device == "cpu":  # against the CPU nearest-neighbour kernel's pair rate
        t_nn = timed(lambda: pointops.nearest_neighbor(p1, p2))
        t_knn = timed(lambda: pointops.knn_points(p1, p2, K=16))
        text += (f"\n\nCPU: nearest_neighbor {B}x{N}x{N}: {t_nn:.1f} ms ({B * N * N / (t_nn * 1e-3):.2e} pairs/s); "
                 f"knn_points K=16: {t_knn:.1f} ms ({B * N * N / (t_knn * 1e-3):.2e} pairs/s), "
                 f"{t_knn / t_nn:.2f}x the NN time.")
    return text


def ball_query_section(quick, device, p3d):
    B, N = (2, 2048) if quick or device == "cpu" else (8, 16384)
    p1, p2 = cloud(B, N, 3, device), cloud(B, N, 4, device)
    K, r = 64, 0.1
    dists, idx, _ = pointops.ball_query(p1, p2, K=K, radius=r, return_nn=False)
    ref = torch_ball_query(p1, p2, K, r)
    exact = (ref == idx).double().mean().item()
    t = timed(lambda: pointops.ball_query(p1, p2, K=K, radius=r, return_nn=False))
    t_torch = timed(lambda: torch_ball_query(p1, p2, K, r))
    row = [f"{B}x{N}x{N}", K, r, f"{t:.3f}", f"{B * N * N / (t * 1e-3):.2e}", f"{t_torch:.3f}", f"{t_torch / t:.1f}x",
           f"{100 * exact:.3f}%"]
    header = ["B x N x M", "K", "radius", "pointops ms", "pairs/s", "torch ms", "vs torch", "same idx as torch"]
    if p3d is not None:
        p3d_idx, _ = pytorch3d_ball_query(p3d, p1, p2, K, r)
        t_p3d = timed(lambda: pytorch3d_ball_query(p3d, p1, p2, K, r))
        row += [f"{t_p3d:.3f}", f"{t_p3d / t:.1f}x", f"{100 * (p3d_idx == idx).double().mean().item():.3f}%"]
        header += ["PyTorch3D ms", "vs PyTorch3D", "same idx as PyTorch3D"]
    text = ("## ball_query\n\nThe first K points within the radius, in index order (squared distance < r^2). torch: "
            "`cdist` mask and the K smallest indices inside, query-chunked (its distances use the matrix-product "
            "form, so a point at the boundary can fall on either side: agreement below 100% by that much).\n\n")
    return text + markdown_table(header, [row])


def farthest_points_section(quick, device, p3d):
    cases = [(2, 4096, 256)] if quick or device == "cpu" else [(16, 65536, 4096), (1, 1 << 20, 16384)]
    rows = []
    for B, N, K in cases:
        pts = cloud(B, N, 5, device)
        _, idx = pointops.sample_farthest_points(pts, K=K)
        t = timed(lambda: pointops.sample_farthest_points(pts, K=K))
        ref = torch_fps(pts, min(K, 512))
        same_prefix = (ref == idx[:, :ref.shape[1]]).all(1).double().mean().item()
        t_torch = timed(lambda: torch_fps(pts, K), budget_ms=1)
        row = [f"{B}x{N} -> {K}", f"{t:.2f}", f"{t_torch:.1f}", f"{t_torch / t:.0f}x", f"{100 * same_prefix:.0f}%"]
        if p3d is not None:
            p3d_idx = pytorch3d_fps(p3d, pts, K)
            t_p3d = timed(lambda: pytorch3d_fps(p3d, pts, K), budget_ms=1)
            row += [f"{t_p3d:.1f}", f"{t_p3d / t:.0f}x", f"{100 * (p3d_idx == idx).all(1).double().mean().item():.0f}%"]
        rows.append(row)
    header = ["B x N -> K", "pointops ms", "torch loop ms", "vs torch", "clouds equal to torch (first 512)"]
    if p3d is not None:
        header += ["PyTorch3D ms", "vs PyTorch3D", "clouds equal to PyTorch3D"]
    text = ("## sample_farthest_points\n\nUnit-cube clouds, float32, start at point 0. torch: a Python loop of K - 1 "
            "(distance, minimum, argmax) steps over the batch. Equality: whole index rows (the first 512 samples "
            "for torch), which can part at a float32 near-tie of two maxima.\n\n")
    return text + markdown_table(header, rows)


def run(quick: bool = False, parts=("knn", "ball_query", "farthest_points")) -> str:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    p3d = load_pytorch3d() if device == "cuda" else None
    sections = {"knn": knn_section, "ball_query": ball_query_section, "farthest_points": farthest_points_section}
    return "\n\n".join(sections[part](quick, device, p3d) for part in parts)
