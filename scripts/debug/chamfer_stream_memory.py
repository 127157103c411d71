"""Memory the caching allocator holds after many unsynchronised grid chamfer calls (two
streams) against the same two directions on one stream (two knn_points calls)."""
import sys
from pathlib import Path
import torch
import pointops  # noqa: F401
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_cuda_check import lidar_scans, rigid_motion  # noqa: E402
ops = torch.ops.pointops
scan = lidar_scans()["KITTI frame"][None].cuda()
moved = rigid_motion(scan)
both = lambda: ops.chamfer(scan, moved, algorithm="grid")  # noqa: E731
def one_stream():
    return (ops.knn_points(scan, moved, K=1, algorithm="grid")[:2], ops.knn_points(moved, scan, K=1, algorithm="grid")[:2])
auto = lambda: ops.chamfer(scan, moved)  # noqa: E731
for name, f in [("one stream (two knn_points)", one_stream), ("chamfer grid, two streams", both),
                ("chamfer auto, two streams", auto)]:
    for calls in (1, 10, 100, 400):
        torch.cuda.synchronize(); torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        for _ in range(calls):
            f()
        torch.cuda.synchronize()
        print(f"{name:28s} {calls:4d} calls unsynced: reserved {torch.cuda.memory_reserved() / 2**20:7.1f} MB, "
              f"peak allocated {torch.cuda.max_memory_allocated() / 2**20:7.1f} MB", flush=True)
