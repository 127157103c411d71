"""Every public op family on a second GPU: with cuda:0 current, a call on cuda:1 tensors (the
launchers' device guards) returns on cuda:1 exactly what the same call returns on cuda:0, forward
and backward, allocates nothing on cuda:0 and leaves cuda:0 current. A call mixing cuda:0 and cuda:1
tensors is refused with an error that names the argument.

Needs a CUDA build and at least two GPUs (scripts/gpu_check.sh's ddp stage runs it); skipped
elsewhere. "Exactly" means bitwise: the ops are deterministic (voxelization by contract, particle
sums without float atomics, Chamfer's forward always and its backward under
torch.use_deterministic_algorithms), and both GPUs run the same kernels on the same inputs. That
needs two GPUs of the same model (the launchers size their grids from the SM count): the bitwise
tests skip on a mixed pair.
"""
import pytest
import torch

import pointops
from conftest import HAS_CUDA, DeterministicAlgorithms

pytestmark = pytest.mark.skipif(not HAS_CUDA or torch.cuda.device_count() < 2,
                                reason="needs a CUDA build of pointops and at least 2 CUDA GPUs")

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)
VOXEL = [0.5, 0.5, 0.5]
RANGE = [0.0, 0.0, 0.0, 4.0, 4.0, 4.0]


@pytest.fixture(autouse=True)
def cuda0_current():
    with torch.cuda.device(CUDA0):
        yield


@pytest.fixture
def same_gpu_model():
    a, b = (torch.cuda.get_device_properties(d) for d in (CUDA0, CUDA1))
    if (a.name, a.major, a.minor, a.multi_processor_count) != (b.name, b.major, b.minor, b.multi_processor_count):
        pytest.skip(f"bitwise comparisons need two GPUs of one model, got {a.name} and {b.name}")


def tensors_of(result):
    """The tensors of a result (tuples, NamedTuples, nested pairs), in order; None entries dropped."""
    if torch.is_tensor(result):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in tensors_of(item)]
    assert result is None, f"unexpected output {type(result).__name__}"
    return []


