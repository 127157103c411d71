"""Two kernels that miss issue 19's end-to-end targets, for ncu: the particle-sum seed case
(480,000 targets x 50 sources, Gaussian) and the full strided reduction of 2^25 float32 (its main
kernel and the partials' combine). Each is called a few times (warm-up) before the profiled call.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats python scripts/debug/ncu_leads.py
"""
import torch

import pointops
from pointops import strided

g = torch.Generator(device="cuda").manual_seed(0)
targets = torch.rand(480_000, 3, device="cuda", generator=g)
sources = torch.rand(50, 3, device="cuda", generator=g)
weights = torch.randn(50, device="cuda", generator=g)
x = torch.rand(4096, 8192, device="cuda", generator=g)
for _ in range(3):
    pointops.particle_sum(targets, sources, weights, "gaussian", sigma=0.1)
for _ in range(3):
    strided.reduce(x)
torch.cuda.synchronize()
torch.cuda.profiler.start()  # ncu --profile-from-start off profiles from here
pointops.particle_sum(targets, sources, weights, "gaussian", sigma=0.1)
strided.reduce(x)  # the main kernel and the partials' combine
torch.cuda.synchronize()
torch.cuda.profiler.stop()
