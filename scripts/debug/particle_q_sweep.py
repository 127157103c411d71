"""particle_sum (Gaussian, D = 3, one weight column) timed at shapes around the choice between the
one-target-per-thread and the several-targets-per-thread CUDA variants (kUnsplitTargetsPerSm in
csrc/particle_sum/particle_sum_cuda.cu). CUDA events, median of 200 calls; the sum of each result
is printed so that two builds can be compared.

    python scripts/debug/particle_q_sweep.py
"""
import sys

import torch

import pointops

sys.path.insert(0, "benchmarks")
from common import time_ms  # noqa: E402

SHAPES = [(480_000, 50), (1_000_000, 50), (2_000_000, 50), (200_000, 50), (480_000, 500), (100_000, 1000),
          (480_000, 1500), (60_000, 50)]

rows = []
for M, N in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    targets = torch.rand(M, 3, device="cuda", generator=g)
    sources = torch.rand(N, 3, device="cuda", generator=g)
    weights = torch.randn(N, device="cuda", generator=g)
    call = lambda: pointops.particle_sum(targets, sources, weights, "gaussian", sigma=0.1)  # noqa: E731
    total = call().double().sum().item()
    rows.append(f"{M}x{N} {time_ms(call, warmup=10, repeat=200, cuda=True):.4f} ms sum={total:.6e}")
print(" | ".join(rows))
