"""Packed-cloud neighbourhoods against torch_cluster 1.6.3: knn_graph, radius_graph, knn, radius, fps.

    python benchmarks/run.py --only cluster
    python benchmarks/bench_cluster.py [--quick] [--batch-only]

pointops' torch_cluster faces (pointops.knn_graph, radius_graph, knn, radius, fps) against
torch_cluster's own CUDA ops, in the same process. torch_cluster is JIT-built from its unmodified
sources in the git-ignored .peers/torch_cluster/ (benchmarks/peers.py), and the Python logic that
torch_cluster runs around its CUDA calls (batch pointers; knn_graph's k + 1 neighbours and self-loop
mask; radius_graph's ignore_same_index; the flow swap) is replayed by peers.py's wrappers, so a
torch_cluster timing covers the work of calling torch_cluster.

Correctness comes first, on every row: the two edge lists, sorted as (query, neighbour) pairs, must
be equal; a row that differs says for how many queries (for fps: how many clouds' sample sequences).
CUDA events, warm-up, median of repeats (benchmarks/common.py).

Without CUDA the section prints one line saying it is skipped. On the CPU with --quick, if the
torch_cluster sources are present, it instead checks the comparison path at tiny sizes against
torch_cluster's CPU ops (k-d trees, built once with torch.utils.cpp_extension), without timings.
"""
import torch

import pointops
from common import markdown_table, time_ms
from peers import (load_torch_cluster, load_torch_cluster_cpu, torch_cluster_fps, torch_cluster_knn,
                   torch_cluster_knn_graph, torch_cluster_radius, torch_cluster_radius_graph)

TARGET = 3.0  # pointops should be at least this many times faster than torch_cluster

# (a) a batch of clouds, the PyG training shape; (b) one large cloud, where torch_cluster's CUDA
# search, brute force within each cloud, is O(N^2).
BATCH, BATCH_QUICK = (64, 4096), (8, 1024)
LARGE, LARGE_QUICK = 1_000_000, 65536
K, R, MAX_NEIGHBORS, RATIO = 16, 0.1, 32, 0.25
# r for the large cloud: 0.1 * (4096 / 1e6) ** (1/3), the radius that holds as many points of 1M
# uniform points (~17 per ball) as r = 0.1 does of a 4096-point cloud. At r = 0.1 a ball of the 1M
# cloud holds ~4,200 points: max_num_neighbors = 32 would keep an arbitrary lowest-index 1% of each
# ball, and torch_cluster's search would stop after ~7,600 points instead of scanning the cloud.
R_LARGE = 0.016


def uniform(n, seed, device):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.rand(n, 3, generator=g, device=device)


