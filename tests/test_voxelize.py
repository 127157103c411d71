"""Tests of the voxelization family against an independent numpy/torch reference.

Tolerances: none. Both backends and the reference compute the cell as floor((p - min) / size) in
float32 (float64 for float64 points) with IEEE operations, copy point rows bit for bit, and sum
the kept points in input order in opmath (float32 for half/bf16/float32, float64 for float64)
before one division and one rounding to the point dtype. Identical operations in an identical
order give identical bits, so every comparison below is exact (torch.equal).
"""
import math

import numpy as np
import pytest
import torch

import pointops
from pointops import Voxelizer, voxel_features, voxelize
from conftest import DEVICES, HAS_CUDA, check_cuda_graph, requires_cuda

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
VOXEL = [0.5, 0.5, 0.5]
RANGE = [0.0, 0.0, 0.0, 4.0, 4.0, 4.0]


# ---------------------------------------------------------------- reference (numpy + torch.unique-free)

def ref_dims(voxel_size, point_range):
    dims = []
    for k in range(3):
        r = (point_range[k + 3] - point_range[k]) / voxel_size[k]
        dims.append(math.floor(r) + (1 if r - math.floor(r) >= 0.5 else 0))  # round half away from zero
    return dims


def ref_assign(points, voxel_size, point_range, batch=None):
    """First-appearance voxel id of every point (-1 out of range), voxel coords (b?, z, y, x)."""
    cell_dtype = np.float64 if points.dtype == torch.float64 else np.float32
    xyz = points[:, :3].detach().cpu().to(torch.float64).numpy().astype(cell_dtype)  # exact for every dtype
    lo = np.asarray(point_range[:3], dtype=cell_dtype)
    size = np.asarray(voxel_size, dtype=cell_dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        cell = np.floor((xyz - lo) / size)
        valid = np.all((cell >= 0) & (cell < np.asarray(ref_dims(voxel_size, point_range))), axis=1)
    n = points.shape[0]
    rows = np.zeros((n, 4), dtype=np.int64)
    rows[valid, 1:] = cell[valid][:, ::-1].astype(np.int64)  # z, y, x
    if batch is not None:
        rows[:, 0] = batch.cpu().numpy()
    voxel = np.full(n, -1, dtype=np.int64)
    coords = np.zeros((0, 4), dtype=np.int64)
    idx = np.nonzero(valid)[0]
    if idx.size:
        uniq, first, inverse = np.unique(rows[idx], axis=0, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")          # unique rows by first appearance
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        voxel[idx] = rank[inverse.reshape(-1)]
        coords = uniq[order]
    return voxel, (coords if batch is not None else coords[:, 1:])


def ref_rank(voxel):
    """Rank of each point among the points of its voxel, in input order."""
    rank = np.full(voxel.shape, -1, dtype=np.int64)
    idx = np.nonzero(voxel >= 0)[0]
    if idx.size:
        order = idx[np.argsort(voxel[idx], kind="stable")]
        sorted_v = voxel[order]
        starts = np.searchsorted(sorted_v, sorted_v, side="left")
        rank[order] = np.arange(order.size) - starts
    return rank


def opmath(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def reference_voxelize(points, voxel_size, point_range, max_points, max_voxels, batch=None):
    points = points.detach().cpu()
    voxel, coords = ref_assign(points, voxel_size, point_range, batch)
    num = min(coords.shape[0], max_voxels)
    voxel = np.where(voxel < max_voxels, voxel, -1)
    rank = ref_rank(voxel)
    f = points.shape[1]
    voxels = torch.zeros((num, max_points, f), dtype=points.dtype)
    sums = torch.zeros((num, f), dtype=opmath(points.dtype))
    counts = torch.zeros(num, dtype=torch.int32)
    for r in range(max_points):  # rank by rank: each voxel's sum sees its points in input order
        sel = torch.from_numpy(np.nonzero(rank == r)[0])
        v = torch.from_numpy(voxel[sel.numpy()])
        voxels[v, r] = points[sel]
        sums[v] += points[sel].to(sums.dtype)
        counts[v] += 1
    features = (sums / counts.clamp(min=1)[:, None].to(sums.dtype)).to(points.dtype)
    return dict(voxels=voxels, coords=torch.from_numpy(coords[:num]).to(torch.int32), num_points=counts,
                features=features, point_to_voxel=torch.from_numpy(voxel))


def reference_voxel_features(points, voxel_size, point_range, reduce, batch=None):
    points = points.detach().cpu()
    voxel, coords = ref_assign(points, voxel_size, point_range, batch)
    rank = ref_rank(voxel)
    num, f = coords.shape[0], points.shape[1]
    acc = torch.zeros((num, f), dtype=opmath(points.dtype))
    counts = torch.zeros(num, dtype=torch.int32)
    for r in range(int(rank.max()) + 1 if num else 0):
        sel = torch.from_numpy(np.nonzero(rank == r)[0])
        v = torch.from_numpy(voxel[sel.numpy()])
        x = points[sel].to(acc.dtype)
        if reduce == "max":
            m = acc[v]
            acc[v] = x if r == 0 else torch.where((torch.isnan(x) | (x > m)) & ~torch.isnan(m), x, m)
        else:
            acc[v] += x
        counts[v] += 1
    if reduce == "mean":
        acc = acc / counts[:, None].to(acc.dtype)
    return dict(features=acc.to(points.dtype), coords=torch.from_numpy(coords).to(torch.int32), num_points=counts,
                point_to_voxel=torch.from_numpy(voxel))


def assert_same(result, expected):
    for name, want in expected.items():
        got = getattr(result, name).cpu()
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert torch.equal(got, want), name


# ---------------------------------------------------------------- inputs

def make_cloud(case, n=600, f=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if case == "random":  # some points out of range on every side
        xyz = torch.rand(n, 3, generator=g, dtype=torch.float64) * 6 - 1
    elif case == "duplicates":  # 15 distinct positions repeated: heavy duplication, big voxels
        base = torch.rand(15, 3, generator=g, dtype=torch.float64) * 4
        xyz = base[torch.randint(0, 15, (n,), generator=g)]
    elif case == "one_voxel":
        xyz = 1.0 + torch.rand(n, 3, generator=g, dtype=torch.float64) * 0.4
    elif case == "out_of_range":
        xyz = 10 + torch.rand(n, 3, generator=g, dtype=torch.float64)
    elif case == "empty":
        xyz = torch.zeros(0, 3, dtype=torch.float64)
    elif case == "nan_inf":
        xyz = torch.rand(n, 3, generator=g, dtype=torch.float64) * 4
        bad = torch.rand(n, 3, generator=g) < 0.1
        special = torch.tensor([math.nan, math.inf, -math.inf], dtype=torch.float64)
        xyz[bad] = special[torch.randint(0, 3, (int(bad.sum()),), generator=g)]
    elif case == "edges":  # points exactly on cell faces, including min and max
        xyz = torch.randint(-1, 10, (n, 3), generator=g).to(torch.float64) * 0.5
    else:
        raise ValueError(case)
    extra = torch.rand(xyz.shape[0], f - 3, generator=g, dtype=torch.float64) * 100
    return torch.cat([xyz, extra], 1).to(dtype)


CASES = ["random", "duplicates", "one_voxel", "out_of_range", "empty", "nan_inf", "edges"]
CAPS = [(100, 10_000), (3, 7)]  # no cap hit; both caps overflowing


# ---------------------------------------------------------------- correctness

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("caps", CAPS)
def test_voxelize_matches_reference(device, dtype, case, caps):
    points = make_cloud(case, dtype=dtype)
    out = voxelize(points.to(device), VOXEL, RANGE, *caps)
    assert_same(out, reference_voxelize(points, VOXEL, RANGE, *caps))
    assert out.num_voxels is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_voxel_features_matches_reference(device, dtype, case, reduce):
    points = make_cloud(case, dtype=dtype, f=5)
    out = voxel_features(points.to(device), VOXEL, RANGE, reduce)
    assert_same(out, reference_voxel_features(points, VOXEL, RANGE, reduce))


@pytest.mark.parametrize("device", DEVICES)
def test_voxel_features_max_propagates_nan(device):
    points = torch.tensor([[0.1, 0.1, 0.1, 1.0], [0.2, 0.2, 0.2, math.nan], [0.3, 0.3, 0.3, 5.0]], device=device)
    out = voxel_features(points, VOXEL, RANGE, "max")
    assert out.features.shape == (1, 4) and torch.isnan(out.features[0, 3])
    assert out.features[0, :3].tolist() == pytest.approx([0.3, 0.3, 0.3])


@pytest.mark.parametrize("device", DEVICES)
def test_edge_semantics(device):
    # x = max is out (the half-open range); x just below max is in the last cell; the range [0, 1]
    # with 0.3 voxels has round(3.33) = 3 cells, so [0.9, 1.0] is out although it is < max.
    points = torch.tensor([[4.0, 1, 1], [3.9999998, 1, 1], [0.0, 0, 0], [-1e-7, 1, 1], [1, 1, 1]], device=device)
    out = voxelize(points, VOXEL, RANGE, 4, 100)
    assert out.point_to_voxel.tolist() == [-1, 0, 1, -1, 2]
    assert out.coords.tolist() == [[2, 2, 7], [0, 0, 0], [2, 2, 2]]
    rounded = torch.tensor([[0.95, 0.1, 0.1], [0.85, 0.1, 0.1]], device=device)
    out = voxelize(rounded, [0.3, 0.3, 0.3], [0, 0, 0, 1, 1, 1], 4, 100)
    assert out.point_to_voxel.tolist() == [-1, 0] and out.coords.tolist() == [[0, 0, 2]]


@pytest.mark.parametrize("device", DEVICES)
def test_caps_semantics(device):
    # voxel A gets 4 points (cap 2: the 3rd and 4th keep their id), B 1, C is the 3rd voxel (cap 2).
    a, b, c = [0.1, 0.1, 0.1], [1.1, 0.1, 0.1], [2.1, 0.1, 0.1]
    points = torch.tensor([a, b, a, a, c, a], device=device)
    out = voxelize(points, VOXEL, RANGE, 2, 2)
    assert out.point_to_voxel.tolist() == [0, 1, 0, 0, -1, 0]
    assert out.num_points.tolist() == [2, 1]
    assert out.voxels.shape == (2, 2, 3) and out.voxels[1, 1].abs().sum() == 0  # zero padding


@pytest.mark.parametrize("device", DEVICES)
def test_padded_matches_exact(device):
    points = make_cloud("random", n=2000).to(device)
    for max_voxels in (40, 10_000):
        exact = voxelize(points, VOXEL, RANGE, 5, max_voxels)
        padded = voxelize(points, VOXEL, RANGE, 5, max_voxels, padded=True)
        v = exact.voxels.shape[0]
        assert padded.voxels.shape[0] == max_voxels and padded.num_voxels.item() == v
        assert padded.num_voxels.dtype == torch.int64 and padded.num_voxels.device == points.device
        for name in ("voxels", "coords", "num_points", "features"):
            assert torch.equal(getattr(padded, name)[:v], getattr(exact, name)), name
        assert torch.equal(padded.point_to_voxel, exact.point_to_voxel)
        assert (padded.voxels[v:] == 0).all() and (padded.features[v:] == 0).all()
        assert (padded.coords[v:] == -1).all() and (padded.num_points[v:] == 0).all()
    empty = voxelize(points[:0], VOXEL, RANGE, 5, 8, padded=True)
    assert empty.voxels.shape == (8, 5, 4) and empty.num_voxels.item() == 0 and (empty.coords == -1).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True])
def test_batched_equals_per_cloud(device, padded):
    g = torch.Generator().manual_seed(3)
    points = make_cloud("duplicates", n=3000, seed=1)
    points[:, :3] += torch.rand(3000, 3, generator=g, dtype=torch.float32) * 0.8  # different clouds overlap
    batch = torch.randint(0, 3, (3000,), generator=g)  # unsorted
    out = voxelize(points.to(device), VOXEL, RANGE, 4, 100_000, batch=batch.to(device), padded=padded)
    num = int(out.num_voxels) if padded else out.voxels.shape[0]
    assert_same(out._replace(voxels=out.voxels[:num], coords=out.coords[:num], num_points=out.num_points[:num],
                             features=out.features[:num]),
                 reference_voxelize(points, VOXEL, RANGE, 4, 100_000, batch=batch))
    for b in range(3):
        single = voxelize(points[batch == b].to(device), VOXEL, RANGE, 4, 100_000)
        rows = (out.coords[:num, 0] == b).nonzero().squeeze(1)
        assert torch.equal(out.coords[rows, 1:], single.coords)
        assert torch.equal(out.voxels[rows], single.voxels)
        assert torch.equal(out.features[rows], single.features)
        assert torch.equal(out.num_points[rows], single.num_points)
        local = torch.full((num,), -1, dtype=torch.int64, device=device)
        local[rows] = torch.arange(rows.numel(), device=device)
        p2v = out.point_to_voxel[batch.to(device) == b]
        assert torch.equal(torch.where(p2v >= 0, local[p2v.clamp(min=0)], -1), single.point_to_voxel)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_input(device):
    base = make_cloud("random", n=1000, f=6).to(device)
    transposed = base.t().contiguous().t()  # column-major view
    sliced = torch.cat([base, base], 1)[:, ::2]  # strided columns: x, z, extra...
    for view in (transposed, sliced[::2]):
        assert not view.is_contiguous()
        assert_same(voxelize(view, VOXEL, RANGE, 4, 500), reference_voxelize(view.contiguous(), VOXEL, RANGE, 4, 500))
    batch = torch.arange(2000, device=device).remainder(3)[::2]  # a strided batch tensor
    assert not batch.is_contiguous()
    out = voxelize(base, VOXEL, RANGE, 4, 500, batch=batch)
    assert_same(out, reference_voxelize(base, VOXEL, RANGE, 4, 500, batch=batch))


def test_voxelizer_module():
    vox = Voxelizer([0.5, 0.5, 0.5], RANGE, max_points_per_voxel=4, max_voxels=50)
    assert vox.grid_size == (8, 8, 8) and "grid_size=(8, 8, 8)" in repr(vox)
    points = make_cloud("random")
    assert_same(vox(points), reference_voxelize(points, VOXEL, RANGE, 4, 50))
    assert Voxelizer(VOXEL, RANGE, 4, 50, padded=True)(points).voxels.shape == (50, 4, 4)
    with pytest.raises(RuntimeError, match="voxel_size must be positive"):
        Voxelizer([0.5, 0, 0.5], RANGE, 4, 50)


def test_tensor_parameters():
    points = make_cloud("random")
    out = voxelize(points, torch.tensor(VOXEL), torch.tensor(RANGE), 4, 50)
    assert_same(out, reference_voxelize(points, VOXEL, RANGE, 4, 50))


# ---------------------------------------------------------------- real scans

def load_scan(shared_data, name):
    path = shared_data / "lidar" / name
    if not path.exists():
        pytest.skip(f"{path} is not present")
    if name.startswith("ff9e"):
        return torch.from_numpy(np.fromfile(path, np.float16).reshape(-1, 5))
    return torch.from_numpy(np.fromfile(path, np.float32).reshape(-1, 4))


LIDAR_RANGE = [-54.0, -54.0, -5.0, 54.0, 54.0, 3.0]
# (file, voxel size, in-range points, unique voxels, points kept at 10 per voxel): the README's table
SCANS = [
    ("0000000000.bin", [0.2, 0.2, 0.2], 110_691, 18_300, 78_014),
    ("0000000000.bin", [0.075, 0.075, 0.2], 110_691, 42_677, 107_056),
    ("0000000010.bin", [0.2, 0.2, 0.2], 116_197, 17_675, 77_172),
    ("ff9eff4389a740848f9a56ad749a4ae8.bin", [0.075, 0.075, 0.2], 236_511, 105_086, 217_374),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scan", SCANS, ids=[f"{s[0][:6]}-{s[1][0]}" for s in SCANS])
def test_real_scans(shared_data, device, scan):
    name, voxel_size, in_range, unique, kept = scan
    points = load_scan(shared_data, name)
    out = voxelize(points.to(device), voxel_size, LIDAR_RANGE, 10, 160_000)
    assert out.voxels.shape[0] == unique
    assert int((out.point_to_voxel >= 0).sum()) == in_range
    assert int(out.num_points.sum()) == kept
    assert_same(out, reference_voxelize(points, voxel_size, LIDAR_RANGE, 10, 160_000))
    dyn = voxel_features(points.to(device), voxel_size, LIDAR_RANGE, "mean")
    assert dyn.features.shape[0] == unique and int(dyn.num_points.sum()) == in_range


# ---------------------------------------------------------------- CUDA: determinism, parity, streams

@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu_and_is_bitwise_repeatable(dtype):
    points = make_cloud("duplicates", n=200_000, f=5, dtype=dtype)
    points[:, :3] += torch.rand(200_000, 3, dtype=torch.float64).to(dtype) * 0.3
    batch = torch.randint(0, 4, (200_000,))
    cpu = voxelize(points, VOXEL, RANGE, 7, 150, batch=batch)
    runs = [voxelize(points.cuda(), VOXEL, RANGE, 7, 150, batch=batch.cuda()) for _ in range(5)]
    for run in runs:
        for name in ("voxels", "coords", "num_points", "features", "point_to_voxel"):
            assert torch.equal(getattr(run, name).cpu(), getattr(cpu, name)), name
    cpu_dyn = voxel_features(points, VOXEL, RANGE, "mean", batch=batch)
    for _ in range(3):
        dyn = voxel_features(points.cuda(), VOXEL, RANGE, "mean", batch=batch.cuda())
        for name in VoxelFeatureNames:
            assert torch.equal(getattr(dyn, name).cpu(), getattr(cpu_dyn, name)), name


VoxelFeatureNames = ("features", "coords", "num_points", "point_to_voxel")


@requires_cuda
@pytest.mark.parametrize("max_points", [1, 7, 64, 5000])
def test_cuda_crowded_voxels_match_cpu(max_points):
    # 120k points in 4 voxels, in shuffled order: thousands of points race down each voxel's list of
    # first points at once (and the list of P = 5000 is searched, not scanned). The CPU's in-order
    # loop is the reference for which points each voxel keeps and their order.
    g = torch.Generator().manual_seed(5)
    centers = torch.tensor([[0.1, 0.1, 0.1], [2.1, 0.1, 0.1], [0.1, 2.1, 0.1], [3.1, 3.1, 3.1]])
    points = centers[torch.randint(0, 4, (120_000,), generator=g)] + torch.rand(120_000, 3, generator=g) * 0.35
    points = torch.cat([points, torch.rand(120_000, 1, generator=g)], 1)
    cpu = voxelize(points, VOXEL, RANGE, max_points, 10)
    for _ in range(3):
        gpu = voxelize(points.cuda(), VOXEL, RANGE, max_points, 10)
        for name in ("voxels", "coords", "num_points", "features", "point_to_voxel"):
            assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name


@requires_cuda
def test_cuda_real_scan_matches_cpu(shared_data):
    points = load_scan(shared_data, "ff9eff4389a740848f9a56ad749a4ae8.bin")
    cpu = voxelize(points, [0.075, 0.075, 0.2], LIDAR_RANGE, 10, 160_000)
    for padded in (False, True):
        gpu = voxelize(points.cuda(), [0.075, 0.075, 0.2], LIDAR_RANGE, 10, 160_000, padded=padded)
        v = cpu.voxels.shape[0]
        for name in ("voxels", "coords", "num_points", "features"):
            assert torch.equal(getattr(gpu, name)[:v].cpu(), getattr(cpu, name)), name
        assert torch.equal(gpu.point_to_voxel.cpu(), cpu.point_to_voxel)


@requires_cuda
def test_cuda_non_default_stream():
    points = make_cloud("random", n=5000).cuda()
    expected = voxelize(points, VOXEL, RANGE, 4, 100)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = voxelize(points, VOXEL, RANGE, 4, 100)
        padded = voxelize(points, VOXEL, RANGE, 4, 100, padded=True)
        dyn = voxel_features(points, VOXEL, RANGE, "max")
    stream.synchronize()
    for name in ("voxels", "coords", "num_points", "features", "point_to_voxel"):
        assert torch.equal(getattr(out, name), getattr(expected, name))
        assert torch.equal(getattr(padded, name)[: out.voxels.shape[0]] if name != "point_to_voxel"
                           else padded.point_to_voxel, getattr(expected, name))
    assert_same(dyn, reference_voxel_features(points.cpu(), VOXEL, RANGE, "max"))


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_second_device():
    # The device guard: tensors on cuda:1 while cuda:0 is current.
    points = make_cloud("random", n=5000)
    batch = torch.randint(0, 3, (5000,))
    expected = voxelize(points, VOXEL, RANGE, 4, 100, batch=batch)
    out = voxelize(points.to("cuda:1"), VOXEL, RANGE, 4, 100, batch=batch.to("cuda:1"))
    padded = voxelize(points.to("cuda:1"), VOXEL, RANGE, 4, 100, batch=batch.to("cuda:1"), padded=True)
    for name in ("voxels", "coords", "num_points", "features", "point_to_voxel"):
        assert getattr(out, name).device == torch.device("cuda:1")
        assert torch.equal(getattr(out, name).cpu(), getattr(expected, name))
    assert int(padded.num_voxels) == out.voxels.shape[0]
    dyn = voxel_features(points.to("cuda:1"), VOXEL, RANGE, "mean")
    assert_same(dyn, reference_voxel_features(points, VOXEL, RANGE, "mean"))


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
@pytest.mark.parametrize("batched", [False, True])
def test_voxel_features_gradcheck(device, reduce, batched):
    # Cells are 0.5 wide; gradcheck's 1e-6 steps move no point across a face (the closest of these
    # random points is far further than that from one), and random values have no max ties.
    g = torch.Generator().manual_seed(5)
    points = (torch.rand(60, 4, generator=g, dtype=torch.float64) * torch.tensor([1.5, 1.0, 1.0, 10.0],
              dtype=torch.float64) - 0.2).to(device).requires_grad_()
    batch = torch.randint(0, 2, (60,), generator=g).to(device) if batched else None
    fn = lambda p: voxel_features(p, VOXEL, RANGE, reduce, batch=batch).features  # noqa: E731
    assert torch.autograd.gradcheck(fn, (points,), eps=1e-6, atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_voxel_features_max_gradient_goes_to_first_tie(device):
    points = torch.tensor([[0.1, 0.1, 0.1, 2.0], [0.2, 0.2, 0.2, 2.0], [9, 9, 9, 7.0]], device=device,
                          requires_grad=True)
    voxel_features(points, VOXEL, RANGE, "max").features.sum().backward()
    assert points.grad.tolist() == [[0, 0, 0, 1], [1, 1, 1, 0], [0, 0, 0, 0]]


# ---------------------------------------------------------------- errors

def call(device, points=None, batch=None, voxel_size=VOXEL, point_range=RANGE, p=4, v=10, **kw):
    points = torch.rand(5, 4, device=device) if points is None else points.to(device)
    batch = None if batch is None else batch.to(device)
    return voxelize(points, voxel_size, point_range, p, v, batch=batch, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kwargs, match", [
    (dict(voxel_size=[0.5, 0.0, 0.5]), r"voxel_size must be positive and finite, got 0 for y"),
    (dict(voxel_size=[0.5, 0.5, -1.0]), r"voxel_size must be positive and finite, got -1 for z"),
    (dict(point_range=[0, 0, 0, 4, 0, 4]), r"point_range must have min < max .* for y"),
    (dict(voxel_size=[0.5, 0.5]), r"voxel_size must have 3 values \(x, y, z\), got 2"),
    (dict(point_range=[0, 0, 4, 4]), r"point_range must have 6 values .* got 4"),
    (dict(voxel_size=[10.0, 0.5, 0.5]), r"the grid has no cells along x"),
    (dict(points=torch.rand(5, 2)), r"points must have F >= 3 columns"),
    (dict(points=torch.rand(5)), r"points must be a 2-D tensor \(N, F\)"),
    (dict(points=torch.randint(0, 4, (5, 4))), r"points must be float16, bfloat16, float32 or float64, got Long"),
    (dict(batch=torch.zeros(5, dtype=torch.int32)), r"batch must be an int64 tensor, got Int"),
    (dict(batch=torch.zeros(4, dtype=torch.int64)), r"batch must have shape \(N,\)"),
    (dict(batch=torch.tensor([0, 1, -1, 0, 0])), r"batch must hold indices in \[0, 2147483647\], got 1 point"),
    (dict(voxel_size=[0.002] * 3, point_range=[-1e6] * 3 + [1e6] * 3), r"the grid is too large: .* overflow the 64-bit"),
    (dict(voxel_size=[1.0] * 3, point_range=[0, 0, 0, 2**21, 2**21, 2**20], batch=torch.ones(5, dtype=torch.int64)),
     r"batch must hold indices in \[0, 0\]"),
    (dict(p=0), r"max_points_per_voxel must be >= 1, got 0"),
    (dict(v=0), r"max_voxels must be >= 1, got 0"),
])
def test_errors(device, kwargs, match):
    with pytest.raises(RuntimeError, match=match):
        call(device, **kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_more_errors(device):
    with pytest.raises(RuntimeError, match=r"reduce must be 'mean', 'sum' or 'max', got 'median'"):
        voxel_features(torch.rand(5, 3, device=device), VOXEL, RANGE, "median")
    with pytest.raises(RuntimeError, match=r"batch must hold indices in \[0, 2147483647\]"):
        voxel_features(torch.rand(5, 3, device=device), VOXEL, RANGE, batch=torch.full((5,), -3, device=device))
    with pytest.raises(RuntimeError, match=r"batch must hold indices"):
        call(device, batch=torch.tensor([0, 1, 2**31, 0, 0]))
    if device == "cpu" and HAS_CUDA:
        with pytest.raises(RuntimeError, match=r"batch must be on the same device as points"):
            voxelize(torch.rand(5, 3), VOXEL, RANGE, 4, 10, batch=torch.zeros(5, dtype=torch.int64, device="cuda"))
    with pytest.raises(RuntimeError, match=r"_voxel_features_backward: grad_features and features must have shape"):
        p = torch.rand(5, 4, device=device)
        torch.ops.pointops._voxel_features_backward(torch.rand(2, 3, device=device), p,
                                                    torch.zeros(5, dtype=torch.int64, device=device),
                                                    torch.ones(2, dtype=torch.int32, device=device),
                                                    torch.rand(2, 4, device=device), "sum")


@pytest.mark.parametrize("device", DEVICES)
def test_padded_drops_bad_batch_without_raising(device):
    points = torch.rand(5, 3, device=device)
    out = call(device, points=points, batch=torch.tensor([0, -1, 0, 2**40, 1]), padded=True)
    assert out.point_to_voxel[[1, 3]].tolist() == [-1, -1] and (out.point_to_voxel[[0, 2, 4]] >= 0).all()


# ---------------------------------------------------------------- torch.library / torch.compile

def opcheck_inputs(device):
    points = make_cloud("duplicates", n=300, f=4).to(device)
    batch = torch.randint(0, 2, (300,), generator=torch.Generator().manual_seed(0)).to(device)
    return points, batch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batched", [False, True])
def test_opcheck(device, batched):
    points, batch = opcheck_inputs(device)
    batch = batch if batched else None
    ops = torch.ops.pointops
    torch.library.opcheck(ops.voxelize.default, (points, batch, VOXEL, RANGE, 3, 20))
    torch.library.opcheck(ops.voxelize_padded.default, (points, batch, VOXEL, RANGE, 3, 20))
    # Differentiable in the points through voxels and features (the kept points and their mean); the
    # integer outputs carry no gradient.
    with_grad = points.double().requires_grad_()
    torch.library.opcheck(ops.voxelize.default, (with_grad, batch, VOXEL, RANGE, 3, 20))
    torch.library.opcheck(ops.voxelize_padded.default, (with_grad, batch, VOXEL, RANGE, 3, 20))
    for padded in (False, True):
        out = pointops.voxelize(with_grad, VOXEL, RANGE, 3, 20, batch=batch, padded=padded)
        assert out.voxels.requires_grad and out.features.requires_grad
        assert not any(t.requires_grad for t in (out.coords, out.num_points, out.point_to_voxel, out.num_voxels)
                       if t is not None)
    for reduce in ("mean", "sum", "max"):
        p64 = points.double().requires_grad_()
        torch.library.opcheck(ops.voxel_features.default, (p64, batch, VOXEL, RANGE, reduce))
        feats, _, num, p2v = ops.voxel_features(p64.detach(), batch, VOXEL, RANGE, reduce)
        torch.library.opcheck(ops._voxel_features_backward.default,
                              (torch.rand_like(feats), p64.detach(), p2v, num, feats, reduce))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_padded(device):
    # Static shapes: max_voxels rows, the count stays on the device; no graph break, no sync.
    points, batch = opcheck_inputs(device)
    fn = lambda p, b: voxelize(p, VOXEL, RANGE, 3, 40, batch=b, padded=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    for got, want in zip(compiled(points, batch), fn(points, batch)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_size(device):
    # V is data-dependent: the fake kernels return an unbacked SymInt (new_dynamic_size), so
    # fullgraph=True traces through and downstream ops are compiled with a symbolic V.
    points, _ = opcheck_inputs(device)

    def fn(p):
        out = voxelize(p, VOXEL, RANGE, 3, 40)
        dyn = voxel_features(p, VOXEL, RANGE, "max")
        return out.voxels * 2, out.coords, out.point_to_voxel, dyn.features + 1, dyn.num_points

    for got, want in zip(torch.compile(fn, fullgraph=True)(points), fn(points)):
        assert torch.equal(got, want)


def test_compile_fullgraph_backward():
    points, _ = opcheck_inputs("cpu")
    p1, p2 = points.double().requires_grad_(), points.double().requires_grad_()
    fn = lambda p: (voxel_features(p, VOXEL, RANGE, "mean").features ** 2).sum()  # noqa: E731
    torch.compile(fn, fullgraph=True)(p1).backward()
    fn(p2).backward()
    # Same ops on the same values; only the fused square-and-sum may reorder the final reduction,
    # which does not touch the per-point gradient 2 * feature / count: exact.
    assert torch.equal(p1.grad, p2.grad)


def test_build_info_and_exports():
    assert hasattr(pointops, "Voxels") and pointops.voxelize is voxelize


@requires_cuda
def test_cuda_graph_capture_and_replay_padded():
    # padded=True is the sync-free form (V stays max_voxels); voxelize without padding and
    # voxel_features learn V with a host sync and cannot be captured (their docstrings say so).
    g = torch.Generator().manual_seed(4)
    points = (torch.rand(2000, 4, generator=g) * 5 - 0.5).cuda()
    batch = torch.randint(0, 3, (2000,), generator=g).cuda()

    def step():
        return tuple(pointops.voxelize(points, VOXEL, RANGE, 4, 300, batch=batch, padded=True))

    def refill(seed):
        g = torch.Generator().manual_seed(seed)
        points.copy_(torch.rand(points.shape, generator=g) * 5 - 0.5)

    check_cuda_graph(step, refill, exact=range(6))  # deterministic by contract
