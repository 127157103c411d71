"""Every CUDA kernel once, on small inputs, for compute-sanitizer (memcheck, racecheck, ...).

    compute-sanitizer --tool racecheck python scripts/sanitize_cases.py
Exits non-zero if any output is wrong, so a sanitizer run also checks results.
"""
import torch

import pointops
from pointops import strided


def chamfer_cases():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for dim in (2, 3, 5):
            for norm in (1, 2):
                x = torch.randn(3, 700, dim, device="cuda", dtype=dtype, requires_grad=True)
                y = torch.randn(3, 530, dim, device="cuda", dtype=dtype, requires_grad=True)
                xl = torch.tensor([700, 0, 301], device="cuda")
                yl = torch.tensor([1, 530, 257], device="cuda")
                dist1, dist2, idx1, idx2 = pointops.chamfer(x, y, xl, yl, norm=norm)
                ref1, _, _, _ = pointops.chamfer(x.detach().cpu(), y.detach().cpu(), xl.cpu(), yl.cpu(), norm=norm)
                assert torch.allclose(dist1.cpu().double(), ref1.double(), rtol=1e-2, equal_nan=True), (dtype, dim)
                (dist1.sum() + dist2.sum()).backward()
                torch.use_deterministic_algorithms(True)
                x.grad = y.grad = None
                normals = torch.randn_like(x), torch.randn_like(y)
                loss, loss_normals = pointops.chamfer_distance(x, y, xl, yl, *normals, norm=norm)
                (loss + loss_normals).backward()
                torch.use_deterministic_algorithms(False)
    # empty clouds and an empty batch
    e = torch.zeros(2, 0, 3, device="cuda")
    f = torch.randn(2, 4, 3, device="cuda")
    pointops.chamfer(e, f)
    pointops.chamfer(f, e)
    pointops.chamfer(f[:0], f[:0])
    print("chamfer cases ok")


def voxelize_cases():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        points = (torch.rand(5000, 4, device="cuda") * 12 - 1).to(dtype)
        points[::7] = points[3]  # a crowded voxel
        points[5, 0] = float("nan")
        batch = torch.randint(0, 3, (5000,), device="cuda")
        for b in (None, batch):
            got = pointops.voxelize(points, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 5, 300, batch=b)
            ref = pointops.voxelize(points.cpu(), [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 5, 300,
                                    batch=None if b is None else b.cpu())
            for g, r in zip(got, ref):
                assert (g is None and r is None) or torch.equal(g.cpu(), r), dtype
            pointops.voxelize(points, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 5, 300, batch=b, padded=True)
            for reduce in ("mean", "sum", "max"):
                p = points.double().requires_grad_()
                out = pointops.voxel_features(p, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], reduce, batch=b)
                out.features.sum().backward()
    # More than 32 tiles of the numbering scan, so the look-back walks past its first window.
    points = torch.rand(40_000, 4, device="cuda") * 12 - 1
    got = pointops.voxelize(points, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 5, 3000)
    ref = pointops.voxelize(points.cpu(), [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 5, 3000)
    for g, r in zip(got, ref):
        assert (g is None and r is None) or torch.equal(g.cpu(), r), "40k points"
    empty = torch.zeros(0, 4, device="cuda")
    pointops.voxelize(empty, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 5, 300)
    pointops.voxel_features(empty, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10])
    print("voxelize cases ok")