def seeded_like(t, seed):
    """A fixed random tensor like t (made on the CPU, so identical for both devices)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t.shape, generator=g, dtype=t.dtype).to(t.device)


def results_on(device, fn, args, differentiable):
    """fn's output tensors and, when ``differentiable`` names argument positions, the gradients
    of its differentiable outputs (against fixed random output gradients) with respect to those
    arguments; every tensor argument is copied to ``device`` first. With device cuda:1 it also
    checks that cuda:0 stays current and sees no allocation, after the forward and the backward."""
    args = [a.to(device) if torch.is_tensor(a) else a for a in args]
    for i in differentiable:
        args[i].requires_grad_()
    if device == CUDA1:
        torch.cuda.synchronize(CUDA0)
        torch.cuda.reset_peak_memory_stats(CUDA0)
        allocated_on_0 = torch.cuda.memory_allocated(CUDA0)
    outputs = tensors_of(fn(*args))
    results = [o.detach() for o in outputs]
    if device == CUDA1:
        assert torch.cuda.current_device() == 0, "the forward changed the current device"
    if differentiable:
        with_grad = [o for o in outputs if o.requires_grad]
        assert with_grad, "no output is differentiable"
        grads = torch.autograd.grad(with_grad, [args[i] for i in differentiable],
                                    [seeded_like(o, seed=k) for k, o in enumerate(with_grad)])
        results += list(grads)
        if device == CUDA1:
            assert torch.cuda.current_device() == 0, "the backward changed the current device"
    if device == CUDA1:
        # A launcher without its device guard would allocate its scratch (and launch) on cuda:0.
        assert torch.cuda.max_memory_allocated(CUDA0) == allocated_on_0, "the cuda:1 call allocated on cuda:0"
    return results


def assert_same_on_both_gpus(fn, args, differentiable=(), grad_tolerance=None):
    """fn(*args) on cuda:1 (cuda:0 current) gives bitwise the results on cuda:0, on cuda:1.
    ``grad_tolerance`` (rtol, atol) relaxes the gradients only, for a backward with float atomics."""
    expected = results_on(CUDA0, fn, args, differentiable)
    got = results_on(CUDA1, fn, args, differentiable)
    assert len(got) == len(expected)
    num_outputs = len(got) - len(differentiable)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.device == CUDA1, f"result {k} is on {g.device}"
        rtol, atol = grad_tolerance if (grad_tolerance and k >= num_outputs) else (0.0, 0.0)
        torch.testing.assert_close(g.cpu(), e.cpu(), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, k=k: f"result {k} differs between cuda:1 and cuda:0: {m}")


# ---------------------------------------------------------------- Chamfer / nearest neighbour
def clouds(B=2, N=500, M=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(B, N, 3, generator=g), torch.randn(B, M, 3, generator=g)
    return x, y, torch.tensor([N, N - 123]), torch.tensor([M - 45, M])


# Chamfer's backward scatters into the other cloud with float atomics unless deterministic
# algorithms are on: then only the summation order differs between runs. Reordering a float32
# sum of k terms changes it by at most (k - 1) 2^-24 sum|t|; here a reference point gathers
# k <~ 10 queries with |t| = 2 |x - y| |g| <~ 12, so <~ 7e-5. A gradient computed on the wrong
# device or from the wrong memory is off by O(1).
ATOMICS_TOLERANCE = (1e-5, 1e-4)


@pytest.mark.usefixtures("same_gpu_model")
@pytest.mark.parametrize("op", ["nearest_neighbor", "chamfer"])
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("deterministic", [True, False])
def test_nearest_neighbor_and_chamfer_on_second_gpu(op, ragged, norm, deterministic):
    x, y, x_lengths, y_lengths = clouds(seed=norm)
    fn = lambda a, b, la, lb: getattr(pointops, op)(a, b, la, lb, norm=norm)  # noqa: E731
    lengths = (x_lengths, y_lengths) if ragged else (None, None)
    with DeterministicAlgorithms(deterministic):
        assert_same_on_both_gpus(fn, (x, y, *lengths), differentiable=(0, 1),
                                 grad_tolerance=None if deterministic else ATOMICS_TOLERANCE)


@pytest.mark.usefixtures("same_gpu_model")
@pytest.mark.parametrize("ragged", [False, True])
@pytest.mark.parametrize("point_reduction", ["mean", "max"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_chamfer_distance_on_second_gpu(ragged, point_reduction, deterministic):
    x, y, x_lengths, y_lengths = clouds(seed=3)
    lengths = (x_lengths, y_lengths) if ragged else (None, None)
    fn = lambda a, b, la, lb: pointops.chamfer_distance(a, b, la, lb, point_reduction=point_reduction)  # noqa: E731
    with DeterministicAlgorithms(deterministic):
        assert_same_on_both_gpus(fn, (x, y, *lengths), differentiable=(0, 1),
                                 grad_tolerance=None if deterministic else ATOMICS_TOLERANCE)


@pytest.mark.parametrize("op", ["nearest_neighbor", "chamfer", "chamfer_distance"])
def test_chamfer_family_refuses_two_gpus(op):
    fn = getattr(pointops, op)
    x, y, x_lengths, _ = clouds()
    with pytest.raises(RuntimeError, match=r"y must be on the same device as x \(cuda:0\), got cuda:1"):
        fn(x.to(CUDA0), y.to(CUDA1))
    with pytest.raises(RuntimeError, match=r"x_lengths must be on the same device as x \(cuda:1\), got cuda:0"):
        fn(x.to(CUDA1), y.to(CUDA1), x_lengths.to(CUDA0))
    assert torch.cuda.current_device() == 0


# ---------------------------------------------------------------- voxelization
def lidar_like(n=5000, seed=0):
    """x, y, z in [-1, 5)^3 (some points outside RANGE on every side) and an intensity column;
    a cloud index per point, unsorted."""
    g = torch.Generator().manual_seed(seed)
    points = torch.cat([torch.rand(n, 3, generator=g) * 6 - 1, torch.rand(n, 1, generator=g)], dim=1)
    return points, torch.randint(0, 3, (n,), generator=g)


@pytest.mark.usefixtures("same_gpu_model")
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("max_voxels", [100, 100_000])  # the cap binds / every voxel kept
def test_voxelize_on_second_gpu(batched, padded, max_voxels):
    points, batch = lidar_like(seed=max_voxels)
    fn = lambda p, b: pointops.voxelize(p, VOXEL, RANGE, 4, max_voxels, batch=b, padded=padded)  # noqa: E731
    assert_same_on_both_gpus(fn, (points, batch if batched else None))


@pytest.mark.usefixtures("same_gpu_model")
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("reduce", ["mean", "sum", "max"])
def test_voxel_features_on_second_gpu(batched, reduce):
    points, batch = lidar_like(seed=1)
    fn = lambda p, b: pointops.voxel_features(p, VOXEL, RANGE, reduce, batch=b)  # noqa: E731
    assert_same_on_both_gpus(fn, (points, batch if batched else None), differentiable=(0,))


def test_voxelize_refuses_two_gpus():
    points, batch = lidar_like()
    points, batch = points.to(CUDA1), batch.to(CUDA0)
    calls = {
        "voxelize": lambda: pointops.voxelize(points, VOXEL, RANGE, 4, 100, batch=batch),
        "voxelize padded": lambda: pointops.voxelize(points, VOXEL, RANGE, 4, 100, batch=batch, padded=True),
        "voxel_features": lambda: pointops.voxel_features(points, VOXEL, RANGE, "mean", batch=batch),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=r"batch must be on the same device as points \(cuda:1\), got cuda:0"):
            call()
    assert torch.cuda.current_device() == 0


# ---------------------------------------------------------------- particle sums
def particles(M, N, D=3, C=None, B=None, complex_weights=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead = () if B is None else (B,)
    x, y = torch.rand(*lead, M, D, generator=g), torch.rand(*lead, N, D, generator=g)
    shape = (*lead, N) if C is None else (*lead, N, C)
    w = torch.randn(shape, generator=g, dtype=torch.complex64 if complex_weights else torch.float32)
    return x, y, w


PARTICLE_CASES = {
    "gaussian, 2 right-hand sides": (particles(300, 2000, C=2), "gaussian", dict(sigma=0.1)),
    "gaussian, batched, D=2": (particles(200, 700, D=2, B=2), "gaussian", dict(sigma=0.2)),
    "laplace": (particles(300, 2000), "laplace", {}),
    "laplace, few targets, many sources": (particles(8, 60_000), "laplace", {}),  # sources split across blocks
    "helmholtz, complex weights": (particles(300, 2000, complex_weights=True), "helmholtz", dict(wavenumber=5.0)),
}


@pytest.mark.usefixtures("same_gpu_model")
@pytest.mark.parametrize("case", PARTICLE_CASES)
@pytest.mark.parametrize("with_grad", [False, True])  # with targets.requires_grad the forward also computes moments
def test_particle_sum_on_second_gpu(case, with_grad):
    (x, y, w), kernel, params = PARTICLE_CASES[case]
    fn = lambda a, b, c: pointops.particle_sum(a, b, c, kernel, **params)  # noqa: E731
    assert_same_on_both_gpus(fn, (x, y, w), differentiable=(0, 1, 2) if with_grad else ())


def test_particle_sum_refuses_two_gpus():
    x, y, w = particles(30, 40)
    with pytest.raises(RuntimeError, match=r"sources must be on the same device as targets \(cuda:0\), got cuda:1"):
        pointops.particle_sum(x.to(CUDA0), y.to(CUDA1), w.to(CUDA1), "laplace")
    with pytest.raises(RuntimeError, match=r"weights must be on the same device as targets \(cuda:1\), got cuda:0"):
        pointops.particle_sum(x.to(CUDA1), y.to(CUDA1), w.to(CUDA0), "laplace")
    assert torch.cuda.current_device() == 0
