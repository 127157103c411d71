"""Particle sums: against a chunked float64 oracle, CPU vs CUDA, gradients, empty and degenerate
inputs, errors, opcheck and torch.compile.

Tolerances are the accuracy contract of pointops/particle_sum.py, as relative l2 errors against a
float64 direct sum of the same input values: float32 1e-6 (helmholtz 1e-5), float64 1e-12, and for
float16/bfloat16 one rounding of the float32 result to the output type (unit roundoff 2^-11 and
2^-8) on top of the float32 error.
"""
import math

import pytest
import torch

import pointops
from conftest import DEVICES, HAS_CUDA, check_cuda_graph, requires_cuda

SIGMA = 0.1
WAVENUMBER = 20.0
KERNELS = ("gaussian", "laplace", "helmholtz")
PARAMS = {"gaussian": {"sigma": SIGMA}, "laplace": {}, "helmholtz": {"wavenumber": WAVENUMBER}}
UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
# float32 gradients: float32 particle sums (the forward's accuracy) combined over the weight
# columns and scaled; the test allows ten times the forward's bound.
GRAD_TOL = {"gaussian": 1e-5, "laplace": 1e-5, "helmholtz": 1e-4}


def tolerance(dtype, kernel):
    if dtype == torch.float64:
        return 1e-12
    base = 1e-5 if kernel == "helmholtz" else 1e-6
    return base + UNIT.get(dtype, 0.0)


def kernel_matrix(r2, kernel, sigma=SIGMA, wavenumber=WAVENUMBER):
    """g(r) on a float64 matrix of squared distances; r = 0 terms of the singular kernels are 0."""
    if kernel == "gaussian":
        return torch.exp(r2 / (-2.0 * sigma**2))
    keep = r2 >= torch.finfo(torch.float64).tiny
    r = torch.where(keep, r2, torch.ones_like(r2)).sqrt()
    inv = torch.where(keep, 1.0 / (4.0 * math.pi * r), torch.zeros_like(r))
    if kernel == "laplace":
        return inv
    return inv * torch.exp(1j * wavenumber * r)


def dense_sum(x, y, w, kernel, sigma=SIGMA, wavenumber=WAVENUMBER):
    """The sum with the M x N matrix formed, in the inputs' dtype (float64 for the oracle), with
    autograd: the reference for gradients."""
    d = x[..., :, None, :] - y[..., None, :, :]
    g = kernel_matrix((d * d).sum(-1), kernel, sigma, wavenumber)
    vector = w.dim() == x.dim() - 1
    W = w[..., None] if vector else w
    if g.is_complex() or W.is_complex():
        dtype = torch.complex128
        g, W = g.to(dtype), W.to(dtype)
    out = g @ W
    return out[..., 0] if vector else out


