"""Every public op under every way PyTorch differentiates: forward mode (torch.autograd.forward_ad),
the torch.func transforms (grad, vjp, jacrev, jvp, jacfwd, hessian) and vmap with torch's per-sample
fallback disabled, plus gradcheck with forward-mode and batched checks. The ops come from the
registry in tests/transform_cases.py; each has a dense torch reference, differentiated by torch.

Tolerances (float64 throughout): pointops' derivatives and the reference's are the same formulas
evaluated in a different order (fused kernels, gathers against full matrices), over at most a few
hundred terms: rtol 1e-9, atol 1e-10 (particle sums, whose moments subtract two sums: atol 1e-9).
gradcheck keeps its defaults (float64 central differences, eps 1e-6); the inputs are kept away from
every point where an op is not differentiable (see the registry).
"""
import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import pointops
from conftest import DEVICES, DeterministicAlgorithms
from transform_cases import CASES, INTEGER_OUTPUT_OPS, NOT_OPS, WRAPPERS

RTOL, ATOL = 1e-9, 1e-10


@pytest.fixture(autouse=True)
def strict_vmap_and_determinism():
    """vmap must never fall back to a per-sample loop; gradcheck wants bitwise repeatable backwards
    (CUDA scatters with atomics unless deterministic algorithms are on)."""
    previous = torch._C._functorch._is_vmap_fallback_enabled()
    torch._C._functorch._set_vmap_fallback_enabled(False)
    try:
        with DeterministicAlgorithms():
            yield
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(previous)


def case_params(predicate=lambda c: True):
    return [pytest.param(c, id=c.name) for c in CASES if predicate(c)]


def atol(case):
    return 1e-9 if case.covers == "particle_sum" else ATOL


def random_like(t, seed):
    g = torch.Generator().manual_seed(seed)
    if t.is_complex():
        return torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)
    return torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)


def real_view(t):
    return torch.view_as_real(t) if t.is_complex() else t


def scalarized(fn, outputs):
    """A fixed random linear functional of fn's floating outputs (non-finite entries -- distances to an
    empty cloud -- left out, they carry no derivative): the scalar loss the reverse-mode tests take."""
    weights = [random_like(real_view(o), 1000 + i) for i, o in enumerate(outputs)]

    def loss(*args):
        total = 0
        for o, w in zip(fn(*args), weights):
            o = real_view(o)
            total = total + torch.where(torch.isfinite(o), o, torch.zeros_like(o)).mul(w).sum()
        return total
    return loss


def over_real_inputs(fn, inputs):
    """(fn of the real inputs alone, those inputs, their positions): jacfwd, jacrev and hessian take
    real inputs only, so complex weights are held fixed there (grad, vjp and forward mode
    differentiate them)."""
    positions = [k for k, t in enumerate(inputs) if not t.is_complex()]

    def of_real(*real):
        args = list(inputs)
        for k, t in zip(positions, real):
            args[k] = t
        return fn(*args)
    return of_real, tuple(inputs[k] for k in positions), positions


def assert_close(got, want, case, what):
    torch.testing.assert_close(got, want, rtol=RTOL, atol=atol(case), msg=lambda m: f"{case.name}, {what}: {m}")


# ---------------------------------------------------------------- forward mode
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", case_params())
def test_forward_mode_gives_every_tangent(case, device):
    """Each floating output carries a tangent equal to the reference's: never a missing or zero one
    where the reference's is not zero."""
    inputs, op, ref = case.build(device)
    for k in range(len(inputs)):
        tangents = tuple(random_like(t, 10 + i) if i == k else torch.zeros_like(t) for i, t in enumerate(inputs))
        with fwAD.dual_level():
            duals = [fwAD.make_dual(t, dt) if i == k else t for i, (t, dt) in enumerate(zip(inputs, tangents))]
            got = [fwAD.unpack_dual(o).tangent for o in op(*duals)]
        _, want = jvp(ref, inputs, tangents)
        for j, (g, w) in enumerate(zip(got, want)):
            w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
            if g is None:
                assert not case.differentiable or not w.any(), \
                    f"{case.name}: output {j} has no tangent for input {k}, the reference's is not zero"
                continue
            assert_close(torch.where(torch.isfinite(g), g, torch.zeros_like(g)), w, case,
                         f"tangent of output {j} for input {k}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", case_params(lambda c: c.differentiable))
