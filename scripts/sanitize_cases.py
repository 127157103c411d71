"""Every CUDA kernel once, on small inputs, for compute-sanitizer (memcheck, racecheck, ...).

    compute-sanitizer --tool racecheck python scripts/sanitize_cases.py [family ...]
Exits non-zero if any output is wrong, so a sanitizer run also checks results.
"""
import sys

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


def neighbors_cases():
    """knn_points on every CUDA path (K = 1 through the NN kernel, register lists of 8..64 with and
    without reference splits and the merge, in spatial order, the any-D tile, the sort path for K > 64), ball_query with
    and without splits, the (B, N, K) backward (atomic and deterministic), farthest point sampling on
    one block, several and the whole grid, and the packed faces, each checked against the CPU."""
    torch.manual_seed(0)

    def same(got, ref, what):
        for g, r in zip(got, ref):
            assert torch.equal(g.cpu(), r), what

    lengths = (torch.tensor([700, 0, 301], device="cuda"), torch.tensor([1, 530, 257], device="cuda"))
    for dtype in (torch.float32, torch.float64, torch.float16):
        for dim in (2, 3, 7):
            p1 = torch.randn(3, 700, dim, device="cuda", dtype=dtype)
            p2 = torch.randn(3, 530, dim, device="cuda", dtype=dtype)
            for K in (1, 5, 16, 40, 100):
                for norm in (1, 2):
                    got = pointops.knn_points(p1, p2, *lengths, norm=norm, K=K)[:2]
                    ref = pointops.knn_points(p1.cpu(), p2.cpu(), *(t.cpu() for t in lengths), norm=norm, K=K)[:2]
                    same(got, ref, ("knn", dtype, dim, K, norm))
            got = pointops.ball_query(p1, p2, *lengths, K=20, radius=0.8, return_nn=False)[:2]
            ref = pointops.ball_query(p1.cpu(), p2.cpu(), *(t.cpu() for t in lengths), K=20, radius=0.8,
                                      return_nn=False)[:2]
            same(got, ref, ("ball", dtype, dim))
    # one small cloud against a large one: reference splits and the merge kernels
    p1, p2 = torch.rand(1, 300, 3, device="cuda"), torch.rand(1, 40_000, 3, device="cuda")
    for K in (8, 33):
        same(pointops.knn_points(p1, p2, K=K)[:2], pointops.knn_points(p1.cpu(), p2.cpu(), K=K)[:2], ("split", K))
    same(pointops.ball_query(p1, p2, K=50, radius=0.05)[:2], pointops.ball_query(p1.cpu(), p2.cpu(), K=50, radius=0.05)[:2],
         "ball split")
    # the spatial order (chosen at this size): sorted tiles, skipped tiles, ragged lengths, D = 2, 3
    for dim in (2, 3):
        q, r = torch.rand(2, 3000, dim, device="cuda"), torch.rand(2, 4100, dim, device="cuda")
        lens = (torch.tensor([3000, 17], device="cuda"), torch.tensor([2500, 4100], device="cuda"))
        for K in (8, 33, 64):
            same(pointops.knn_points(q, r, *lens, K=K)[:2],
                 pointops.knn_points(q.cpu(), r.cpu(), *(t.cpu() for t in lens), K=K)[:2], ("spatial", dim, K))
        for K in (8, 40):
            same(pointops.ball_query(q, r, *lens, K=K, radius=0.08)[:2],
                 pointops.ball_query(q.cpu(), r.cpu(), *(t.cpu() for t in lens), K=K, radius=0.08)[:2],
                 ("ball, spatial cases", dim, K))
    # backward over (B, N, K) indices, atomic and deterministic
    a = torch.randn(2, 300, 3, device="cuda", requires_grad=True)
    b = torch.randn(2, 400, 3, device="cuda", requires_grad=True)
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        dists, _, nn = pointops.knn_points(a, b, K=12, return_nn=True)
        (dists.sum() + nn.sum()).backward()
        pointops.ball_query(a, b, K=30, radius=0.5)[0].sum().backward()
    torch.use_deterministic_algorithms(False)
    x, y = torch.rand(900, 3, device="cuda"), torch.rand(700, 3, device="cuda")
    bx, by = torch.randint(0, 3, (900,), device="cuda"), torch.randint(0, 4, (700,), device="cuda")
    assert torch.equal(pointops.knn(x, y, 6, bx, by).cpu(), pointops.knn(x.cpu(), y.cpu(), 6, bx.cpu(), by.cpu()))
    assert torch.equal(pointops.radius(x, y, 0.2, bx, by).cpu(), pointops.radius(x.cpu(), y.cpu(), 0.2, bx.cpu(), by.cpu()))
    empty = torch.zeros(2, 0, 3, device="cuda")
    pointops.knn_points(empty, p2.expand(2, -1, -1), K=4)
    pointops.knn_points(p1.expand(2, -1, -1), empty, K=4)
    pointops.ball_query(empty, empty, K=4, radius=0.1)
    torch.cuda.synchronize()
    print("neighbors cases ok")


def farthest_points_cases():
    # one block; a cluster with its slices in registers; a cluster with points past the registers
    # (in shared memory); the whole grid in registers; the grid past registers; the grid past
    # shared memory (D = 1000); float64
    for B, N, D, K, dtype in ((3, 500, 3, 40, torch.float32), (2, 30_000, 3, 300, torch.float32),
                              (1, 100_000, 3, 50, torch.float32), (1, 400_000, 3, 64, torch.float32),
                              (1, 1_600_000, 3, 16, torch.float32), (1, 9000, 1000, 20, torch.float32),
                              (2, 20_000, 2, 30, torch.float64)):
        pts = torch.rand(B, N, D, device="cuda", dtype=dtype)
        assert torch.equal(pointops.sample_farthest_points(pts, K=K)[1].cpu(),
                           pointops.sample_farthest_points(pts.cpu(), K=K)[1]), ("fps", N)
    x, bx = torch.rand(900, 3, device="cuda"), torch.randint(0, 3, (900,), device="cuda")
    assert torch.equal(pointops.fps(x, bx, 0.3, random_start=False).cpu(),
                       pointops.fps(x.cpu(), bx.cpu(), 0.3, random_start=False))
    pointops.sample_farthest_points(torch.zeros(2, 0, 3, device="cuda"), K=3)
    torch.cuda.synchronize()
    print("farthest points cases ok")


CASES = {"chamfer": chamfer_cases, "voxelize": voxelize_cases, "particle_sum": particle_sum_cases,
         "strided": strided_cases, "neighbors": neighbors_cases, "farthest_points": farthest_points_cases}

if __name__ == "__main__":
    # python scripts/sanitize_cases.py [family ...]: the named families, or all of them
    for name in sys.argv[1:] or CASES:
        CASES[name]()
    torch.cuda.synchronize()
