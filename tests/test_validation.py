"""The argument checks of the Python entry points (issue 10): one case per check, with the message
matched. TypeError for an argument of the wrong type, ValueError for a bad value of an argument
the Python layer owns (fscore's threshold and lengths, a cap beyond int64, a ParticleSum
parameter), RuntimeError where the C++ op's check speaks (those are tested beside each op).
Also: the valid edges these checks must keep accepting, and torch.compile(fullgraph=True) through
the checks with the scalars passed as arguments of the compiled function.
"""
import math

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
    # The case: a 1-D input used to fail with "not enough values to unpack".
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
    # The case: lengths of the wrong shape used to fail inside a broadcast.
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