def test_jvp_and_jacfwd_match_the_reference(case, device):
    inputs, op, ref = case.build(device)
    tangents = tuple(random_like(t, 20 + i) for i, t in enumerate(inputs))
    for got, want in zip(jvp(op, inputs, tangents)[1], jvp(ref, inputs, tangents)[1]):
        finite = torch.isfinite(want)
        assert_close(got[finite], want[finite], case, "torch.func.jvp")
    loss, real, positions = over_real_inputs(scalarized(op, op(*inputs)), inputs)
    ref_loss = over_real_inputs(scalarized(ref, ref(*inputs)), inputs)[0]
    argnums = tuple(range(len(real)))
    for k, got, want in zip(positions, jacfwd(loss, argnums)(*real), jacfwd(ref_loss, argnums)(*real)):
        assert_close(got, want, case, f"torch.func.jacfwd, input {k}")


# ---------------------------------------------------------------- reverse mode under torch.func
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", case_params(lambda c: c.differentiable))
def test_grad_vjp_jacrev_equal_autograd(case, device):
    inputs, op, ref = case.build(device)
    outputs = op(*inputs)
    loss = scalarized(op, outputs)
    argnums = tuple(range(len(inputs)))
    leaves = [t.clone().requires_grad_() for t in inputs]
    plain = torch.autograd.grad(loss(*leaves), leaves, allow_unused=True)
    plain = [torch.zeros_like(t) if g is None else g for g, t in zip(plain, inputs)]
    by_grad = grad(loss, argnums=argnums)(*inputs)
    real_loss, real, positions = over_real_inputs(loss, inputs)
    by_jacrev = dict(zip(positions, jacrev(real_loss, argnums=tuple(range(len(real))))(*real)))
    reference = grad(scalarized(ref, ref(*inputs)), argnums=argnums)(*inputs)
    _, pullback = vjp(lambda *a: tuple(real_view(o) for o in op(*a)), *inputs)
    cotangents = tuple(random_like(real_view(o), 30 + i) for i, o in enumerate(outputs))
    cotangents = tuple(torch.where(torch.isfinite(real_view(o)), c, torch.zeros_like(c))
                       for o, c in zip(outputs, cotangents))
    by_vjp = pullback(cotangents)
    with torch.enable_grad():
        leaves = [t.clone().requires_grad_() for t in inputs]
        outs = [real_view(o) for o in op(*leaves)]
        plain_vjp = torch.autograd.grad(outs, leaves, cotangents, allow_unused=True)
    for k in range(len(inputs)):
        assert_close(by_grad[k], plain[k], case, f"torch.func.grad, input {k}")
        if k in by_jacrev:
            assert_close(by_jacrev[k], plain[k], case, f"torch.func.jacrev, input {k}")
        assert_close(by_grad[k], reference[k], case, f"torch.func.grad against the reference, input {k}")
        want = torch.zeros_like(inputs[k]) if plain_vjp[k] is None else plain_vjp[k]
        assert_close(by_vjp[k], want, case, f"torch.func.vjp, input {k}")


# ---------------------------------------------------------------- second order
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", case_params(lambda c: c.differentiable))
def test_hessian(case, device):
    """torch.func.hessian (forward over reverse) and jacrev of jacrev equal the reference's; where
    a second derivative is not implemented, a RuntimeError that says so (never a silent zero)."""
    inputs, op, ref = case.build(device)
    loss, real, positions = over_real_inputs(scalarized(op, op(*inputs)), inputs)
    ref_loss = over_real_inputs(scalarized(ref, ref(*inputs)), inputs)[0]
    checked = range(len(real))
    if case.second_order != "yes":
        for transform in (hessian, lambda f: jacrev(jacrev(f))):
            with pytest.raises(RuntimeError, match=case.second_order):
                transform(loss)(*real)
        checked = [len(real) - 1]  # the weights: their gradient is a particle sum, differentiable
    for k in checked:
        want = hessian(ref_loss, argnums=k)(*real)
        assert_close(hessian(loss, argnums=k)(*real), want, case, f"hessian in input {positions[k]}")
        assert_close(jacrev(jacrev(loss, argnums=k), argnums=k)(*real), want, case,
                     f"jacrev(jacrev) in input {positions[k]}")


