"""Host time per call (µs, perf_counter around many calls, then one synchronize) of a backward on
the current machine: plain torch on a tiny graph (the autograd engine's own cost, CUDA's device
thread included) beside chamfer / chamfer_distance at 32 x 2048^2, and a profile of the latter
with input shapes (which op of the backward takes the host time).
    python scripts/debug/host_probe.py
"""
import time

import torch
from torch.profiler import ProfilerActivity, profile

import pointops


def bench(name, fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{name}: host {1e6 * (t1 - t) / n:.1f} us/call")


for dev in ("cuda", "cpu"):
    w = torch.randn(64, 3, device=dev, requires_grad=True)
    bench(f"torch (w * 2).sum() fwd, {dev}", lambda: (w * 2).sum())
    bench(f"torch (w * 2).sum().backward(), {dev}", lambda: (w * 2).sum().backward())
g = torch.ones((), device="cuda")
bench("0-dim cuda tensor / 8.0", lambda: g / 8.0, 2000)
x = torch.randn(32, 2048, 3, device="cuda", requires_grad=True)
y = torch.randn(32, 2048, 3, device="cuda", requires_grad=True)
bench("chamfer_distance fwd", lambda: pointops.chamfer_distance(x, y), 200)
bench("chamfer_distance fwd+bwd", lambda: pointops.chamfer_distance(x, y)[0].backward(), 200)
bench("chamfer fwd", lambda: pointops.chamfer(x, y), 200)
bench("chamfer fwd+bwd (sum)", lambda: sum(t.sum() for t in pointops.chamfer(x, y)[:2]).backward(), 200)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
    for _ in range(5):
        pointops.chamfer_distance(x, y)[0].backward()
    torch.cuda.synchronize()
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=12,
                                                         max_name_column_width=40, max_shapes_column_width=60))
