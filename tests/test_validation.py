"""The argument checks of the Python entry points: one case per check, with the message
matched. TypeError for an argument of the wrong type, ValueError for a bad value of an argument
the Python layer owns (fscore's threshold and lengths, a cap beyond int64, a ParticleSum
parameter), RuntimeError where the C++ op's check speaks (those are tested beside each op).
Also: the valid edges these checks must keep accepting, and torch.compile(fullgraph=True) through
the checks with the scalars passed as arguments of the compiled function.
"""
import math
import re

import numpy as np
import pytest
import torch

import pointops
from conftest import DEVICES, requires_cuda

VOXEL = [0.5, 0.5, 0.5]
RANGE = [0.0, 0.0, 0.0, 4.0, 4.0, 4.0]


def chamfer_dists(device="cpu"):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(2, 5, 3, generator=g).to(device), torch.rand(2, 4, 3, generator=g).to(device)
    dist1, dist2, _, _ = pointops.chamfer(x, y)
    return dist1, dist2


# ---------------------------------------------------------------- fscore
@pytest.mark.parametrize("device", DEVICES)
def test_fscore_wrong_rank(device):
    dist1, dist2 = chamfer_dists(device)
    # Regression: a 1-D input used to fail with "not enough values to unpack".
    with pytest.raises(ValueError, match=r"fscore: dist1 must be a 2-D tensor \(B, N\), got shape \(5,\)"):
        pointops.fscore(dist1[0], dist2)
    with pytest.raises(ValueError, match=r"fscore: dist2 must be a 2-D tensor \(B, M\), got shape \(1, 2, 4\)"):
        pointops.fscore(dist1, dist2[None])
    with pytest.raises(ValueError, match=r"fscore: dist1 must be a 2-D tensor \(B, N\), got shape \(\)"):
        pointops.fscore(dist1[0, 0], dist2)


@pytest.mark.parametrize("device", DEVICES)
def test_fscore_threshold_values(device):
    dist1, dist2 = chamfer_dists(device)
    with pytest.raises(ValueError, match="fscore: threshold must be a non-negative squared distance, got -0.01"):
        pointops.fscore(dist1, dist2, -0.01)
    with pytest.raises(ValueError, match="fscore: threshold must be a non-negative squared distance, got nan"):
        pointops.fscore(dist1, dist2, math.nan)
    with pytest.raises(ValueError, match="fscore: threshold must be a non-negative squared distance, got -inf"):
        pointops.fscore(dist1, dist2, -math.inf)


def test_fscore_threshold_types():
    dist1, dist2 = chamfer_dists()
    for bad, shown in ((None, "NoneType None"), ("0.1", "str '0.1'"), (True, "bool True"),
                       (torch.tensor(0.1), r"Tensor tensor\(0.1000\)"), (0.1j, r"complex 0.1j")):
        with pytest.raises(TypeError, match=rf"fscore: threshold must be a real number \(a squared distance\), got {shown}"):
            pointops.fscore(dist1, dist2, bad)


def test_fscore_tensor_types():
    dist1, dist2 = chamfer_dists()
    with pytest.raises(TypeError, match=r"fscore: dist1 must be a tensor \(B, N\), got list"):
        pointops.fscore([[0.1]], dist2)
    with pytest.raises(TypeError, match=r"fscore: dist2 must be a tensor \(B, M\), got NoneType"):
        pointops.fscore(dist1, None)
    with pytest.raises(TypeError, match="fscore: dist1 must be a floating-point tensor of squared distances, got torch.int64"):
        pointops.fscore(dist1.long(), dist2)
    with pytest.raises(TypeError, match="fscore: dist2 must be a floating-point tensor of squared distances, got torch.complex64"):
        pointops.fscore(dist1, dist2.to(torch.complex64))
    with pytest.raises(TypeError, match="fscore: dist1 must be a floating-point tensor of squared distances, got torch.bool"):
        pointops.fscore(dist1 > 0, dist2)


def test_fscore_batch_mismatch():
    dist1, dist2 = chamfer_dists()
    with pytest.raises(ValueError, match=r"fscore: dist1 and dist2 must have the same batch size B, got dist1 \(2, 5\) "
                                         r"and dist2 \(1, 4\)"):
        pointops.fscore(dist1, dist2[:1])


