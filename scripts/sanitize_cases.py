"""Every CUDA kernel once, on small inputs, for compute-sanitizer (memcheck, racecheck, ...).

    compute-sanitizer --tool racecheck python scripts/sanitize_cases.py
Exits non-zero if any output is wrong, so a sanitizer run also checks results.
"""
import torch

import pointops


def chamfer_cases():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for dim in (2, 3, 5):
            x = torch.randn(3, 700, dim, device="cuda", dtype=dtype, requires_grad=True)
            y = torch.randn(3, 530, dim, device="cuda", dtype=dtype, requires_grad=True)
            xl = torch.tensor([700, 0, 301], device="cuda")
            yl = torch.tensor([1, 530, 257], device="cuda")
            dist1, dist2, idx1, idx2 = pointops.chamfer(x, y, xl, yl)
            ref1, _, _, _ = pointops.chamfer(x.detach().cpu(), y.detach().cpu(), xl.cpu(), yl.cpu())
            assert torch.allclose(dist1.cpu().double(), ref1.double(), rtol=1e-2, equal_nan=True), (dtype, dim)
            (dist1.sum() + dist2.sum()).backward()
            torch.use_deterministic_algorithms(True)
            x.grad = y.grad = None
            pointops.chamfer_distance(x, y, xl, yl).backward()
            torch.use_deterministic_algorithms(False)
    # empty clouds and an empty batch
    e = torch.zeros(2, 0, 3, device="cuda")
    f = torch.randn(2, 4, 3, device="cuda")
    pointops.chamfer(e, f)
    pointops.chamfer(f, e)
    pointops.chamfer(f[:0], f[:0])
    print("chamfer cases ok")


if __name__ == "__main__":
    chamfer_cases()
    torch.cuda.synchronize()
