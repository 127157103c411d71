"""One warm call of each neighbourhood op at the benchmark sizes, for ncu / nsys:
    ncu -k regex:knn_search --launch-skip 1 --launch-count 1 --section ... python scripts/debug/profile_neighbors.py knn 16
    python scripts/debug/profile_neighbors.py ball|fps|fps1m|knn K
(fps: 16 x 65536 points, fps1m: 1 x 2^20 points, the benchmark's two farthest-point sizes)
Each op runs twice (the first call is the warm-up ncu skips) and the second call is timed with events.
"""
import sys

import torch

import pointops

op = sys.argv[1] if len(sys.argv) > 1 else "knn"
K = int(sys.argv[2]) if len(sys.argv) > 2 else 16
g = torch.Generator(device="cuda").manual_seed(0)
if op == "knn":
    p1, p2 = (torch.rand(8, 8192, 3, generator=g, device="cuda") for _ in range(2))
    call = lambda: pointops.knn_points(p1, p2, K=K)
elif op == "ball":
    p1, p2 = (torch.rand(8, 16384, 3, generator=g, device="cuda") for _ in range(2))
    call = lambda: pointops.ball_query(p1, p2, K=K, radius=0.1, return_nn=False)
else:
    pts = torch.rand(*((1, 2**20) if op == "fps1m" else (16, 65536)), 3, generator=g, device="cuda")
    call = lambda: pointops.sample_farthest_points(pts, K=K)
for _ in range(2):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
print(f"{op} K={K}: {start.elapsed_time(end):.3f} ms (second call)")
if len(sys.argv) > 3 and sys.argv[3] == "kernels":  # where the GPU time of one call goes
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=70))
