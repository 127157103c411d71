"""Per-kernel time of voxelize on the nuScenes scan (the 0.15 ms target). Run from the repo root
with the LiDAR files in .data/lidar: python scripts/debug/profile_voxelize.py"""
import numpy as np
import torch
import pointops
from torch.profiler import ProfilerActivity, profile

raw = np.fromfile(".data/lidar/ff9eff4389a740848f9a56ad749a4ae8.bin", np.float16).reshape(-1, 5).astype(np.float32)
pts = torch.from_numpy(raw).cuda()
args = ([0.075, 0.075, 0.2], [-54, -54, -5, 54, 54, 3], 10, 160000)
for padded in (False, True):
    for _ in range(10):
        pointops.voxelize(pts, *args, padded=padded)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            pointops.voxelize(pts, *args, padded=padded)
        torch.cuda.synchronize()
    print(f"padded={padded}")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=70))
