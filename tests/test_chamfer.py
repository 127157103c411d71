"""Nearest neighbour / Chamfer: against a float64 brute-force oracle, CPU vs CUDA, gradients,
ragged and empty inputs, errors, opcheck and torch.compile."""
import math

import pytest
import torch

import pointops
from conftest import DEVICES, HAS_CUDA, DeterministicAlgorithms, requires_cuda

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# Unit roundoff of each dtype. Distances are computed from the exact input values in float32
# (float64 for float64 inputs) and rounded once to the output dtype.
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24, torch.float64: 2.0**-53}


def accumulate_unit(dtype):
    return UNIT[torch.float64] if dtype == torch.float64 else UNIT[torch.float32]


def distance_rtol(dtype, dim):
    # x - y is rounded once relative to the difference, each square and add once more: at most
    # (dim + 2) roundings in the accumulate type, then one rounding to the output dtype.
    return (dim + 2) * accumulate_unit(dtype) + (UNIT[dtype] if dtype in (torch.float16, torch.bfloat16) else 0.0)


def pair_distances(x, y, norm=2):
    """(B, N, M) float64 distances: squared Euclidean (norm=2) or L1 (norm=1)."""
    diff = x.detach().double().cpu()[:, :, None, :] - y.detach().double().cpu()[:, None, :, :]
    return (diff**2 if norm == 2 else diff.abs()).sum(-1)


def reference_nearest(x, y, x_lengths=None, y_lengths=None, norm=2):
    """float64 brute force on the exact input values: (dist, idx, all pair distances).
    torch.min returns the first minimum, i.e. ties go to the smallest index."""
    B, N, M = x.shape[0], x.shape[1], y.shape[1]
    pairs = pair_distances(x, y, norm)
    if y_lengths is not None:
        pairs = pairs.masked_fill(torch.arange(M)[None, None, :] >= y_lengths.cpu()[:, None, None], math.inf)
    if M > 0:
        dist, idx = pairs.min(-1)
    else:
        dist, idx = torch.full((B, N), math.inf, dtype=torch.float64), torch.zeros(B, N, dtype=torch.int64)
    idx = torch.where(torch.isinf(dist), -1, idx)
    if x_lengths is not None:
        padded = torch.arange(N)[None, :] >= x_lengths.cpu()[:, None]
        dist = dist.masked_fill(padded, 0.0)
        idx = idx.masked_fill(padded, -1)
    return dist, idx, pairs


def assert_nearest_correct(dist, idx, x, y, x_lengths=None, y_lengths=None, norm=2):
    """Rounding bound, for either norm: each |x - y| or (x - y)^2 term and each add is one
    rounding in the accumulate type, as distance_rtol counts."""
    ref_dist, ref_idx, pairs = reference_nearest(x, y, x_lengths, y_lengths, norm)
    dim = x.shape[-1]
    rtol = distance_rtol(x.dtype, dim)
    atol = 2.0**-24 if x.dtype == torch.float16 else 0.0  # float16 subnormal spacing
    dist, idx = dist.cpu(), idx.cpu()
    assert idx.dtype == torch.int64 and dist.dtype == x.dtype
    assert ((idx == -1) == (ref_idx == -1)).all(), "matched / unmatched points differ from the oracle"
    torch.testing.assert_close(dist.double(), ref_dist, rtol=rtol, atol=atol)
    # The chosen neighbour is at the true minimum distance up to the rounding of two distances
    # (indices may differ from the oracle only between neighbours that close).
    matched = idx >= 0
    if pairs.shape[2] == 0:  # empty reference clouds: nothing can be matched (checked above)
        return
    chosen = pairs.gather(2, idx.clamp(min=0)[..., None])[..., 0]
    slack = 2 * (dim + 2) * accumulate_unit(x.dtype)
    assert (chosen[matched] <= ref_dist[matched] * (1 + slack) + 1e-300).all()
    assert ((idx >= -1) & (idx < max(y.shape[1], 1))).all()


def random_clouds(B, N, M, D, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, D, generator=g).to(dtype).to(device)
    y = torch.randn(B, M, D, generator=g).to(dtype).to(device)
    return x, y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 2, 3, 5])