@pytest.mark.parametrize("device", DEVICES)
def test_fscore_lengths(device):
    dist1, dist2 = chamfer_dists(device)
    lengths = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    # Regression: lengths of the wrong shape used to fail inside a broadcast.
    with pytest.raises(ValueError, match=r"fscore: x_lengths must have shape \(B,\) = \(2,\) to match dist1, got shape \(3,\)"):
        pointops.fscore(dist1, dist2, 0.1, lengths(1, 2, 3))
    with pytest.raises(ValueError, match=r"fscore: y_lengths must have shape \(B,\) = \(2,\) to match dist2, got shape \(1, 2\)"):
        pointops.fscore(dist1, dist2, 0.1, None, lengths([1, 2]))
    with pytest.raises(ValueError, match=r"fscore: x_lengths must lie in \[0, 5\] \(the points per cloud of dist1\), "
                                         r"got values in \[2, 6\]"):
        pointops.fscore(dist1, dist2, 0.1, lengths(6, 2))  # used to give a precision below the truth
    with pytest.raises(ValueError, match=r"fscore: y_lengths must lie in \[0, 4\] .* got values in \[-1, 4\]"):
        pointops.fscore(dist1, dist2, 0.1, None, lengths(-1, 4))
    with pytest.raises(TypeError, match=r"fscore: x_lengths must be an int64 \(or int32\) tensor, got torch.float32"):
        pointops.fscore(dist1, dist2, 0.1, lengths(5.0, 5.0))
    with pytest.raises(TypeError, match=r"fscore: y_lengths must be a tensor \(B,\) or None, got list"):
        pointops.fscore(dist1, dist2, 0.1, None, [4, 4])


@requires_cuda
def test_fscore_devices():
    dist1, dist2 = chamfer_dists("cuda")
    with pytest.raises(ValueError, match=r"fscore: dist2 must be on the same device as dist1 \(cuda:0\), got cpu"):
        pointops.fscore(dist1, dist2.cpu())
    with pytest.raises(ValueError, match=r"fscore: x_lengths must be on the same device as dist1 \(cuda:0\), got cpu"):
        pointops.fscore(dist1, dist2, 0.1, torch.tensor([5, 5]))


@pytest.mark.parametrize("device", DEVICES)
def test_fscore_valid_edges(device):
    dist1 = torch.tensor([[0.0, 0.5, math.nan, math.inf]], device=device)
    dist2 = torch.tensor([[0.25, 2.0]], device=device)
    # threshold 0 matches nothing; +inf matches every finite distance; numpy and int thresholds work.
    f, p, r = pointops.fscore(dist1, dist2, 0.0)
    assert f.tolist() == p.tolist() == r.tolist() == [0.0]
    f, p, r = pointops.fscore(dist1, dist2, math.inf)
    assert p.tolist() == [0.5] and r.tolist() == [1.0]  # NaN and inf never count as matched
    for threshold in (np.float32(1.0), np.float64(1.0), 1):
        f, p, r = pointops.fscore(dist1, dist2, threshold)
        assert p.tolist() == [0.5] and r.tolist() == [0.5] and f.tolist() == [0.5]
    # int32 lengths, and lengths at the bounds.
    f, p, r = pointops.fscore(dist1, dist2, 1.0, torch.tensor([2], dtype=torch.int32, device=device),
                              torch.tensor([0], device=device))
    assert p.tolist() == [1.0] and r.tolist() == [0.0]
    # Empty: no clouds, and clouds of no points: well-defined (B,) float32 outputs, zeros.
    for a, b in ((dist1[:0], dist2[:0]), (dist1[:, :0], dist2[:, :0])):
        for t in pointops.fscore(a, b, 1.0):
            assert t.shape == (a.shape[0],) and t.dtype == torch.float32 and not t.any()


def test_fscore_compile_fullgraph():
    # The checks trace (threshold is a Python float argument of the compiled function, so dynamo
    # may make it symbolic); the value check of the lengths is skipped in the graph.
    torch._dynamo.reset()
    dist1, dist2 = chamfer_dists()
    x_len, y_len = torch.tensor([3, 5]), torch.tensor([4, 1])
    fn = lambda a, b, t, xl, yl: pointops.fscore(a, b, t, xl, yl)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    for threshold in (0.05, 0.2):
        for got, want in zip(compiled(dist1, dist2, threshold, x_len, y_len), fn(dist1, dist2, threshold, x_len, y_len)):
            assert torch.equal(got, want)


# ---------------------------------------------------------------- voxelize / voxel_features / Voxelizer
@pytest.mark.parametrize("op", ["voxelize", "voxel_features"])
def test_voxel_points_and_batch_types(op):
    call = ((lambda p, **kw: pointops.voxelize(p, VOXEL, RANGE, 4, 10, **kw)) if op == "voxelize"
            else (lambda p, **kw: pointops.voxel_features(p, VOXEL, RANGE, **kw)))
    # None used to reach the dispatcher: "no fallback function is registered for schema ...".
    with pytest.raises(TypeError, match=r"voxelize: points must be a tensor \(N, F\), got NoneType"):
        call(None)
    with pytest.raises(TypeError, match=r"voxelize: points must be a tensor \(N, F\), got list"):
        call([[0.5, 0.5, 0.5]])
    with pytest.raises(TypeError, match=r"voxelize: batch must be a tensor \(N,\) int64 or None, got list"):
        call(torch.rand(3, 3), batch=[0, 0, 0])


