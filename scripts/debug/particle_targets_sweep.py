"""Targets per thread of particle_sum's few-targets kernels (launch_d3_few), one process per choice:

    for q in default 1 2; do POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD=$q \\
        python scripts/debug/particle_targets_sweep.py; done

(the variable is read once per process; "default" is not a valid value, so it leaves the rule.)
Each case's result is first checked against a float64 direct sum on 3,000 of its targets (the tests'
tolerances for float32: relative L2 1e-6, 1e-5 for Helmholtz). Then two times: "kernel", a CUDA
graph of 20 calls replayed 30 times, median per call (the GPU's time, launch gaps inside a graph
~1 us); "one call", CUDA events around a single eager call, median of 300 (issue 19's measure:
the host's time to the launch, the launch, the kernel).
"""
import os
import sys
from pathlib import Path

import torch

import pointops

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_particle_sum import oracle_sum, params, rel_l2  # noqa: E402  (its float64 oracle, sigma 0.1, k 20)
from common import time_ms  # noqa: E402  (benchmarks/common.py)

# name: (B, M, N, kernel, columns, complex weights)
CASES = {
    "seed 480000x50 gaussian": (1, 480_000, 50, "gaussian", None, False),
    "300000x50 gaussian": (1, 300_000, 50, "gaussian", None, False),
    "2x240007x50 gaussian C=2": (2, 240_007, 50, "gaussian", 2, False),
    "480000x256 gaussian": (1, 480_000, 256, "gaussian", None, False),
    "520000x200 laplace": (1, 520_000, 200, "laplace", None, False),
    "480000x50 helmholtz complex": (1, 480_000, 50, "helmholtz", None, True),
}


def inputs(B, M, N, C, complex_weights, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(B, M, 3, device="cuda", generator=g)
    y = torch.rand(B, N, 3, device="cuda", generator=g)
    shape = (B, N) if C is None else (B, N, C)
    w = torch.randn(shape, device="cuda", generator=g)
    if complex_weights:
        w = torch.complex(w, torch.randn(shape, device="cuda", generator=g))
    return x, y, w


def graph_us_per_call(fn, calls=20, replays=30):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    q = os.environ.get("POINTOPS_PARTICLE_FEW_TARGETS_PER_THREAD", "default")
    for name, (B, M, N, kernel, C, complex_weights) in CASES.items():
        x, y, w = inputs(B, M, N, C, complex_weights)
        fn = lambda: pointops.particle_sum(x, y, w, kernel, **params(kernel))  # noqa: E731
        out = fn()
        pick = torch.cat([torch.arange(1000), torch.randperm(M, generator=torch.Generator().manual_seed(1))[:1000],
                          torch.arange(M - 1000, M)]).cuda()
        ref = torch.stack([oracle_sum(x[b], y[b], w[b], kernel, pick) for b in range(B)])
        err = rel_l2(out[:, pick], ref)
        limit = 1e-5 if kernel == "helmholtz" else 1e-6
        assert err <= limit, (name, q, err)
        kernel_us = graph_us_per_call(fn)
        one_call_us = time_ms(fn, warmup=20, repeat=300, cuda=True) * 1e3
        print(f"q={q:>7} | {name:28} | kernel {kernel_us:6.1f} us | one call {one_call_us:6.1f} us | "
              f"rel L2 {err:.1e}", flush=True)