def test_nearest_neighbor_matches_oracle(device, dtype, dim):
    x, y = random_clouds(3, 37, 53, dim, dtype, device, seed=dim)
    dist, idx = pointops.nearest_neighbor(x, y)
    assert_nearest_correct(dist, idx, x, y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 2, 3, 5])
def test_l1_nearest_neighbor_matches_oracle(device, dtype, dim):
    x, y = random_clouds(3, 37, 53, dim, dtype, device, seed=dim + 40)
    dist, idx = pointops.nearest_neighbor(x, y, norm=1)
    assert_nearest_correct(dist, idx, x, y, norm=1)
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y, norm=1)
    assert torch.equal(dist1, dist) and torch.equal(idx1, idx)
    assert_nearest_correct(dist2, idx2, y, x, norm=1)


@pytest.mark.parametrize("device", DEVICES)
def test_l1_and_l2_pick_different_neighbours(device):
    # From the origin, (2, 0) has L2^2 4 and L1 2; (1.2, 1.2) has L2^2 2.88 and L1 2.4.
    x = torch.zeros(1, 1, 2, device=device)
    y = torch.tensor([[[2.0, 0.0], [1.2, 1.2]]], device=device)
    assert pointops.nearest_neighbor(x, y)[1].item() == 1
    assert pointops.nearest_neighbor(x, y, norm=1)[1].item() == 0
    assert pointops.nearest_neighbor(x, y, norm=1)[0].item() == 2.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("dim", [2, 3, 7])
def test_many_tiles_and_splits(device, dim, norm):
    # Several shared-memory tiles, reference splits and query chunks on CUDA; a partial last tile.
    x, y = random_clouds(2, 2500, 1700, dim, torch.float32, device, seed=11)
    dist, idx = pointops.nearest_neighbor(x, y, norm=norm)
    assert_nearest_correct(dist, idx, x, y, norm=norm)
    dist2, idx2 = pointops.nearest_neighbor(y, x, norm=norm)
    assert_nearest_correct(dist2, idx2, y, x, norm=norm)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_chamfer_is_both_directions(device, dtype):
    x, y = random_clouds(2, 40, 65, 3, dtype, device, seed=3)
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y)
    assert_nearest_correct(dist1, idx1, x, y)
    assert_nearest_correct(dist2, idx2, y, x)


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_lengths_never_match_padding(device):
    x, y = random_clouds(3, 30, 40, 3, torch.float32, device, seed=5)
    x_lengths = torch.tensor([30, 12, 0], device=device)
    y_lengths = torch.tensor([7, 40, 25], device=device)
    # Padding of y placed exactly on the queries: it would win every query if it were searched.
    y[0, 7:10] = x[0, :3]
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y, x_lengths, y_lengths)
    assert_nearest_correct(dist1, idx1, x, y, x_lengths, y_lengths)
    assert_nearest_correct(dist2, idx2, y, x, y_lengths, x_lengths)
    assert (idx1[0] < 7).all()
    assert (idx1[1, 12:] == -1).all() and (dist1[1, 12:] == 0).all()
    assert (idx2[2, :25] == -1).all() and torch.isinf(dist2[2, :25]).all()  # x cloud 2 is empty


@pytest.mark.parametrize("device", DEVICES)
def test_lengths_accept_int32(device):
    x, y = random_clouds(2, 10, 12, 3, torch.float32, device)
    a = pointops.nearest_neighbor(x, y, torch.tensor([5, 10], dtype=torch.int32, device=device))
    b = pointops.nearest_neighbor(x, y, torch.tensor([5, 10], device=device))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("device", DEVICES)
