"""Packed neighbourhood ops (torch_cluster / torch_geometric faces): knn, radius, fps and
knn_interpolate against float64 oracles written here (no pointops call), with unsorted batch
vectors, empty clouds and clouds present in only one of x / y; exact ties; errors; CPU == CUDA.
The padded oracle and its rounding-aware checkers come from test_neighbors.py."""
import math

import pytest
import torch

import pointops
from conftest import DEVICES, requires_cuda
from test_neighbors import (DTYPES, KS, UNIT, check_ball, check_knn, compute_unit, near_tie_slots, output_rtol,
                            pair_distances, reference_ball, reference_knn, search_rtol)

# Cloud sizes in x and in y: cloud 1 only in y (its queries get no edge), cloud 2 only in x, cloud 4
# in neither (a gap in the numbering), cloud 5 a single query.
SIZES_X, SIZES_Y = [30, 0, 7, 25, 0, 12], [20, 9, 0, 15, 0, 1]


def shuffled_batch(sizes, g):
    """An unsorted batch vector holding sizes[c] entries of cloud c."""
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return batch[torch.randperm(len(batch), generator=g)]


def packed_clouds(D, dtype, device, seed, sizes_x=SIZES_X, sizes_y=SIZES_Y, lattice=False):
    g = torch.Generator().manual_seed(seed)
    batch_x, batch_y = shuffled_batch(sizes_x, g), shuffled_batch(sizes_y, g)
    if lattice:  # integer coordinates (exact distances), and copies of x among x: exact ties
        x = torch.randint(-2, 3, (len(batch_x), D), generator=g).float()
        x[-8:] = x[:8]
        batch_x[-8:] = batch_x[:8]
        y = torch.randint(-2, 3, (len(batch_y), D), generator=g).float()
    else:
        x, y = torch.randn(len(batch_x), D, generator=g), torch.randn(len(batch_y), D, generator=g)
    return x.to(dtype).to(device), y.to(dtype).to(device), batch_x.to(device), batch_y.to(device)


def packed_candidates(x, y, batch_x=None, batch_y=None):
    """(1, Ny, Nx) float64 squared distances from each query y to each x of its own cloud, +inf
    for other clouds and non-finite distances."""
    pairs = pair_distances(y[None], x[None])
    if batch_x is not None or batch_y is not None:
        bx = batch_x.cpu() if batch_x is not None else torch.zeros(len(x), dtype=torch.int64)
        by = batch_y.cpu() if batch_y is not None else torch.zeros(len(y), dtype=torch.int64)
        pairs = pairs.masked_fill(by[None, :, None] != bx[None, None, :], math.inf)
    return pairs.masked_fill(~torch.isfinite(pairs), math.inf)


def edges_to_rows(edges, num_queries, width):
    """torch_cluster's (2, E) layout -> (1, Ny, width) neighbour rows padded with -1, checking the
    layout: int64, row 0 the query (y) index ascending, row 1 the x index, at most `width` per row."""
    assert edges.dtype == torch.int64 and edges.dim() == 2 and edges.shape[0] == 2
    rows, cols = edges.cpu()
    assert (rows[1:] >= rows[:-1]).all(), "edges not grouped by ascending y index"
    assert ((rows >= 0) & (rows < num_queries)).all()
    counts = torch.bincount(rows, minlength=num_queries)
    pos = torch.arange(len(rows)) - (counts.cumsum(0) - counts)[rows]
    assert (pos < width).all(), "more edges than neighbours asked for"
    idx = torch.full((1, num_queries, width), -1, dtype=torch.int64)
    idx[0, rows, pos] = cols
    return idx


def rows_to_edges(idx):
    """(1, Ny, K) rows (-1: none) -> the (2, E) edges torch_cluster's contract describes."""
    rows = torch.arange(idx.shape[1])[:, None].expand_as(idx[0])
    keep = idx[0] >= 0
    return torch.stack([rows[keep], idx[0][keep]])