@pytest.mark.parametrize("op", ["voxelize", "voxel_features"])
def test_voxel_type_checks_after_a_recognised_call(op):
    """voxelize recognises the tuples of its last plain call by identity (the per-call
    checks of the sequences are skipped for them); the tensor arguments are still checked."""
    vs, pr = tuple(VOXEL), tuple(RANGE)
    call = ((lambda p, **kw: pointops.voxelize(p, vs, pr, 4, 10, **kw)) if op == "voxelize"
            else (lambda p, **kw: pointops.voxel_features(p, vs, pr, **kw)))
    call(torch.rand(3, 3))  # recognised from here on
    with pytest.raises(TypeError, match=r"voxelize: points must be a tensor \(N, F\), got list"):
        call([[0.5, 0.5, 0.5]])
    with pytest.raises(TypeError, match=r"voxelize: batch must be a tensor \(N,\) int64 or None, got list"):
        call(torch.rand(3, 3), batch=[0, 0, 0])
    p = torch.rand(5, 3) * 4
    fresh = (pointops.voxelize(p, list(VOXEL), list(RANGE), 4, 10) if op == "voxelize"
             else pointops.voxel_features(p, list(VOXEL), list(RANGE)))
    for got, want in zip(call(p), fresh):  # the same result as a call that takes every check
        assert (got is None and want is None) or torch.equal(got, want)


@pytest.mark.parametrize("name", ["voxel_size", "point_range"])
def test_voxel_float_sequences(name):
    good = {"voxel_size": VOXEL, "point_range": RANGE}[name]

    def call(value):
        args = {"voxel_size": VOXEL, "point_range": RANGE, name: value}
        return pointops.voxelize(torch.rand(3, 3), args["voxel_size"], args["point_range"], 4, 10)

    with pytest.raises(TypeError, match=rf"voxelize: {name} must be a sequence of floats or a 1-D tensor, got NoneType"):
        call(None)
    with pytest.raises(TypeError, match=rf"voxelize: {name} must be a sequence of floats or a 1-D tensor, got float"):
        call(0.5)
    # A string is iterable: "0.5" used to fail with "could not convert string to float: '.'".
    with pytest.raises(TypeError, match=rf"voxelize: {name} must be a sequence of floats or a 1-D tensor, got str"):
        call("0.5")
    # ["1", ...] used to be parsed silently, True taken as 1.0.
    with pytest.raises(TypeError, match=rf"voxelize: {name}\[0\] must be a real number, got str '1'"):
        call(["1"] + good[1:])
    with pytest.raises(TypeError, match=rf"voxelize: {name}\[1\] must be a real number, got bool True"):
        call(good[:1] + [True] + good[2:])
    with pytest.raises(TypeError, match=rf"voxelize: {name}\[0\] must be a real number, got complex 1j"):
        call([1j] + good[1:])
    # A 2-D tensor used to be reported as "got list".
    with pytest.raises(ValueError, match=rf"voxelize: {name} must be a sequence of floats or a 1-D tensor, "
                                         r"got a tensor of shape \(1, 3\)"):
        call(torch.ones(1, 3))
    with pytest.raises(TypeError, match=rf"voxelize: {name} must hold real numbers, got a torch.complex64 tensor"):
        call(torch.ones(3, dtype=torch.complex64))
    # numpy values and arrays are sequences of real numbers.
    assert call(np.asarray(good, dtype=np.float32)).point_to_voxel.shape == (3,)


@pytest.mark.parametrize("name", ["max_points_per_voxel", "max_voxels"])
def test_voxel_int_arguments(name):
    def call(value, module=False):
        caps = {"max_points_per_voxel": 4, "max_voxels": 10, name: value}
        if module:
            return pointops.Voxelizer(VOXEL, RANGE, **caps)
        return pointops.voxelize(torch.rand(3, 3), VOXEL, RANGE, **caps)

    for module in (False, True):
        # int() used to truncate 2.7 to 2 and parse "5"; NaN raised "cannot convert float NaN to integer".
        for bad, shown in ((2.7, "float 2.7"), ("5", "str '5'"), (None, "NoneType None"), (True, "bool True"),
                           (math.nan, "float nan"), (torch.tensor(2.0), r"Tensor tensor\(2.\)")):
            with pytest.raises(TypeError, match=rf"voxelize: {name} must be an int, got {shown}"):
                call(bad, module)
        # Used to be the dispatcher's "Expected a value of type 'int' ... but instead found type 'int'".
        with pytest.raises(ValueError, match=rf"voxelize: {name} must fit in int64, got 9223372036854775808"):
            call(2**63, module)
    # The C++ bound, now also at the module's construction (it used to wait for the first call).
    with pytest.raises(RuntimeError, match=rf"voxelize: {name} must be >= 1, got 0"):
        call(0, module=True)


