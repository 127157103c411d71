"""Far queries on the CPU: nearest_neighbor with queries near a sphere of references (0.1% off its
radius), 10% off, and in a blob at its centre, timed with algorithm="brute", "grid" and "auto"
(best of 3 wall times, torch's threads). The blob is the case the grid's probe hands back to brute
force (csrc/grid/grid_search_cpu.cpp, probe_says_brute); results are checked equal to brute force.

    python scripts/far_queries_cpu.py [sizes...]
"""
import sys
import time

import torch

import pointops


def best_ms(fn, repeat=3):
    out = fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, out


def sphere(n, g):
    v = torch.randn(1, n, 3, generator=g)
    return v / v.norm(dim=-1, keepdim=True)


sizes = [int(a) for a in sys.argv[1:]] or [20_000, 50_000]
print(f"threads: {torch.get_num_threads()}")
print("| points (N = M) | queries | brute ms | grid ms | auto ms | auto / brute |")
print("|---|---|---|---|---|---|")
for n in sizes:
    g = torch.Generator().manual_seed(0)
    y = sphere(n, g)
    for name, x in (("near (radius x 1.001)", sphere(n, g) * 1.001), ("10% off (radius x 1.1)", sphere(n, g) * 1.1),
                    ("blob at the centre (sd 0.02)", torch.randn(1, n, 3, generator=g) * 0.02)):
        tb, want = best_ms(lambda: pointops.nearest_neighbor(x, y, algorithm="brute"))
        tg, got_grid = best_ms(lambda: pointops.nearest_neighbor(x, y, algorithm="grid"), repeat=1)
        ta, got_auto = best_ms(lambda: pointops.nearest_neighbor(x, y))
        for got in (got_grid, got_auto):
            assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
        print(f"| {n:,} | {name} | {tb:.1f} | {tg:.1f} | {ta:.1f} | {ta / tb:.2f} |")
