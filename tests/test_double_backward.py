"""Higher-order gradients: gradgradcheck (float64, finite differences against the analytic double
backward) for nearest_neighbor / chamfer / chamfer_distance, voxel_features and particle_sum, and a
clear error where a second derivative is not implemented (never a silent zero).

gradgradcheck's default tolerances (atol 1e-5, rtol 1e-3 on float64 central differences with eps
1e-6) hold because every function here is smooth at the random inputs: no two candidate
neighbours, no voxel boundary and no max-tie lies within eps of the evaluation point.
"""
import pytest
import torch

import pointops
from conftest import DEVICES, DeterministicAlgorithms

gradgradcheck = torch.autograd.gradgradcheck


@pytest.fixture(autouse=True)
def deterministic():
    """gradgradcheck runs each backward twice and wants bitwise equal results: on CUDA the
    reference cloud's gradient is scattered with float atomics unless deterministic algorithms are
    on (then a sort-based gather; the CPU always gathers)."""
    with DeterministicAlgorithms():
        yield


def random(*shape, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(device).requires_grad_()


# ---------------------------------------------------------------- nearest neighbour / chamfer
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", [1, 2])
def test_nearest_neighbor_and_chamfer(device, norm):
    x, y = random(2, 9, 3, device=device, seed=1), random(2, 7, 3, device=device, seed=2)
    xl, yl = torch.tensor([9, 4], device=device), torch.tensor([5, 0], device=device)  # padding; an empty cloud
    assert gradgradcheck(lambda a, b: pointops.nearest_neighbor(a, b, xl, yl, norm=norm)[0], (x, y))
    assert gradgradcheck(lambda a, b: pointops.chamfer(a, b, norm=norm)[:2], (x, y))
    assert gradgradcheck(lambda a, b: pointops.ChamferFunction.apply(a, b)[:2], (x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_chamfer_distance_with_normals(device):
    x, y = random(2, 8, 3, device=device, seed=3), random(2, 6, 3, device=device, seed=4)
    nx, ny = random(2, 8, 3, device=device, seed=5), random(2, 6, 3, device=device, seed=6)
    w = torch.tensor([0.5, 2.0], dtype=torch.float64, device=device)

    def loss(a, b, na, nb):
        value, normals = pointops.chamfer_distance(a, b, x_normals=na, y_normals=nb, weights=w)
        return value + normals
    assert gradgradcheck(loss, (x, y, nx, ny))
    assert gradgradcheck(lambda a, b: pointops.chamfer_distance(a, b, squared=False)[0], (x, y))


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_penalty_matches_the_closed_form(device):
    # loss = sum_i |x_i - y_nn(i)|^2, so grad_x = 2 (x - y_nn) and |grad_x|^2 = 4 loss; the gradient
    # of the penalty |grad_x|^2 with respect to x is therefore 4 grad_x = 8 (x - y_nn).
    x, y = random(1, 30, 3, device=device, seed=7), random(1, 20, 3, device=device, seed=8)
    dist, idx = pointops.nearest_neighbor(x, y)
    (grad_x,) = torch.autograd.grad(dist.sum(), x, create_graph=True)
    (penalty_grad,) = torch.autograd.grad(grad_x.pow(2).sum(), x)
    nearest = y[0, idx[0]].detach()
    torch.testing.assert_close(penalty_grad[0], 8 * (x[0].detach() - nearest), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- voxel_features
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_voxel_features(device, reduce):
    g = torch.Generator().manual_seed(9)
    points = (torch.rand(60, 4, generator=g, dtype=torch.float64) * 2).to(device).requires_grad_()
    points.data[5] = float("nan")  # out of range: no gradient, no voxel

    def features(p):
        return pointops.voxel_features(p, [0.5, 0.5, 0.5], [0, 0, 0, 2, 2, 2], reduce)[0]
    assert gradgradcheck(features, (points,))
    # A second-order quantity that is not zero: the gradient of |d(sum f^2)/dp|^2 with respect to
    # the output weights exercises the adjoint of the backward (d/d grad_features).
    f = features(points)
    (grad_points,) = torch.autograd.grad((f * f).sum(), points, create_graph=True)
    (second,) = torch.autograd.grad(grad_points.pow(2).sum(), points)
    assert second.abs().sum() > 0 and torch.isfinite(second).all()


# ---------------------------------------------------------------- particle sums
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weights", ["vector", "columns", "complex", "batched"])
def test_gaussian_particle_sum(device, weights):
    shapes = {"vector": ((6, 3), (5, 3), (5,)), "columns": ((6, 2), (5, 2), (5, 3)),
              "complex": ((6, 3), (5, 3), (5, 2)), "batched": ((2, 6, 3), (2, 5, 3), (2, 5))}[weights]
    x = random(*shapes[0], device=device, seed=10, scale=0.3)
    y = random(*shapes[1], device=device, seed=11, scale=0.3)
    c = random(*shapes[2], device=device, seed=12)
    if weights == "complex":
        c = torch.complex(c.detach(), c.detach().flip(0)).requires_grad_()
    assert gradgradcheck(lambda a, b, w: pointops.particle_sum(a, b, w, "gaussian", sigma=0.4), (x, y, c))


@pytest.mark.parametrize("device", DEVICES)
def test_gaussian_first_derivatives_agree_with_and_without_create_graph(device):
    # create_graph takes the composite (differentiable) route; the plain backward the fused kernel.
    x = random(40, 3, device=device, seed=13, scale=0.5) + 100.0  # far from the origin: the shift matters
    y = random(30, 3, device=device, seed=14, scale=0.5) + 100.0
    c = random(30, 2, device=device, seed=15)
    out = pointops.particle_sum(x, y, c, "gaussian", sigma=0.3)
    G = torch.randn_like(out)
    plain = torch.autograd.grad(out, (x, y, c), G, retain_graph=True)
    differentiable = torch.autograd.grad(out, (x, y, c), G, create_graph=True)
    for p, d in zip(plain, differentiable):
        assert d.requires_grad
        torch.testing.assert_close(d, p, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["laplace", "helmholtz"])
def test_singular_kernels_refuse_second_derivatives_of_position_gradients(device, kernel):
    params = {"laplace": {}, "helmholtz": {"wavenumber": 3.0}}[kernel]
    x, y, c = random(6, 3, device=device, seed=16), random(5, 3, device=device, seed=17), random(5, device=device, seed=18)
    out = pointops.particle_sum(x, y, c, kernel, **params)
    G = torch.randn_like(out)
    plain = torch.autograd.grad(out, (x, y, c), G, retain_graph=True)
    grads = torch.autograd.grad(out, (x, y, c), G, create_graph=True)
    for p, d in zip(plain, grads):  # first derivatives are right either way
        torch.testing.assert_close(d, p, rtol=1e-12, atol=1e-14)
    for g in grads[:2]:
        with pytest.raises(RuntimeError, match=f"implemented for kernel='gaussian' only, got kernel='{kernel}'"):
            torch.autograd.grad(g.real.sum() if g.is_complex() else g.sum(), (x, y, c), allow_unused=True)
    # The weights' gradient is itself a particle sum: its derivatives work (a mixed second derivative).
    def weight_gradient(a):
        o = pointops.particle_sum(a, y, c, kernel, **params)
        return torch.autograd.grad(o, c, G, create_graph=True)[0]
    assert torch.autograd.gradcheck(weight_gradient, (x,))