# ---------------------------------------------------------------- vmap
def samples(inputs, count=3):
    """count variations of the inputs, stacked along a new first dim."""
    return tuple(torch.stack([t * (1 + 0.05 * v) + 0.01 * v for v in range(count)]) for t in inputs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", case_params())
def test_vmap_without_fallback(case, device):
    """vmap (its per-sample fallback disabled) equals a loop over the samples, batching every input
    and only the first; vmap(grad(...)) gives the per-sample gradients. Ops whose output sizes
    depend on the values refuse vmap with a clear error."""
    inputs, op, _ = case.build(device)
    stacked = samples(inputs)
    if not case.vmap:
        with pytest.raises(RuntimeError, match="cannot run under torch.vmap"):
            vmap(op)(*stacked)
        return
    for in_dims in (0, (0,) + (None,) * (len(inputs) - 1)):
        args = stacked if in_dims == 0 else (stacked[0],) + tuple(inputs[1:])
        got = vmap(op, in_dims=in_dims)(*args)
        for v in range(stacked[0].shape[0]):
            sample = [a[v] if in_dims == 0 or i == 0 else a for i, a in enumerate(args)]
            for j, (g, w) in enumerate(zip(got, op(*sample))):
                torch.testing.assert_close(g[v], w, rtol=RTOL, atol=atol(case), equal_nan=True,
                                           msg=lambda m: f"{case.name}: vmap output {j}, sample {v}: {m}")
        if case.differentiable:
            loss = scalarized(op, op(*inputs))
            per_sample = vmap(grad(loss), in_dims=in_dims)(*args)
            for v in range(stacked[0].shape[0]):
                sample = [a[v] if in_dims == 0 or i == 0 else a for i, a in enumerate(args)]
                assert_close(per_sample[v], grad(loss)(*sample), case, f"vmap(grad), sample {v}")


# ---------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", case_params(lambda c: c.differentiable))
def test_gradcheck_forward_and_batched(case, device):
    inputs, op, _ = case.build(device)
    leaves = tuple(t.clone().requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(op, leaves, check_forward_ad=True, check_batched_grad=True,
                                    check_batched_forward_grad=True)


# ---------------------------------------------------------------- the registry covers the API
def test_every_public_op_is_registered():
    covered = {c.covers for c in CASES}
    public = set(pointops.__all__) - {"__version__"}
    public |= {f"strided.{name}" for name in pointops.strided.__all__ if callable(getattr(pointops.strided, name))}
    missing = public - covered - set(INTEGER_OUTPUT_OPS) - set(NOT_OPS) - set(WRAPPERS)
    assert not missing, f"public ops without a transform case in tests/transform_cases.py: {sorted(missing)}"


# ---------------------------------------------------------------- integer outputs, plain autograd inside vmap
@pytest.mark.parametrize("device", DEVICES)
def test_integer_ops_run_inside_transforms(device):
    """The ops with integer outputs (indices, edges) run inside grad, jvp and vjp (they pick the
    points the differentiable part then uses); under vmap the padded ones batch, the packed ones
    (whose edge and sample counts depend on the values) refuse with a clear error."""
    x = torch.randn(2, 12, 3, dtype=torch.float64, device=device)
    flat = x.reshape(-1, 3)
    batch = torch.tensor([0] * 12 + [1] * 12, device=device)

    def uses_indices(p):
        q = p.reshape(-1, 3)
        edges = pointops.knn(q, q, 3, batch, batch)
        near = pointops.radius(q, q, 0.8, batch, batch, max_num_neighbors=4)
        sampled = pointops.fps(q, batch, ratio=0.5, random_start=False)
        graph = torch.cat([pointops.knn_graph(q, 2, batch), pointops.radius_graph(q, 0.8, batch, max_num_neighbors=2)], 1)
        closest = pointops.nearest(q, q[::2], batch, batch[::2])
        cells = pointops.grid_cluster(q, torch.full((3,), 0.5, dtype=q.dtype, device=q.device))
        idx = pointops.knn_points(p, p, K=2).idx
        fps_idx = pointops.sample_farthest_points(p, K=3)[1]
        return ((q[edges[1]] - q[edges[0]]) ** 2).sum() + q[near[1]].sum() + q[sampled].sum() \
            + q[graph[0]].sum() + q[closest].sum() + q[cells % len(q)].sum() \
            + pointops.knn_gather(p, idx).sum() + torch.gather(p, 1, fps_idx[..., None].expand(-1, -1, 3)).sum()

    leaf = x.clone().requires_grad_()
    expected = torch.autograd.grad(uses_indices(leaf), leaf)[0]
    torch.testing.assert_close(grad(uses_indices)(x), expected, rtol=RTOL, atol=ATOL)
    tangent = torch.randn_like(x)
    torch.testing.assert_close(jvp(uses_indices, (x,), (tangent,))[1], (expected * tangent).sum(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(vjp(uses_indices, x)[1](torch.ones((), dtype=x.dtype, device=device))[0], expected)

    stacked = torch.stack([x, x.flip(1)])
    idx = vmap(lambda p: pointops.knn_points(p, p, K=2).idx)(stacked)
    assert torch.equal(idx[1], pointops.knn_points(x.flip(1), x.flip(1), K=2).idx)
    fps_idx = vmap(lambda p: pointops.sample_farthest_points(p, K=3)[1])(stacked)
    assert torch.equal(fps_idx[0], pointops.sample_farthest_points(x, K=3)[1])
    size = torch.full((3,), 0.5, dtype=x.dtype, device=device)
    cells = vmap(lambda p: pointops.grid_cluster(p.reshape(-1, 3), size))(stacked)
    assert torch.equal(cells[1], pointops.grid_cluster(x.flip(1).reshape(-1, 3), size))
    for name, call in (("knn", lambda q: pointops.knn(q, q, 3)), ("radius", lambda q: pointops.radius(q, q, 0.5)),
                       ("fps", lambda q: pointops.fps(q, ratio=0.5)), ("knn", lambda q: pointops.knn_graph(q, 3)),
                       ("radius", lambda q: pointops.radius_graph(q, 0.5)), ("nearest", lambda q: pointops.nearest(q, q))):
        with pytest.raises(RuntimeError, match=f"pointops.{name} cannot run under torch.vmap"):
            vmap(call)(torch.stack([flat, flat]))


@pytest.mark.parametrize("device", DEVICES)
def test_plain_autograd_through_vmap(device):
    """vmap inside an ordinary training step: the per-sample losses of vmapped chamfer_distance,
    backpropagated with .backward(), equal the loop's gradients."""
    x = torch.randn(3, 2, 8, 3, dtype=torch.float64, device=device, requires_grad=True)
    y = torch.randn(2, 9, 3, dtype=torch.float64, device=device)
    vmap(lambda a: pointops.chamfer_distance(a, y)[0])(x).sum().backward()
    leaf = x.detach().clone().requires_grad_()
    sum(pointops.chamfer_distance(leaf[v], y)[0] for v in range(3)).backward()
    torch.testing.assert_close(x.grad, leaf.grad, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
def test_raw_particle_op_refuses_transforms(device):
    """torch.ops.pointops.particle_sum differentiates with plain autograd only; forward mode and
    torch.func go through pointops.particle_sum. The raw op says so rather than drop a tangent."""
    x, y, c = (torch.randn(4, 3, dtype=torch.float64, device=device), torch.randn(5, 3, dtype=torch.float64,
               device=device), torch.randn(5, dtype=torch.float64, device=device))
    raw = torch.ops.pointops.particle_sum
    with fwAD.dual_level(), pytest.raises(RuntimeError, match="call pointops.particle_sum"):
        raw(fwAD.make_dual(x, torch.ones_like(x)), y, c, "gaussian", 1.0)
    with pytest.raises(RuntimeError, match="call pointops.particle_sum"):
        grad(lambda a: raw(a, y, c, "gaussian", 1.0).sum())(x)
    torch.testing.assert_close(vmap(lambda a: raw(a, y, c, "gaussian", 1.0))(torch.stack([x, 2 * x]))[1],
                               pointops.particle_sum(2 * x, y, c, sigma=1.0))
