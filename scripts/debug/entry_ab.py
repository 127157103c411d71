"""Host time of the fronts calling the OpOverload against its C++ entry (pointops/_entry.py),
interleaved in one process: this CPU's clock drifts by up to 2x within a benchmark run, so two
separate runs of bench_overhead.py cannot resolve a 0.2 µs difference.

    PYTHONPATH=. python scripts/debug/entry_ab.py [rounds]

Each round times 2000 calls of the front with the module's global set to the overload, then 2000
with the entry, then 2000 of torch.exp on 8 elements (the overhead benchmark's unit); the median
over rounds of each, and of the per-round difference, are printed (µs; units = µs / exp's)."""
import importlib
import statistics
import sys
import time

import torch

import pointops

# The modules, not the package's functions of the same names.
strided, chamfer, chamfer_loss, particle_sum, voxelize = (
    importlib.import_module(f"pointops.{name}") for name in ("strided", "chamfer", "chamfer_loss", "particle_sum",
                                                              "voxelize"))


def per_call_us(fn, calls=2000):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) * 1e6 / calls


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 41
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, m = torch.rand(8, generator=g), torch.rand(2, 2, generator=g)
    x, y = torch.rand(1, 8, 3, generator=g), torch.rand(1, 8, 3, generator=g)
    t, s, w = torch.rand(8, 3, generator=g), torch.rand(8, 3, generator=g), torch.rand(8, generator=g)
    pts = torch.rand(8, 4, generator=g)
    vs, pr = (0.25, 0.25, 0.25), (0.0, 0.0, 0.0, 1.0, 1.0, 1.0)  # the same tuples each call, as a loop passes them
    ops = torch.ops.pointops
    cases = [  # (name, module, global, overload, call)
        ("strided.map exp", strided, "_MAP", ops.strided_map.default, lambda: strided.map(a, "exp")),
        ("strided.reduce sum, dim 0", strided, "_REDUCE", ops.strided_reduce.default, lambda: strided.reduce(m, 0)),
        ("chamfer", chamfer, "_CHAMFER", ops.chamfer.default, lambda: pointops.chamfer(x, y)),
        ("chamfer_distance fwd", chamfer_loss, "_CHAMFER_DISTANCE", ops._chamfer_distance.default,
         lambda: pointops.chamfer_distance(x, y)[0]),
        ("particle_sum gaussian", particle_sum, "_PARTICLE_SUM", ops.particle_sum.default,
         lambda: pointops.particle_sum(t, s, w, sigma=0.5)),
        ("voxelize", voxelize, "_VOXELIZE", ops.voxelize.default,
         lambda: pointops.voxelize(pts, vs, pr, 4, 100_000)),
    ]
    unit = lambda: torch.exp(a)  # noqa: E731
    print(f"torch {torch.__version__}; {rounds} rounds of 2000 calls; median µs (units of torch.exp)")
    print("| front | OpOverload | C++ entry | difference per round | exp |")
    print("|---|---|---|---|---|")
    for name, module, attr, overload, call in cases:
        entry = getattr(module, attr)
        assert entry is not overload, f"{name}: the module does not use an entry"
        for _ in range(2000):
            call()
        old, new, exp = [], [], []
        for _ in range(rounds):
            setattr(module, attr, overload)
            old.append(per_call_us(call))
            setattr(module, attr, entry)
            new.append(per_call_us(call))
            exp.append(per_call_us(unit))
        setattr(module, attr, entry)
        u = statistics.median(exp)
        o, n = statistics.median(old), statistics.median(new)
        d = statistics.median([p - q for p, q in zip(old, new)])
        print(f"| {name} | {o:.2f} ({o / u:.2f}) | {n:.2f} ({n / u:.2f}) | {d:.2f} ({d / u:.2f}) | {u:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
