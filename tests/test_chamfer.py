"""Nearest neighbour / Chamfer: against a float64 brute-force oracle, CPU vs CUDA, gradients,
ragged and empty inputs, errors, opcheck and torch.compile."""
import math

import pytest
import torch

import pointops
from conftest import DEVICES, HAS_CUDA, requires_cuda

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


def reference_nearest(x, y, x_lengths=None, y_lengths=None):
    """float64 brute force on the exact input values: (dist, idx, all pair distances).
    torch.min returns the first minimum, i.e. ties go to the smallest index."""
    xd, yd = x.detach().double().cpu(), y.detach().double().cpu()
    B, N, M = xd.shape[0], xd.shape[1], yd.shape[1]
    pairs = ((xd[:, :, None, :] - yd[:, None, :, :]) ** 2).sum(-1)
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


def assert_nearest_correct(dist, idx, x, y, x_lengths=None, y_lengths=None):
    ref_dist, ref_idx, pairs = reference_nearest(x, y, x_lengths, y_lengths)
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
@pytest.mark.parametrize("dim", [2, 3, 7])
def test_many_tiles_and_splits(device, dim):
    # Several shared-memory tiles, reference splits and query chunks on CUDA; a partial last tile.
    x, y = random_clouds(2, 2500, 1700, dim, torch.float32, device, seed=11)
    dist, idx = pointops.nearest_neighbor(x, y)
    assert_nearest_correct(dist, idx, x, y)
    dist2, idx2 = pointops.nearest_neighbor(y, x)
    assert_nearest_correct(dist2, idx2, y, x)


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
    # Losses: both empty -> 0, never NaN; one side empty -> +inf (distance to an empty set).
    both = pointops.chamfer_distance(empty_x, y[:, :0])
    assert both.item() == 0
    one = pointops.chamfer_distance(empty_x, y)
    assert torch.isinf(one) and not torch.isnan(one)
    lengths = pointops.chamfer_distance(x, y, torch.tensor([0, 0], device=device), torch.tensor([0, 0], device=device))
    assert lengths.item() == 0
    for reduction in ("mean", "sum", "max"):
        value = pointops.chamfer_distance(x, y, torch.tensor([0, 5], device=device),
                                          torch.tensor([0, 4], device=device), point_reduction=reduction,
                                          batch_reduction=None)
        assert value[0].item() == 0 and torch.isfinite(value[1])
    x.requires_grad_()
    loss = pointops.chamfer_distance(x[:, :0], y[:, :0])
    loss.backward()
    assert (x.grad == 0).all()
    assert pointops.chamfer_distance(x[:0], y[:0]).item() == 0


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
def reference_chamfer_grads(x, y, idx1, idx2, g1, g2):
    """Gradients of sum(g1 * |x - y[idx1]|^2) + sum(g2 * |y - x[idx2]|^2) by torch autograd."""
    xr = x.detach().double().cpu().requires_grad_()
    yr = y.detach().double().cpu().requires_grad_()
    i1, i2 = idx1.cpu(), idx2.cpu()
    def term(a, b, idx, g):
        gathered = b.gather(1, idx.clamp(min=0)[..., None].expand(-1, -1, a.shape[-1]))
        d = ((a - gathered) ** 2).sum(-1)
        return (g.double().cpu() * torch.where(idx >= 0, d, torch.zeros_like(d))).sum()
    (term(xr, yr, i1, g1) + term(yr, xr, i2, g2)).backward()
    return xr.grad, yr.grad