def test_lidar_scale_accuracy(device):
    # Coordinates ~50 m, neighbours ~1 cm away: the expanded |x|^2+|y|^2-2x.y form loses every
    # digit in float32 here; the exact form keeps float32 rounding.
    g = torch.Generator().manual_seed(7)
    base = torch.tensor([50.0, -40.0, 1.5]) + 5 * torch.rand(1, 4000, 3, generator=g)
    x = base.clone()
    y = base[:, torch.randperm(4000, generator=g)] + 0.01 * torch.randn(1, 4000, 3, generator=g)
    x, y = x.float().to(device), y.float().to(device)
    dist, idx = pointops.nearest_neighbor(x, y)
    assert_nearest_correct(dist, idx, x, y)
    # The test can fail: the expanded form, evaluated in float32, is far outside the tolerance.
    xf, yf = x.cpu(), y.cpu()
    expanded = ((xf**2).sum(-1)[:, :, None] + (yf**2).sum(-1)[:, None, :] - 2 * xf @ yf.transpose(1, 2)).min(-1).values
    ref = reference_nearest(x, y)[0]
    assert ((expanded.double() - ref).abs() / ref).max() > 100 * distance_rtol(torch.float32, 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_l1_ties_go_to_smallest_index(device, dtype):
    # Integer lattice: L1 distances are exact small integers, so ties are real ties.
    g = torch.Generator().manual_seed(12)
    x = torch.randint(-3, 4, (2, 300, 3), generator=g).to(dtype).to(device)
    y = torch.randint(-3, 4, (2, 700, 3), generator=g).to(dtype).to(device)
    dist, idx = pointops.nearest_neighbor(x, y, norm=1)
    ref_dist, ref_idx, _ = reference_nearest(x, y, norm=1)
    assert torch.equal(idx.cpu(), ref_idx) and torch.equal(dist.cpu().double(), ref_dist)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_go_to_smallest_index(device, dtype):
    # Small integers: every distance is exact in every dtype, so ties are real ties.
    x = torch.tensor([[[0.0, 0.0, 0.0], [2.0, 2.0, 0.0]]], dtype=dtype, device=device)
    y = torch.tensor([[[3.0, 2.0, 0.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [2.0, 3.0, 0.0]]],
                     dtype=dtype, device=device)
    dist, idx = pointops.nearest_neighbor(x, y)
    assert idx.tolist() == [[1, 0]]
    assert dist.tolist() == [[1.0, 1.0]]
    # Duplicated cloud, long enough to span tiles and splits: always the first copy.
    x, _ = random_clouds(1, 700, 1, 3, dtype, device, seed=9)
    y = torch.cat([x, x, x], dim=1)
    dist, idx = pointops.nearest_neighbor(x, y)
    assert torch.equal(idx.cpu(), torch.arange(700)[None]) and (dist == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_inputs(device):
    x, y = random_clouds(1, 600, 900, 3, torch.float32, device, seed=4)
    x[0, 5, 1] = float("nan")
    x[0, 6, 0] = float("inf")
    y[0, 0] = float("nan")        # never matched
    y[0, 1, 2] = float("inf")     # infinitely far: never matched
    y[0, 2] = x[0, 7]             # exact match for query 7
    dist, idx = pointops.nearest_neighbor(x, y)
    assert idx[0, 5] == -1 and torch.isnan(dist[0, 5])
    assert idx[0, 6] == -1 and torch.isnan(dist[0, 6])
    assert idx[0, 7] == 2 and dist[0, 7] == 0
    assert ((idx[0] != 0) & (idx[0] != 1)).all()
    ok = torch.ones(600, dtype=torch.bool)
    ok[5:7] = False
    y_finite = y.clone()
    y_finite[0, :2] = 1e30  # what "never matched" means: as if those points were unreachable
    assert_nearest_correct(dist[:, ok], idx[:, ok], x[:, ok], y_finite)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    x, y = random_clouds(2, 5, 4, 3, torch.float32, device)
    empty_x = x[:, :0]
    dist, idx = pointops.nearest_neighbor(empty_x, y)
    assert dist.shape == (2, 0) and idx.shape == (2, 0)
    dist, idx = pointops.nearest_neighbor(x, y[:, :0])
    assert torch.isinf(dist).all() and (idx == -1).all()
    dist1, dist2, idx1, idx2 = pointops.chamfer(x[:0], y[:0])
    assert dist1.shape == (0, 5) and dist2.shape == (0, 4)
    dist1, dist2, idx1, idx2 = pointops.chamfer(empty_x, y)
    assert dist1.shape == (2, 0) and torch.isinf(dist2).all() and (idx2 == -1).all()
    for norm in (1, 2):
        dist, idx = pointops.nearest_neighbor(x, y[:, :0], norm=norm)
        assert torch.isinf(dist).all() and (idx == -1).all()
    x.requires_grad_()
    dist1, dist2, _, _ = pointops.chamfer(x[:, :0], y)
    (dist1.sum() + dist2[torch.isfinite(dist2)].sum()).backward()
    assert (x.grad == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_single_point_clouds(device):
    x = torch.tensor([[[1.0, 2.0, 3.0]]], device=device)
    y = torch.tensor([[[1.0, 2.0, 5.0]]], device=device)
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y)
    assert dist1.item() == 4 and dist2.item() == 4 and idx1.item() == 0 and idx2.item() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    x, y = random_clouds(3, 20, 30, 3, torch.float32, device)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, permuted strides
    ys = torch.stack([y, -y], dim=-1)[..., 0]           # strided last dim, same values as y
    assert not xt.is_contiguous() and not ys.is_contiguous()
    a = pointops.chamfer(xt, ys)
    b = pointops.chamfer(x, y.contiguous())
    for u, v in zip(a, b):
        assert torch.equal(u, v)


# ---------------------------------------------------------------- gradients
def reference_chamfer_grads(x, y, idx1, idx2, g1, g2, norm=2):
    """Gradients of sum(g1 * d(x, y[idx1])) + sum(g2 * d(y, x[idx2])) by torch autograd, d the
    squared L2 or the L1 distance (torch's abs has derivative sign, 0 at 0, as pointops')."""
    xr = x.detach().double().cpu().requires_grad_()
    yr = y.detach().double().cpu().requires_grad_()
    i1, i2 = idx1.cpu(), idx2.cpu()
    def term(a, b, idx, g):
        gathered = b.gather(1, idx.clamp(min=0)[..., None].expand(-1, -1, a.shape[-1]))
        d = ((a - gathered) ** 2 if norm == 2 else (a - gathered).abs()).sum(-1)
        return (g.double().cpu() * torch.where(idx >= 0, d, torch.zeros_like(d))).sum()
    (term(xr, yr, i1, g1) + term(yr, xr, i2, g2)).backward()
    return xr.grad, yr.grad


def gradient_error_bound(x, y, idx1, idx2, g1, g2, norm=2):
    """Per-element bound on |computed - exact| gradient: every contribution 2 g (a - b) (L1:
    g sign(a - b)) is computed in the accumulate type; each reference point sums up to k of them there ((k + 3)
    roundings, relative to the sum of their magnitudes); each direction is rounded once to the
    output dtype and the two directions are added in it (3 roundings of the output dtype, each off by
    at most half the dtype's subnormal spacing in absolute terms where the result is subnormal:
    float16 gradients of a few 1e-6 are)."""
    xd, yd = x.detach().double().cpu(), y.detach().double().cpu()
    def magnitudes(a, b, idx, g):
        gathered = b.gather(1, idx.clamp(min=0)[..., None].expand(-1, -1, a.shape[-1]))
        slope = 2 * (a - gathered).abs() if norm == 2 else torch.ones_like(a)
        m = g.detach().double().cpu()[..., None].abs() * slope * (idx >= 0)[..., None]
        scattered = torch.zeros_like(b).scatter_add_(1, idx.clamp(min=0)[..., None].expand_as(m), m)
        k = max(int(torch.bincount(row[row >= 0], minlength=1).max()) for row in idx) if idx.numel() else 0
        return m, scattered, k
    mx1, my1, k1 = magnitudes(xd, yd, idx1.cpu(), g1)
    my2, mx2, k2 = magnitudes(yd, xd, idx2.cpu(), g2)
    acc, out = accumulate_unit(x.dtype), UNIT[x.dtype]
    rel = (max(k1, k2) + 3) * acc + 3 * out
    tiny = 3 * 0.5 * torch.finfo(x.dtype).smallest_normal * 2 * UNIT[x.dtype]  # 3 x half the subnormal spacing
    return rel * (mx1 + mx2) + tiny, rel * (my1 + my2) + tiny


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [1, 2])
def test_backward_matches_autograd_of_gather(device, dtype, norm):
    x, y = random_clouds(2, 300, 200, 3, dtype, device, seed=21)
    x.requires_grad_()
    y.requires_grad_()
    x_lengths = torch.tensor([300, 150], device=device)
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y, x_lengths, norm=norm)
    g1 = torch.rand_like(dist1)
    g2 = torch.rand_like(dist2)
    ((dist1 * g1).sum() + (dist2 * g2).sum()).backward()
    ref_x, ref_y = reference_chamfer_grads(x, y, idx1, idx2, g1, g2, norm)
    bound_x, bound_y = gradient_error_bound(x, y, idx1, idx2, g1, g2, norm)
    assert ((x.grad.double().cpu() - ref_x).abs() <= bound_x).all()
    assert ((y.grad.double().cpu() - ref_y).abs() <= bound_y).all()
    assert (x.grad[1, 150:] == 0).all()  # padding gets no gradient


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck(device):
    x, y = random_clouds(2, 9, 7, 3, torch.float64, device, seed=8)
    x.requires_grad_()
    y.requires_grad_()
    x_lengths = torch.tensor([9, 4], device=device)
    y_lengths = torch.tensor([5, 7], device=device)
    for norm in (1, 2):  # random points: no coordinate difference within gradcheck's eps of 0
        assert torch.autograd.gradcheck(
            lambda a, b: pointops.nearest_neighbor(a, b, x_lengths, y_lengths, norm=norm)[0], (x, y))
        assert torch.autograd.gradcheck(
            lambda a, b: pointops.chamfer(a, b, x_lengths, y_lengths, norm=norm)[:2], (x, y))
    assert torch.autograd.gradcheck(lambda a, b: pointops.ChamferFunction.apply(a, b)[:2], (x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_is_deterministic_under_deterministic_mode(device):
    # Many queries share each reference point, so an atomics-based scatter would reorder sums.
    x, y = random_clouds(1, 20000, 50, 3, torch.float32, device, seed=2)
    x.requires_grad_()
    y.requires_grad_()
    grads = []
    with DeterministicAlgorithms():
        for _ in range(2):
            x.grad = y.grad = None
            pointops.chamfer_distance(x, y)[0].backward()
            grads.append((x.grad.clone(), y.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    x.grad = y.grad = None
    pointops.chamfer_distance(x, y)[0].backward()  # the default (atomics on CUDA) path agrees to rounding
    torch.testing.assert_close(y.grad, grads[0][1], rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------- fscore
def test_fscore():
    dist1 = torch.tensor([[0.0, 0.5, 2.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
    dist2 = torch.tensor([[0.1, 5.0, 0.0], [0.0, 0.0, 0.0]])
    f, p, r = pointops.fscore(dist1, dist2, threshold=1.0)
    assert p.tolist() == [0.75, 0.0] and torch.allclose(r, torch.tensor([2 / 3, 1.0]))
    assert torch.allclose(f, torch.tensor([2 * 0.75 * (2 / 3) / (0.75 + 2 / 3), 0.0]))
    f, p, r = pointops.fscore(dist1, dist2, 1.0, x_lengths=torch.tensor([2, 0]), y_lengths=torch.tensor([1, 0]))
    assert p.tolist() == [1.0, 0.0] and r.tolist() == [1.0, 0.0] and f.tolist() == [1.0, 0.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("N, M", [(1000, 777), (0, 5), (6, 0), (1, 1)])
def test_fscore_without_lengths_equals_full_lengths(device, N, M):
    # Without lengths fscore skips the padding mask; full lengths take the masked path. Same counts,
    # same float32 divisions: equal bit for bit (NaN distances, 0/0 and empty clouds included).
    g = torch.Generator().manual_seed(N + M)
    dist1 = (torch.rand(3, N, generator=g) * 2e-3).to(device)
    dist2 = (torch.rand(3, M, generator=g) * 2e-3).to(device)
    if N:
        dist1[0, 0] = float("nan")
        dist1[2] = 1.0  # cloud 2: no x point matched
    if M:
        dist2[2] = 1.0  # ... and no y point: p + r = 0
    full = (torch.full((3,), N, device=device), torch.full((3,), M, device=device))
    for threshold in (1e-3, 0.0, 5e-4):
        got = pointops.fscore(dist1, dist2, threshold)
        want = pointops.fscore(dist1, dist2, threshold, *full)
        for a, b in zip(got, want):
            assert a.dtype == torch.float32 and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_chamfer_function_matches_chamfer(device):
    x, y = random_clouds(2, 30, 20, 3, torch.float32, device, seed=17)
    xa, ya = x.clone().requires_grad_(), y.clone().requires_grad_()
    xb, yb = x.clone().requires_grad_(), y.clone().requires_grad_()
    out_a = pointops.ChamferFunction.apply(xa, ya)
    out_b = pointops.chamfer(xb, yb)
    for u, v in zip(out_a, out_b):
        assert torch.equal(u, v)
    (out_a[0].sum() + 2 * out_a[1].sum()).backward()
    (out_b[0].sum() + 2 * out_b[1].sum()).backward()
    assert torch.allclose(xa.grad, xb.grad) and torch.allclose(ya.grad, yb.grad)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("device", DEVICES)
def test_error_messages(device):
    x, y = random_clouds(2, 5, 4, 3, torch.float32, device)
    nn = pointops.nearest_neighbor
    with pytest.raises(RuntimeError, match=r"x must be a 3-D tensor \(B, N, D\), got shape \[5, 3\]"):
        nn(x[0], y)
    with pytest.raises(RuntimeError, match=r"y must be a 3-D tensor \(B, M, D\)"):
        nn(x, y[0])
    with pytest.raises(RuntimeError, match="same batch size B"):
        nn(x, y[:1])
    with pytest.raises(RuntimeError, match="same point dimension D"):
        nn(x, y[..., :2])
    with pytest.raises(RuntimeError, match="D must be at least 1"):
        nn(x[..., :0], y[..., :0])
    with pytest.raises(RuntimeError, match="y must have the same dtype as x"):
        nn(x, y.double())
    with pytest.raises(RuntimeError, match="x must be float16, bfloat16, float32 or float64, got Long"):
        nn(x.long(), y.long())
    with pytest.raises(RuntimeError, match=r"x_lengths must have shape \(B,\) = \(2,\)"):
        nn(x, y, torch.tensor([1, 2, 3], device=device))
    with pytest.raises(RuntimeError, match="y_lengths must be an int64"):
        nn(x, y, None, torch.tensor([1.0, 2.0], device=device))
    with pytest.raises(RuntimeError, match=r"x_lengths must lie in \[0, 5\].*got values in \[-1, 2\]"):
        nn(x, y, torch.tensor([-1, 2], device=device))
    with pytest.raises(RuntimeError, match=r"y_lengths must lie in \[0, 4\].*got values in \[2, 5\]"):
        pointops.chamfer(x, y, None, torch.tensor([2, 5], device=device))
    with pytest.raises(RuntimeError, match=r"grad_dist must have shape \(B, N\)"):
        torch.ops.pointops._nearest_neighbor_backward(torch.zeros(2, 4, device=device), x, y,
                                                      torch.zeros(2, 5, dtype=torch.long, device=device))
    for bad in (0, 3, -2):
        with pytest.raises(RuntimeError, match=rf"norm must be 1 \(L1 distance\) or 2 \(squared Euclidean distance\), got {bad}"):
            nn(x, y, norm=bad)
        with pytest.raises(RuntimeError, match="norm must be 1"):
            torch.ops.pointops._nearest_neighbor_backward(torch.zeros(2, 5, device=device), x, y,
                                                          torch.zeros(2, 5, dtype=torch.long, device=device), bad)
    with pytest.raises(RuntimeError, match="idx must be int64"):
        torch.ops.pointops._nearest_neighbor_backward(torch.zeros(2, 5, device=device), x, y,
                                                      torch.zeros(2, 5, dtype=torch.int32, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_op_never_reads_past_y_for_a_hand_made_index(device):
    x, y = random_clouds(2, 5, 4, 3, torch.float32, device)
    bad = torch.full((2, 5), 7, dtype=torch.long, device=device)
    bad[0, 0] = 2**40
    backward = torch.ops.pointops._nearest_neighbor_backward
    if device == "cpu":
        with pytest.raises(RuntimeError, match=r"idx must hold indices in \[-1, 4\) \(into y\), got values in \[7, "):
            backward(torch.ones(2, 5, device=device), x, y, bad)
    else:  # CUDA cannot check without a sync: such an index counts as unmatched, in the derivatives too
        g = torch.ones(2, 5, device=device, requires_grad=True)
        grad_x, grad_y = backward(g, x.requires_grad_(), y.requires_grad_(), bad)
        assert (grad_x == 0).all() and (grad_y == 0).all()
        d_g, d_x, d_y = torch.autograd.grad((grad_x.sum() + grad_y.sum()), (g, x, y), allow_unused=True)
        assert (d_g == 0).all() and (d_x is None or (d_x == 0).all()) and (d_y is None or (d_y == 0).all())


@requires_cuda
def test_error_different_devices():
    x, y = random_clouds(2, 5, 4, 3, torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="same device"):
        pointops.nearest_neighbor(x.cuda(), y)
    with pytest.raises(RuntimeError, match="x_lengths must be on the same device as x"):
        pointops.nearest_neighbor(x.cuda(), y.cuda(), torch.tensor([1, 2]))


# ---------------------------------------------------------------- CUDA specifics
@requires_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [2, 3, 4])
@pytest.mark.parametrize("norm", [1, 2])
def test_cuda_matches_cpu(dtype, dim, norm):
    x, y = random_clouds(4, 3000, 2000, dim, dtype, "cpu", seed=31)
    lengths_x = torch.tensor([3000, 1, 2999, 1024])
    lengths_y = torch.tensor([2000, 257, 1, 0])
    cpu = pointops.chamfer(x, y, lengths_x, lengths_y, norm=norm)
    gpu = pointops.chamfer(x.cuda(), y.cuda(), lengths_x.cuda(), lengths_y.cuda(), norm=norm)
    # Same inputs, same operation order; the device fuses multiply-adds, so distances may differ
    # in the last bit (one rounding per coordinate), and indices only between such near-ties.
    rtol = distance_rtol(dtype, dim)
    for c, g in zip(cpu[:2], gpu[:2]):
        torch.testing.assert_close(g.cpu(), c, rtol=rtol, atol=0, equal_nan=True)
    assert_nearest_correct(gpu[0], gpu[2], x, y, lengths_x, lengths_y, norm=norm)
    assert_nearest_correct(gpu[1], gpu[3], y, x, lengths_y, lengths_x, norm=norm)
    assert (gpu[2].cpu() == cpu[2]).float().mean() > 0.999


@requires_cuda
def test_cuda_repeated_runs_bitwise_identical():
    x, y = random_clouds(8, 4096, 4096, 3, torch.float32, "cuda", seed=1)
    first = pointops.chamfer(x, y)
    for _ in range(3):
        for a, b in zip(first, pointops.chamfer(x, y)):
            assert torch.equal(a, b)


@requires_cuda
def test_cuda_non_default_stream():
    x, y = random_clouds(2, 3000, 2000, 3, torch.float32, "cuda", seed=6)
    expected = pointops.chamfer(x, y)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = pointops.chamfer(x, y)
    stream.synchronize()
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_second_device():
    x, y = random_clouds(2, 500, 300, 3, torch.float32, "cuda:1", seed=6)
    dist, idx = pointops.nearest_neighbor(x, y)
    assert dist.device == x.device
    assert_nearest_correct(dist, idx, x, y)


# ---------------------------------------------------------------- torch.library / torch.compile
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, y = random_clouds(2, 17, 13, 3, torch.float32, device, seed=3)
    lengths = (torch.tensor([17, 5], device=device), torch.tensor([13, 13], device=device))
    for requires_grad in (False, True):
        a, b = x.clone().requires_grad_(requires_grad), y.clone().requires_grad_(requires_grad)
        torch.library.opcheck(torch.ops.pointops.nearest_neighbor.default, (a, b, None, None))
        torch.library.opcheck(torch.ops.pointops.nearest_neighbor.default, (a, b, *lengths))
        torch.library.opcheck(torch.ops.pointops.chamfer.default, (a, b, *lengths))
        torch.library.opcheck(torch.ops.pointops.nearest_neighbor.default, (a, b, *lengths, 1))
        torch.library.opcheck(torch.ops.pointops.chamfer.default, (a, b, *lengths, 1))
    for norm in (1, 2):
        _, idx = pointops.nearest_neighbor(x, y, norm=norm)
        torch.library.opcheck(torch.ops.pointops._nearest_neighbor_backward.default,
                              (torch.rand(2, 17, device=device), x, y, idx, norm))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    x, y = random_clouds(2, 64, 48, 3, torch.float32, device, seed=4)

    def loss_fn(a, b):
        dist1, dist2, _, _ = pointops.chamfer(a, b)
        nn_dist, _ = pointops.nearest_neighbor(a, b)
        l1_dist, _ = pointops.nearest_neighbor(a, b, norm=1)
        return (pointops.chamfer_distance(a, b, squared=False)[0] + dist1.mean() + dist2.max() + nn_dist.sum()
                + l1_dist.mean())

    compiled = torch.compile(loss_fn, fullgraph=True)
    grads = []
    for fn in (loss_fn, compiled):
        a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
        loss = fn(a, b)
        loss.backward()
        grads.append((loss.detach(), a.grad, b.grad))
    for e, c in zip(*grads):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not hasattr(torch._dynamo.config, "trace_autograd_ops"),
                    reason="this torch cannot trace Tensor.backward() inside a compiled function")
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_training_step(device):
    torch._dynamo.reset()
    x, y = random_clouds(2, 64, 48, 3, torch.float32, device, seed=5)

    def step(a, b):
        loss, _ = pointops.chamfer_distance(a, b)
        loss.backward()
        return loss.detach()

    results = []
    for compile_it in (False, True):
        a, b = x.clone().requires_grad_(), y.clone().requires_grad_()
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            fn = torch.compile(step, fullgraph=True) if compile_it else step
            loss = fn(a, b)
        results.append((loss, a.grad, b.grad))
    for e, c in zip(*results):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- real data
def read_obj_vertices(path):
    rows = [line.split()[1:4] for line in path.read_text().splitlines() if line.startswith("v ")]
    return torch.tensor([[float(v) for v in row] for row in rows])


@pytest.mark.parametrize("device", DEVICES)
def test_real_mesh_vertices(device, shared_data):
    bunny = read_obj_vertices(shared_data / "shapes" / "stanford-bunny.obj")
    assert bunny.shape == (35947, 3)
    g = torch.Generator().manual_seed(0)
    x = bunny[torch.randperm(len(bunny), generator=g)[:3000]][None]
    y = (bunny[torch.randperm(len(bunny), generator=g)[:2500]] + 1e-4 * torch.randn(2500, 3, generator=g))[None]
    x, y = x.to(device), y.to(device)
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y)
    assert_nearest_correct(dist1, idx1, x, y)
    assert_nearest_correct(dist2, idx2, y, x)


# ---------------------------------------------------------------- property test
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), N=st.integers(0, 40), M=st.integers(0, 40), dim=st.integers(1, 6),
       seed=st.integers(0, 2**16), ragged=st.booleans(), grid=st.booleans())
def test_property_any_shape_matches_oracle(B, N, M, dim, seed, ragged, grid):
    """Any shape, ragged or not; `grid` puts points on a coarse integer lattice (many exact ties)."""
    g = torch.Generator().manual_seed(seed)
    make = (lambda n: torch.randint(-2, 3, (B, n, dim), generator=g).float()) if grid else (
        lambda n: torch.randn(B, n, dim, generator=g))
    x, y = make(N), make(M)
    xl = torch.randint(0, N + 1, (B,), generator=g) if ragged else None
    yl = torch.randint(0, M + 1, (B,), generator=g) if ragged else None
    for device in ["cpu"] + (["cuda"] if HAS_CUDA else []):
        args = [t.to(device) if t is not None else None for t in (x, y, xl, yl)]
        dist1, dist2, idx1, idx2 = pointops.chamfer(*args)
        assert_nearest_correct(dist1, idx1, x, y, xl, yl)
        assert_nearest_correct(dist2, idx2, y, x, yl, xl)
        if grid:  # integer coordinates: distances exact, so indices are exactly the oracle's
            assert torch.equal(idx1.cpu(), reference_nearest(x, y, xl, yl)[1])
