"""Where does the fwd+bwd time of chamfer_distance go?
    python scripts/debug/profile_chamfer.py [B N]     (default 8 8192: B x N x N clouds)"""
import sys
import time
import torch
import pointops
from torch.profiler import ProfilerActivity, profile

B, N = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (8, 8192)
print(f"chamfer_distance fwd+bwd, {B} x {N} x {N}")
x = torch.randn(B, N, 3, device="cuda", requires_grad=True)
y = torch.randn(B, N, 3, device="cuda", requires_grad=True)
def step():
    pointops.chamfer_distance(x, y)[0].backward()
for _ in range(5):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(20):
    step()
t1 = time.perf_counter()
torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"host enqueue {1e3*(t1-t0)/20:.3f} ms/step, wall {1e3*(t2-t0)/20:.3f} ms/step")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=10, max_name_column_width=60))