def gradient_error_bound(x, y, idx1, idx2, g1, g2):
    """Per-element bound on |computed - exact| gradient: every contribution 2 g (a - b) is
    computed in the accumulate type; each reference point sums up to k of them there ((k + 3)
    roundings, relative to the sum of their magnitudes); each direction is rounded once to the
    output dtype and the two directions are added in it (3 roundings of the output dtype)."""
    xd, yd = x.detach().double().cpu(), y.detach().double().cpu()
    def magnitudes(a, b, idx, g):
        gathered = b.gather(1, idx.clamp(min=0)[..., None].expand(-1, -1, a.shape[-1]))
        m = 2 * g.detach().double().cpu()[..., None].abs() * (a - gathered).abs() * (idx >= 0)[..., None]
        scattered = torch.zeros_like(b).scatter_add_(1, idx.clamp(min=0)[..., None].expand_as(m), m)
        k = max(int(torch.bincount(row[row >= 0], minlength=1).max()) for row in idx) if idx.numel() else 0
        return m, scattered, k
    mx1, my1, k1 = magnitudes(xd, yd, idx1.cpu(), g1)
    my2, mx2, k2 = magnitudes(yd, xd, idx2.cpu(), g2)
    acc, out = accumulate_unit(x.dtype), UNIT[x.dtype]
    rel = (max(k1, k2) + 3) * acc + 3 * out
    return rel * (mx1 + mx2), rel * (my1 + my2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_autograd_of_gather(device, dtype):
    x, y = random_clouds(2, 300, 200, 3, dtype, device, seed=21)
    x.requires_grad_()
    y.requires_grad_()
    x_lengths = torch.tensor([300, 150], device=device)
    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y, x_lengths)
    g1 = torch.rand_like(dist1)
    g2 = torch.rand_like(dist2)
    ((dist1 * g1).sum() + (dist2 * g2).sum()).backward()
    ref_x, ref_y = reference_chamfer_grads(x, y, idx1, idx2, g1, g2)
    bound_x, bound_y = gradient_error_bound(x, y, idx1, idx2, g1, g2)
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
    assert torch.autograd.gradcheck(lambda a, b: pointops.nearest_neighbor(a, b, x_lengths, y_lengths)[0], (x, y))
    assert torch.autograd.gradcheck(lambda a, b: pointops.chamfer(a, b, x_lengths, y_lengths)[:2], (x, y))
    for reduction in ("mean", "sum", "max"):
        for squared in (True, False):
            assert torch.autograd.gradcheck(
                lambda a, b: pointops.chamfer_distance(a, b, x_lengths, y_lengths, point_reduction=reduction,
                                                       batch_reduction=None, squared=squared), (x, y))
    assert torch.autograd.gradcheck(lambda a, b: pointops.ChamferFunction.apply(a, b)[:2], (x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_backward_is_deterministic_under_deterministic_mode(device):
    # Many queries share each reference point, so an atomics-based scatter would reorder sums.
    x, y = random_clouds(1, 20000, 50, 3, torch.float32, device, seed=2)
    x.requires_grad_()
    y.requires_grad_()
    grads = []
    with DeterministicMode():
        for _ in range(2):
            x.grad = y.grad = None
            pointops.chamfer_distance(x, y).backward()
            grads.append((x.grad.clone(), y.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    x.grad = y.grad = None
    pointops.chamfer_distance(x, y).backward()  # the default (atomics on CUDA) path agrees to rounding
    torch.testing.assert_close(y.grad, grads[0][1], rtol=1e-4, atol=1e-7)


class DeterministicMode:
    def __enter__(self):
        self.previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.previous)


# ---------------------------------------------------------------- losses
def reference_loss(x, y, xl, yl, point_reduction, batch_reduction, single, squared):
    d1, _, _ = reference_nearest(x, y, xl, yl)
    d2, _, _ = reference_nearest(y, x, yl, xl)
    if not squared:
        d1, d2 = d1.sqrt(), d2.sqrt()
    def reduce(d, lengths):
        out = []
        for b in range(d.shape[0]):
            v = d[b, : int(lengths[b])]
            if v.numel() == 0:
                out.append(torch.tensor(0.0, dtype=torch.float64))
            else:
                out.append({"mean": v.mean(), "sum": v.sum(), "max": v.max()}[point_reduction])
        return torch.stack(out)
    loss = reduce(d1, xl)
    if not single:
        loss = loss + reduce(d2, yl)
    return {"mean": loss.mean(), "sum": loss.sum(), None: loss}[batch_reduction]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("point_reduction", ["mean", "sum", "max"])
@pytest.mark.parametrize("batch_reduction", ["mean", "sum", None])
@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("squared", [True, False])
def test_chamfer_distance_reductions(device, point_reduction, batch_reduction, single, squared):
    x, y = random_clouds(3, 25, 18, 3, torch.float64, device, seed=13)
    xl = torch.tensor([25, 10, 1], device=device)
    yl = torch.tensor([18, 18, 3], device=device)
    got = pointops.chamfer_distance(x, y, xl, yl, point_reduction=point_reduction,
                                    batch_reduction=batch_reduction, single_directional=single, squared=squared)
    want = reference_loss(x, y, xl.cpu(), yl.cpu(), point_reduction, batch_reduction, single, squared)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=0)
    module = pointops.ChamferLoss(point_reduction, batch_reduction, single, squared)
    torch.testing.assert_close(module(x, y, xl, yl), got, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_chamfer_distance_per_point_and_bad_arguments(device):
    x, y = random_clouds(2, 6, 4, 3, torch.float32, device)
    dx, dy = pointops.chamfer_distance(x, y, point_reduction=None, batch_reduction=None)
    d1, d2, _, _ = pointops.chamfer(x, y)
    assert torch.equal(dx, d1) and torch.equal(dy, d2)
    dx, dy = pointops.chamfer_distance(x, y, point_reduction=None, batch_reduction=None, single_directional=True)
    assert dy is None
    with pytest.raises(ValueError, match="point_reduction must be"):
        pointops.chamfer_distance(x, y, point_reduction="median")
    with pytest.raises(ValueError, match="batch_reduction must be"):
        pointops.chamfer_distance(x, y, batch_reduction="max")
    with pytest.raises(ValueError, match="batch_reduction must be None when point_reduction is None"):
        pointops.chamfer_distance(x, y, point_reduction=None)


def test_fscore():
    dist1 = torch.tensor([[0.0, 0.5, 2.0, 0.0], [3.0, 3.0, 3.0, 3.0]])
    dist2 = torch.tensor([[0.1, 5.0, 0.0], [0.0, 0.0, 0.0]])
    f, p, r = pointops.fscore(dist1, dist2, threshold=1.0)
    assert p.tolist() == [0.75, 0.0] and torch.allclose(r, torch.tensor([2 / 3, 1.0]))
    assert torch.allclose(f, torch.tensor([2 * 0.75 * (2 / 3) / (0.75 + 2 / 3), 0.0]))
    f, p, r = pointops.fscore(dist1, dist2, 1.0, x_lengths=torch.tensor([2, 0]), y_lengths=torch.tensor([1, 0]))
    assert p.tolist() == [1.0, 0.0] and r.tolist() == [1.0, 0.0] and f.tolist() == [1.0, 0.0]


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
    with pytest.raises(RuntimeError, match="idx must be int64"):
        torch.ops.pointops._nearest_neighbor_backward(torch.zeros(2, 5, device=device), x, y,
                                                      torch.zeros(2, 5, dtype=torch.int32, device=device))


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
def test_cuda_matches_cpu(dtype, dim):
    x, y = random_clouds(4, 3000, 2000, dim, dtype, "cpu", seed=31)
    lengths_x = torch.tensor([3000, 1, 2999, 1024])
    lengths_y = torch.tensor([2000, 257, 1, 0])
    cpu = pointops.chamfer(x, y, lengths_x, lengths_y)
    gpu = pointops.chamfer(x.cuda(), y.cuda(), lengths_x.cuda(), lengths_y.cuda())
    # Same inputs, same operation order; the device fuses multiply-adds, so distances may differ
    # in the last bit (one rounding per coordinate), and indices only between such near-ties.
    rtol = distance_rtol(dtype, dim)
    for c, g in zip(cpu[:2], gpu[:2]):
        torch.testing.assert_close(g.cpu(), c, rtol=rtol, atol=0, equal_nan=True)
    assert_nearest_correct(gpu[0], gpu[2], x, y, lengths_x, lengths_y)
    assert_nearest_correct(gpu[1], gpu[3], y, x, lengths_y, lengths_x)
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
    _, idx = pointops.nearest_neighbor(x, y)
    torch.library.opcheck(torch.ops.pointops._nearest_neighbor_backward.default,
                          (torch.rand(2, 17, device=device), x, y, idx))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    x, y = random_clouds(2, 64, 48, 3, torch.float32, device, seed=4)

    def loss_fn(a, b):
        dist1, dist2, _, _ = pointops.chamfer(a, b)
        nn_dist, _ = pointops.nearest_neighbor(a, b)
        return pointops.chamfer_distance(a, b, squared=False) + dist1.mean() + dist2.max() + nn_dist.sum()

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
        loss = pointops.chamfer_distance(a, b)
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