# ---------------------------------------------------------------- knn
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3, 5])
def test_knn_matches_oracle(device, dtype, dim):
    x, y, batch_x, batch_y = packed_clouds(dim, dtype, device, seed=dim)
    for bx, by in [(batch_x, batch_y), (None, None)]:
        cand = packed_candidates(x, y, bx, by)
        rtol = search_rtol(dtype, dim)
        for k in KS:
            idx = edges_to_rows(pointops.knn(x, y, k, bx, by), len(y), k)
            check_knn(None, idx, cand, k, dtype, dim)  # fewer edges exactly where the cloud is smaller
            chosen = cand.gather(-1, idx.clamp(min=0))
            found = idx >= 0
            assert (chosen[..., 1:] >= chosen[..., :-1] * (1 - 2.01 * rtol))[found[..., 1:]].all(), "not nearest first"
    cloud1 = (batch_y == 1).nonzero()[:, 0].cpu()
    assert not torch.isin(pointops.knn(x, y, 4, batch_x, batch_y)[0].cpu(), cloud1).any()  # no x in cloud 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_knn_exact_ties(device, dtype):
    x, y, batch_x, batch_y = packed_clouds(3, dtype, device, seed=7, lattice=True)
    cand = packed_candidates(x, y, batch_x, batch_y)
    for k in KS:
        expected = rows_to_edges(reference_knn(cand, k)[1])
        assert torch.equal(pointops.knn(x, y, k, batch_x, batch_y).cpu(), expected), k
    # the torch_cluster example: nearest first, the smaller x index first among equal distances
    x = torch.tensor([[-1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [1.0, 1.0]], dtype=dtype, device=device)
    y = torch.tensor([[-1.0, 0.0], [1.0, 0.0]], dtype=dtype, device=device)
    assert pointops.knn(x, y, 2).tolist() == [[0, 0, 1, 1], [0, 1, 2, 3]]
    assert pointops.knn(x, y, 3).tolist() == [[0, 0, 0, 1, 1, 1], [0, 1, 2, 2, 3, 0]]


# ---------------------------------------------------------------- radius
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3, 5])
def test_radius_matches_oracle(device, dtype, dim):
    x, y, batch_x, batch_y = packed_clouds(dim, dtype, device, seed=dim + 10)
    for bx, by in [(batch_x, batch_y), (None, None)]:
        cand = packed_candidates(x, y, bx, by)
        for r in (0.5 * math.sqrt(2 * dim), math.sqrt(2 * dim)):
            for max_num_neighbors in (1, 5, 32, 200):
                edges = pointops.radius(x, y, r, bx, by, max_num_neighbors=max_num_neighbors)
                idx = edges_to_rows(edges, len(y), max_num_neighbors)
                check_ball(None, idx, cand, max_num_neighbors, r, dtype, dim)  # first ones in x's index order
    edges = pointops.radius(x, y, 1.0, batch_x, batch_y)  # default max_num_neighbors=32
    assert torch.bincount(edges[0].cpu(), minlength=len(y)).max() <= 32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_radius_exact_boundary(device, dtype):
    x, y, batch_x, batch_y = packed_clouds(3, dtype, device, seed=8, lattice=True)
    cand = packed_candidates(x, y, batch_x, batch_y)
    for r in (1.0, 1.5, 2.0):  # squared distances are integers: d == r is outside
        for max_num_neighbors in (1, 4, 32):
            expected = rows_to_edges(reference_ball(cand, max_num_neighbors, r)[1])
            got = pointops.radius(x, y, r, batch_x, batch_y, max_num_neighbors=max_num_neighbors)
            assert torch.equal(got.cpu(), expected), (r, max_num_neighbors)


# ---------------------------------------------------------------- fps
def fps_count(n, ratio):
    """torch_cluster's sample count: ceil(n * ratio) in float32."""
    return int(torch.ceil(torch.tensor(float(n), dtype=torch.float32) * torch.tensor(ratio, dtype=torch.float32)))


def reference_fps(points, count, start=0):
    """Naive farthest point sampling in float64: from `start`, repeatedly the untaken finite point
    with the largest squared distance to the taken ones, the smallest index on ties (torch.argmax
    returns the first maximum)."""
    points = points.double()
    finite = torch.isfinite(points).all(1)
    mind = torch.full((len(points),), math.inf, dtype=torch.float64).masked_fill(~finite, -math.inf)
    taken = [start]
    while len(taken) < min(count, int(finite.sum())):
        mind = torch.minimum(mind, ((points - points[taken[-1]]) ** 2).sum(1).masked_fill(~finite, -math.inf))
        mind[taken[-1]] = -1.0  # never taken twice (duplicates, at distance 0, still can be)
        taken.append(int(mind.argmax()))
    return taken


