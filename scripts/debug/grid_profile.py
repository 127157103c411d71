"""What a grid search spends its GPU time on: torch.profiler's CUDA time per kernel (build kernels,
the cub sort, the search) for a few named cases, five calls each.

    python scripts/debug/grid_profile.py [case ...]   (default: all; see CASES)"""
import math
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import pointops  # noqa: F401

ops = torch.ops.pointops
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grid_cuda_check import lidar_scans, rigid_motion  # noqa: E402


def cases():
    g = torch.Generator(device="cuda").manual_seed(5)
    u = lambda *s: torch.rand(*s, generator=g, device="cuda")  # noqa: E731
    p1, p2 = u(8, 16384, 3), u(8, 16384, 3)
    yield "ball K=64 r=0.1 8x16384^2", lambda: ops.ball_query(p1, p2, K=64, radius=0.1, algorithm="grid")
    s1, s2 = u(8, 8192, 3), u(8, 8192, 3)
    yield "knn K=8 8x8192^2", lambda: ops.knn_points(s1, s2, K=8, algorithm="grid")
    x, y = u(1, 1 << 20, 3), u(1, 1 << 20, 3)
    yield "knn K=1 1M uniform", lambda: ops.knn_points(x, y, K=1, algorithm="grid")
    for name, scan in lidar_scans().items():
        a = scan[None].cuda()
        b = rigid_motion(a)
        yield f"knn K=1 {name} moved vs scan", lambda a=a, b=b: ops.knn_points(b, a, K=1, algorithm="grid")


def main():
    wanted = sys.argv[1:]
    print("grid profile on", torch.cuda.get_device_name(), flush=True)
    for name, fn in cases():
        if wanted and not any(w in name for w in wanted):
            continue
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA or
                  getattr(e, "self_device_time_total", 0) > 0]
        total = sum(getattr(e, "self_device_time_total", 0) for e in events) / 5
        print(f"== {name}: {total / 1e3:.3f} ms of kernels per call", flush=True)
        for e in sorted(events, key=lambda e: -getattr(e, "self_device_time_total", 0))[:12]:
            t = getattr(e, "self_device_time_total", 0) / 5
            if t > 0:
                print(f"   {t / 1e3:8.4f} ms  x{e.count // 5:<3d} {e.key[:110]}", flush=True)


if __name__ == "__main__":
    main()