def particle_sum_cases():
    """Every compiled variant family: D = 3 kernels with many and few targets (split sources and
    the merge), every column chunk, moments, complex weights, the any-D kernel, coincident points
    (the re-summed blocks), float64 and the half types."""
    torch.manual_seed(0)
    params = {"gaussian": {"sigma": 0.2}, "laplace": {}, "helmholtz": {"wavenumber": 7.0}}
    for kernel, p in params.items():
        for dtype in (torch.float32, torch.float64, torch.float16):
            for M, N, C in ((300, 700, None), (40_000, 300, 16), (50, 5000, 3)):
                x = torch.rand(M, 3, device="cuda", dtype=dtype)
                y = torch.rand(N, 3, device="cuda", dtype=dtype)
                y[:5] = x[:5]  # coincident pairs
                w = torch.randn((N,) if C is None else (N, C), device="cuda", dtype=dtype)
                got = pointops.particle_sum(x, y, w, kernel, **p)
                ref = pointops.particle_sum(x.cpu(), y.cpu(), w.cpu(), kernel, **p)
                err = ((got.cpu() - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-2, (kernel, dtype, M, N, C, err)
            wc = torch.randn(700, 2, device="cuda", dtype=torch.complex64 if dtype != torch.float64 else torch.complex128)
            xs = torch.rand(2, 300, 3, device="cuda", dtype=wc.real.dtype, requires_grad=True)
            ys = torch.rand(2, 700, 3, device="cuda", dtype=wc.real.dtype, requires_grad=True)
            wcb = wc.expand(2, 700, 2).clone().requires_grad_()
            pointops.particle_sum(xs, ys, wcb, kernel, **p).abs().sum().backward()
    for dim in (1, 2, 7):
        x = torch.rand(200, dim, device="cuda", requires_grad=True)
        y = torch.rand(3000, dim, device="cuda", requires_grad=True)
        w = torch.randn(3000, 5, device="cuda", requires_grad=True)
        pointops.particle_sum(x, y, w, "gaussian", sigma=0.3).sum().backward()
    e = torch.zeros(0, 3, device="cuda")
    f = torch.rand(4, 3, device="cuda")
    pointops.particle_sum(e, f, f[:, 0], "laplace")
    pointops.particle_sum(f, e, e[:, 0], "laplace")
    print("particle_sum cases ok")


def _close(got, ref, rtol):
    got, ref = got.double().cpu(), ref.double().cpu()
    scale = ref.abs().max().clamp(min=1e-30)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = ((got - ref).abs().max() / scale).item() if got.numel() else 0.0
    assert err <= rtol, err


def strided_cases():
    torch.manual_seed(0)
    for dtype, rtol in ((torch.float32, 1e-5), (torch.float64, 1e-12), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
        x = torch.randn(37, 130, dtype=dtype)
        views = [x, x.t(), x[1::2, 3::3], x[:, :128], torch.randn(1, 130, dtype=dtype).expand(37, 130)]
        for v in views:
            for fn in ("exp", "relu", "neg"):
                _close(strided.map(v.cuda(), fn), strided.map(v, fn), rtol)
            _close(strided.zip(v.cuda(), v[0].cuda(), "add"), strided.zip(v, v[0], "add"), rtol)
            for dim in (0, 1, None, (0, 1)):
                for fn in ("sum", "max"):
                    _close(strided.reduce(v.cuda(), dim, fn), strided.reduce(v.double(), dim, fn), rtol)
        long_row = (torch.rand(3, 300_000) / 300_000).to(dtype)  # sums ~0.5: finite in float16 too
        _close(strided.reduce(long_row.cuda(), 1), strided.reduce(long_row.double(), 1), rtol)
        for cols in (70, 128):  # outer reductions in chunks, element and vector columns
            long_col = torch.rand(10_000, cols, dtype=dtype)
            _close(strided.reduce(long_col.cuda(), 0), strided.reduce(long_col.double(), 0), rtol)
        flat = torch.rand(1 << 21, dtype=dtype) / (1 << 21)  # inner chunks combined by a block
        _close(strided.reduce(flat.cuda(), None), strided.reduce(flat.double(), None), rtol)
        for sa, sb in (((33, 71), (71, 65)), ((2, 1, 130, 260), (3, 260, 129)), ((5, 0), (0, 4)),
                       ((256, 144), (144, 384))):  # the last: whole tiles (float32 unchecked kernels)
            a, b = torch.randn(sa, dtype=dtype), torch.randn(sb, dtype=dtype)
            for ta, tb in ((a, b), (a.mT.contiguous().mT, b.mT.contiguous().mT)):
                ref = torch.matmul(ta.double(), tb.double())
                _close(strided.matmul(ta.cuda(), tb.cuda()), ref, max(rtol, 1e-5) * 10)
    out = torch.empty(130, 37, device="cuda").t()  # tiled: the input is unit-stride along out's rows
    strided.map(torch.randn(37, 130, device="cuda"), "tanh", out=out)
    y = torch.randn(300, 200, device="cuda")
    _close(strided.zip(y, y.t().contiguous().t(), "add"), y.double() * 2, 1e-6)  # tiled zip, partial tiles
    torch.cuda.synchronize()
    print("strided cases ok")


if __name__ == "__main__":
    chamfer_cases()
    voxelize_cases()
    particle_sum_cases()
    strided_cases()
    torch.cuda.synchronize()