def check_fps_cloud(samples, points, count, rtol, start=0):
    """Each sample is, given the ones before it, an untaken point whose min squared distance to them
    is the largest up to the rounding of the compute type (the k-th min of values each within rtol):
    exactly the oracle's choice where no other candidate is that close to the maximum."""
    points = points.double()
    finite = torch.isfinite(points).all(1)
    assert len(samples) == min(count, int(finite.sum()))
    assert len(samples) == 0 or samples[0] == start
    assert len(set(samples)) == len(samples), "a point taken twice"
    mind = torch.full((len(points),), math.inf, dtype=torch.float64)
    taken = torch.zeros(len(points), dtype=torch.bool)
    for previous, chosen in zip(samples, samples[1:]):
        taken[previous] = True
        mind = torch.minimum(mind, ((points - points[previous]) ** 2).sum(1))
        candidates = mind.masked_fill(taken | ~finite, -math.inf)
        best = candidates.max()
        assert candidates[chosen] >= best * (1 - 2.01 * rtol), "not the farthest point"
        if int((candidates >= best * (1 - 2.01 * rtol)).sum()) == 1:
            assert chosen == int(candidates.argmax())


def split_samples(samples, batch):
    """fps output -> {cloud: local indices in the order taken}, checking cloud 0's samples come
    first, then cloud 1's, ..."""
    samples, batch = samples.cpu(), batch.cpu()
    assert samples.dtype == torch.int64 and samples.dim() == 1
    clouds = batch[samples]
    assert (clouds[1:] >= clouds[:-1]).all(), "samples not grouped by cloud in order"
    out = {}
    for c in batch.unique().tolist():
        members = (batch == c).nonzero()[:, 0]
        local = torch.full((len(batch),), -1, dtype=torch.int64)
        local[members] = torch.arange(len(members))
        out[c] = (members, local[samples[clouds == c]].tolist())
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fps_matches_oracle(device, dtype):
    x, _, batch, _ = packed_clouds(3, dtype, device, seed=21, sizes_x=[40, 0, 1, 23, 9])
    rtol = search_rtol(dtype, 3)
    for ratio in (0.1, 0.25, 0.5, 1.0):
        samples = pointops.fps(x, batch, ratio=ratio, random_start=False)
        clouds = split_samples(samples, batch)
        assert sorted(clouds) == [0, 2, 3, 4]
        for c, (members, local) in clouds.items():
            check_fps_cloud(local, x[members].cpu(), fps_count(len(members), ratio), rtol)
        samples = pointops.fps(x, None, ratio=ratio, random_start=False)
        members, local = split_samples(samples, torch.zeros_like(batch))[0]
        check_fps_cloud(local, x.cpu(), fps_count(len(x), ratio), rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fps_exact_ties_and_duplicates(device, dtype):
    x, _, batch, _ = packed_clouds(2, dtype, device, seed=22, sizes_x=[30, 12], lattice=True)
    for ratio in (0.3, 1.0):  # 1.0: every point, duplicates (distance 0) last, in index order
        clouds = split_samples(pointops.fps(x, batch, ratio=ratio, random_start=False), batch)
        for c, (members, local) in clouds.items():
            assert local == reference_fps(x[members].cpu(), fps_count(len(members), ratio)), (c, ratio)
    same = torch.zeros(5, 3, dtype=dtype, device=device)
    assert pointops.fps(same, ratio=1.0, random_start=False).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("device", DEVICES)
def test_fps_never_takes_non_finite_points(device):
    x, _, batch, _ = packed_clouds(3, torch.float32, device, seed=24, sizes_x=[20, 15])
    members = [(batch == c).nonzero()[:, 0] for c in (0, 1)]
    x[members[0][3], 1] = float("nan")
    x[members[0][7], 0] = float("inf")
    x[members[1][1:], 2] = float("nan")  # cloud 1: one finite point
    clouds = split_samples(pointops.fps(x, batch, ratio=1.0, random_start=False), batch)
    assert len(clouds[0][1]) == 18 and clouds[1][1] == [0]  # fewer than ceil(ratio * n): finite points only
    check_fps_cloud(clouds[0][1], x[members[0]].cpu(), 20, search_rtol(torch.float32, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_fps_count_is_ceil_in_float32(device):
    # float32(0.1) * 10 rounds to 1.0 in float32 (ceil 1); in float64 it is 1.0000000149 (ceil 2)
    x = torch.randn(10, 3, device=device)
    assert len(pointops.fps(x, ratio=0.1, random_start=False)) == 1
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([600, 399, 1])).to(device)
    x = torch.randn(1000, 3, device=device)
    samples = pointops.fps(x, batch, ratio=0.25, random_start=False)
    assert torch.bincount(batch[samples].cpu()).tolist() == [150, 100, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_fps_random_start(device):
    x, _, batch, _ = packed_clouds(3, torch.float32, device, seed=23, sizes_x=[40, 0, 17, 9])
    runs = [pointops.fps(x, batch, ratio=0.5, generator=torch.Generator(device=device).manual_seed(5))
            for _ in range(2)]
    assert torch.equal(runs[0], runs[1])  # a pure function of the generator's state
    starts = set()
    for c, (members, local) in split_samples(runs[0], batch).items():
        check_fps_cloud(local, x[members].cpu(), fps_count(len(members), 0.5), search_rtol(torch.float32, 3),
                        start=local[0])
        starts.add(local[0])
    assert starts != {0}  # some cloud did not start at its first point


# ---------------------------------------------------------------- knn_interpolate
def reference_interpolate(features, pos_x, pos_y, batch_x, batch_y, k):
    """torch_geometric's formula in float64: y_i = sum_j w_ij x_j / sum_j w_ij over the k nearest
    x of y_i's cloud, w_ij = 1 / max(d_ij^2, 1e-16); zeros where y_i's cloud has no x. Also
    returns which rows have a k-th neighbour tied (to rounding) with the next one."""
    cand = packed_candidates(pos_x, pos_y, batch_x, batch_y)
    dists, idx = reference_knn(cand, k)
    w = (1.0 / dists.clamp(min=1e-16)).masked_fill(idx < 0, 0.0)[0]
    gathered = features.detach().cpu().double()[idx[0].clamp(min=0)]
    total = w.sum(-1, keepdim=True)
    y = (w[..., None] * gathered).sum(1) / torch.where(total > 0, total, torch.ones_like(total))
    return y, cand


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_knn_interpolate_matches_formula(device, dtype):
    pos_x, pos_y, batch_x, batch_y = packed_clouds(3, dtype, device, seed=31)
    pos_y, batch_y = pos_y.clone(), batch_y.clone()
    pos_y[:3], batch_y[:3] = pos_x[:3], batch_x[:3]  # queries on an x point: its weight is 1e16
    g = torch.Generator().manual_seed(32)
    features = torch.randn(len(pos_x), 4, generator=g).to(dtype).to(device)
    rtol = search_rtol(dtype, 3)
    for k in (1, 3, 8, 40):  # 40: more than any cloud
        got = pointops.knn_interpolate(features, pos_x, pos_y, batch_x, batch_y, k=k)
        assert got.shape == (len(pos_y), 4) and got.dtype == dtype
        want, cand = reference_interpolate(features, pos_x, pos_y, batch_x, batch_y, k)
        # Rows whose k-th neighbour is tied (to rounding) with the next may take either: skipped,
        # and there must be few. Weights come from distances off by output_rtol; each y is a
        # convex combination of its features, computed in float32 at least, rounded to the dtype.
        stable = ~near_tie_slots(cand, k, rtol)[0, :, k - 1]
        assert stable.float().mean() > 0.9
        scale = features.detach().abs().max().double().cpu()
        atol = (4 * output_rtol(dtype, 3) + (k + 4) * compute_unit(dtype)) * scale + 1e-300
        torch.testing.assert_close(got.cpu().double()[stable], want[stable], rtol=UNIT[dtype], atol=atol)
        assert (got[batch_y == 1] == 0).all()  # cloud 1 has no x: zeros (torch_geometric: NaN)
    # a query on an x point takes that point's feature: the other weights are < 1e16 times smaller
    got = pointops.knn_interpolate(features, pos_x, pos_y, batch_x, batch_y, k=3)
    torch.testing.assert_close(got[:3], features[:3], rtol=UNIT[dtype] + 4 * compute_unit(dtype), atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
def test_knn_interpolate_gradcheck(device):
    g = torch.Generator().manual_seed(3)
    batch_x = torch.tensor([0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0], device=device)
    batch_y = torch.tensor([1, 0, 0, 1, 1, 0, 2], device=device)  # cloud 2: no x
    pos_x = torch.randn(12, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    pos_y = torch.randn(7, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    features = torch.randn(12, 2, generator=g, dtype=torch.float64).to(device).requires_grad_()
    cand = packed_candidates(pos_x, pos_y, batch_x, batch_y)
    values = cand.sort(-1).values[0, :6, :4]  # the set of the 3 nearest is stable under eps
    assert (values[:, 3] - values[:, 2] > 1e-3).all() and (values[:, 0] > 1e-3).all()
    assert torch.autograd.gradcheck(
        lambda f, px, py: pointops.knn_interpolate(f, px, py, batch_x, batch_y, k=3), (features, pos_x, pos_y))


# ---------------------------------------------------------------- empty inputs and errors
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("empty", ["x", "y", "both"])
def test_empty_inputs(device, empty):
    x, y = torch.randn(6, 3, device=device), torch.randn(4, 3, device=device)
    a, b = x[:0] if empty != "y" else x, y[:0] if empty != "x" else y
    knn = pointops.knn(a, b, 3)
    assert knn.shape == (2, 0) and knn.dtype == torch.int64  # torch_cluster: empty x or y gives (2, 0)
    assert pointops.radius(a, b, 1.0).shape == (2, 0)
    out = pointops.knn_interpolate(torch.randn(len(a), 5, device=device), a, b, k=2)
    assert out.shape == (len(b), 5) and (out == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_no_shared_cloud_and_tiny_inputs(device):
    x, y = torch.randn(6, 3, device=device), torch.randn(4, 3, device=device)
    bx, by = torch.zeros(6, dtype=torch.int64, device=device), torch.ones(4, dtype=torch.int64, device=device)
    assert pointops.knn(x, y, 3, bx, by).shape == (2, 0)
    assert pointops.radius(x, y, 10.0, bx, by).shape == (2, 0)
    assert (pointops.knn_interpolate(torch.randn(6, 2, device=device), x, y, bx, by) == 0).all()
    empty_batch = torch.zeros(0, dtype=torch.int64, device=device)
    assert pointops.fps(x[:0], ratio=0.5).shape == (0,)
    assert pointops.fps(x[:0], empty_batch, ratio=0.5).shape == (0,)
    assert pointops.fps(x[:1], ratio=0.5, random_start=False).tolist() == [0]
    assert pointops.knn(x[:1], y[:1], 5).tolist() == [[0], [0]]
    assert pointops.radius(x[:1], x[:1], 0.1).tolist() == [[0], [0]]


@pytest.mark.parametrize("device", DEVICES)
def test_error_messages(device):
    x, y = torch.randn(6, 3, device=device), torch.randn(4, 3, device=device)
    bx = torch.zeros(6, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=r"x must be a tensor \(N, D\) or \(N,\), got shape \[1, 6, 3\]"):
        pointops.knn(x[None], y, 2)
    with pytest.raises(ValueError, match=r"x and y must have the same point dimension D, got x \[6, 3\] and "
                                         r"y \[4, 2\]"):
        pointops.knn(x, y[:, :2], 2)
    for fn in (lambda **kw: pointops.knn(x, y, 2, **kw), lambda **kw: pointops.radius(x, y, 0.5, **kw),
               lambda **kw: pointops.knn_interpolate(x, x, y, **kw)):
        with pytest.raises(TypeError, match="batch_x must be an int64 tensor, got torch.int32"):
            fn(batch_x=bx.int())
        with pytest.raises(ValueError, match=r"batch_x must have shape \(N,\) = \(6,\) to match (pos_)?x, got "
                                             r"shape \[5\]"):
            fn(batch_x=bx[:5])
        with pytest.raises(ValueError, match=r"batch_y must have shape \(N,\) = \(4,\) to match (pos_)?y, got "
                                             r"shape \[1, 4\]"):
            fn(batch_y=bx[None, :4])
        with pytest.raises(ValueError, match="batch_x must hold cloud numbers >= 0, got -1"):
            fn(batch_x=bx - 1)
        with pytest.raises(ValueError, match="batch_y must hold cloud numbers >= 0, got -3"):
            fn(batch_y=torch.tensor([0, -3, 1, 1], device=device))
        with pytest.raises(TypeError, match="batch_x must be a tensor \\(N,\\) or None, got list"):
            fn(batch_x=[0] * 6)
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        pointops.knn(x, y, 0)
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        pointops.knn_interpolate(x, x, y, k=0)
    with pytest.raises(ValueError, match="max_num_neighbors must be at least 1, got 0"):
        pointops.radius(x, y, 0.5, max_num_neighbors=0)
    for r in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"r \(the radius\) must be a finite number > 0"):
            pointops.radius(x, y, r)
    for ratio in (0, 0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"ratio must be a number in \(0, 1\], got"):
            pointops.fps(x, ratio=ratio)
    for ratio in (torch.tensor(0.0), torch.tensor([1.5]), torch.tensor([float("nan")])):
        with pytest.raises(ValueError, match=r"ratio must hold numbers in \(0, 1\], got"):
            pointops.fps(x, ratio=ratio.to(device))
    with pytest.raises(ValueError, match=r"ratio must be a float, a tensor \(\) or \(1,\), or one ratio per cloud "
                                         r"\(1,\), got shape \[2\]"):
        pointops.fps(x, ratio=torch.tensor([0.5, 0.5], device=device))
    with pytest.raises(TypeError, match="ratio must be a float or a tensor, got bool True"):
        pointops.fps(x, ratio=True)
    with pytest.raises(TypeError, match="ratio must be a float or a floating tensor, got torch.int64"):
        pointops.fps(x, ratio=torch.tensor(1, device=device))
    with pytest.raises(ValueError, match=r"src must be a tensor \(N, D\) or \(N,\), got shape \[1, 6, 3\]"):
        pointops.fps(x[None])
    with pytest.raises(ValueError, match=r"ptr must run from 0 to the number of points \(6\) without decreasing, "
                                         r"got \[0, 4, 3, 6\]"):
        pointops.fps(x, ptr=[0, 4, 3, 6])
    with pytest.raises(ValueError, match=r"ptr must run from 0 to the number of points \(6\)"):
        pointops.fps(x, ptr=torch.tensor([0, 5], device=device))
    with pytest.raises(ValueError, match=r"batch must have shape \(N,\) = \(6,\) to match src"):
        pointops.fps(x, bx[:2])
    with pytest.raises(ValueError, match="batch must hold cloud numbers >= 0, got -1"):
        pointops.fps(x, bx - 1)
    with pytest.raises(ValueError, match=r"x must be a 2-D tensor \(Nx, F\) with Nx = 6 \(the points of pos_x\), got "
                                         r"shape \[5, 2\]"):
        pointops.knn_interpolate(torch.zeros(5, 2, device=device), x, y)


@requires_cuda
def test_error_batch_on_another_device():
    x, y = torch.randn(6, 3, device="cuda"), torch.randn(4, 3, device="cuda")
    with pytest.raises(ValueError, match=r"batch_x must be on the same device as x \(cuda:0\), got cpu"):
        pointops.knn(x, y, 2, torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"batch must be on the same device as src \(cuda:0\), got cpu"):
        pointops.fps(x, torch.zeros(6, dtype=torch.int64))


# ---------------------------------------------------------------- CUDA
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    sizes_x, sizes_y = [3000, 0, 70, 2500, 1], [2000, 40, 0, 3100, 5]
    x, y, bx, by = packed_clouds(3, dtype, "cpu", seed=41, sizes_x=sizes_x, sizes_y=sizes_y)
    features = torch.randn(len(x), 8, generator=torch.Generator().manual_seed(42)).to(dtype)
    gpu = [t.cuda() for t in (x, y, bx, by)]
    for k in (1, 16, 100):
        assert torch.equal(pointops.knn(*gpu[:2], k, *gpu[2:]).cpu(), pointops.knn(x, y, k, bx, by))
        torch.testing.assert_close(pointops.knn_interpolate(features.cuda(), *gpu, k=k).cpu(),
                                   pointops.knn_interpolate(features, x, y, bx, by, k=k),
                                   rtol=(k + 8) * compute_unit(dtype) + 2 * UNIT[dtype],
                                   atol=(k + 8) * compute_unit(dtype) + 2 * UNIT[dtype])
    for max_num_neighbors in (1, 32, 300):
        assert torch.equal(pointops.radius(*gpu[:2], 0.2, *gpu[2:], max_num_neighbors=max_num_neighbors).cpu(),
                           pointops.radius(x, y, 0.2, bx, by, max_num_neighbors=max_num_neighbors))
    for ratio in (0.05, 0.5):
        assert torch.equal(pointops.fps(gpu[0], gpu[2], ratio=ratio, random_start=False).cpu(),
                           pointops.fps(x, bx, ratio=ratio, random_start=False))
