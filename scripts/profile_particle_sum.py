"""Where does particle_sum's time go? Host enqueue vs wall time of the small calls (the seed case,
few targets), the kernels behind each case (torch.profiler), and one launch of each case for ncu:

    python scripts/profile_particle_sum.py                 # timings + profiler tables
    ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:particle_sum_d3 \\
        --section SchedulerStats --section WarpStateStats python scripts/profile_particle_sum.py gaussian
"""
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import pointops

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_particle_sum import SIGMA, oracle_sum, rel_l2  # noqa: E402  (its float64 oracle)
from common import time_ms  # noqa: E402  (benchmarks/common.py)


def inputs(M, N, C=None, complex_weights=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(M, 3, device="cuda", generator=g)
    y = torch.rand(N, 3, device="cuda", generator=g)
    w = torch.randn((N,) if C is None else (N, C), device="cuda", generator=g,
                    dtype=torch.complex64 if complex_weights else torch.float32)
    return x, y, w


CASES = {
    "gaussian": lambda: (inputs(100_000, 100_000), "gaussian", {"sigma": 0.1}),
    "laplace": lambda: (inputs(100_000, 100_000), "laplace", {}),
    "helmholtz": lambda: (inputs(100_000, 100_000, complex_weights=True), "helmholtz", {"wavenumber": 20.0}),
    "rhs16": lambda: (inputs(100_000, 100_000, C=16), "gaussian", {"sigma": 0.1}),
    "moments": lambda: (inputs(100_000, 100_000), "gaussian", {"sigma": 0.1}),
    "seed": lambda: (inputs(480_000, 50), "gaussian", {"sigma": 0.1}),
    "few": lambda: (inputs(50, 1_000_000), "gaussian", {"sigma": 0.1}),
}


def call(name, case=None):
    (x, y, w), kernel, params = CASES[name]() if case is None else case
    if name == "moments":
        x = x[None]
        return lambda: torch.ops.pointops._particle_sum_moments(x, y[None], w[None], kernel, params.get("sigma"), None)
    return lambda: pointops.particle_sum(x, y, w, kernel, **params)


def host_and_wall(fn, repeat=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / repeat, 1e6 * (t2 - t0) / repeat


if __name__ == "__main__":
    if len(sys.argv) > 1:  # one case, a few launches (for ncu)
        fn = call(sys.argv[1])
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        sys.exit(0)
    for name in ("seed", "few"):
        case = CASES[name]()
        fn = call(name, case)
        if name == "seed":  # the forced variant's result first, against a float64 oracle (1e-6: the tests')
            (x, y, w), kernel, params = case
            assert params["sigma"] == SIGMA, "the oracle's sigma"
            ref = oracle_sum(x, y, w, kernel, torch.arange(x.shape[0]))
            err = rel_l2(fn(), ref)
            print(f"seed: relative L2 error {err:.2e} against float64")
            assert err <= 1e-6, err
        host, wall = host_and_wall(fn)
        single = time_ms(fn, warmup=20, repeat=400, cuda=True)
        print(f"{name}: host enqueue {host:.1f} us/call, wall {wall:.1f} us/call back to back, one call "
              f"{single * 1e3:.1f} us (CUDA events, median of 400; POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD="
              f"{os.environ.get('POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD', 'unset')})")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=6, max_name_column_width=70))
