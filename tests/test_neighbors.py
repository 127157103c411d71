"""Neighbourhoods of padded batches (knn_points, knn_gather, ball_query): against a float64 oracle
written here (no pointops call), exact ties, ragged / empty / non-finite inputs, gradients
(gradcheck, gradgradcheck), CPU == CUDA bit for bit, errors, opcheck, torch.compile, CUDA graphs and
streams. The packed faces (knn, radius, fps, knn_interpolate) are in test_neighbors_packed.py, which
uses the oracle and checkers of this file; torch_cluster's graph builders, nearest and grid_cluster
in test_torch_cluster_face.py."""
import math

import pytest
import torch

import pointops
from conftest import DEVICES, DeterministicAlgorithms, requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}
KS = [1, 2, 5, 8, 16, 17, 32, 33, 64, 65, 130]  # 1: the NN search; <= 64 registers on CUDA; > 64 the sort path
DIMS = [1, 2, 3, 5, 40]  # 2, 3 compiled specially; 40 the any-D path (and, on CUDA, a narrower tile)


# ---------------------------------------------------------------- the oracle
def compute_unit(dtype):
    return UNIT[torch.float64] if dtype == torch.float64 else UNIT[torch.float32]


def search_rtol(dtype, dim):
    """Relative error of the distances the search ranks and compares. They are computed from the
    exact input values in float32 (float64 for float64 inputs): x - y rounded once relative to the
    difference, each square (or |.|) and each add (a fused multiply-add) once more, so at most
    dim + 2 roundings (test_chamfer's distance_rtol)."""
    return (dim + 2) * compute_unit(dtype)


def output_rtol(dtype, dim):
    """The returned distances: the searched values rounded once more to a half dtype."""
    return search_rtol(dtype, dim) + (UNIT[dtype] if dtype in (torch.float16, torch.bfloat16) else 0.0)


def output_atol(dtype):
    return 2.0**-24 if dtype == torch.float16 else 0.0  # float16's subnormal spacing


def pair_distances(p1, p2, norm=2):
    """(B, N, M) float64 distances from the exact input values: squared L2 (norm 2) or L1."""
    diff = p1.detach().cpu().double()[:, :, None, :] - p2.detach().cpu().double()[:, None, :, :]
    return (diff**2 if norm == 2 else diff.abs()).sum(-1)


def candidates(p1, p2, lengths1=None, lengths2=None, norm=2):
    """Pair distances with +inf wherever there is no candidate: points of p2 past lengths2, queries
    past lengths1 (padding), and non-finite distances (points with NaN or inf coordinates are
    never matched). Test inputs stay far below float32 overflow, so finite here is finite there."""
    pairs = pair_distances(p1, p2, norm)
    B, N, M = pairs.shape
    none = ~torch.isfinite(pairs)
    if lengths2 is not None:
        none |= torch.arange(M)[None, None, :] >= torch.as_tensor(lengths2).cpu()[:, None, None]
    if lengths1 is not None:
        none |= torch.arange(N)[None, :, None] >= torch.as_tensor(lengths1).cpu()[:, None, None]
    return pairs.masked_fill(none, math.inf)


def reference_knn(cand, K):
    """Each query's candidates sorted STABLY by distance (so by (distance, index)), the first K;
    slots without a neighbour (fewer candidates than K, padded queries) hold idx -1, dist 0."""
    B, N, M = cand.shape
    values, order = torch.sort(cand, dim=-1, stable=True)
    L = min(K, M)
    values, order = values[..., :L], order[..., :L]
    none = torch.isinf(values)
    dists = torch.zeros(B, N, K, dtype=torch.float64)
    idx = torch.full((B, N, K), -1, dtype=torch.int64)
    dists[..., :L] = values.masked_fill(none, 0.0)
    idx[..., :L] = order.masked_fill(none, -1)
    return dists, idx


def reference_ball(cand, K, radius):
    """The first K candidates in index order with squared distance < radius^2 (strictly);
    idx -1, dist 0 in the remaining slots."""
    B, N, M = cand.shape
    inside = cand < radius**2
    rank = inside.cumsum(-1) - 1
    b, i, j = (inside & (rank < K)).nonzero(as_tuple=True)
    dists = torch.zeros(B, N, K, dtype=torch.float64)
    idx = torch.full((B, N, K), -1, dtype=torch.int64)
    idx[b, i, rank[b, i, j]] = j
    dists[b, i, rank[b, i, j]] = cand[b, i, j]
    return dists, idx


def near_tie_slots(cand, K, rtol):
    """(B, N, K): the oracle's k-th neighbour has another candidate so close that the search's
    rounding may order the two either way. With each distance off by at most rtol relative, a <= b
    can be ranked b first only if b - a <= rtol * (a + b)."""
    B, N, M = cand.shape
    values = cand.sort(-1).values
    close = (values[..., 1:] - values[..., :-1] <= rtol * (values[..., 1:] + values[..., :-1])) & torch.isfinite(
        values[..., 1:])
    false = torch.zeros(B, N, 1, dtype=torch.bool)
    near = torch.cat([false, close], -1) | torch.cat([close, false], -1)
    return torch.cat([near, torch.zeros(B, N, max(K - M, 0), dtype=torch.bool)], -1)[..., :K]


