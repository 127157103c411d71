"""chamfer_distance / ChamferLoss as a drop-in for pytorch3d.loss.chamfer_distance: a naive
reference written here (loops over clouds, float64 brute force for both norms, normals by
gather, weights) against CPU and CUDA for every combination of the arguments; gradients for
points and normals; every ValueError; compile.

Tolerances: the reference and pointops compute each distance in float64 from the same inputs in a
possibly different order (the kernel fuses multiply-adds on CUDA), and reduce over at most a few
dozen terms, so results agree to ~50 float64 roundings relative to the loss: rtol 1e-12.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import pointops
from conftest import DEVICES, HAS_CUDA, check_cuda_graph, requires_cuda

RTOL = 1e-12


# ---------------------------------------------------------------- the reference
def reference_direction(p, q, pn, qn, norm, squared, abs_cosine):
    """One cloud, one direction, float64: (distance terms, normal terms or None), each (len(p),).
    A direction whose searched cloud q is empty contributes 0 (PyTorch3D's behaviour)."""
    if len(q) == 0:
        zeros = torch.zeros(len(p), dtype=torch.float64)
        return zeros, (zeros.clone() if pn is not None else None)
    diff = p[:, None, :] - q[None, :, :]
    pairs = (diff**2).sum(-1) if norm == 2 else diff.abs().sum(-1)
    d, j = pairs.min(1)
    if not squared:
        d = d.sqrt()
    if pn is None or qn is None:
        return d, None
    cos = F.cosine_similarity(pn, qn[j], dim=1, eps=1e-6)
    return d, 1 - (cos.abs() if abs_cosine else cos)


def reference_chamfer(x, y, xl=None, yl=None, xn=None, yn=None, weights=None, batch_reduction="mean",
                      point_reduction="mean", norm=2, single=False, abs_cosine=True, squared=True):
    B, P1, P2 = x.shape[0], x.shape[1], y.shape[1]
    if weights is not None and float(weights.sum()) == 0:
        # PyTorch3D returns before the search: per direction its points' sums times the weights,
        # times 0, broadcast (B,) x (B, 1) -> (B, B); the same for the normals, given or not.
        def zero(p):
            z = p.detach().double().cpu().sum((1, 2))[None, :] * weights.double().cpu()[:, None] * 0
            return z.sum() if batch_reduction is not None else z
        if single:
            return zero(x), zero(x)
        if point_reduction is None:
            return (zero(x), zero(y)), (zero(x), zero(y))
        return zero(x) + zero(y), zero(x) + zero(y)
    xl = [P1] * B if xl is None else xl.tolist()
    yl = [P2] * B if yl is None else yl.tolist()
    with_normals = xn is not None and yn is not None
    dev = lambda t: None if t is None else t.detach().double().cpu()  # noqa: E731
    x, y, xn, yn, w = dev(x), dev(y), dev(xn), dev(yn), dev(weights)
    per_point = {"x": torch.zeros(B, P1, dtype=torch.float64), "y": torch.zeros(B, P2, dtype=torch.float64),
                 "nx": torch.zeros(B, P1, dtype=torch.float64), "ny": torch.zeros(B, P2, dtype=torch.float64)}
    reduced = {k: torch.zeros(B, dtype=torch.float64) for k in per_point}
    for b in range(B):
        nx_b = xn[b, :xl[b]] if with_normals else None
        ny_b = yn[b, :yl[b]] if with_normals else None
        for key, (p, q, pn, qn, n) in {"x": (x[b, :xl[b]], y[b, :yl[b]], nx_b, ny_b, xl[b]),
                                       "y": (y[b, :yl[b]], x[b, :xl[b]], ny_b, nx_b, yl[b])}.items():
            d, nt = reference_direction(p, q, pn, qn, norm, squared, abs_cosine)
            if w is not None:
                d = d * w[b]
                nt = None if nt is None else nt * w[b]
            per_point[key][b, :n] = d
            if nt is not None:
                per_point["n" + key][b, :n] = nt
            for k, t in ((key, d), ("n" + key, nt)):
                if t is None:
                    continue
                if point_reduction == "mean":
                    reduced[k][b] = t.sum() / max(n, 1)
                elif point_reduction == "sum":
                    reduced[k][b] = t.sum()
                elif point_reduction == "max":
                    reduced[k][b] = t.max() if n > 0 else 0.0
    if point_reduction is None:
        if single:
            return per_point["x"], per_point["nx"] if with_normals else None
        return (per_point["x"], per_point["y"]), ((per_point["nx"], per_point["ny"]) if with_normals else None)
    if single:
        loss, loss_n = reduced["x"], reduced["nx"]
    elif point_reduction == "max":
        loss, loss_n = torch.maximum(reduced["x"], reduced["y"]), None
    else:
        loss, loss_n = reduced["x"] + reduced["y"], reduced["nx"] + reduced["ny"]
    loss_n = loss_n if with_normals else None

    def batch(v):
        if v is None or batch_reduction is None:
            return v
        if batch_reduction == "sum":
            return v.sum()
        div = max(B, 1) if w is None else (w.sum() if w.sum() > 0 else 1.0)
        return v.sum() / div
    return batch(loss), batch(loss_n)


def assert_same_structure_close(got, want):
    if want is None:
        assert got is None
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            assert_same_structure_close(g, w)
    else:
        assert torch.is_tensor(got) and got.shape == want.shape, (got, want)
        torch.testing.assert_close(got.detach().cpu().double(), want, rtol=RTOL, atol=1e-14)


def clouds(device, dtype=torch.float64, seed=0, B=4, P1=11, P2=9, D=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, P1, D, generator=g, dtype=dtype).to(device)
    y = torch.randn(B, P2, D, generator=g, dtype=dtype).to(device)
    xn = torch.randn(B, P1, D, generator=g, dtype=dtype).to(device)
    yn = torch.randn(B, P2, D, generator=g, dtype=dtype).to(device)
    # Ragged, with an empty x cloud (b=2) and an empty y cloud (b=1): both directions of "empty".
    xl = torch.tensor([P1, min(5, P1), 0, min(7, P1)][:B], device=device)
    yl = torch.tensor([P2, 0, min(4, P2), P2 - 1][:B], device=device)
    return x, y, xn, yn, xl, yl


WEIGHTS = {"none": None, "random": torch.tensor([0.5, 2.0, 1.0, 0.0], dtype=torch.float64),
           "zero": torch.zeros(4, dtype=torch.float64)}


# ---------------------------------------------------------------- every combination
# point_reduction=None needs batch_reduction=None (the other pairs are ValueErrors, tested below).
REDUCTIONS = [(p, b) for p in ("mean", "sum", "max") for b in ("mean", "sum", None)] + [(None, None)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("point_reduction, batch_reduction", REDUCTIONS)
@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("norm", [1, 2])
def test_matches_reference(device, point_reduction, batch_reduction, single, norm):
    x, y, xn, yn, xl, yl = clouds(device, seed=norm)
    normal_modes = [None] if point_reduction == "max" else [None, True, False]
    for ragged in (False, True):
        lengths = (xl, yl) if ragged else (None, None)
        for abs_cosine in normal_modes:
            normals = (xn, yn) if abs_cosine is not None else (None, None)
            for weights_name, weights in WEIGHTS.items():
                weights = None if weights is None else weights.to(device)
                squared_options = (True, False) if norm == 2 else (True,)
                for squared in squared_options:
                    got = pointops.chamfer_distance(
                        x, y, *lengths, *normals, weights, batch_reduction=batch_reduction,
                        point_reduction=point_reduction, norm=norm, single_directional=single,
                        abs_cosine=bool(abs_cosine), squared=squared)
                    want = reference_chamfer(x, y, *lengths, *normals, weights, batch_reduction,
                                             point_reduction, norm, single, bool(abs_cosine), squared)
                    assert isinstance(got, tuple) and len(got) == 2
                    assert_same_structure_close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lower_precision_dtypes(device, dtype):
    """Half types compute distances in float32 and round once; the reductions run in the dtype."""
    x, y, xn, yn, xl, yl = clouds(device, dtype=dtype, seed=3, P1=40, P2=30)
    loss, loss_n = pointops.chamfer_distance(x, y, xl, yl, xn, yn)
    want, want_n = reference_chamfer(x, y, xl, yl, xn, yn)
    assert loss.dtype == dtype and loss_n.dtype == dtype
    # ~50 terms summed in the dtype: a few dozen units of its roundoff.
    rtol = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(loss.double().cpu(), want, rtol=rtol, atol=0)
    torch.testing.assert_close(loss_n.double().cpu(), want_n, rtol=rtol, atol=rtol)


# ---------------------------------------------------------------- the required behaviours
@pytest.mark.parametrize("device", DEVICES)
def test_max_is_the_hausdorff_distance(device):
    # x = {0, 1}, y = {0, 3} on a line: max_x = 1 (1 -> 0), max_y = 4 (3 -> 1). PyTorch3D returns
    # maximum(1, 4) = 4, the squared Hausdorff distance; max_x + max_y would be 5.
    x = torch.tensor([[[0.0], [1.0]]], device=device)
    y = torch.tensor([[[0.0], [3.0]]], device=device)
    loss, loss_n = pointops.chamfer_distance(x, y, point_reduction="max")
    assert loss.item() == 4.0 and loss_n is None
    assert pointops.chamfer_distance(x, y, point_reduction="max", squared=False)[0].item() == 2.0
    assert pointops.chamfer_distance(x, y, point_reduction="max", single_directional=True)[0].item() == 1.0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [1, 2])
def test_empty_partner_contributes_zero(device, norm):
    x, y, xn, yn, _, _ = clouds(device, P1=5, P2=4)
    # y cloud 0 empty: x -> y contributes 0 there; y -> x of cloud 0 has no points: 0 too.
    yl = torch.tensor([0, 4, 4, 4], device=device)
    for point_reduction in ("mean", "sum", "max"):
        loss, _ = pointops.chamfer_distance(x, y, None, yl, point_reduction=point_reduction,
                                            batch_reduction=None, norm=norm)
        assert torch.isfinite(loss).all() and loss[0].item() == 0
    per_point, per_normal = pointops.chamfer_distance(x, y, None, yl, xn, yn, point_reduction=None,
                                                      batch_reduction=None, norm=norm)
    assert (per_point[0][0] == 0).all() and (per_normal[0][0] == 0).all()
    # The whole y empty (P2 = 0): finite, 0, and x still gets a (zero) gradient.
    xg = x.clone().requires_grad_()
    loss, _ = pointops.chamfer_distance(xg, y[:, :0], norm=norm)
    assert loss.item() == 0
    loss.backward()
    assert xg.grad is not None and (xg.grad == 0).all()
    # nearest_neighbor keeps the honest answer at its level.
    dist, idx = pointops.nearest_neighbor(x, y, None, yl, norm=norm)
    assert torch.isinf(dist[0]).all() and (idx[0] == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_empty_clouds(device):
    x, y, xn, yn, _, _ = clouds(device)
    for point_reduction in ("mean", "sum", "max"):
        loss, _ = pointops.chamfer_distance(x[:0], y[:0], point_reduction=point_reduction)
        assert loss.item() == 0
        loss, _ = pointops.chamfer_distance(x[:, :0], y[:, :0], point_reduction=point_reduction,
                                            batch_reduction=None)
        assert loss.shape == (4,) and (loss == 0).all()
    (dx, dy), _ = pointops.chamfer_distance(x[:, :0], y, point_reduction=None, batch_reduction=None)
    assert dx.shape == (4, 0) and dy.shape == (4, 9) and (dy == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_normals", [True, False])
def test_all_zero_weights_follow_pytorch3d(device, with_normals):
    # PyTorch3D's early return: loss and loss_normals are zeros made from the points (so they
    # require grad when the points do, normals or not), () with a batch reduction, (B, B) without.
    x, y, xn, yn, xl, yl = clouds(device)
    x.requires_grad_()
    y.requires_grad_()
    normals = (xn, yn) if with_normals else (None, None)
    w = torch.zeros(4, dtype=torch.float64, device=device)
    for batch_reduction, shape in (("mean", ()), ("sum", ()), (None, (4, 4))):
        x.grad = y.grad = None
        loss, loss_n = pointops.chamfer_distance(x, y, xl, yl, *normals, w, batch_reduction=batch_reduction)
        for t in (loss, loss_n):
            assert t.shape == shape and (t == 0).all() and t.requires_grad
        (loss.sum() + loss_n.sum()).backward()
        assert (x.grad == 0).all() and (y.grad == 0).all()
    (lx, ly), (nx, ny) = pointops.chamfer_distance(x, y, weights=w, point_reduction=None, batch_reduction=None)
    assert all(t.shape == (4, 4) and (t == 0).all() for t in (lx, ly, nx, ny))
    single, single_n = pointops.chamfer_distance(x, y, weights=w, single_directional=True)
    assert single.shape == single_n.shape == () and single_n.requires_grad


@pytest.mark.parametrize("device", DEVICES)
def test_weights_weight_each_cloud(device):
    x, y, _, _, _, _ = clouds(device)
    per_cloud, _ = pointops.chamfer_distance(x, y, batch_reduction=None)
    w = torch.tensor([1.0, 0.0, 3.0, 0.5], dtype=torch.float64, device=device)
    weighted, _ = pointops.chamfer_distance(x, y, weights=w)
    torch.testing.assert_close(weighted, (per_cloud * w).sum() / w.sum(), rtol=RTOL, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_normals_follow_the_nearest_neighbour(device):
    x = torch.tensor([[[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]]], device=device)
    y = torch.tensor([[[0.0, 0.0, 1.0], [10.0, 0.0, 1.0]]], device=device)
    xn = torch.tensor([[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]], device=device)
    yn = torch.tensor([[[0.0, 0.0, -2.0], [0.0, 1.0, 0.0]]], device=device)  # opposite; orthogonal
    _, (nx, ny) = pointops.chamfer_distance(x, y, x_normals=xn, y_normals=yn, point_reduction=None,
                                            batch_reduction=None)
    assert nx.tolist() == [[0.0, 1.0]] and ny.tolist() == [[0.0, 1.0]]  # 1 - |cos|
    _, (nx, _) = pointops.chamfer_distance(x, y, x_normals=xn, y_normals=yn, point_reduction=None,
                                           batch_reduction=None, abs_cosine=False)
    assert nx.tolist() == [[2.0, 1.0]]  # 1 - cos
    # Only one side's normals: no normal loss (as PyTorch3D).
    assert pointops.chamfer_distance(x, y, x_normals=xn)[1] is None


class FakePointclouds:
    """The three methods of pytorch3d.structures.Pointclouds that chamfer_distance uses."""

    def __init__(self, points, lengths, normals=None):
        self._points, self._lengths, self._normals = points, lengths, normals

    def points_padded(self):
        return self._points

    def num_points_per_cloud(self):
        return self._lengths

    def normals_padded(self):
        return self._normals


@pytest.mark.parametrize("device", DEVICES)
def test_pointclouds_objects(device):
    x, y, xn, yn, xl, yl = clouds(device)
    want = pointops.chamfer_distance(x, y, xl, yl, xn, yn)
    got = pointops.chamfer_distance(FakePointclouds(x, xl, xn), FakePointclouds(y, yl, yn))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    mixed, normals = pointops.chamfer_distance(FakePointclouds(x, xl), y, y_lengths=yl)
    torch.testing.assert_close(mixed, pointops.chamfer_distance(x, y, xl, yl)[0], rtol=0, atol=0)
    assert normals is None
    with pytest.raises(ValueError, match="Normals must be None"):
        pointops.chamfer_distance(FakePointclouds(x, xl, xn), FakePointclouds(y, yl, yn), point_reduction="max")


@pytest.mark.parametrize("device", DEVICES)
def test_chamfer_loss_module(device):
    x, y, xn, yn, xl, yl = clouds(device)
    for kwargs in ({}, {"point_reduction": "sum", "batch_reduction": None}, {"norm": 1, "single_directional": True},
                   {"abs_cosine": False, "squared": False}):
        module = pointops.ChamferLoss(**kwargs)
        w = torch.tensor([1.0, 2.0, 0.5, 1.0], dtype=torch.float64, device=device)
        got = module(x, y, xl, yl, xn, yn, w)
        want = pointops.chamfer_distance(x, y, xl, yl, xn, yn, w, **kwargs)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert "norm=" in repr(module)
    with pytest.raises(ValueError, match="point_reduction must be one of"):
        pointops.ChamferLoss(point_reduction="median")
    with pytest.raises(ValueError, match="Support for 1 or 2 norm"):
        pointops.ChamferLoss(norm=3)
    with pytest.raises(TypeError):  # the old positional order (point_reduction first) fails loudly
        pointops.ChamferLoss("sum")


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("point_reduction", ["mean", "sum"])
def test_gradcheck_fused_loss(device, norm, point_reduction):
    # No normals, mean / sum: the one-op path (_chamfer_distance and its C++ node), ragged and
    # weighted, each batch reduction, both directions and one, squared and not.
    x, y, _, _, xl, yl = clouds(device, seed=6, P1=7, P2=6)
    w = torch.tensor([0.5, 2.0, 1.0, 1.5], dtype=torch.float64, device=device)
    x.requires_grad_()
    y.requires_grad_()
    for batch_reduction in ("mean", "sum", None):
        for single in (False, True):
            for squared in (True, False) if norm == 2 else (True,):  # squared=False is norm=2's
                fn = lambda a, b: pointops.chamfer_distance(  # noqa: E731
                    a, b, xl, yl, weights=w, point_reduction=point_reduction, batch_reduction=batch_reduction,
                    single_directional=single, norm=norm, squared=squared)[0]
                # CUDA scatters each point's terms (its own and its matches') with float64 atomics:
                # repeated backwards may differ by a rounding of the sum, ~1e-16 relative here
                assert torch.autograd.gradcheck(fn, (x, y), nondet_tol=1e-12 if device == "cuda" else 0.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("point_reduction", ["mean", "sum", "max"])
def test_gradcheck_points_and_normals(device, norm, point_reduction):
    # CUDA scatters the references' gradients with float64 atomics: two backward passes may add the
    # same terms in another order (a few ulps of ~1 apart), which gradcheck's reentrancy check sees
    nondet = 1e-12 if device == "cuda" else 0.0
    x, y, xn, yn, xl, yl = clouds(device, seed=5, P1=7, P2=6)
    w = torch.tensor([0.5, 2.0, 1.0, 1.5], dtype=torch.float64, device=device)
    for t in (x, y, xn, yn):
        t.requires_grad_()
    if point_reduction == "max":
        fn = lambda a, b: pointops.chamfer_distance(a, b, xl, yl, weights=w, point_reduction="max", norm=norm,  # noqa: E731
                                                    batch_reduction=None)[0]
        assert torch.autograd.gradcheck(fn, (x, y), nondet_tol=nondet)
        return
    fn = lambda a, b, na, nb: pointops.chamfer_distance(  # noqa: E731
        a, b, xl, yl, na, nb, w, point_reduction=point_reduction, norm=norm, batch_reduction=None)
    assert torch.autograd.gradcheck(fn, (x, y, xn, yn), nondet_tol=nondet)
    fn = lambda a, b, na, nb: pointops.chamfer_distance(  # noqa: E731
        a, b, None, None, na, nb, point_reduction=point_reduction, norm=norm, abs_cosine=False)
    assert torch.autograd.gradcheck(fn, (x, y, xn, yn), nondet_tol=nondet)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_reach_the_normals(device):
    x, y, xn, yn, _, _ = clouds(device)
    xn.requires_grad_()
    yn.requires_grad_()
    _, loss_n = pointops.chamfer_distance(x, y, x_normals=xn, y_normals=yn)
    loss_n.backward()
    assert xn.grad.abs().sum() > 0 and yn.grad.abs().sum() > 0


# ---------------------------------------------------------------- errors (PyTorch3D's ValueErrors)
@pytest.mark.parametrize("device", DEVICES)
def test_value_errors(device):
    x, y, xn, yn, xl, yl = clouds(device)
    cd = pointops.chamfer_distance
    cases = [
        (lambda: cd(x[0], y), r"Expected points to be of shape \(N, P, D\); x has shape \(11, 3\)"),
        (lambda: cd(x, y[0]), r"Expected points to be of shape \(N, P, D\); y has shape"),
        (lambda: cd([[0.0]], y), "should be either Pointclouds objects or torch.Tensor"),
        (lambda: cd(x, y, xl[:2]), r"Expected lengths to be of shape \(N,\) = \(4,\); x_lengths is \(2,\)"),
        (lambda: cd(x, y, None, yl[None]), r"Expected lengths to be of shape \(N,\)"),
        (lambda: cd(x, y, xl + 1), "A length value was too long: x_lengths has 12 but x has 11"),
        (lambda: cd(x, y, None, yl - 1), "A length value was negative: y_lengths has -1"),
        (lambda: cd(x, y[:2]), r"y does not have the correct shape: x is \(4, 11, 3\)"),
        (lambda: cd(x, y[..., :2]), "y does not have the correct shape"),
        (lambda: cd(x, y, x_normals=xn[..., :2], y_normals=yn), "Expected normals to be of shape"),
        (lambda: cd(x, y, x_normals=xn, y_normals=yn[:, :3]), "y_normals is"),
        (lambda: cd(x, y, point_reduction="median"), 'point_reduction must be one of \\["mean", "sum", "max"\\]'),
        (lambda: cd(x, y, batch_reduction="max"), 'batch_reduction must be one of \\["mean", "sum"\\] or None'),
        (lambda: cd(x, y, point_reduction=None), "Batch reduction must be None if point_reduction is None"),
        (lambda: cd(x, y, norm=3), "Support for 1 or 2 norm, got norm=3"),
        (lambda: cd(x, y, norm=1, squared=False), "squared=False applies to norm=2 only"),
        (lambda: cd(x, y, x_normals=xn, point_reduction="max"), 'Normals must be None if point_reduction is "max"'),
        (lambda: cd(x, y, weights=torch.ones(3, device=device)), r"weights must be of shape \(N,\) = \(4,\), got \(3,\)"),
        (lambda: cd(x, y, weights=torch.ones(4, 1, device=device)), r"weights must be of shape \(N,\)"),
        (lambda: cd(x, y, weights=torch.tensor([1.0, -0.5, 1.0, 1.0], device=device)),
         "weights cannot be negative, got a minimum of -0.5"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # Dtype and device mismatches are the kernels' RuntimeErrors, naming the argument.
    with pytest.raises(RuntimeError, match="y must have the same dtype as x"):
        cd(x, y.float())


# ---------------------------------------------------------------- torch.compile
def assert_compiled_matches_eager(loss_fn, tensors):
    """loss_fn compiled with fullgraph=True gives the eager loss and gradients (float32 rounding)."""
    compiled = torch.compile(loss_fn, fullgraph=True)
    results = []
    for fn in (loss_fn, compiled):
        args = [t.clone().requires_grad_() for t in tensors]
        loss = fn(*args)
        loss.backward()
        results.append([loss.detach()] + [a.grad for a in args])
    for e, c in zip(*results):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    x, y, xn, yn, xl, yl = clouds(device, dtype=torch.float32, P1=40, P2=30)
    w = torch.tensor([1.0, 0.5, 2.0, 0.0], device=device)

    def loss_fn(a, b, na, nb):
        loss, loss_n = pointops.chamfer_distance(a, b, xl, yl, na, nb, w, norm=1)
        hausdorff, _ = pointops.chamfer_distance(a, b, point_reduction="max")
        return loss + loss_n + hausdorff

    assert_compiled_matches_eager(loss_fn, (x, y, xn, yn))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_loss_compiles_fullgraph(device):
    # The common call (no normals, mean / sum) is one op with a C++ autograd node: traced whole.
    torch._dynamo.reset()
    x, y, _, _, xl, yl = clouds(device, dtype=torch.float32, P1=40, P2=30)
    w = torch.tensor([1.0, 0.5, 2.0, 0.0], device=device)

    def loss_fn(a, b):
        plain, _ = pointops.chamfer_distance(a, b)
        ragged, _ = pointops.chamfer_distance(a, b, xl, yl, weights=w, point_reduction="sum", squared=False)
        single, _ = pointops.chamfer_distance(a, b, batch_reduction=None, single_directional=True, norm=1)
        return plain + ragged + single.sum()

    assert_compiled_matches_eager(loss_fn, (x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_loss_opcheck(device):
    x, y, _, _, xl, yl = clouds(device, dtype=torch.float32, P1=17, P2=13)
    w = torch.tensor([1.0, 0.5, 2.0, 0.0], device=device)
    op = torch.ops.pointops._chamfer_distance.default
    for requires_grad in (False, True):
        a, b = x.clone().requires_grad_(requires_grad), y.clone().requires_grad_(requires_grad)
        torch.library.opcheck(op, (a, b, None, None, None, "mean", "mean", 2, False, True))
        torch.library.opcheck(op, (a, b, xl, yl, w, "sum", None, 1, False, True))
        torch.library.opcheck(op, (a, b, xl, None, w, "mean", "sum", 2, True, False))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_pieces_opcheck(device):
    # The fused node's reduction and backward ops (one launch each on CUDA).
    x, y, _, _, xl, yl = clouds(device, dtype=torch.float32, P1=17, P2=13)
    w = torch.tensor([1.0, 0.5, 2.0, 0.0], device=device)
    d1, d2, i1, i2 = pointops.chamfer(x, y, xl, yl)
    loss = torch.ops.pointops._chamfer_distance_loss.default
    torch.library.opcheck(loss, (d1, d2, xl, yl, w, 13, "mean", "mean", True))
    torch.library.opcheck(loss, (d1, None, None, None, None, 13, "sum", None, False))
    backward = torch.ops.pointops._chamfer_distance_backward.default
    g = torch.tensor(0.7, device=device)
    per_cloud = torch.tensor([0.3, -1.0, 2.0, 0.5], device=device)
    torch.library.opcheck(backward, (g, x, y, d1, i1, d2, i2, xl, yl, w, "mean", "mean", 2, True))
    torch.library.opcheck(backward, (per_cloud, x, y, d1, i1, None, None, xl, yl, None, "sum", None, 1, True))
    torch.library.opcheck(backward, (g, x, y, d1, i1, d2, i2, None, None, None, "mean", "sum", 2, False))


@pytest.mark.parametrize("device", DEVICES)
def test_fused_pieces_refuse_bad_arguments(device):
    """The private loss / backward ops check what they index by (shared checks in chamfer_loss.h,
    the same message on both devices) and the option names."""
    x, y, _, _, xl, yl = clouds(device, dtype=torch.float32, P1=17, P2=13)
    d1, d2, i1, i2 = pointops.chamfer(x, y, xl, yl)
    loss = torch.ops.pointops._chamfer_distance_loss.default
    backward = torch.ops.pointops._chamfer_distance_backward.default
    g = torch.tensor(0.7, device=device)
    with pytest.raises(RuntimeError, match=r"_chamfer_distance_loss: dist1 must be \(B, N\)"):
        loss(d1[0], None, None, None, None, 13, "mean", "mean", True)
    with pytest.raises(RuntimeError, match=r"_chamfer_distance_loss: dist2 must be \(B, num_y\) = \(4, 12\)"):
        loss(d1, d2, xl, yl, None, 12, "mean", "mean", True)
    with pytest.raises(RuntimeError, match="point_reduction must be 'mean' or 'sum', got 'max'"):
        loss(d1, d2, xl, yl, None, 13, "max", "mean", True)
    with pytest.raises(RuntimeError, match="batch_reduction must be 'mean', 'sum' or None, got 'all'"):
        loss(d1, d2, xl, yl, None, 13, "mean", "all", True)
    with pytest.raises(RuntimeError, match="_chamfer_distance_backward: dist2 needs idx2"):
        backward(g, x, y, d1, i1, d2, None, xl, yl, None, "mean", "mean", 2, True)
    with pytest.raises(RuntimeError, match=r"x \(B, N, D\) and y \(B, M, D\) expected"):
        backward(g, x[0], y, d1, i1, d2, i2, xl, yl, None, "mean", "mean", 2, True)
    with pytest.raises(RuntimeError, match=r"dist1 and idx1 must be \(B, N\) = \(4, 17\)"):
        backward(g, x, y, d1[:, :5], i1[:, :5], d2, i2, xl, yl, None, "mean", "mean", 2, True)
    with pytest.raises(RuntimeError, match=r"dist2 and idx2 must be \(B, M\) = \(4, 13\)"):
        backward(g, x, y, d1, i1, d2[:, :5], i2[:, :5], xl, yl, None, "mean", "mean", 2, True)
    with pytest.raises(RuntimeError, match="grad must hold one value per cloud without a batch reduction"):
        backward(g.expand(3), x, y, d1, i1, d2, i2, xl, yl, None, "mean", "mean", 2, True)
    with pytest.raises(RuntimeError, match="grad must hold one value per cloud without a batch reduction"):
        backward(g, x, y, d1, i1, d2, i2, xl, yl, None, "mean", None, 2, True)
    if device == "cpu":  # CUDA skips such an index in the kernel (checking values there would sync)
        bad = i1.clone()
        bad[1, 2] = 13  # one past y's last point
        with pytest.raises(RuntimeError, match=r"_chamfer_distance_backward: idx must hold indices in \[-1, 13\), got 13"):
            backward(g, x, y, d1, bad, d2, i2, xl, yl, None, "mean", "mean", 2, True)
        bad = i2.clone()
        bad[0, 0] = -2
        with pytest.raises(RuntimeError, match=r"_chamfer_distance_backward: idx must hold indices in \[-1, 17\), got -2"):
            backward(g, x, y, d1, i1, d2, bad, xl, yl, None, "mean", "mean", 2, True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm, squared", [(2, True), (2, False), (1, True)])
@pytest.mark.parametrize("batch_reduction", ["mean", "sum", None])
@pytest.mark.parametrize("point_reduction", ["mean", "sum"])
def test_fused_backward_matches_the_differentiable_path(device, norm, squared, batch_reduction, point_reduction):
    # create_graph=False takes the one-op backward (_chamfer_distance_backward), create_graph=True the
    # differentiable torch-op composition: the same gradients. Both compute in float64 from the same
    # distances in a different order (and CUDA scatters with atomics), a few roundings of the largest
    # term: rtol and atol 1e-12 relative to the gradient's scale.
    x, y, _, _, xl, yl = clouds(device, P1=23, P2=19)
    w = WEIGHTS["random"].to(device)
    for lengths, weights, single in (((None, None), None, False), ((xl, yl), w, False), ((xl, yl), None, True)):
        x_ = x.clone().requires_grad_()
        y_ = y.clone().requires_grad_()
        grads = []
        for create_graph in (False, True):
            loss, _ = pointops.chamfer_distance(x_, y_, *lengths, weights=weights, point_reduction=point_reduction,
                                                batch_reduction=batch_reduction, norm=norm, squared=squared,
                                                single_directional=single)
            out = loss if batch_reduction is not None else (loss * torch.arange(1.0, 5.0, device=device,
                                                                                dtype=loss.dtype)).sum()
            grads.append(torch.autograd.grad(out, (x_, y_), create_graph=create_graph))
        for fused, composed in zip(*grads):
            scale = composed.abs().max().item()
            torch.testing.assert_close(fused, composed.detach(), rtol=1e-12, atol=1e-12 * scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("single", [False, True])
def test_fused_cpu_backward_equals_the_two_backward_ops_bitwise(dtype, norm, single):
    # The CPU _chamfer_distance_backward computes in one pass what it used to compose: the distances'
    # gradient (double arithmetic, rounded to the dtype once), a _nearest_neighbor_backward per
    # direction, and their sum in the dtype. Same operations in the same order: equal bit for bit
    # (compared as integers, so the sign of a zero counts too).
    x, y, _, _, xl, yl = clouds("cpu", dtype=dtype, P1=17, P2=13)
    x[0, 3] = y[0, 5]  # a zero distance: a zero gradient term
    w = [0.5, 2.0, 1.0, 0.25]
    d1, d2, i1, i2 = pointops.chamfer(x, y, xl, yl, norm=norm)
    g0 = 0.7
    divisor = sum(w)  # batch_reduction "mean" with weights
    nn_backward = torch.ops.pointops._nearest_neighbor_backward.default

    def distance_grad(own, n):  # point_reduction "mean": 1 / max(length, 1) per cloud
        rows = [[(g0 / divisor) * (w[b] * (1.0 / max(int(own[b]), 1)))] * n for b in range(4)]
        return torch.tensor(rows, dtype=torch.float64).to(dtype)

    gx, gy = nn_backward(distance_grad(xl, 17), x, y, i1, norm)
    if not single:
        gy2, gx2 = nn_backward(distance_grad(yl, 13), y, x, i2, norm)
        gx, gy = gx + gx2, gy + gy2
    fused = torch.ops.pointops._chamfer_distance_backward.default(
        torch.tensor(g0, dtype=torch.float64),  # float64: the kernel reads exactly g0
        x, y, d1, i1, None if single else d2, None if single else i2, xl, yl,
        torch.tensor(w, dtype=torch.float64), "mean", "mean", norm, True)
    as_bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    for got, want in zip(fused, (gx, gy)):
        assert torch.equal(got.view(as_bits), want.view(as_bits))


@requires_cuda
def test_cuda_graph_capture_and_replay():
    # No lengths and no weights: their value checks are host syncs (see the docstring); the rest
    # of chamfer_distance, forward and backward, reads nothing on the host.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 300, 3, generator=g).cuda().requires_grad_()
    y = torch.randn(3, 200, 3, generator=g).cuda().requires_grad_()

    def step():
        loss, _ = pointops.chamfer_distance(x, y)
        per_cloud, _ = pointops.chamfer_distance(x, y, point_reduction="sum", batch_reduction=None, squared=False)
        hausdorff, _ = pointops.chamfer_distance(x, y, point_reduction="max")
        dist1, dist2, idx1, idx2 = pointops.chamfer(x, y)
        total = loss + per_cloud.sum() + hausdorff + dist1.sum() + dist2.sum()
        return (idx1, idx2, loss, per_cloud, hausdorff) + torch.autograd.grad(total, (x, y))

    def refill(seed):
        g = torch.Generator().manual_seed(seed)
        x.copy_(torch.randn(x.shape, generator=g))
        y.copy_(torch.randn(y.shape, generator=g))

    # the indices are exact; the reference clouds' gradients are scattered with float atomics
    check_cuda_graph(step, refill, exact=(0, 1))


@requires_cuda
@pytest.mark.parametrize("norm", [1, 2])
def test_cuda_matches_cpu(norm):
    x, y, xn, yn, xl, yl = clouds("cpu", seed=9, P1=300, P2=200)
    w = torch.tensor([0.5, 2.0, 1.0, 0.0], dtype=torch.float64)
    for point_reduction in ("mean", "sum", None):
        cpu = pointops.chamfer_distance(x, y, xl, yl, xn, yn, w, point_reduction=point_reduction,
                                        batch_reduction=None, norm=norm)
        gpu = pointops.chamfer_distance(*(t.cuda() for t in (x, y, xl, yl, xn, yn, w)),
                                        point_reduction=point_reduction, batch_reduction=None, norm=norm)
        flat = lambda v: [v] if torch.is_tensor(v) else [u for item in v for u in flat(item)]  # noqa: E731
        for c, g in zip(flat(cpu), flat(gpu)):
            torch.testing.assert_close(g.cpu(), c, rtol=RTOL, atol=1e-14)
