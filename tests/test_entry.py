"""The fronts call each op overload's C++ entry (pointops/_entry.py) instead of the OpOverload:
the same dispatch for modes, subclasses and torch.compile, one Python frame less.

CPU only: the entry is the same object for every device (the dispatcher picks the kernel), and the
CUDA tests of every family run through the same fronts."""
import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pointops
from pointops import _entry, strided

OPS = torch.ops.pointops


class _RecordOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def _module(name):
    return importlib.import_module(f"pointops.{name}")  # the module, not the package's function of that name


def _calls():
    """(front call, module, the module's global holding the entry, the overload) for every front
    that calls an eager entry."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(2, 5, 3, generator=g), torch.rand(2, 4, 3, generator=g)
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    m, w = torch.rand(3, 4, generator=g), torch.rand(4, generator=g)
    vs, pr = (0.5, 0.5, 0.5), (0.0, 0.0, 0.0, 1.0, 1.0, 1.0)
    st, ch, cl, ps, nb, vx = (_module(n) for n in ("strided", "chamfer", "chamfer_loss", "particle_sum", "neighbors",
                                                    "voxelize"))
    return [
        (lambda: strided.map(m, "exp"), st, "_MAP", OPS.strided_map.default),
        (lambda: strided.map(m, "exp", out=torch.empty_like(m)), st, "_MAP_OUT", OPS.strided_map_out.default),
        (lambda: strided.zip(m, m, "add"), st, "_ZIP", OPS.strided_zip.default),
        (lambda: strided.zip(m, m, "add", out=torch.empty_like(m)), st, "_ZIP_OUT", OPS.strided_zip_out.default),
        (lambda: strided.reduce(m, 0), st, "_REDUCE", OPS.strided_reduce.default),
        (lambda: strided.matmul(m, m.T), st, "_MATMUL", OPS.strided_matmul.default),
        (lambda: pointops.nearest_neighbor(x, y), ch, "_NEAREST_NEIGHBOR", OPS.nearest_neighbor.default),
        (lambda: pointops.chamfer(x, y), ch, "_CHAMFER", OPS.chamfer.default),
        (lambda: pointops.ChamferFunction.apply(x, y), ch, "_CHAMFER", OPS.chamfer.default),
        (lambda: torch.autograd.grad(pointops.ChamferFunction.apply(xg, yg)[0].sum(), (xg, yg)), ch,
         "_NEAREST_NEIGHBOR_BACKWARD", OPS._nearest_neighbor_backward.default),
        (lambda: pointops.chamfer_distance(x, y), cl, "_CHAMFER_DISTANCE", OPS._chamfer_distance.default),
        (lambda: pointops.particle_sum(x[0], y[0], w, sigma=0.5), ps, "_PARTICLE_SUM", OPS.particle_sum.default),
        (lambda: pointops.knn_points(x, y, K=2), nb, "_KNN_POINTS", OPS.knn_points.default),
        (lambda: pointops.ball_query(x, y, K=2, radius=0.5), nb, "_BALL_QUERY", OPS.ball_query.default),
        (lambda: pointops.sample_farthest_points(x, K=2, random_start_point=False), nb, "_SAMPLE_FARTHEST_POINTS",
         OPS.sample_farthest_points.default),
        (lambda: pointops.voxelize(x[0], vs, pr, 4, 8), vx, "_VOXELIZE", OPS.voxelize.default),
        (lambda: pointops.voxelize(x[0], vs, pr, 4, 8, padded=True), vx, "_VOXELIZE_PADDED",
         OPS.voxelize_padded.default),
        (lambda: pointops.voxel_features(x[0], vs, pr), vx, "_VOXEL_FEATURES", OPS.voxel_features.default),
    ]


@pytest.mark.parametrize("case", range(len(_calls())))
def test_dispatch_modes_see_what_the_overload_gives_them(case, monkeypatch):
    # A mode (as FakeTensorMode, make_fx and the profiler's hooks) must receive the same ops, and
    # the front return the same values, whether it calls the overload or its C++ entry.
    call, module, attr, overload = _calls()[case]
    entry = getattr(module, attr)
    assert entry is getattr(overload, "_op", overload), f"{attr} is not the overload's entry"
    with _RecordOps() as through_entry:
        got = call()
    monkeypatch.setattr(module, attr, overload)
    with _RecordOps() as through_overload:
        want = call()
    assert through_entry.seen == through_overload.seen
    assert any(str(op).startswith("pointops.") for op in through_entry.seen), through_entry.seen
    flat = torch.utils._pytree.tree_leaves
    for a, b in zip(flat(got), flat(want), strict=True):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_export_holds_the_overload():
    # torch.compile / export trace the C++ entry as the overload (torch.compiler.substitute_in_graph):
    # the exported graph names the op, not an opaque builtin.
    class Reduce(torch.nn.Module):
        def forward(self, x):
            return strided.reduce(x, 0)

    program = torch.export.export(Reduce(), (torch.rand(3, 4),))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert OPS.strided_reduce.default in targets, targets


def test_an_overload_without_a_cxx_entry_is_returned_as_is():
    class NotAnOverload:
        def __call__(self, *args):
            return args

    fake = NotAnOverload()
    assert _entry.eager_entry(fake) is fake