def test_voxel_int_arguments_accept_integers():
    points = torch.rand(20, 3) * 4
    want = pointops.voxelize(points, VOXEL, RANGE, 4, 10)
    for caps in ((np.int64(4), np.int32(10)), (torch.tensor(4), torch.tensor(10))):
        got = pointops.voxelize(points, VOXEL, RANGE, *caps)
        assert all(torch.equal(a, b) for a, b in zip(got[:5], want[:5]))
    assert pointops.Voxelizer(VOXEL, RANGE, np.int64(4), 10).max_points_per_voxel == 4


def test_voxel_padded_must_be_bool():
    # padded="no" used to be truthy.
    with pytest.raises(TypeError, match="voxelize: padded must be a bool, got str 'no'"):
        pointops.voxelize(torch.rand(3, 3), VOXEL, RANGE, 4, 10, padded="no")
    with pytest.raises(TypeError, match="voxelize: padded must be a bool, got int 1"):
        pointops.Voxelizer(VOXEL, RANGE, 4, 10, padded=1)


def test_voxel_grid_of_infinite_cells():
    # A subnormal voxel size makes (max - min) / size infinite: the C++ check says so, and the
    # Python mirror (Voxelizer, fake kernels) used to raise OverflowError from math.floor.
    with pytest.raises(RuntimeError, match="voxelize: the grid has inf cells along x; coordinates are int32"):
        pointops.Voxelizer([5e-324, 1.0, 1.0], RANGE, 4, 10)
    with pytest.raises(RuntimeError, match="voxelize: the grid has inf cells along y; coordinates are int32"):
        pointops.voxelize(torch.rand(3, 3), VOXEL, [0, -1e308, 0, 1, 1e308, 1], 4, 10)


def test_voxelize_compile_fullgraph_int_arguments():
    # The caps are int arguments of the compiled function: the int checks must trace.
    torch._dynamo.reset()
    points = torch.rand(50, 4) * 4
    fn = lambda p, mp, mv: pointops.voxelize(p, VOXEL, RANGE, mp, mv, padded=True)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True)
    for caps in ((3, 20), (2, 30)):
        for got, want in zip(compiled(points, *caps), fn(points, *caps)):
            assert torch.equal(got, want)


# ---------------------------------------------------------------- particle_sum / ParticleSum
def test_particle_sum_tensor_types():
    x, y, c = torch.rand(5, 3), torch.rand(4, 3), torch.rand(4)
    # None used to give "tensor does not have a device" (weights) or "got shape [0]" (targets).
    with pytest.raises(TypeError, match=r"targets must be a tensor \(M, D\) or \(B, M, D\), got NoneType"):
        pointops.particle_sum(None, y, c, sigma=1.0)
    with pytest.raises(TypeError, match=r"sources must be a tensor \(N, D\) or \(B, N, D\), got list"):
        pointops.particle_sum(x, y.tolist(), c, sigma=1.0)
    with pytest.raises(TypeError, match=r"weights must be a tensor \(N,\), \(N, C\), \(B, N\) or \(B, N, C\), got NoneType"):
        pointops.particle_sum(x, y, None, sigma=1.0)
    with pytest.raises(TypeError, match=r"weights must be a tensor .* got NoneType"):
        pointops.ParticleSum(sigma=1.0)(x, y, None)