def check_knn(dists, idx, cand, K, dtype, dim):
    """The returned neighbours against the oracle, honestly about rounding: the same number of
    neighbours per query (empty slots at the end: idx -1, dist 0), every index in [0, M) or -1 and
    distinct within a query; indices equal to the oracle's wherever its neighbour has no near tie;
    elsewhere a neighbour whose true distance is the oracle's up to two roundings (the k-th
    smallest of values each within rtol is within rtol of the k-th smallest true value). The
    distances are the chosen pairs' distances to rounding and ascending; equal float32/float64
    distances come in index order. dists None: indices only (the packed knn). Returns the oracle."""
    B, N, M = cand.shape
    ref_dists, ref_idx = reference_knn(cand, K)
    idx = idx.cpu()
    assert idx.dtype == torch.int64 and idx.shape == (B, N, K)
    assert ((idx >= -1) & (idx < max(M, 1))).all(), "an index outside [0, M) or -1"
    found = idx >= 0
    assert torch.equal(found, ref_idx >= 0), "number of neighbours differs from the oracle"
    if M == 0:
        return ref_dists, ref_idx
    rtol = search_rtol(dtype, dim)
    exact = found & ~near_tie_slots(cand, K, rtol)
    assert torch.equal(idx[exact], ref_idx[exact]), "a neighbour without near tie differs from the oracle"
    chosen = cand.gather(-1, idx.clamp(min=0))
    assert ((chosen[found] - ref_dists[found]).abs() <= 2.01 * rtol * ref_dists[found]).all()
    ordered = idx.masked_fill(~found, -1).sort(-1).values
    assert not ((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any(), "a neighbour twice"
    if dists is not None:
        dists = dists.cpu()
        assert dists.dtype == dtype and dists.shape == (B, N, K)
        assert (dists[~found] == 0).all()
        torch.testing.assert_close(dists[found].double(), chosen[found], rtol=output_rtol(dtype, dim),
                                   atol=output_atol(dtype))
        d = dists.double()
        assert (d[..., 1:] >= d[..., :-1])[found[..., 1:]].all(), "distances not ascending"
        if dtype in (torch.float32, torch.float64):  # the output is the searched value itself
            equal = (d[..., 1:] == d[..., :-1]) & found[..., 1:]
            assert (idx[..., 1:] > idx[..., :-1])[equal].all(), "a tie not in index order"
    return ref_dists, ref_idx


def check_ball(dists, idx, cand, K, radius, dtype, dim):
    """ball_query against the oracle: slot k holds the k-th candidate in index order with squared
    distance < radius^2. The search compares its rounded distance with radius^2 rounded once to
    the compute type, so a candidate within that rounding of the sphere may be in or out: the
    returned indices are increasing, each surely or possibly inside, and every surely-inside
    candidate is returned unless the row is full and it comes after the last one returned. Rows
    without such a boundary candidate equal the oracle exactly. dists None: indices only."""
    B, N, M = cand.shape
    ref_dists, ref_idx = reference_ball(cand, K, radius)
    idx = idx.cpu()
    assert idx.dtype == torch.int64 and idx.shape == (B, N, K)
    assert ((idx >= -1) & (idx < max(M, 1))).all(), "an index outside [0, M) or -1"
    found = idx >= 0
    assert (found[..., 1:] <= found[..., :-1]).all(), "an empty slot before a neighbour"
    slack = search_rtol(dtype, dim) + compute_unit(dtype) + 2.0**-40
    r2 = radius**2
    surely, possibly = cand < r2 * (1 - slack), cand < r2 * (1 + slack)
    if M > 0:
        both = found[..., 1:] & found[..., :-1]
        assert (idx[..., 1:] > idx[..., :-1])[both].all(), "neighbours not in index order"
        chosen = cand.gather(-1, idx.clamp(min=0))
        assert possibly.gather(-1, idx.clamp(min=0))[found].all(), "a neighbour outside the ball"
        selected = torch.zeros(B, N, M + 1, dtype=torch.bool).scatter_(-1, idx.masked_fill(~found, M), True)[..., :M]
        last = idx.max(-1, keepdim=True).values
        full = found.sum(-1, keepdim=True) == K
        required = surely & (~full | (torch.arange(M) <= last))
        assert not (required & ~selected).any(), "a candidate inside the ball was skipped"
        clean = ~(possibly & ~surely).any(-1)
        assert torch.equal(idx[clean], ref_idx[clean])
    else:
        assert not found.any()
    if dists is not None:
        dists = dists.cpu()
        assert dists.dtype == dtype and dists.shape == (B, N, K)
        assert (dists[~found] == 0).all()
        if M > 0:
            torch.testing.assert_close(dists[found].double(), chosen[found], rtol=output_rtol(dtype, dim),
                                       atol=output_atol(dtype))
    return ref_dists, ref_idx


def reference_gather(x, idx, lengths=None):
    """x[b, idx[b, i, k]] by advanced indexing; zeros where idx is outside [0, M) (-1) and at
    slots k >= lengths[b] (PyTorch3D's rule)."""
    B, M, U = x.shape
    if M == 0:
        return x.new_zeros(*idx.shape, U)
    valid = (idx >= 0) & (idx < M)
    if lengths is not None:
        valid &= torch.arange(idx.shape[2], device=idx.device) < lengths[:, None, None]
    b = torch.arange(B, device=x.device)[:, None, None].expand_as(idx)
    return torch.where(valid[..., None], x[b, idx.clamp(0, M - 1)], torch.zeros((), dtype=x.dtype, device=x.device))


def clouds(B, N, M, D, dtype, device, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    p1 = (scale * torch.randn(B, N, D, generator=g)).to(dtype).to(device)
    p2 = (scale * torch.randn(B, M, D, generator=g)).to(dtype).to(device)
    return p1, p2


def lattice_clouds(B, N, M, D, dtype, device, seed=0, low=-2, high=2):
    """Integer coordinates: every distance is an exact small integer in every dtype's compute type
    (and the duplicated points of p2 give exact ties), so indices must equal the oracle's."""
    g = torch.Generator().manual_seed(seed)
    p1 = torch.randint(low, high + 1, (B, N, D), generator=g)
    p2 = torch.randint(low, high + 1, (B, M, D), generator=g)
    p2 = torch.cat([p2, p2[:, : M // 4]], 1)  # duplicates: copies of earlier points
    return p1.to(dtype).to(device), p2.to(dtype).to(device)


# Ragged batch of four: full clouds, an empty query cloud, an empty reference cloud, a reference
# cloud smaller than most K.
LENGTHS1, LENGTHS2 = [25, 0, 17, 25], [70, 33, 0, 5]


def knn_kernel(p1, p2, l1=None, l2=None, norm=2, K=1):
    """The knn_points op itself: (dists, idx) with idx -1 where there is no neighbour (the face
    pads those with PyTorch3D's 0, which cannot be told from point 0)."""
    return torch.ops.pointops.knn_points(p1, p2, l1, l2, K, norm)


def check_pytorch3d_padding(out, kernel, p2, l2):
    """knn_points' face against the op: the same distances, index 0 where the op has -1, and
    return_nn zeros there (PyTorch3D's knn_gather zeros slots past lengths2; pointops also those
    the search left empty)."""
    dists, idx = kernel
    assert torch.equal(out.dists, dists)
    assert torch.equal(out.idx, idx.masked_fill(idx < 0, 0))
    if out.knn is not None:
        assert torch.equal(out.knn, reference_gather(p2, idx, l2))


# ---------------------------------------------------------------- knn_points against the oracle
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
def test_knn_points_matches_oracle(device, dtype, dim):
    p1, p2 = clouds(4, 25, 70, dim, dtype, device, seed=dim)
    for lengths in [(None, None), (LENGTHS1, LENGTHS2)]:
        l1, l2 = (torch.tensor(v, device=device) if v is not None else None for v in lengths)
        for norm in (1, 2):
            cand = candidates(p1, p2, l1, l2, norm)
            nn_dist, nn_idx = pointops.nearest_neighbor(p1, p2, l1, l2, norm=norm)
            for K in KS:
                dists, idx = knn_kernel(p1, p2, l1, l2, norm, K)
                check_knn(dists, idx, cand, K, dtype, dim)
                out = pointops.knn_points(p1, p2, l1, l2, norm=norm, K=K, return_nn=True)
                check_pytorch3d_padding(out, (dists, idx), p2, l2)
                # K = 1 is the nearest-neighbour search, and the first column of every K is too: bit for bit
                first_dist, first_idx = dists[..., 0], idx[..., 0]
                matched = nn_idx >= 0
                assert torch.equal(first_idx[matched], nn_idx[matched]), (K, norm)
                assert torch.equal(first_dist[matched], nn_dist[matched]), (K, norm)
                assert (first_idx[~matched] == -1).all() and (first_dist[~matched] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
def test_knn_points_exact_ties_follow_index_order(device, dtype, dim):
    p1, p2 = lattice_clouds(4, 25, 56, dim, dtype, device, seed=dim + 100)  # p2: 70 points, 14 duplicated
    l1, l2 = torch.tensor(LENGTHS1, device=device), torch.tensor(LENGTHS2, device=device)
    for norm in (1, 2):
        cand = candidates(p1, p2, l1, l2, norm)
        for K in KS:
            dists, idx, _ = pointops.knn_points(p1, p2, l1, l2, norm=norm, K=K)
            ref_dists, ref_idx = reference_knn(cand, K)
            assert torch.equal(idx.cpu(), ref_idx.clamp(min=0)), (K, norm)  # PyTorch3D's padding: 0
            # exact integer distances, rounded once to the output dtype (bfloat16 above 256)
            assert torch.equal(dists.cpu(), ref_dists.to(dtype)), (K, norm)


@pytest.mark.parametrize("device", DEVICES)
def test_knn_points_hand_made_ties_and_k_beyond_the_cloud(device):
    p1 = torch.tensor([[[0.0, 0.0], [2.0, 2.0]]], device=device)
    p2 = torch.tensor([[[3.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]]], device=device)
    for K in (6, 70):  # the register and (on CUDA) the sort path
        dists, idx, _ = pointops.knn_points(p1, p2, K=K)
        pad = [0] * (K - 4)  # PyTorch3D's padding past the cloud: index 0, distance 0
        assert idx.tolist() == [[[1, 2, 3, 0] + pad, [0, 1, 3, 2] + pad]]
        assert dists.tolist() == [[[1, 1, 1, 9] + [0] * (K - 4), [5, 5, 5, 13] + [0] * (K - 4)]]
        dists, idx, _ = pointops.knn_points(p1, p2, K=K, norm=1)
        assert idx.tolist() == [[[1, 2, 3, 0] + pad, [0, 1, 3, 2] + pad]]
        assert dists.tolist() == [[[1, 1, 1, 3] + [0] * (K - 4), [3, 3, 3, 5] + [0] * (K - 4)]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [1, 2])
def test_knn_points_several_tiles_and_query_blocks(device, norm):
    # The CPU streams the references in tiles of 1024 and the queries in blocks of 32: 2100
    # references (a partial last tile), 70 queries, lengths that end inside a tile.
    for dim in (3, 7):
        p1, p2 = clouds(2, 70, 2100, dim, torch.float32, device, seed=40 + dim)
        l1, l2 = torch.tensor([70, 33], device=device), torch.tensor([2100, 1030], device=device)
        cand = candidates(p1, p2, l1, l2, norm)
        for K in (2, 16, 65):
            dists, idx = knn_kernel(p1, p2, l1, l2, norm, K)
            check_knn(dists, idx, cand, K, torch.float32, dim)
            check_pytorch3d_padding(pointops.knn_points(p1, p2, l1, l2, norm=norm, K=K, return_nn=True),
                                    (dists, idx), p2, l2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(device, dtype):
    p1, p2 = clouds(3, 30, 80, 3, dtype, device, seed=7)
    t1 = p1.transpose(0, 1).contiguous().transpose(0, 1)  # same values, permuted strides
    t2 = torch.stack([p2, -p2], dim=-1)[..., 0]          # strided last dimension
    assert not t1.is_contiguous() and not t2.is_contiguous()
    lengths2 = torch.tensor([80, 3, 41], device=device)
    for K in (1, 5, 70):
        for norm in (1, 2):
            a = pointops.knn_points(t1, t2, None, lengths2, norm=norm, K=K, return_nn=True)
            b = pointops.knn_points(p1, p2.contiguous(), None, lengths2, norm=norm, K=K, return_nn=True)
            for u, v in zip(a, b):
                assert torch.equal(u, v)
        a = pointops.ball_query(t1, t2, None, lengths2, K=K, radius=1.0)
        b = pointops.ball_query(p1, p2.contiguous(), None, lengths2, K=K, radius=1.0)
        for u, v in zip(a, b):
            assert torch.equal(u, v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_points_never_matched(device, dtype):
    p1, p2 = clouds(2, 40, 90, 3, dtype, device, seed=13)
    p1[0, 5, 1] = float("nan")   # a NaN query: no neighbour at all
    p1[0, 6, 0] = float("inf")   # an infinite query: every distance inf or NaN
    p1[1, 7, 2] = float("-inf")
    p2[0, 0] = float("nan")      # never matched
    p2[0, 1, 2] = float("inf")   # infinitely far: never matched
    p2[0, 2, 0] = float("-inf")
    p2[1, 10:20] = float("nan")
    p2[0, 3] = p1[0, 8]          # an exact match for query 8
    for norm in (1, 2):
        cand = candidates(p1, p2, norm=norm)
        for K in (1, 2, 17, 65, 130):
            dists, idx = knn_kernel(p1, p2, None, None, norm, K)
            check_knn(dists, idx, cand, K, dtype, 3)
            check_pytorch3d_padding(pointops.knn_points(p1, p2, norm=norm, K=K, return_nn=True), (dists, idx), p2, None)
            idx, dists = idx.cpu(), dists.cpu()
            assert (idx[0, 5] == -1).all() and (idx[0, 6] == -1).all() and (idx[1, 7] == -1).all()
            assert (dists[0, 5:7] == 0).all() and (dists[1, 7] == 0).all()
            assert not torch.isin(idx[0], torch.tensor([0, 1, 2])).any()
            assert not torch.isin(idx[1], torch.arange(10, 20)).any()
            assert idx[0, 8, 0] == 3 and dists[0, 8, 0] == 0
    for K in (1, 8, 130):
        dists, idx, nn = pointops.ball_query(p1, p2, K=K, radius=1.5)
        check_ball(dists, idx, candidates(p1, p2), K, 1.5, dtype, 3)
        assert (idx.cpu()[0, 5:7] == -1).all() and not torch.isin(idx.cpu()[0], torch.tensor([0, 1, 2])).any()
        assert torch.isfinite(nn).all()  # never a non-finite neighbour, zeros in empty slots


@pytest.mark.parametrize("device", DEVICES)
def test_knn_points_flags(device):
    p1, p2 = clouds(2, 20, 30, 3, torch.float32, device, seed=3)
    lengths2 = torch.tensor([30, 4], device=device)
    base = pointops.knn_points(p1, p2, lengths2=lengths2, K=8)
    assert isinstance(base, pointops.KNN) and base._fields == ("dists", "idx", "knn") and base.knn is None
    for kwargs in ({"version": 0}, {"version": 3}, {"version": -1}):
        other = pointops.knn_points(p1, p2, lengths2=lengths2, K=8, **kwargs)  # accepted and ignored
        assert torch.equal(other.dists, base.dists) and torch.equal(other.idx, base.idx)
    # return_sorted=False: the same neighbours, farthest first, padding still last (cloud 1 has 4 points)
    other = pointops.knn_points(p1, p2, lengths2=lengths2, K=8, return_sorted=False, return_nn=True)
    assert torch.equal(other.dists[0], base.dists[0].flip(-1)) and torch.equal(other.idx[0], base.idx[0].flip(-1))
    assert torch.equal(other.dists[1, :, :4], base.dists[1, :, :4].flip(-1)) and (other.dists[1, :, 4:] == 0).all()
    assert torch.equal(other.idx[1, :, :4], base.idx[1, :, :4].flip(-1)) and (other.idx[1, :, 4:] == 0).all()
    assert torch.equal(other.knn, pointops.knn_gather(p2, other.idx, lengths2))
    other = pointops.knn_points(p1, p2, lengths2=lengths2.int(), K=8)  # int32 lengths too
    assert torch.equal(other.dists, base.dists) and torch.equal(other.idx, base.idx)
    ball = pointops.ball_query(p1, p2, lengths2=lengths2, K=8, radius=0.7)
    other = pointops.ball_query(p1, p2, lengths2=lengths2.int(), K=8, radius=0.7)
    assert torch.equal(other.dists, ball.dists) and torch.equal(other.idx, ball.idx)


# ---------------------------------------------------------------- knn_gather
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_knn_gather_matches_indexing(device, dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 12, 4, generator=g).to(dtype).to(device)
    idx = torch.randint(-1, 12, (3, 7, 6), generator=g).to(device)
    idx[0, 0, 0] = 12     # outside [0, M): zeros too
    idx[1, 1, 1] = 2**40
    lengths = torch.tensor([6, 2, 0], device=device)
    for lens in (None, lengths):
        got = pointops.knn_gather(x, idx, lens)
        assert got.shape == (3, 7, 6, 4) and got.dtype == dtype
        assert torch.equal(got, reference_gather(x, idx, lens))
    got = pointops.knn_gather(x, idx, lengths)
    assert (got[:, :, 6:] == 0).all() and (got[1, :, 2:] == 0).all() and (got[2] == 0).all()
    assert (got[idx == -1] == 0).all() and (got[0, 0, 0] == 0).all() and (got[1, 1, 1] == 0).all()
    x_nan = x.clone()
    x_nan[0, 3] = float("nan")
    idx_nan = torch.full_like(idx, 3)
    idx_nan[0, :, 1] = -1
    assert (pointops.knn_gather(x_nan, idx_nan)[0, :, 1] == 0).all()  # a masked slot is 0, never 0 * NaN
    empty = pointops.knn_gather(x[:, :0], idx)  # M = 0: nothing to gather
    assert empty.shape == (3, 7, 6, 4) and (empty == 0).all()
    assert pointops.knn_gather(x[:0], idx[:0]).shape == (0, 7, 6, 4)


@pytest.mark.parametrize("device", DEVICES)
def test_knn_gather_gradient(device):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 9, 3, generator=g, dtype=torch.float64).to(device).requires_grad_()
    idx = torch.randint(-1, 9, (2, 5, 4), generator=g).to(device)
    lengths = torch.tensor([4, 3], device=device)
    assert torch.autograd.gradcheck(lambda a: pointops.knn_gather(a, idx, lengths), (x,))
    weight = torch.randn(2, 5, 4, 3, generator=g, dtype=torch.float64).to(device)
    (pointops.knn_gather(x, idx, lengths) * weight).sum().backward()
    xr = x.detach().clone().requires_grad_()
    (reference_gather(xr, idx, lengths) * weight).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-14, atol=1e-14)


# ---------------------------------------------------------------- ball_query against the oracle
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", DIMS)
def test_ball_query_matches_oracle(device, dtype, dim):
    p1, p2 = clouds(4, 25, 70, dim, dtype, device, seed=dim + 20)
    for lengths in [(None, None), (LENGTHS1, LENGTHS2)]:
        l1, l2 = (torch.tensor(v, device=device) if v is not None else None for v in lengths)
        cand = candidates(p1, p2, l1, l2)
        for radius in (0.5 * math.sqrt(2 * dim), 0.9 * math.sqrt(2 * dim)):  # a few and many neighbours
            for K in (1, 2, 5, 17, 33, 65, 130):
                dists, idx, nn = pointops.ball_query(p1, p2, l1, l2, K=K, radius=radius)
                check_ball(dists, idx, cand, K, radius, dtype, dim)
                assert torch.equal(nn, reference_gather(p2, idx))
        assert pointops.ball_query(p1, p2, l1, l2, K=4, radius=1.0, return_nn=False).knn is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ball_query_exact_radius_is_outside(device, dtype):
    # Integer distances: r^2 = 1, 2.25, 4 are exact, so "< radius^2 strictly" is decided exactly.
    p1, p2 = lattice_clouds(3, 30, 60, 3, dtype, device, seed=9, low=-1, high=1)
    l1, l2 = torch.tensor([30, 11, 0], device=device), torch.tensor([75, 20, 75], device=device)
    cand = candidates(p1, p2, l1, l2)
    for radius in (1.0, 1.5, 2.0):
        for K in (1, 3, 8, 40, 100):
            dists, idx, _ = pointops.ball_query(p1, p2, l1, l2, K=K, radius=radius)
            ref_dists, ref_idx = reference_ball(cand, K, radius)
            assert torch.equal(idx.cpu(), ref_idx) and torch.equal(dists.cpu(), ref_dists.to(dtype)), (radius, K)
    p1 = torch.zeros(1, 1, 3, dtype=dtype, device=device)
    p2 = torch.tensor([[[1.0, 0, 0], [0, 0.5, 0], [0, 0, 1.0], [0, 0, -0.5]]], dtype=dtype, device=device)
    assert pointops.ball_query(p1, p2, K=4, radius=1.0).idx.tolist() == [[[1, 3, -1, -1]]]


@pytest.mark.parametrize("device", DEVICES)
def test_ball_query_first_k_in_index_order_not_nearest(device):
    p1 = torch.zeros(1, 1, 3, device=device)
    p2 = torch.tensor([[[0.9, 0, 0], [5, 0, 0], [0, 0.8, 0], [0, 0, 0.1], [0.2, 0, 0]]], device=device)
    dists, idx, nn = pointops.ball_query(p1, p2, K=2, radius=1.0)
    assert idx.tolist() == [[[0, 2]]]
    torch.testing.assert_close(dists, torch.tensor([[[0.81, 0.64]]], device=device))
    assert torch.equal(nn, p2[:, [0, 2]][:, None])
    dists, idx, nn = pointops.ball_query(p1, p2, K=6, radius=1.0)
    assert idx.tolist() == [[[0, 2, 3, 4, -1, -1]]] and (dists[0, 0, 4:] == 0).all() and (nn[0, 0, 4:] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_ball_query_several_tiles(device):
    p1, p2 = clouds(2, 70, 2100, 3, torch.float32, device, seed=50)
    l1, l2 = torch.tensor([70, 40], device=device), torch.tensor([2100, 1030], device=device)
    cand = candidates(p1, p2, l1, l2)
    for K in (4, 64, 300):
        dists, idx, _ = pointops.ball_query(p1, p2, l1, l2, K=K, radius=0.6)
        check_ball(dists, idx, cand, K, 0.6, torch.float32, 3)


# ---------------------------------------------------------------- empty and degenerate inputs
@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    p1, p2 = clouds(2, 5, 4, 3, torch.float32, device)
    for K in (1, 3, 70):
        for a, b, shape in [(p1[:0], p2[:0], (0, 5, K)), (p1[:, :0], p2, (2, 0, K)), (p1, p2[:, :0], (2, 5, K))]:
            # no neighbour: knn_points pads with PyTorch3D's index 0, ball_query with its -1
            for out, pad in ((pointops.knn_points(a, b, K=K, return_nn=True), 0), (pointops.ball_query(a, b, K=K), -1)):
                assert out.dists.shape == shape and out.idx.shape == shape and out.knn.shape == shape + (3,)
                assert out.dists.dtype == torch.float32 and out.idx.dtype == torch.int64
                assert (out.idx == pad).all() and (out.dists == 0).all() and (out.knn == 0).all()
    # all-zero lengths: the clouds exist but hold no valid point
    zero = torch.zeros(2, dtype=torch.int64, device=device)
    for out, pad in ((pointops.knn_points(p1, p2, zero, None, K=3), 0), (pointops.knn_points(p1, p2, None, zero, K=3), 0),
                     (pointops.ball_query(p1, p2, zero, None, K=3), -1), (pointops.ball_query(p1, p2, None, zero, K=3), -1)):
        assert (out.idx == pad).all() and (out.dists == 0).all()
    a, b = p1.clone().requires_grad_(), p2.clone().requires_grad_()
    out = pointops.knn_points(a, b[:, :0], K=3)
    ball = pointops.ball_query(a[:, :0], b, K=3)
    (out.dists.sum() + ball.dists.sum()).backward()
    assert (a.grad == 0).all() and (b.grad == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_point_and_identical_points(device, dtype):
    p1 = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=dtype, device=device)
    p2 = torch.tensor([[[1.0, 2.0, 5.0]]], dtype=dtype, device=device)
    dists, idx, nn = pointops.knn_points(p1, p2, K=3, return_nn=True)
    assert idx.tolist() == [[[0, 0, 0]]] and dists.tolist() == [[[4.0, 0.0, 0.0]]]  # PyTorch3D's padding
    assert torch.equal(nn[0, 0, 0], p2[0, 0]) and (nn[0, 0, 1:] == 0).all()
    assert pointops.ball_query(p1, p2, K=2, radius=2.5).idx.tolist() == [[[0, -1]]]
    assert pointops.ball_query(p1, p2, K=2, radius=2.0).idx.tolist() == [[[-1, -1]]]  # d == r: outside
    # every point identical: every distance ties at 0, so the first K indices in order
    same = torch.full((2, 100, 3), 0.25, dtype=dtype, device=device)
    for K in (1, 5, 64, 65, 130):
        dists, idx, _ = pointops.knn_points(same[:, :7], same, K=K)
        expected = torch.arange(K).where(torch.arange(K) < 100, -1).expand(2, 7, K)
        assert torch.equal(idx.cpu(), expected.clamp(min=0)) and (dists == 0).all()
        dists, idx, _ = pointops.ball_query(same[:, :7], same, K=K, radius=0.1)
        assert torch.equal(idx.cpu(), expected) and (dists == 0).all()


# ---------------------------------------------------------------- gradients
def assert_stable_neighbourhoods(cand, K, margin):
    """gradcheck's premise: the first K + 1 sorted distances of each query are more than `margin`
    apart (finite differences with eps 1e-6 cannot reorder them or change the set)."""
    values = cand.sort(-1).values[..., : K + 1]
    gaps = values[..., 1:] - values[..., :-1]
    assert (gaps[torch.isfinite(gaps)] > margin).all(), "test input has near ties: pick another seed"


def gradient_inputs(device, seed, B=2, N=6, M=9, D=3):
    g = torch.Generator().manual_seed(seed)
    p1 = torch.randn(B, N, D, generator=g, dtype=torch.float64).to(device).requires_grad_()
    p2 = torch.randn(B, M, D, generator=g, dtype=torch.float64).to(device).requires_grad_()
    return p1, p2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["brute", "grid"])  # the backward reads only the indices
@pytest.mark.parametrize("norm", [1, 2])
def test_knn_points_gradcheck_and_gradgradcheck(device, norm, algorithm):
    p1, p2 = gradient_inputs(device, seed=1)
    l1, l2 = torch.tensor([6, 4], device=device), torch.tensor([9, 5], device=device)
    # L1: no coordinate difference within eps of 0 either (|.| has a kink there)
    assert ((p1.detach()[:, :, None] - p2.detach()[:, None]).abs() > 1e-3).all()
    for K in (1, 4, 7):  # 7 > lengths2[1]: empty slots carry no gradient
        assert_stable_neighbourhoods(candidates(p1, p2, l1, l2, norm), K, 1e-3)

        def fn(a, b):
            return pointops.knn_points(a, b, l1, l2, norm=norm, K=K, algorithm=algorithm).dists

        assert torch.autograd.gradcheck(fn, (p1, p2))
        with DeterministicAlgorithms():  # CUDA: the reference gradient without atomics, so bitwise repeatable
            assert torch.autograd.gradgradcheck(fn, (p1, p2))  # L1's second derivative is 0, checked as such
    assert torch.autograd.gradcheck(
        lambda a, b: pointops.knn_points(a, b, l1, l2, norm=norm, K=4, return_nn=True, algorithm=algorithm)[::2],
        (p1, p2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["brute", "grid"])  # the backward reads only the indices
def test_ball_query_gradcheck_and_gradgradcheck(device, algorithm):
    p1, p2 = gradient_inputs(device, seed=10, N=6, M=12)
    l1, l2 = torch.tensor([6, 5], device=device), torch.tensor([12, 7], device=device)
    radius = 1.6
    cand = candidates(p1, p2, l1, l2)
    assert ((cand - radius**2).abs() > 1e-3).all(), "a point near the sphere: pick another seed"
    counts = (cand < radius**2).sum(-1)
    assert counts.max() > 3 and (counts[0] > 0).all()  # the K = 3 cap is reached somewhere, rows not empty

    for K in (3, 12):
        def fn(a, b):
            out = pointops.ball_query(a, b, l1, l2, K=K, radius=radius, algorithm=algorithm)
            return out.dists, out.knn

        assert torch.autograd.gradcheck(fn, (p1, p2))
        with DeterministicAlgorithms():
            assert torch.autograd.gradgradcheck(fn, (p1, p2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [1, 2])
def test_knn_points_gradient_values(device, dtype, norm):
    # The gradient of sum(w * dists) for the returned neighbours, against torch autograd in float64
    # on the same pairs. Error bound: each term (w * 2 diff, or w * sign(diff)) and each add in the
    # compute type, then one rounding to the dtype; relative to the sum of |terms| of the element.
    B, N, M, K = 2, 25, 40, 12
    p1, p2 = clouds(B, N, M, 3, dtype, device, seed=30 + norm)
    l2 = torch.tensor([M, 9], device=device)
    a, b = p1.clone().requires_grad_(), p2.clone().requires_grad_()
    dists, idx, _ = pointops.knn_points(a, b, None, l2, norm=norm, K=K)
    w = torch.rand(dists.shape, generator=torch.Generator().manual_seed(1)).to(dtype).to(device)
    (dists * w).sum().backward()

    idx, w = knn_kernel(p1, p2, None, l2, norm, K)[1].cpu(), w.cpu().double()  # -1 where the face pads with 0
    valid = idx >= 0
    ra = p1.detach().cpu().double().requires_grad_()
    rb = p2.detach().cpu().double().requires_grad_()
    diff = ra[:, :, None] - reference_gather(rb, idx)
    ((diff**2 if norm == 2 else diff.abs()).sum(-1) * w * valid).sum().backward()
    term = ((2 * diff.detach().abs()) if norm == 2 else torch.ones_like(diff)) * (w * valid)[..., None]
    size_a = term.sum(2)
    bidx = torch.arange(B)[:, None, None].expand_as(idx)
    size_b = torch.zeros_like(rb).index_put_((bidx[valid], idx[valid]), term[valid], accumulate=True)
    rel = UNIT[dtype] + 4 * (N * K + 3) * compute_unit(dtype)
    atol = 4 * output_atol(dtype)
    assert ((a.grad.cpu().double() - ra.grad).abs() <= rel * size_a + atol).all()
    assert ((b.grad.cpu().double() - rb.grad).abs() <= rel * size_b + atol).all()
    assert (b.grad[1, 9:] == 0).all()  # padding of p2 gets no gradient


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("device", DEVICES)
def test_error_messages(device):
    p1, p2 = clouds(2, 5, 4, 3, torch.float32, device)
    knn, ball = pointops.knn_points, pointops.ball_query
    for fn in (knn, ball):
        with pytest.raises(ValueError, match="K must be at least 1, got 0"):
            fn(p1, p2, K=0)
        with pytest.raises(ValueError, match="K must be at least 1, got -3"):
            fn(p1, p2, K=-3)
        with pytest.raises(TypeError, match="K must be an int, got float 2.0"):
            fn(p1, p2, K=2.0)
        # PyTorch3D's ValueErrors, with the shapes
        with pytest.raises(ValueError, match=r"pts1 and pts2 must have the same batch dimension, got p1 \(2, 5, 3\) "
                                             r"and p2 \(1, 4, 3\)"):
            fn(p1, p2[:1])
        with pytest.raises(ValueError, match="pts1 and pts2 must have the same point dimension, got p1"):
            fn(p1, p2[..., :2])
        with pytest.raises(RuntimeError, match=r"p1 must be a 3-D tensor \(B, N, D\), got shape \[5, 3\]"):
            fn(p1[0], p2)
        with pytest.raises(RuntimeError, match=r"p2 must be a 3-D tensor \(B, M, D\), got shape \[4, 3\]"):
            fn(p1, p2[0])
        with pytest.raises(RuntimeError, match="p1 must be float16, bfloat16, float32 or float64, got Long"):
            fn(p1.long(), p2.long())
        with pytest.raises(RuntimeError, match=r"p2 must have the same dtype as p1 \(Float\), got Double"):
            fn(p1, p2.double())
        with pytest.raises(RuntimeError, match="the point dimension D must be at least 1"):
            fn(p1[..., :0], p2[..., :0])
        with pytest.raises(RuntimeError, match=r"lengths1 must lie in \[0, 5\] \(the number of points of p1\), got "
                                               r"values in \[1, 6\]"):
            fn(p1, p2, torch.tensor([6, 1], device=device))
        with pytest.raises(RuntimeError, match=r"lengths2 must lie in \[0, 4\] \(the number of points of p2\), got "
                                               r"values in \[1, 5\]"):
            fn(p1, p2, None, torch.tensor([1, 5], device=device))
        with pytest.raises(RuntimeError, match=r"lengths2 must lie in \[0, 4\].*got values in \[-1, 1\]"):
            fn(p1, p2, None, torch.tensor([1, -1], device=device))
        with pytest.raises(RuntimeError, match="lengths1 must be an int64 \\(or int32\\) tensor, got Float"):
            fn(p1, p2, torch.tensor([1.0, 2.0], device=device))
        with pytest.raises(RuntimeError, match=r"lengths2 must have shape \(B,\) = \(2,\) to match p2, got "
                                               r"shape \[3\]"):
            fn(p1, p2, None, torch.tensor([1, 2, 3], device=device))
        with pytest.raises(TypeError, match="p1 must be a torch.Tensor, got NoneType"):
            fn(None, p2)
    for bad in (0, 3, -1):
        with pytest.raises(ValueError, match=f"Support for 1 or 2 norm: norm must be 1 or 2, got {bad}"):
            knn(p1, p2, norm=bad)
        with pytest.raises(RuntimeError, match=rf"norm must be 1 \(L1 distance\) or 2 \(squared Euclidean distance\), "
                                               rf"got {bad}"):
            torch.ops.pointops.knn_points(p1, p2, None, None, 2, bad)
    for bad in (0, -1.0, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=f"radius must be a finite number > 0, got {bad}"):
            ball(p1, p2, radius=bad)
        with pytest.raises(RuntimeError, match="radius must be a finite number > 0, got"):
            torch.ops.pointops.ball_query(p1, p2, None, None, 2, float(bad))
    with pytest.raises(TypeError, match="radius must be a real number, got bool True"):
        ball(p1, p2, radius=True)
    for op in (torch.ops.pointops.knn_points, torch.ops.pointops.ball_query):  # the C++ checks themselves
        with pytest.raises(RuntimeError, match="K must be at least 1, got 0"):
            op(p1, p2, None, None, 0)
        with pytest.raises(RuntimeError, match="p1 and p2 must have the same batch size B"):
            op(p1, p2[:1])
        with pytest.raises(RuntimeError, match="p1 and p2 must have the same point dimension D"):
            op(p1, p2[..., :2])
    idx = torch.zeros(2, 3, 4, dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=r"x and idx must have same batch dimension, got x \(1, 4, 3\)"):
        pointops.knn_gather(p2[:1], idx)
    with pytest.raises(TypeError, match="knn_gather: idx must be int64, got torch.int32"):
        pointops.knn_gather(p2, idx.int())
    with pytest.raises(ValueError, match=r"knn_gather: x must be \(B, M, U\) and idx \(B, L, K\), got x \(4, 3\)"):
        pointops.knn_gather(p2[0], idx)
    with pytest.raises(TypeError, match="idx must be a torch.Tensor, got list"):
        pointops.knn_gather(p2, [0])


@requires_cuda
def test_error_different_devices():
    p1, p2 = clouds(2, 5, 4, 3, torch.float32, "cpu")
    for fn in (pointops.knn_points, pointops.ball_query):
        with pytest.raises(RuntimeError, match=r"p2 must be on the same device as p1 \(cuda:0\), got cpu"):
            fn(p1.cuda(), p2)
        with pytest.raises(RuntimeError, match="lengths1 must be on the same device as p1"):
            fn(p1.cuda(), p2.cuda(), torch.tensor([1, 2]))
        with pytest.raises(RuntimeError, match="lengths2 must be on the same device as p2"):
            fn(p1.cuda(), p2.cuda(), None, torch.tensor([1, 2]))


# ---------------------------------------------------------------- torch.library / torch.compile
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(device, dtype):
    p1, p2 = clouds(2, 9, 7, 3, dtype, device, seed=3)
    lengths = (torch.tensor([9, 4], device=device), torch.tensor([7, 3], device=device))
    for requires_grad in (False, True):
        a, b = p1.clone().requires_grad_(requires_grad), p2.clone().requires_grad_(requires_grad)
        opcheck = torch.library.opcheck
        opcheck(torch.ops.pointops.knn_points.default, (a, b, None, None, 1, 2))  # the NN search
        opcheck(torch.ops.pointops.knn_points.default, (a, b, *lengths, 9, 1))    # K beyond lengths2
        opcheck(torch.ops.pointops.ball_query.default, (a, b, None, None, 4, 1.2))
        opcheck(torch.ops.pointops.ball_query.default, (a, b, *lengths, 9, 1.2))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    p1, p2 = clouds(2, 40, 30, 3, torch.float32, device, seed=4)
    lengths2 = torch.tensor([30, 12], device=device)

    def fn(a, b):
        knn = pointops.knn_points(a, b, None, lengths2, K=5, return_nn=True)
        ball = pointops.ball_query(a, b, None, lengths2, K=6, radius=0.8)
        return knn.dists.sum() + knn.knn.sum() + ball.dists.sum() + ball.knn.sum(), knn.idx, ball.idx

    compiled = torch.compile(fn, fullgraph=True)
    results = []
    for f in (fn, compiled):
        a, b = p1.clone().requires_grad_(), p2.clone().requires_grad_()
        loss, *indices = f(a, b)
        loss.backward()
        results.append((loss.detach(), *indices, a.grad, b.grad))
    for eager, comp in zip(*results):
        if eager.dtype == torch.int64:
            assert torch.equal(comp, eager)
        else:
            torch.testing.assert_close(comp, eager, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- CUDA
def with_non_finite(p1, p2):
    """A few NaN / inf coordinates in both clouds (never matched), on a copy."""
    p1, p2 = p1.clone(), p2.clone()
    p1[0, 3, 1] = float("nan")
    p1[0, 4, 0] = float("inf")
    p2[0, 5] = float("nan")
    p2[0, 6, min(2, p2.shape[2] - 1)] = float("-inf")
    p2[0, 300:310, 0] = float("inf")
    return p1, p2


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [2, 3, 7])
def test_cuda_knn_points_matches_cpu_bitwise(dtype, dim):
    # Several tiles and query blocks; few queries against a large cloud (the reference cloud split
    # across blocks, then the merge kernel); ragged lengths with splits. K: registers (2..64, list
    # lengths 8, 16, 64) and the sort path (100). Same operations in the same order on both devices.
    cases = [
        (4, 600, 1500, [600, 1, 599, 0], [1500, 257, 1, 1023]),
        (1, 300, 20000, None, None),
        (2, 200, 9000, [200, 37], [9000, 4097]),
    ]
    for seed, (B, N, M, l1, l2) in enumerate(cases):
        p1, p2 = with_non_finite(*clouds(B, N, M, dim, dtype, "cpu", seed=60 + seed))
        l1, l2 = (torch.tensor(v) if v is not None else None for v in (l1, l2))
        gpu_args = [t.cuda() if t is not None else None for t in (p1, p2, l1, l2)]
        for norm in (1, 2):
            for K in (1, 2, 16, 40, 64, 100):
                cpu = torch.ops.pointops.knn_points(p1, p2, l1, l2, K, norm)
                gpu = torch.ops.pointops.knn_points(*gpu_args, K, norm)
                assert torch.equal(gpu[1].cpu(), cpu[1]), (B, N, M, norm, K)
                assert torch.equal(gpu[0].cpu(), cpu[0]), (B, N, M, norm, K)


def spatial_cases(dim, dtype, seed):
    """Clouds for the spatial order (D = 2, 3): uniform with ragged lengths (one cloud empty, one of
    a single point) and non-finite points; far from the origin (LiDAR coordinates); clustered, with
    exact ties (integer lattice, every point of p2 present several times); degenerate (every point
    equal; every point on a line)."""
    g = torch.Generator().manual_seed(seed)
    p1, p2 = with_non_finite(*clouds(4, 700, 2600, dim, dtype, "cpu", seed=seed))
    yield p1, p2, torch.tensor([700, 1, 0, 650]), torch.tensor([2600, 2049, 1, 0])
    far = torch.tensor([3.0e4, -1.2e4, 75.0][:dim])
    p1, p2 = clouds(2, 900, 3000, dim, torch.float64, "cpu", seed=seed + 1, scale=40.0)
    yield (p1 + far).to(dtype), (p2 + far).to(dtype), None, None
    p1, p2 = lattice_clouds(2, 800, 1600, dim, dtype, "cpu", seed=seed + 2, low=-3, high=3)
    p2 = torch.cat([p2, p2.flip(1)], 1)[:, torch.randperm(2 * p2.shape[1], generator=g)]
    yield p1, p2, None, None
    same = torch.full((1, 2500, dim), 0.5, dtype=dtype)
    yield same[:, :600], same, None, None
    line = torch.linspace(-1, 1, 2500, dtype=torch.float64)[:, None] * torch.ones(dim, dtype=torch.float64)
    yield line[None, torch.randperm(2500, generator=g)[:700]].to(dtype), line[None].to(dtype), None, None


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [2, 3])
def test_cuda_knn_spatial_order_matches_cpu_bitwise(dtype, dim, monkeypatch):
    # The spatial order (forced: the launcher chooses it for M >= 2048 only) visits points in another
    # order and skips boxes of points: the answers must not change. It exists for float32 compute
    # (float16 computes in float32) and K > 16: the other K and float64 run in index order here.
    for order in ("1", "0"):
        monkeypatch.setenv("POINTOPS_SPATIAL_ORDER", order)
        for p1, p2, l1, l2 in spatial_cases(dim, dtype, seed=90 + dim):
            gpu_args = [t.cuda() if t is not None else None for t in (p1, p2, l1, l2)]
            for norm in (1, 2):
                for K in (2, 9, 16, 33, 64):
                    cpu = torch.ops.pointops.knn_points(p1, p2, l1, l2, K, norm)
                    gpu = torch.ops.pointops.knn_points(*gpu_args, K, norm)
                    assert torch.equal(gpu[1].cpu(), cpu[1]), (order, p2.shape, norm, K)
                    assert torch.equal(gpu[0].cpu(), cpu[0]), (order, p2.shape, norm, K)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("dim", [2, 3])
def test_cuda_ball_query_on_spatial_cases_matches_cpu_bitwise(dtype, dim):
    # The spatial order's hard cases (far from the origin, lattice ties, all points equal, a line)
    # for ball_query, which scans in index order on CUDA. Radii per case: a few to a few hundred
    # points inside.
    radii = [0.35, 14.0, 1.5, 0.1, 0.05]
    for (p1, p2, l1, l2), radius in zip(spatial_cases(dim, dtype, seed=110 + dim), radii):
        gpu_args = [t.cuda() if t is not None else None for t in (p1, p2, l1, l2)]
        for K in (1, 8, 17, 40, 64, 65):
            cpu = torch.ops.pointops.ball_query(p1, p2, l1, l2, K, radius)
            gpu = torch.ops.pointops.ball_query(*gpu_args, K, radius)
            assert torch.equal(gpu[1].cpu(), cpu[1]), (p2.shape, radius, K)
            assert torch.equal(gpu[0].cpu(), cpu[0]), (p2.shape, radius, K)


@requires_cuda
def test_cuda_knn_spatial_order_at_benchmark_scale():
    # The automatic choice at a training size (spatial order for K > 16), against the index order
    # and, on sampled queries, against the float64 oracle.
    g = torch.Generator(device="cuda").manual_seed(5)
    p1, p2 = torch.rand(3, 8192, 3, generator=g, device="cuda"), torch.rand(3, 8192, 3, generator=g, device="cuda")
    for K in (16, 33, 64):
        auto = torch.ops.pointops.knn_points(p1, p2, None, None, K, 2)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("POINTOPS_SPATIAL_ORDER", "0")
            index_order = torch.ops.pointops.knn_points(p1, p2, None, None, K, 2)
        assert torch.equal(auto[1], index_order[1]) and torch.equal(auto[0], index_order[0])
        rows = torch.arange(0, 8192, 97)
        cand = candidates(p1[:, rows], p2)
        check_knn(auto[0][:, rows], auto[1][:, rows], cand, K, torch.float32, 3)


@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [2, 3, 7])
def test_cuda_ball_query_matches_cpu_bitwise(dtype, dim):
    cases = [
        (3, 500, 2000, [500, 1, 0], [2000, 300, 1999]),
        (1, 64, 30000, None, None),     # splits and the merge
        (2, 100, 12000, [100, 50], [12000, 5000]),
    ]
    radius = 0.35 * math.sqrt(2 * dim)
    for seed, (B, N, M, l1, l2) in enumerate(cases):
        p1, p2 = with_non_finite(*clouds(B, N, M, dim, dtype, "cpu", seed=70 + seed))
        l1, l2 = (torch.tensor(v) if v is not None else None for v in (l1, l2))
        gpu_args = [t.cuda() if t is not None else None for t in (p1, p2, l1, l2)]
        for K in (1, 8, 64, 200):
            cpu = torch.ops.pointops.ball_query(p1, p2, l1, l2, K, radius)
            gpu = torch.ops.pointops.ball_query(*gpu_args, K, radius)
            assert torch.equal(gpu[1].cpu(), cpu[1]), (B, N, M, K)
            assert torch.equal(gpu[0].cpu(), cpu[0]), (B, N, M, K)


@requires_cuda
def test_cuda_large_k_and_wide_points_match_the_oracle():
    # K = 130 (the sort path) and D = 40 (the any-D tile) at a size with several tiles and splits.
    p1, p2 = clouds(1, 64, 5000, 40, torch.float32, "cuda", seed=80)
    cand = candidates(p1, p2)
    for K in (16, 64, 130):
        dists, idx, _ = pointops.knn_points(p1, p2, K=K)
        check_knn(dists, idx, cand, K, torch.float32, 40)
    dists, idx, _ = pointops.ball_query(p1, p2, K=64, radius=7.0)
    check_ball(dists, idx, cand, 64, 7.0, torch.float32, 40)


@requires_cuda
@pytest.mark.parametrize("spatial", ["0", "1"])
def test_cuda_graph_capture_and_replay(spatial, monkeypatch):
    # No lengths (checking them costs a host copy): nothing else in these ops syncs with the host,
    # the spatial order's sorts included.
    monkeypatch.setenv("POINTOPS_SPATIAL_ORDER", spatial)
    g = torch.Generator().manual_seed(21)
    p1 = torch.randn(2, 500, 3, generator=g).cuda().requires_grad_()
    p2 = torch.randn(2, 700, 3, generator=g).cuda().requires_grad_()
    w = torch.rand(2, 500, 16, generator=g).cuda()

    def step():
        knn = pointops.knn_points(p1, p2, K=16)
        mid = pointops.knn_points(p1, p2, K=40)  # spatial order where forced
        far = pointops.knn_points(p1, p2, K=80)  # the sort path
        ball = pointops.ball_query(p1, p2, K=16, radius=0.4, return_nn=False)
        loss = (knn.dists * w).sum() + mid.dists.sum() + far.dists.sum() + (ball.dists * w).sum()
        grad1, grad2 = torch.autograd.grad(loss, (p1, p2))
        return knn.dists, knn.idx, mid.dists, mid.idx, far.dists, far.idx, ball.dists, ball.idx, grad1, grad2

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside the capture
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    first_idx = captured[1].clone()
    for seed in (1, 2):  # new values in the static inputs, then replay
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            p1.copy_(torch.randn(2, 500, 3, generator=g).cuda())
            p2.copy_(torch.randn(2, 700, 3, generator=g).cuda())
        graph.replay()
        torch.cuda.synchronize()
        expected = step()
        for got, want in zip(captured[:9], expected[:9]):  # grad1 is written per query: deterministic
            assert torch.equal(got, want)
        # grad2 is scattered with float atomics (any order): equal to rounding
        torch.testing.assert_close(captured[9], expected[9], rtol=1e-5, atol=1e-5)
    assert not torch.equal(captured[1], first_idx)  # the replay recomputed


@requires_cuda
def test_cuda_graph_capture_with_gathered_neighbours():
    g = torch.Generator().manual_seed(22)
    p1 = torch.randn(2, 300, 3, generator=g).cuda().requires_grad_()
    p2 = torch.randn(2, 400, 3, generator=g).cuda().requires_grad_()

    def step():
        knn = pointops.knn_points(p1, p2, K=8, return_nn=True)
        ball = pointops.ball_query(p1, p2, K=8, radius=0.5)
        loss = knn.knn.square().sum() + knn.dists.sum() + ball.knn.square().sum()
        return (knn.knn, ball.knn, *torch.autograd.grad(loss, (p1, p2)))

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    with torch.no_grad():
        p1.copy_(torch.randn(2, 300, 3, generator=g).cuda())
        p2.copy_(torch.randn(2, 400, 3, generator=g).cuda())
    graph.replay()
    torch.cuda.synchronize()
    expected = step()
    for got, want in zip(captured[:3], expected[:3]):
        assert torch.equal(got, want)
    torch.testing.assert_close(captured[3], expected[3], rtol=1e-5, atol=1e-5)


@requires_cuda
def test_cuda_non_default_stream():
    p1, p2 = clouds(2, 3000, 2000, 3, torch.float32, "cuda", seed=6)
    lengths2 = torch.tensor([2000, 700], device="cuda")
    expected = [pointops.knn_points(p1, p2, None, lengths2, K=K, return_nn=True) for K in (1, 16, 100)]
    expected.append(pointops.ball_query(p1, p2, None, lengths2, K=32, radius=0.3))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = [pointops.knn_points(p1, p2, None, lengths2, K=K, return_nn=True) for K in (1, 16, 100)]
        got.append(pointops.ball_query(p1, p2, None, lengths2, K=32, radius=0.3))
    stream.synchronize()
    for a, b in zip(expected, got):
        for u, v in zip(a, b):
            assert torch.equal(u, v)