def oracle(x, y, w, kernel, sigma=SIGMA, wavenumber=WAVENUMBER):
    """float64 direct sum on the exact input values, sources in chunks (never M x N at once)."""
    X, Y = x.detach().cpu().double(), y.detach().cpu().double()
    W = w.detach().cpu()
    W = W.to(torch.complex128) if W.is_complex() else W.double()
    chunk = max(1, 4_000_000 // max(1, X.shape[-2]))
    out = None
    for s in range(0, Y.shape[-2], chunk):
        part = dense_sum(X, Y[..., s:s + chunk, :], W[..., s:s + chunk] if W.dim() == X.dim() - 1
                         else W[..., s:s + chunk, :], kernel, sigma, wavenumber)
        out = part if out is None else out + part
    if out is None:  # N = 0
        out = dense_sum(X, Y, W, kernel, sigma, wavenumber)
    return out


def rel_l2(got, ref):
    got = got.detach().cpu().to(ref.dtype)
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


def make_inputs(M, N, D=3, C=None, complex_weights=False, B=None, dtype=torch.float32, device="cpu", seed=0):
    """Targets and sources uniform in the unit cube, mixed-sign weights."""
    g = torch.Generator().manual_seed(seed)
    lead = () if B is None else (B,)
    x = torch.rand(*lead, M, D, generator=g, dtype=torch.float64)
    y = torch.rand(*lead, N, D, generator=g, dtype=torch.float64)
    shape = (*lead, N) if C is None else (*lead, N, C)
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    if complex_weights:
        w = torch.complex(w, torch.randn(shape, generator=g, dtype=torch.float64))
        w = w.to(torch.complex64 if dtype != torch.float64 else torch.complex128)
    else:
        w = w.to(dtype)
    return x.to(dtype).to(device), y.to(dtype).to(device), w.to(device)


def expected_dtype(coords_dtype, kernel, complex_weights):
    if kernel == "helmholtz" or complex_weights:
        return torch.complex128 if coords_dtype == torch.float64 else torch.complex64
    return coords_dtype


# ---------------------------------------------------------------- against the oracle
WEIGHTS = [  # (C, complex)
    (None, False), (3, False), (16, False), (None, True), (3, True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("C,complex_weights", WEIGHTS)
def test_matches_oracle(device, kernel, dtype, C, complex_weights):
    # 700 sources: two full tiles of 256 and a partial one, full and partial blocks of 64.
    x, y, w = make_inputs(300, 700, C=C, complex_weights=complex_weights, dtype=dtype, device=device, seed=1)
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    assert out.dtype == expected_dtype(dtype, kernel, complex_weights)
    assert out.shape == ((300,) if C is None else (300, C))
    assert out.device == x.device
    assert rel_l2(out, oracle(x, y, w, kernel)) <= tolerance(dtype, kernel)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_many_targets(device, kernel):
    """Enough targets for the many-targets-per-thread CUDA kernels (and their source splits)."""
    x, y, w = make_inputs(40_000, 1500, C=2, device=device, seed=2)
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    idx = torch.randperm(40_000, generator=torch.Generator().manual_seed(0))[:2000]
    assert rel_l2(out[idx.to(device)], oracle(x[idx.to(device)], y, w, kernel)) <= tolerance(torch.float32, kernel)


@requires_cuda
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("C,complex_weights", [(None, False), (2, False), (None, True)])
def test_few_sources_two_targets_per_thread(kernel, C, complex_weights):
    """Sources that fit one tile and more targets than one wave of one-target blocks holds (> 2048
    threads per SM on any GPU) but fewer than 4096 per SM of a 132-SM H100: the two-targets-per-thread
    variant there for the Gaussian and Laplace sums (complex weights: its other epilogue), one target
    per thread for Helmholtz (whose pairs outweigh a shared source read). 50 sources: a partial block of 64, the
    unrolled remainder. Two clouds of a target count that is not a multiple of a block's 256; the
    checked targets include each cloud's first and last 300 (a write past the first cloud's end would
    land on the second's first targets; memcheck sees one past the last cloud's). Elsewhere the same
    sizes take another variant and are checked all the same."""
    B, M = 2, 240_007
    x, y, w = make_inputs(M, 50, C=C, complex_weights=complex_weights, B=B, device="cuda", seed=5)
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    idx = torch.cat([torch.arange(300), torch.randperm(M, generator=torch.Generator().manual_seed(1))[:1000],
                     torch.arange(M - 300, M)]).cuda()
    assert rel_l2(out[:, idx], oracle(x[:, idx], y, w, kernel)) <= tolerance(torch.float32, kernel)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("C", [None, 2])
def test_batched(device, kernel, C):
    x, y, w = make_inputs(120, 500, C=C, B=3, device=device, seed=3)
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    assert out.shape == ((3, 120) if C is None else (3, 120, C))
    ref = oracle(x, y, w, kernel)
    assert rel_l2(out, ref) <= tolerance(torch.float32, kernel)
    for b in range(3):  # batches are independent sums
        torch.testing.assert_close(out[b], pointops.particle_sum(x[b], y[b], w[b], kernel, **PARAMS[kernel]),
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_dimensions(device, dim, dtype):
    x, y, w = make_inputs(200, 600, D=dim, C=3, dtype=dtype, device=device, seed=4)
    sigma = 0.1 * math.sqrt(dim)  # a comparable number of neighbours in every dimension
    out = pointops.particle_sum(x, y, w, "gaussian", sigma=sigma)
    assert rel_l2(out, oracle(x, y, w, "gaussian", sigma=sigma)) <= tolerance(dtype, "gaussian")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["laplace", "helmholtz"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_coincident_points_are_dropped(device, kernel, dtype):
    """Targets equal to sources (the self-interaction): those terms are dropped, the rest summed."""
    _, y, w = make_inputs(1, 900, dtype=dtype, device=device, seed=5)
    x = torch.cat([y[::3], y[:5] + 0.25])  # every third source, and 5 points coinciding with none
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    assert torch.isfinite(torch.view_as_real(out) if out.is_complex() else out).all()
    assert rel_l2(out, oracle(x, y, w, kernel)) <= tolerance(dtype, kernel)
    # Gradients stay finite too: the moments of coincident pairs are dropped with them.
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    f = pointops.particle_sum(xg, yg, w, kernel, **PARAMS[kernel])
    (f.real if f.is_complex() else f).sum().backward()
    assert torch.isfinite(xg.grad).all() and torch.isfinite(yg.grad).all()


@pytest.mark.parametrize("device", DEVICES)
def test_helmholtz_phase_up_to_100(device):
    """k r between 80 and 100 for every pair (opposite corners of the unit cube): float32 within
    1e-5, the contract for k r <= 100."""
    x, y, w = make_inputs(400, 3000, complex_weights=True, device=device, seed=30)
    x, y = 0.1 * x, 0.9 + 0.1 * y
    k = 100.0 / math.sqrt(3.0)
    out = pointops.particle_sum(x, y, w, "helmholtz", wavenumber=k)
    assert rel_l2(out, oracle(x, y, w, "helmholtz", wavenumber=k)) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_seed_three_planes(device):
    """The seed's case: the Gaussian field of 50 sources on three planes through the unit cube."""
    from pointops.demo.particle_sum import plane_targets

    targets = plane_targets(resolution=80).to(device)
    g = torch.Generator().manual_seed(0)
    sources = torch.rand(50, 3, generator=g).to(device)
    weights = (0.5 + torch.rand(50, generator=g)).to(device)
    out = pointops.particle_sum(targets, sources, weights, "gaussian", sigma=0.1)
    assert out.shape == (3 * 80 * 80,)
    assert rel_l2(out, oracle(targets, sources, weights, "gaussian", sigma=0.1)) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["gaussian", "laplace"])
def test_long_sum_accuracy(device, kernel):
    """2,000 targets x 200,000 sources of mixed sign in float32, within 1e-6 of float64."""
    x, y, w = make_inputs(2000, 200_000, device=device, seed=6)
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    assert rel_l2(out, oracle(x, y, w, kernel)) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_million_sources_accuracy(device):
    x, y, w = make_inputs(16, 1_000_000, device=device, seed=7)
    out = pointops.particle_sum(x, y, w, "gaussian", sigma=SIGMA)
    assert rel_l2(out, oracle(x, y, w, "gaussian")) <= 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", KERNELS)
def test_half_types(device, dtype, kernel):
    x, y, w = make_inputs(150, 400, C=2, dtype=dtype, device=device, seed=8)
    out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    assert out.dtype == expected_dtype(dtype, kernel, False)
    ref = oracle(x, y, w, kernel)  # on the half-rounded input values
    tol = tolerance(torch.float32, kernel) + (UNIT[dtype] if not out.is_complex() else 0.0)
    assert rel_l2(out, ref) <= tol


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    x, y, w = make_inputs(90, 300, C=4, device=device, seed=9)
    xs = x.t().contiguous().t()                                  # column-major
    ys = torch.cat([y, y], 1)[:, ::2]                            # stepped
    ys.copy_(y)
    ws = w.t().contiguous().t()[:, 1:3]                          # a slice of the columns
    out = pointops.particle_sum(xs, ys, ws, "gaussian", sigma=SIGMA)
    ref = pointops.particle_sum(x, y, w[:, 1:3].contiguous(), "gaussian", sigma=SIGMA)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_inputs_propagate(device):
    x, y, w = make_inputs(50, 300, device=device, seed=10)
    x[7, 1] = float("nan")
    for kernel in KERNELS:
        out = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
        bad = torch.isnan(torch.view_as_real(out).sum(-1) if out.is_complex() else out)
        assert bad[7] and bad.sum() == 1, kernel
        keep = torch.arange(50, device=device) != 7
        assert rel_l2(out[keep], oracle(x[keep], y, w, kernel)) <= tolerance(torch.float32, kernel)


@pytest.mark.parametrize("device", DEVICES)
def test_tiny_sigma_keeps_coincident_pairs(device):
    """sigma far below the float range of 1 / (2 sigma^2): exp(-0) = 1 for coincident points, 0 else."""
    x, y, w = make_inputs(10, 30, device=device, seed=11)
    x[:3] = y[:3]
    out = pointops.particle_sum(x, y, w, "gaussian", sigma=1e-30)
    expected = torch.zeros(10, device=device)
    expected[:3] = w[:3]
    assert torch.equal(out, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_module(device):
    x, y, w = make_inputs(40, 70, device=device, seed=12)
    module = pointops.ParticleSum("helmholtz", wavenumber=3.0)
    assert "helmholtz" in repr(module) and "wavenumber=3.0" in repr(module)
    assert torch.equal(module(x, y, w), pointops.particle_sum(x, y, w, "helmholtz", wavenumber=3.0))
    with pytest.raises(ValueError, match="kernel must be one of 'gaussian', 'laplace', 'helmholtz', got 'cauchy'"):
        pointops.ParticleSum("cauchy")


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_runs_bitwise_identical(device):
    for M, N in ((60, 50_000), (40_000, 3000)):  # few targets (split sources), many targets
        x, y, w = make_inputs(M, N, C=2, device=device, seed=13)
        first = pointops.particle_sum(x, y, w, "laplace")
        for _ in range(2):
            assert torch.equal(pointops.particle_sum(x, y, w, "laplace"), first)


# ---------------------------------------------------------------- empty inputs
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_inputs(device, kernel):
    p = PARAMS[kernel]
    x, y, w = make_inputs(6, 9, C=2, device=device, seed=14)
    dtype = expected_dtype(torch.float32, kernel, False)
    out = pointops.particle_sum(x[:0], y, w, kernel, **p)                     # M = 0
    assert out.shape == (0, 2) and out.dtype == dtype
    out = pointops.particle_sum(x, y[:0], w[:0], kernel, **p)                 # N = 0: zeros
    assert out.shape == (6, 2) and out.dtype == dtype and (out == 0).all()
    out = pointops.particle_sum(x, y, w[:, :0], kernel, **p)                  # C = 0
    assert out.shape == (6, 0)
    out = pointops.particle_sum(x[None, :0], y[None], w[None, :, 0], kernel, **p)  # batched, M = 0
    assert out.shape == (1, 0)
    out = pointops.particle_sum(x.expand(0, 6, 3), y.expand(0, 9, 3), w[:, 0].expand(0, 9), kernel, **p)  # B = 0
    assert out.shape == (0, 6)
    # gradients of empty sums are zeros of the inputs' shapes
    xg, yg, wg = (t.clone().requires_grad_() for t in (x, y[:0], w[:0]))
    f = pointops.particle_sum(xg, yg, wg, kernel, **p)
    (f.real if f.is_complex() else f).sum().backward()
    assert xg.grad.shape == x.shape and (xg.grad == 0).all()
    assert yg.grad.shape == (0, 3) and wg.grad.shape == (0, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_single_point(device):
    x, y, w = make_inputs(1, 1, device=device, seed=15)
    out = pointops.particle_sum(x, y, w, "gaussian", sigma=SIGMA)
    assert rel_l2(out, oracle(x, y, w, "gaussian")) <= 1e-6
    assert (pointops.particle_sum(y, y, w, "laplace") == 0).all()  # the only pair is coincident


# ---------------------------------------------------------------- gradients
def _loss(f, G):
    return (f * G).real.sum() if f.is_complex() else (f * G).sum()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("complex_weights", [False, True])
def test_gradcheck(device, kernel, complex_weights):
    x, y, w = make_inputs(4, 6, C=2, complex_weights=complex_weights, dtype=torch.float64, device=device, seed=16)
    x, y, w = (t.clone().requires_grad_() for t in (x, y, w))
    fn = lambda a, b, c: pointops.particle_sum(a, b, c, kernel, **PARAMS[kernel])  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, y, w), eps=1e-6, atol=1e-8, rtol=1e-6)
    # batched, vector weights, one input at a time
    xb, yb, wb = make_inputs(5, 4, B=2, complex_weights=complex_weights, dtype=torch.float64, device=device, seed=17)
    for i in range(3):
        args = [t.clone().requires_grad_(j == i) for j, t in enumerate((xb, yb, wb))]
        assert torch.autograd.gradcheck(fn, tuple(args), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_gaussian_dimensions(device):
    for dim in (1, 2, 7):  # 7: two passes of the any-dimension kernel's moments on CUDA
        x, y, w = make_inputs(4, 5, D=dim, C=2, dtype=torch.float64, device=device, seed=18)
        x, y, w = (t.clone().requires_grad_() for t in (x, y, w))
        fn = lambda a, b, c: pointops.particle_sum(a, b, c, "gaussian", sigma=0.3)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x, y, w), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("complex_weights", [False, True])
def test_float32_gradients_against_float64(device, kernel, complex_weights):
    x, y, w = make_inputs(300, 20_000, C=2, complex_weights=complex_weights, device=device, seed=19)
    G = torch.randn(300, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    if kernel == "helmholtz" or complex_weights:
        G = torch.complex(G, torch.randn(300, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    a, b, c = (t.clone().requires_grad_() for t in (x, y, w))
    f = pointops.particle_sum(a, b, c, kernel, **PARAMS[kernel])
    _loss(f, G.to(f.dtype).to(device)).backward()
    a64, b64, c64 = ((t.cpu().to(torch.complex128) if t.is_complex() else t.cpu().double()).requires_grad_()
                     for t in (x, y, w))
    _loss(dense_sum(a64, b64, c64, kernel), G).backward()
    grads = [(a.grad, b.grad, c.grad), (a64.grad, b64.grad, c64.grad)]
    for got, ref, name in zip(grads[0], grads[1], ("targets", "sources", "weights")):
        assert got.dtype == (w.dtype if name == "weights" else x.dtype)
        err = rel_l2(got, ref)
        assert err <= GRAD_TOL[kernel], f"{name}: {err:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_only_where_asked(device):
    x, y, w = make_inputs(30, 40, device=device, seed=20)
    a = x.clone().requires_grad_()
    pointops.particle_sum(a, y, w, "gaussian", sigma=SIGMA).sum().backward()
    assert a.grad is not None and y.grad is None and w.grad is None
    c = w.clone().requires_grad_()
    pointops.particle_sum(x, y, c, "gaussian", sigma=SIGMA).sum().backward()
    torch.testing.assert_close(c.grad, pointops.particle_sum(y, x, torch.ones(30, device=device), "gaussian",
                                                             sigma=SIGMA))


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("device", DEVICES)
def test_error_messages(device):
    x, y, w = make_inputs(5, 4, device=device, seed=21)
    ps = pointops.particle_sum
    with pytest.raises(RuntimeError, match="kernel must be one of 'gaussian', 'laplace', 'helmholtz', got 'cauchy'"):
        ps(x, y, w, "cauchy")
    with pytest.raises(RuntimeError, match="the gaussian kernel needs sigma"):
        ps(x, y, w)
    with pytest.raises(RuntimeError, match="sigma must be finite and > 0, got 0"):
        ps(x, y, w, sigma=0.0)
    with pytest.raises(RuntimeError, match="sigma must be finite and > 0, got -1"):
        ps(x, y, w, sigma=-1.0)
    with pytest.raises(RuntimeError, match="sigma must be finite and > 0, got nan"):
        ps(x, y, w, sigma=float("nan"))
    with pytest.raises(RuntimeError, match="sigma applies to the gaussian kernel only"):
        ps(x, y, w, "laplace", sigma=1.0)
    with pytest.raises(RuntimeError, match="the helmholtz kernel needs wavenumber"):
        ps(x, y, w, "helmholtz")
    with pytest.raises(RuntimeError, match="wavenumber must be finite, got inf"):
        ps(x, y, w, "helmholtz", wavenumber=float("inf"))
    with pytest.raises(RuntimeError, match="wavenumber applies to the helmholtz kernel only"):
        ps(x, y, w, "gaussian", sigma=1.0, wavenumber=2.0)
    with pytest.raises(RuntimeError, match=r"the laplace kernel needs D = 3, got targets of shape \[5, 2\]"):
        ps(x[:, :2], y[:, :2], w, "laplace")
    with pytest.raises(RuntimeError, match="the helmholtz kernel needs D = 3"):
        ps(x[:, :2], y[:, :2], w, "helmholtz", wavenumber=1.0)
    with pytest.raises(RuntimeError, match=r"weights must have shape \(N,\) or \(N, C\) with N = 4 \(the number of "
                                           r"sources\), got shape \[3\]"):
        ps(x, y, w[:3], sigma=1.0)
    with pytest.raises(RuntimeError, match=r"sources must have the same dimension D as targets \(3\), got shape \[4, 2\]"):
        ps(x, y[:, :2], w, sigma=1.0)
    with pytest.raises(RuntimeError, match=r"sources must have the same batch size B as targets \(2\), got shape"):
        ps(x.expand(2, 5, 3), y.expand(3, 4, 3), w.expand(2, 4), sigma=1.0)
    with pytest.raises(RuntimeError, match=r"weights must have shape \(B, N\) or \(B, N, C\) with B = 2, N = 4"):
        ps(x.expand(2, 5, 3), y.expand(2, 4, 3), w, sigma=1.0)
    with pytest.raises(RuntimeError, match=r"sources must be a 2-D \(N, D\) tensor like targets, got shape \[1, 4, 3\]"):
        ps(x, y[None], w, sigma=1.0)
    with pytest.raises(RuntimeError, match=r"targets must be a 2-D \(M, D\) or 3-D \(B, M, D\) tensor, got shape \[5\]"):
        ps(x[:, 0], y, w, sigma=1.0)
    with pytest.raises(RuntimeError, match="sources must have the same dtype as targets"):
        ps(x, y.double(), w, sigma=1.0)
    with pytest.raises(RuntimeError, match="weights must be Float or ComplexFloat to match targets"):
        ps(x, y, w.double(), sigma=1.0)
    with pytest.raises(RuntimeError, match="weights must be Half to match targets"):
        ps(x.half(), y.half(), w.to(torch.complex64), sigma=1.0)
    with pytest.raises(RuntimeError, match="targets must be float16, bfloat16, float32 or float64, got Long"):
        ps(x.long(), y.long(), w.long(), sigma=1.0)
    with pytest.raises(RuntimeError, match="the dimension D must be at least 1"):
        ps(x[:, :0], y[:, :0], w, sigma=1.0)


def test_cpu_refuses_more_accumulators_than_it_bounds():
    # 2^17 accumulators per target (16 MiB of scratch per thread): more is refused up front, never
    # an int overflow or a per-thread allocation that grows without bound.
    x, y = torch.rand(2, 3), torch.rand(2, 3)
    with pytest.raises(RuntimeError, match=r"131073 real weight column\(s\) x 1 part\(s\) need 131073 accumulators"):
        pointops.particle_sum(x, y, torch.rand(2, 2**17 + 1), "gaussian", sigma=1.0)
    with pytest.raises(RuntimeError, match=r"x \(1 \+ D\) = \(1 \+ 3\) moment slots need 160000 accumulators"):
        pointops.particle_sum(x.clone().requires_grad_(), y, torch.rand(2, 40000), "gaussian", sigma=1.0)
    assert pointops.particle_sum(x, y, torch.rand(2, 2**17), "gaussian", sigma=1.0).shape == (2, 2**17)


@requires_cuda
def test_error_different_devices():
    x, y, w = make_inputs(5, 4, seed=22)
    with pytest.raises(RuntimeError, match="sources must be on the same device as targets"):
        pointops.particle_sum(x.cuda(), y, w.cuda(), sigma=1.0)
    with pytest.raises(RuntimeError, match="weights must be on the same device as targets"):
        pointops.particle_sum(x.cuda(), y.cuda(), w, sigma=1.0)


# ---------------------------------------------------------------- CUDA specifics
@requires_cuda
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("M,N,C", [(50, 100_000, None), (3000, 2000, 5), (40_000, 700, 16), (70_000, 300, None)])
def test_cuda_matches_cpu(kernel, M, N, C):
    x, y, w = make_inputs(M, N, C=C, seed=23)
    cpu = pointops.particle_sum(x, y, w, kernel, **PARAMS[kernel])
    gpu = pointops.particle_sum(x.cuda(), y.cuda(), w.cuda(), kernel, **PARAMS[kernel])
    # Both are within the float32 contract of float64, so within twice it of each other.
    assert rel_l2(gpu, cpu.to(torch.complex128 if cpu.is_complex() else torch.float64)) <= 2 * tolerance(
        torch.float32, kernel)


@requires_cuda
def test_cuda_non_default_stream():
    x, y, w = make_inputs(3000, 5000, C=2, device="cuda", seed=24)
    expected = pointops.particle_sum(x, y, w, "gaussian", sigma=SIGMA)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = pointops.particle_sum(x, y, w, "gaussian", sigma=SIGMA)
    stream.synchronize()
    assert torch.equal(expected, got)


@pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_cuda_second_device():
    x, y, w = make_inputs(300, 2000, device="cuda:1", seed=25)
    out = pointops.particle_sum(x, y, w, "laplace")
    assert out.device == x.device
    assert rel_l2(out, oracle(x, y, w, "laplace")) <= 1e-6


# ---------------------------------------------------------------- torch.library / torch.compile
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, y, w = make_inputs(7, 9, C=2, device=device, seed=26)
    _, _, wc = make_inputs(7, 9, C=2, complex_weights=True, device=device, seed=26)
    ops = torch.ops.pointops
    for requires_grad in (False, True):
        a, b = x.clone().requires_grad_(requires_grad), y.clone().requires_grad_(requires_grad)
        c, cc = w.clone().requires_grad_(requires_grad), wc.clone().requires_grad_(requires_grad)
        torch.library.opcheck(ops.particle_sum.default, (a, b, c, "gaussian", SIGMA, None))
        torch.library.opcheck(ops.particle_sum.default, (a, b, c[:, 0], "laplace", None, None))
        torch.library.opcheck(ops.particle_sum.default, (a, b, cc, "helmholtz", None, WAVENUMBER))
    torch.library.opcheck(ops._particle_sum_moments.default, (x[None], y[None], w[None], "gaussian", SIGMA, None))
    torch.library.opcheck(ops._particle_sum_moments.default, (x[None], y[None], wc[None], "helmholtz", None, 2.0))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_matches_eager(device):
    torch._dynamo.reset()
    x, y, w = make_inputs(64, 80, C=2, device=device, seed=27)

    def loss_fn(a, b, c):
        f = pointops.particle_sum(a, b, c, "gaussian", sigma=0.3)
        h = pointops.ParticleSum("helmholtz", wavenumber=4.0)(a, b, c[:, 0])
        return f.square().sum() + h.abs().sum() + pointops.particle_sum(a, b, c, "laplace").mean()

    compiled = torch.compile(loss_fn, fullgraph=True)
    results = []
    for fn in (loss_fn, compiled):
        a, b, c = (t.clone().requires_grad_() for t in (x, y, w))
        loss = fn(a, b, c)
        loss.backward()
        results.append((loss.detach(), a.grad, b.grad, c.grad))
    for e, c in zip(*results):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


@requires_cuda
def test_cuda_graph_capture_and_replay():
    # Forward and all three gradients; no host sync anywhere (the sums are deterministic).
    g = torch.Generator().manual_seed(8)
    x = torch.rand(300, 3, generator=g).cuda().requires_grad_()
    y = torch.rand(500, 3, generator=g).cuda().requires_grad_()
    c = torch.randn(500, 2, generator=g).cuda().requires_grad_()

    def step():
        f = pointops.particle_sum(x, y, c, "gaussian", sigma=0.2)
        h = pointops.particle_sum(x, y, c[:, 0], "laplace")
        return (f, h) + torch.autograd.grad(f.sum() + h.sum(), (x, y, c))

    def refill(seed):
        g = torch.Generator().manual_seed(seed)
        for t in (x, y, c):
            t.copy_(torch.rand(t.shape, generator=g))

    check_cuda_graph(step, refill, exact=range(5))