def differing_queries(ours, theirs, query_row, num_nodes):
    """How many queries have different neighbour sets in two (2, E) edge lists (order free)."""
    def keys(edges):
        return torch.sort(edges[query_row] * num_nodes + edges[1 - query_row]).values

    a, b = keys(ours), keys(theirs)
    if a.shape == b.shape and torch.equal(a, b):
        return 0
    # Edges in one list only, plus queries whose edge counts differ (catches duplicated edges).
    only = torch.cat([a[~torch.isin(a, b)], b[~torch.isin(b, a)]]) // num_nodes
    count_a = torch.bincount(a // num_nodes, minlength=num_nodes)
    count_b = torch.bincount(b // num_nodes, minlength=num_nodes)
    return int(torch.unique(torch.cat([only, torch.nonzero(count_a != count_b).flatten()])).numel())


def differing_clouds(ours, theirs, batch):
    """How many clouds' fps sequences differ (both list cloud 0's samples in order, then cloud 1's...)."""
    if ours.shape != theirs.shape:
        return int(torch.unique(torch.cat([batch[ours], batch[theirs]])).numel())
    return int(torch.unique(batch[theirs[ours != theirs]]).numel())


def exact_text(n, unit):
    return "yes" if n == 0 else f"no ({n} {unit} differ)"


def row(case, label, ours, theirs, check, unit, timing):
    """One table row: correctness on the first calls, then (timing = (pointops, torch_cluster)
    (warm-up, repeat) pairs, or None) the medians."""
    if ours is None:
        return [case, label, "-", "-", "-", "-", "-", f"pointops.{label.split()[0].split('(')[0]} not available"]
    out, ref = ours(), theirs()
    exact = exact_text(check(out, ref), unit)
    if timing is None:
        return [case, label, ref.shape[-1], "-", "-", "-", "-", exact]
    (w_po, n_po), (w_tc, n_tc) = timing
    t_po = time_ms(ours, warmup=w_po, repeat=n_po, cuda=True)
    t_tc = time_ms(theirs, warmup=w_tc, repeat=n_tc, cuda=True)
    return [case, label, ref.shape[-1], f"{t_po:.3f}", f"{t_tc:.3f}", f"{t_tc / t_po:.1f}x",
            f"{w_po}+{n_po} / {w_tc}+{n_tc}", exact]


def graph_rows(case, x, batch, r, mod, timing, max_neighbors=MAX_NEIGHBORS):
    """knn_graph and radius_graph rows of one point set (source_to_target: row 1 is the query)."""
    n = x.shape[0]
    knn_graph, radius_graph = getattr(pointops, "knn_graph", None), getattr(pointops, "radius_graph", None)
    return [
        row(case, f"knn_graph k={K}",
            knn_graph and (lambda: knn_graph(x, K, batch, loop=False, flow="source_to_target")),
            lambda: torch_cluster_knn_graph(mod, x, K, batch, loop=False, flow="source_to_target"),
            lambda a, b: differing_queries(a, b, 1, n), "queries", timing),
        row(case, f"radius_graph r={r} max={max_neighbors}",
            radius_graph and (lambda: radius_graph(x, r, batch, loop=False, max_num_neighbors=max_neighbors,
                                                   flow="source_to_target")),
            lambda: torch_cluster_radius_graph(mod, x, r, batch, loop=False, max_num_neighbors=max_neighbors,
                                               flow="source_to_target"),
            lambda a, b: differing_queries(a, b, 1, n), "queries", timing),
    ]


def flat_rows(case, x, batch, r, mod, timing, max_neighbors=MAX_NEIGHBORS):
    """knn(x, x), radius(x, x) and fps rows of one batch of clouds (row 0 is the query)."""
    n = x.shape[0]
    return [
        row(case, f"knn(x, x) k={K}", lambda: pointops.knn(x, x, K, batch, batch),
            lambda: torch_cluster_knn(mod, x, x, K, batch, batch),
            lambda a, b: differing_queries(a, b, 0, n), "queries", timing),
        row(case, f"radius(x, x) r={r} max={max_neighbors}",
            lambda: pointops.radius(x, x, r, batch, batch, max_num_neighbors=max_neighbors),
            lambda: torch_cluster_radius(mod, x, x, r, batch, batch, max_num_neighbors=max_neighbors),
            lambda a, b: differing_queries(a, b, 0, n), "queries", timing),
        # random_start=False: both start each cloud at its first point, so the sequences must agree.
        row(case, f"fps ratio={RATIO}", lambda: pointops.fps(x, batch, ratio=RATIO, random_start=False),
            lambda: torch_cluster_fps(mod, x, batch, ratio=RATIO, random_start=False),
            lambda a, b: differing_clouds(a, b, batch), "clouds", timing),
    ]


HEADER = ["case", "op", "edges / samples", "pointops ms", "torch_cluster ms", "torch_cluster / pointops",
          "warm-up+timed (pointops / torch_cluster)", "exact"]


def cuda_section(quick, mod, large_cloud=True):
    (B, N), large = (BATCH_QUICK, LARGE_QUICK) if quick else (BATCH, LARGE)
    fast, slow = ((3, 20), (3, 20)), ((3, 20), (1, 3))
    x = uniform(B * N, 0, "cuda")
    batch = torch.arange(B, device="cuda").repeat_interleave(N)  # sorted, as torch_cluster requires
    case = f"{B} x {N}"
    rows = graph_rows(case, x, batch, R, mod, fast) + flat_rows(case, x, batch, R, mod, fast)
    del x, batch
    if large_cloud:
        x = uniform(large, 1, "cuda")
        rows += graph_rows(f"1 x {large:,}", x, None, R_LARGE, mod, slow)
        del x
    timed = [r for r in rows if r[5] != "-"]
    met = sum(float(r[5][:-1]) >= TARGET for r in timed)
    text = (f"Target: pointops >= {TARGET:.0f}x torch_cluster (torch_cluster / pointops column). torch_cluster "
            "1.6.3's CUDA ops built from its unmodified sources, its Python logic around them replayed (peers.py). "
            f"Uniform points in the unit cube, float32, D = 3; ({case}) a sorted batch vector of {B} clouds, "
            f"(1 x {large:,}) one cloud. radius_graph of the large cloud uses r = {R_LARGE}: the radius that holds "
            f"as many points (~17) of {large:,} uniform points as r = {R} holds of a 4096-point cloud; at r = {R} "
            f"its balls hold ~4,200 points, of which max_num_neighbors = {MAX_NEIGHBORS} keeps the lowest-index "
            "1%. torch_cluster's CUDA knn / radius scan the whole cloud per query (O(N^2) on one cloud: seconds "
            "per call at 1M), so those rows time it with 1 warm-up + 3 timed calls; every other timing is 3 "
            "warm-ups + the median of 20. exact: the (query, neighbour) pairs of both, sorted, are equal "
            "(fps: each cloud's sample sequence, both starting at the cloud's first point); otherwise how many "
            f"queries (clouds) differ.\n\nRows at or above the target: {met} of {len(timed)}.\n\n")
    return text + markdown_table(HEADER, rows)


def cpu_smoke(mod):
    """The comparison path at tiny sizes against torch_cluster's CPU ops. Its radius caps
    max_num_neighbors in k-d tree order (CUDA: index order), so the cap is set above any ball here."""
    sizes = [150, 200, 250]
    x = uniform(sum(sizes), 0, "cpu")
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    rows = graph_rows("3 clouds", x, batch, 0.15, mod, None, 256)
    rows += flat_rows("3 clouds", x, batch, 0.15, mod, None, 256)
    rows += graph_rows("1 x 2,000", uniform(2000, 1, "cpu"), None, 0.1, mod, None, 2000)
    return ("CPU smoke run (no timings): pointops against torch_cluster's CPU ops, tiny sizes.\n\n"
            + markdown_table(HEADER, rows))


def run(quick: bool = False, large_cloud: bool = True) -> str:
    title = "## torch_cluster faces (knn_graph, radius_graph, knn, radius, fps)\n\n"
    if not torch.cuda.is_available():
        mod = load_torch_cluster_cpu() if quick else None  # a one-off build of about a minute
        if mod is None:
            return title + "skipped: needs CUDA (torch_cluster's CUDA ops and the timings run on a GPU)"
        return title + "skipped: needs CUDA for the timings.\n\n" + cpu_smoke(mod)
    mod = load_torch_cluster()
    if mod is None:
        return title + "skipped: needs torch_cluster's sources in .peers/torch_cluster/ (see benchmarks/peers.py)"
    return title + cuda_section(quick, mod, large_cloud)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch-only", action="store_true", help="leave out the 1M-point cloud (torch_cluster: ~1 min)")
    args = parser.parse_args()
    print(run(quick=args.quick, large_cloud=not args.batch_only))