def test_particle_sum_module_checks_parameters_at_construction():
    # These used to construct, and fail (RuntimeError) only at the first call.
    cases = [
        (dict(kernel="gaussian"), "the gaussian kernel needs sigma \\(its width\\), got none"),
        (dict(kernel="gaussian", sigma=-1.0), "sigma must be finite and > 0, got -1.0"),
        (dict(kernel="gaussian", sigma=0), "sigma must be finite and > 0, got 0.0"),
        (dict(kernel="gaussian", sigma=math.nan), "sigma must be finite and > 0, got nan"),
        (dict(kernel="gaussian", sigma=math.inf), "sigma must be finite and > 0, got inf"),
        (dict(kernel="laplace", sigma=0.1), "sigma applies to the gaussian kernel only, got sigma=0.1 with kernel 'laplace'"),
        (dict(kernel="helmholtz"), "the helmholtz kernel needs wavenumber \\(k\\), got none"),
        (dict(kernel="helmholtz", wavenumber=math.nan), "wavenumber must be finite, got nan"),
        (dict(kernel="helmholtz", wavenumber=-math.inf), "wavenumber must be finite, got -inf"),
        (dict(kernel="gaussian", sigma=0.1, wavenumber=2.0),
         "wavenumber applies to the helmholtz kernel only, got wavenumber=2.0 with kernel 'gaussian'"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            pointops.ParticleSum(**kwargs)


def test_particle_sum_module_parameter_types():
    # float("abc") used to raise "could not convert string to float", float([1.0]) a TypeError
    # naming no argument; True used to be taken as 1.0.
    for bad, shown in (("abc", "str 'abc'"), ([1.0], r"list \[1.0\]"), (True, "bool True"), (1j, "complex 1j")):
        with pytest.raises(TypeError, match=rf"sigma must be a real number or None, got {shown}"):
            pointops.ParticleSum("gaussian", sigma=bad)
        with pytest.raises(TypeError, match=rf"wavenumber must be a real number or None, got {shown}"):
            pointops.ParticleSum("helmholtz", wavenumber=bad)
    # Real numbers of other types are fine.
    assert pointops.ParticleSum("gaussian", sigma=np.float32(0.5)).sigma == 0.5
    assert pointops.ParticleSum("helmholtz", wavenumber=3).wavenumber == 3.0


# ---------------------------------------------------------------- build_info
def test_build_info():
    info = pointops.build_info()
    assert {"version", "cuda", "cuda_version", "torch_version", "loaded"} <= set(info)
    assert info["version"] == pointops.__version__ and isinstance(info["cuda"], bool)
    with pytest.raises(TypeError):
        pointops.build_info(True)


# ---------------------------------------------------------------- nearest_neighbor / chamfer_distance
def assert_clear_error(call, argument):
    """The call raises RuntimeError / ValueError / TypeError (not NotImplementedError) naming `argument`."""
    with pytest.raises(Exception) as info:
        call()
    error = info.value
    assert isinstance(error, (RuntimeError, ValueError, TypeError)) and not isinstance(error, NotImplementedError), (
        repr(error))
    assert re.search(rf"(?<!\w){argument}(?!\w)", str(error)), repr(error)


def test_nearest_neighbor_non_tensors():
    for call in (pointops.nearest_neighbor, pointops.chamfer, pointops.ChamferFunction.apply):
        with pytest.raises(TypeError, match="x must be a torch.Tensor, got NoneType"):
            call(None, torch.rand(1, 4, 3))
        with pytest.raises(TypeError, match="y must be a torch.Tensor, got list"):
            call(torch.rand(1, 4, 3), [[0.0, 0.0, 0.0]])


def test_chamfer_distance_complex_lengths():
    # The lengths' values are read (one sync) only after their dtype is known to be an integer.
    assert_clear_error(lambda: pointops.chamfer_distance(torch.rand(2, 5, 3), torch.rand(2, 4, 3),
                                                         torch.tensor([1j, 1j])), "x_lengths")


def test_chamfer_distance_complex_weights():
    assert_clear_error(lambda: pointops.chamfer_distance(torch.rand(2, 5, 3), torch.rand(2, 4, 3),
                                                         weights=torch.tensor([1j, 1j])), "weights")


def test_chamfer_distance_integer_normals():
    x, y = torch.rand(2, 5, 3), torch.rand(2, 4, 3)
    assert_clear_error(lambda: pointops.chamfer_distance(x, y, x_normals=x.long(), y_normals=y.long()), "x_normals")


def test_chamfer_norm_is_an_int_not_a_flag():
    x, y = torch.rand(2, 5, 3), torch.rand(2, 4, 3)
    with pytest.raises(ValueError, match="Support for 1 or 2 norm, got norm=True"):
        pointops.chamfer_distance(x, y, norm=True)
    with pytest.raises(ValueError, match="squared=False applies to norm=2 only"):
        pointops.ChamferLoss(norm=1, squared=False)  # refused when built, not at the first call


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (a second device for the lengths)")
def test_chamfer_distance_lengths_on_another_device():
    x, y = torch.rand(2, 5, 3), torch.rand(2, 4, 3)
    assert_clear_error(lambda: pointops.chamfer_distance(x, y, torch.tensor([5, 5], device="cuda")), "x_lengths")
