"""Fuzzing every public pointops entry point: hypothesis draws shapes (0-size dims,
wrong ranks), dtypes (float16 ... complex64, int64, bool), values (NaN, +-Inf, 1e30, subnormals),
devices (cpu, and cuda when present), layouts (non-contiguous views, zero-stride views of more
than 2^31 points) and optional arguments (lengths out of range, batch indices, bad scalars).

Every call must either return outputs of the documented shapes and dtypes (indices in range or
-1), and survive a backward pass when its inputs require grad, or raise a RuntimeError, ValueError
or TypeError with a message; a ValueError or TypeError must name an argument of the call.

The examples run in a child process: this file run as a script, one target per child. A segfault
or an abort there is a non-zero exit code that fails the parent test with the child's output
(faulthandler's traceback and the last case tried), where it would otherwise kill pytest. On a
CPU-only run the child also caps its address space, so that an op trying to allocate tens of GB
raises "can't allocate memory" (which the checks below reject) instead of being OOM-killed.

Runs derandomized (the same examples on every run) with a bounded example count per target.
"""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TARGETS = ("nearest_neighbor", "chamfer", "chamfer_distance", "fscore", "voxelize", "voxel_features", "particle_sum")
EXAMPLES = 300  # per target; the whole file runs in about a minute on 2 CPU cores
CHILD_TIMEOUT_S = 240
ADDRESS_SPACE_CAP = 8 * 2**30  # CPU-only child: far above its ~1 GB of address space, below the RAM


# ================================================================ parent side (pytest)
def run_child(target: str, last_case: Path) -> subprocess.CompletedProcess:
    import pointops  # the same package the child must import

    repo = Path(pointops.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
               POINTOPS_FUZZ_LAST_CASE=str(last_case))
    return subprocess.run([sys.executable, "-X", "faulthandler", str(Path(__file__).resolve()), target],
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env, cwd=str(repo))


def describe_exit(code: int) -> str:
    if code < 0:
        import signal
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit code {code}"


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz(target, tmp_path):
    last_case = tmp_path / "last_case.txt"
    proc = run_child(target, last_case)
    output = (proc.stdout + proc.stderr)[-8000:]
    if proc.returncode != 0:
        tried = last_case.read_text() if last_case.exists() else "(none recorded)"
        pytest.fail(f"fuzzing {target}: the child process ended with {describe_exit(proc.returncode)}.\n"
                    f"Last case tried: {tried}\nOutput:\n{output}")
    # The child's summary: the examples ran, and they reached both outcomes (a strategy that only
    # ever errors would test nothing past the argument checks).
    summary = re.search(rf"fuzzed {target}: (\d+) results, (\d+) errors", proc.stdout)
    assert summary, f"no summary line from the child:\n{output}"
    results, errors = int(summary.group(1)), int(summary.group(2))
    assert results >= EXAMPLES // 10 and errors >= EXAMPLES // 10, summary.group(0)


def test_a_crashing_child_fails_the_test(tmp_path):
    # The harness itself: a segfault in the child is reported as a signal, not as a pass.
    proc = run_child("_segfault", tmp_path / "last_case.txt")
    assert proc.returncode < 0 and describe_exit(proc.returncode) == "killed by signal SIGSEGV", proc.returncode
    assert "Fatal Python error: Segmentation fault" in proc.stderr


# ================================================================ child side (the examples)
ALLOWED_ERRORS = (RuntimeError, ValueError, TypeError)
STATS = {"results": 0, "errors": 0}


def record_case(case) -> None:
    """Write the case about to run where the parent reads it if this process dies during it."""
    path = os.environ.get("POINTOPS_FUZZ_LAST_CASE")
    if path:
        with open(path, "w") as f:
            f.write(describe(case))


def check_error(error: BaseException, argument_names) -> None:
    """An error is acceptable when it is one of the three types, says something, and (for a
    ValueError / TypeError, raised by our Python layer or by Python itself) names an argument."""
    kind = type(error).__name__
    message = str(error).strip()
    # NotImplementedError is a RuntimeError, but "lt_cpu not implemented for 'ComplexFloat'" is a
    # torch op failing inside our code, not a check.
    if not isinstance(error, ALLOWED_ERRORS) or isinstance(error, NotImplementedError):
        raise AssertionError(f"unexpected {kind}: {message}") from error
    assert message, f"{kind} with an empty message"
    # An allocation failure means a size was not checked before allocating (the child caps its
    # address space so that this raises rather than OOM-kills).
    assert "allocate" not in message, f"{kind} from an allocation: {message}"
    if isinstance(error, (ValueError, TypeError)):
        assert any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message) for name in argument_names), (
            f"{kind} names none of the arguments {sorted(argument_names)}: {message}")


def attempt(call, argument_names, check_result):
    """Run `call`; check its result with `check_result` or its error with `check_error`."""
    try:
        out = call()
    except AssertionError:
        raise
    except Exception as error:  # noqa: BLE001 -- every exception type is judged by check_error
        check_error(error, argument_names)
        STATS["errors"] += 1
        return
    check_result(out)
    STATS["results"] += 1


def backward_through(tensors, inputs) -> None:
    """A backward pass from every floating output to the inputs that require grad; the gradients
    must have the inputs' shapes."""
    import torch

    outputs = [t for t in tensors if t is not None and t.requires_grad]
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not outputs or not leaves:
        return
    total = sum(t.real.sum() if t.is_complex() else t.sum() for t in outputs)
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    for leaf, grad in zip(leaves, grads):
        assert grad is None or grad.shape == leaf.shape, (grad.shape, leaf.shape)


def child_main(target: str) -> None:
    import faulthandler

    faulthandler.enable()
    if target == "_segfault":
        import ctypes
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    import torch

    if not torch.cuda.is_available():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))

    import pointops  # noqa: F401
    from hypothesis import HealthCheck, given, settings

    strategy, body = FUZZERS[target]()
    run = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
                   suppress_health_check=list(HealthCheck))(given(strategy)(body))
    run()
    print(f"fuzzed {target}: {STATS['results']} results, {STATS['errors']} errors", flush=True)


# ---------------------------------------------------------------- strategies
def strategies():
    """The strategy helpers, built only in the child (hypothesis and torch are imported there)."""
    import torch
    from hypothesis import strategies as st

    float_dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    other_dtypes = [torch.int64, torch.bool, torch.complex64]
    special = [math.nan, math.inf, -math.inf, 1e30, -1e30, 1e-40, 5e-324, 0.0, -0.0]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and pointops_has_cuda() else [])

    def mostly(valid, invalid):
        """A valid value about 11 times in 12: every argument can be wrong, but a call with
        several arguments must still often be all valid to reach the kernels. (sampled_from over a
        repeated list: st.one_of picks its branches about evenly whatever their number.)"""
        repeats = max(1, math.ceil(11 * len(invalid) / len(valid)))
        return st.sampled_from(list(valid) * repeats + list(invalid))

    def dtypes():
        return mostly(float_dtypes, other_dtypes)

    def sizes(high=6):
        return st.one_of(st.integers(1, high), st.sampled_from([0, 1]))  # empty about 1 time in 4

    def shapes(rank, high=6):
        return st.lists(sizes(high), min_size=rank, max_size=rank).map(tuple)

    @st.composite
    def tensors(draw, shape, dtype, device, scale=1.0, offset=0.0):
        """Normal values, or with a sprinkle of specials (NaN, Inf, 1e30, subnormal), or one
        constant; sometimes a non-contiguous view."""
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        values = torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset
        kind = draw(st.sampled_from(["normal", "normal", "special", "constant"]))
        if kind == "special" and values.numel() > 0:
            fills = torch.tensor(draw(st.lists(st.sampled_from(special), min_size=1, max_size=3)), dtype=torch.float64)
            mask = torch.rand(shape, generator=g) < draw(st.sampled_from([0.1, 0.5, 1.0]))
            values = torch.where(mask, fills[torch.randint(len(fills), shape, generator=g)], values)
        elif kind == "constant":
            values = torch.full(shape, draw(st.sampled_from(special + [1.0])), dtype=torch.float64)
        t = values.to(dtype)
        if len(shape) > 0 and draw(st.booleans()):
            t = t.repeat_interleave(2, dim=-1)[..., ::2]  # same values, last-dim stride 2
        return t.to(device)

    @st.composite
    def lengths(draw, batch, points, device):
        """None, or per-cloud lengths: mostly in range, sometimes past either end, of the wrong
        dtype or shape, or not a tensor."""
        kind = draw(mostly(["none", "valid"], ["out_of_range", "dtype", "shape", "list"]))
        if kind == "none":
            return None
        if kind == "list":
            return [points] * batch
        dtype = draw(st.sampled_from([torch.int64, torch.int32]))
        if kind == "dtype":
            dtype = draw(st.sampled_from([torch.float32, torch.bool, torch.complex64]))
        low, high = (0, points) if kind != "out_of_range" else (-3, points + 3)
        if dtype == torch.int32:
            high = min(high, 2**31 - 1)  # the 2^31-point clouds
        values = draw(st.lists(st.integers(low, high), min_size=batch, max_size=batch))
        t = torch.tensor(values, dtype=dtype, device=device)
        return t[None] if kind == "shape" else t

    return dict(torch=torch, st=st, mostly=mostly, dtypes=dtypes, sizes=sizes, shapes=shapes,
                tensors=tensors, lengths=lengths, devices=devices)


def pointops_has_cuda() -> bool:
    import pointops
    return bool(pointops.build_info()["cuda"])


def huge_cloud(torch, batch, dim, dtype, device):
    """(batch, 2^31, dim) zeros as a zero-stride view: 2^31 points, no memory. The ops must refuse
    it by its size (at most 2^31 - 1 points per cloud) before copying it."""
    return torch.zeros(1, 1, max(dim, 1), dtype=dtype, device=device).expand(batch, 2**31, max(dim, 1))


# ---------------------------------------------------------------- nearest_neighbor / chamfer / ChamferFunction
CLOUD_ARGUMENTS = {"x", "y", "x_lengths", "y_lengths", "norm"}


def cloud_pair_strategy(s):
    st, torch = s["st"], s["torch"]

    @st.composite
    def cloud_pair(draw):
        device = draw(st.sampled_from(s["devices"]))
        dtype = draw(s["dtypes"]())
        B, N, M, D = draw(s["sizes"](3)), draw(s["sizes"]()), draw(s["sizes"]()), draw(s["mostly"]([1, 2, 3, 4], [0]))
        x_rank = draw(s["mostly"]([3], [0, 1, 2, 4]))
        x_shape = (B, N, D) if x_rank == 3 else draw(s["shapes"](x_rank))
        y_shape = (B, M, D)
        mismatch = draw(s["mostly"]([None], ["batch", "dim", "dtype", "device"]))
        if mismatch == "batch":
            y_shape = (B + 1, M, D)
        elif mismatch == "dim":
            y_shape = (B, M, D + 1)
        y_dtype = draw(s["dtypes"]()) if mismatch == "dtype" else dtype
        y_device = draw(st.sampled_from(s["devices"])) if mismatch == "device" else device
        scale = draw(st.sampled_from([1.0, 1e-3, 1e20]))
        x = draw(s["tensors"](x_shape, dtype, device, scale))
        y = draw(s["tensors"](y_shape, y_dtype, y_device, scale))
        if draw(s["mostly"]([False], [True])):  # more than 2^31 - 1 points, refused before any copy
            if draw(st.booleans()):
                x = huge_cloud(torch, B, D, dtype, device)
            else:
                y = huge_cloud(torch, B, D, y_dtype, y_device)
        x_len = draw(s["lengths"](B, x.shape[1] if x.dim() > 1 else 0, device))
        y_len = draw(s["lengths"](B, y.shape[1], device))
        norm = draw(s["mostly"]([2, 1], [0, 3, -1, 2.0]))
        requires_grad = draw(st.booleans())
        if requires_grad and x.is_floating_point() and y.is_floating_point():
            x.requires_grad_(True)
            y.requires_grad_(True)
        chamfer_op = draw(st.sampled_from(["chamfer", "ChamferFunction"]))  # for the "chamfer" target
        return dict(chamfer_op=chamfer_op, x=x, y=y, x_lengths=x_len, y_lengths=y_len, norm=norm)

    return cloud_pair()


def check_direction(torch, dist, idx, queries, refs, q_len, r_len):
    """One direction's documented contract: dist (B, N) in the query dtype, idx (B, N) int64 in
    [-1, M) (below the reference cloud's length), padding gets 0 / -1."""
    B, N, M = queries.shape[0], queries.shape[1], refs.shape[1]
    assert dist.shape == (B, N) and dist.dtype == queries.dtype, (dist.shape, dist.dtype)
    assert idx.shape == (B, N) and idx.dtype == torch.int64, (idx.shape, idx.dtype)
    if idx.numel() == 0:
        return
    limit = torch.full((B,), M, dtype=torch.int64, device=idx.device) if r_len is None else r_len.long()
    assert bool(((idx >= -1) & (idx < limit[:, None])).all()), f"index out of range: {idx}"
    if q_len is not None:
        padding = torch.arange(N, device=idx.device)[None, :] >= q_len.long()[:, None]
        assert bool((idx[padding] == -1).all()) and bool((dist[padding] == 0).all()), "padding was matched"


def fuzz_clouds(target):
    def make():
        s = strategies()
        torch = s["torch"]
        import pointops

        def body(case):
            record_case(case)
            x, y, xl, yl, norm = case["x"], case["y"], case["x_lengths"], case["y_lengths"], case["norm"]
            op = target if target == "nearest_neighbor" else case["chamfer_op"]
            if op == "nearest_neighbor":
                def call():
                    out = pointops.nearest_neighbor(x, y, xl, yl, norm=norm)
                    backward_through(out, (x, y))
                    return out

                def check(out):
                    check_direction(torch, out[0], out[1], x, y, xl, yl)
            else:
                def call():
                    if op == "ChamferFunction":
                        out = pointops.ChamferFunction.apply(x, y)
                    else:
                        out = pointops.chamfer(x, y, xl, yl, norm=norm)
                    backward_through(out[:2], (x, y))
                    return out

                def check(out):
                    lens = (xl, yl) if op == "chamfer" else (None, None)
                    check_direction(torch, out[0], out[2], x, y, *lens)
                    check_direction(torch, out[1], out[3], y, x, *reversed(lens))
            attempt(call, CLOUD_ARGUMENTS, check)

        return cloud_pair_strategy(s), body

    return make


# ---------------------------------------------------------------- chamfer_distance / ChamferLoss
def fuzz_chamfer_distance():
    s = strategies()
    st, torch = s["st"], s["torch"]
    import pointops

    arguments = CLOUD_ARGUMENTS | {"x_normals", "y_normals", "weights", "batch_reduction", "point_reduction",
                                   "single_directional", "abs_cosine", "squared"}

    @st.composite
    def case(draw):
        c = draw(cloud_pair_strategy(s))
        x, y = c["x"], c["y"]
        # Normals, weights: valid, wrong shape, wrong dtype (integer, complex), or None.
        normals = draw(s["mostly"](["none", "valid"], ["shape", "dtype"]))
        for name, cloud in (("x_normals", x), ("y_normals", y)):
            c[name] = None
            if normals != "none" and cloud.dim() == 3 and cloud.shape[1] <= 64:  # not the 2^31-point view
                shape = cloud.shape if normals != "shape" else (cloud.shape[0], cloud.shape[1] + 1, 3)
                dtype = cloud.dtype if cloud.is_floating_point() else torch.float32
                if normals == "dtype":
                    dtype = draw(st.sampled_from([torch.int64, torch.complex64]))
                c[name] = draw(s["tensors"](tuple(shape), dtype, cloud.device))
        c["weights"] = None
        if draw(st.booleans()) and x.dim() >= 1:
            B = x.shape[0] + draw(s["mostly"]([0], [1]))
            dtype = draw(s["mostly"]([torch.float32, torch.float64], [torch.int64, torch.complex64]))
            c["weights"] = draw(s["tensors"]((B,), dtype, x.device))
        c["point_reduction"] = draw(s["mostly"](["mean", "sum", "max", None], ["min"]))
        # batch_reduction must be None with point_reduction None, normals None with "max".
        c["batch_reduction"] = draw(s["mostly"]([None] if c["point_reduction"] is None else ["mean", "sum", None],
                                                ["median", "mean"]))
        if c["point_reduction"] == "max" and draw(s["mostly"]([True], [False])):
            c["x_normals"] = c["y_normals"] = None
        c["single_directional"] = draw(st.booleans())
        c["abs_cosine"] = draw(st.booleans())
        c["squared"] = draw(st.sampled_from([True, True, False]))
        c["module"] = draw(st.booleans())
        return c

    def body(c):
        record_case(c)
        x, y = c["x"], c["y"]
        kwargs = {k: c[k] for k in ("x_lengths", "y_lengths", "x_normals", "y_normals", "weights")}
        options = dict(batch_reduction=c["batch_reduction"], point_reduction=c["point_reduction"],
                       norm=c["norm"], single_directional=c["single_directional"], abs_cosine=c["abs_cosine"])

        def call():
            if c["module"]:
                out = pointops.ChamferLoss(**options, squared=c["squared"])(x, y, **kwargs)
            else:
                out = pointops.chamfer_distance(x, y, **kwargs, **options, squared=c["squared"])
            flat = [t for part in out if part is not None for t in (part if isinstance(part, tuple) else (part,))]
            backward_through(flat, (x, y))
            return out

        def check(out):
            loss, loss_normals = out
            B, N, M = x.shape[0], x.shape[1], y.shape[1]
            w = c["weights"]
            if w is not None and w.shape == (B,) and w.is_floating_point() and float(w.sum()) == 0:
                # PyTorch3D's early return: zeros from the points times the weights (dtypes
                # promoted), () or (B, B), for loss_normals too, normals or not
                shape = () if c["batch_reduction"] else (B, B)
                dtype = torch.promote_types(x.dtype, w.dtype)
                parts = [t for part in out for t in (part if isinstance(part, tuple) else (part,))]
                assert all(t.shape == shape and t.dtype == dtype and not t.any() for t in parts), parts
                return
            if c["point_reduction"] is None:
                expected = [(B, N)] if c["single_directional"] else [(B, N), (B, M)]
                got = [loss] if c["single_directional"] else list(loss)
            else:
                expected = [() if c["batch_reduction"] else (B,)]
                got = [loss]
            assert [tuple(t.shape) for t in got] == expected, ([t.shape for t in got], expected)
            assert all(t.dtype == x.dtype for t in got), [t.dtype for t in got]
            assert (loss_normals is None) == (c["x_normals"] is None or c["y_normals"] is None)

        attempt(call, arguments, check)

    return case(), body


# ---------------------------------------------------------------- fscore
def fuzz_fscore():
    s = strategies()
    st, torch = s["st"], s["torch"]
    import numpy as np

    import pointops

    arguments = {"dist1", "dist2", "threshold", "x_lengths", "y_lengths"}

    @st.composite
    def case(draw):
        device = draw(st.sampled_from(s["devices"]))
        B, N, M = draw(s["sizes"](3)), draw(s["sizes"]()), draw(s["sizes"]())
        ranks = draw(s["mostly"]([(2, 2)], [(1, 2), (2, 3), (0, 2), (2, 1)]))
        shape1 = (B, N) if ranks[0] == 2 else draw(s["shapes"](ranks[0]))
        shape2 = (B + draw(s["mostly"]([0], [1])), M) if ranks[1] == 2 else draw(s["shapes"](ranks[1]))
        dist1 = draw(s["tensors"](shape1, draw(s["dtypes"]()), device))
        dist2 = draw(s["tensors"](shape2, draw(s["dtypes"]()), device))
        dist1 = draw(s["mostly"]([dist1], [[[0.0]]]))  # or not a tensor
        threshold = draw(s["mostly"]([1e-3, 1.0, 0.0, math.inf, 1e30, 5e-324, np.float32(0.5)],
                                     [-1.0, math.nan, None, "0.1", True, torch.tensor(0.1)]))
        x_len = draw(s["lengths"](B, N, device))
        y_len = draw(s["lengths"](B, M, device))
        return dict(dist1=dist1, dist2=dist2, threshold=threshold, x_lengths=x_len, y_lengths=y_len)

    def body(c):
        record_case(c)

        def call():
            return pointops.fscore(c["dist1"], c["dist2"], c["threshold"], c["x_lengths"], c["y_lengths"])

        def check(out):
            B = c["dist1"].shape[0]
            for t in out:
                assert t.shape == (B,) and t.dtype == torch.float32, (t.shape, t.dtype)
                assert bool(((t >= 0) & (t <= 1)).all()), f"fscore output outside [0, 1]: {out}"

        attempt(call, arguments, check)

    return case(), body


# ---------------------------------------------------------------- voxelize / voxel_features / Voxelizer
VOXEL_ARGUMENTS = {"points", "voxel_size", "point_range", "max_points_per_voxel", "max_voxels", "batch", "padded",
                   "reduce"}


def voxel_strategy(s, features_op: bool):
    st, torch = s["st"], s["torch"]

    @st.composite
    def case(draw):
        device = draw(st.sampled_from(s["devices"]))
        dtype = draw(s["dtypes"]())
        N, F = draw(s["sizes"](40)), draw(s["mostly"]([3, 4, 5], [2, 0]))
        rank = draw(s["mostly"]([2], [0, 1, 3]))
        shape = (N, F) if rank == 2 else draw(s["shapes"](rank))
        points = draw(s["tensors"](shape, dtype, device, scale=draw(st.sampled_from([2.0, 1e30])), offset=1.0))
        huge = draw(s["mostly"]([False], [True]))
        if huge:  # more than 2^30 points, refused before any copy
            points = torch.zeros(1, 4, dtype=dtype, device=device).expand(2**30 + 1, 4)
        good_size = [0.5, 0.5, 0.5]
        voxel_size = draw(s["mostly"]([good_size, torch.tensor(good_size)], [
            [0.5, 0.5], [0.0, 0.5, 0.5], [-1.0, 0.5, 0.5], [math.nan, 0.5, 0.5], [math.inf, 0.5, 0.5],
            [5e-324, 1.0, 1.0], [1e-9, 1e-9, 1e-9], "0.5", None, 0.5, ["0.5", 0.5, 0.5], [True, 0.5, 0.5],
            torch.tensor([good_size]), torch.tensor([1j, 1, 1])]))
        point_range = draw(s["mostly"]([[-2.0, -2, -2, 4, 4, 4], [0.0, 0, 0, 1e3, 1e3, 1e3]], [
            [4.0, -2, -2, -2, 4, 4], [0.0, 0, 0, 0, 4, 4], [-2.0, -2, -2, 4, 4], [math.nan, -2, -2, 4, 4, 4],
            [-math.inf, -2, -2, 4, 4, 4], [-1e30, -1e30, -1e30, 1e30, 1e30, 1e30], [0.0, 0, 0, 0.1, 4, 4],
            None, "range", torch.tensor([-2.0, -2, -2, 4, 4, 4])]))
        # Caps: small values are allocated (V x P x F); the refused ones are checked before that.
        max_points = draw(s["mostly"]([1, 2, 5, 64], [0, -1, 2**31, 2**63, 2**70, 2.5, "5", None, True]))
        padded = draw(s["mostly"]([False, True], ["yes"]))
        big_voxels = [2**40] if padded is False else []  # padded allocates max_voxels rows
        max_voxels = draw(s["mostly"]([1, 3, 100] + big_voxels, [0, -5, 2**63, 3.0, None]))
        batch_kind = draw(s["mostly"](["none", "valid"], ["bad_index", "huge_index", "dtype", "shape", "list"]))
        rows = points.shape[0] if points.dim() >= 1 else 0
        batch = None
        if rows > 2**20:
            pass  # the 2^30-point view: no batch tensor of that size
        elif batch_kind == "list":
            batch = [0] * rows
        elif batch_kind != "none":
            high = {"valid": 3, "bad_index": 3, "huge_index": 2**40}.get(batch_kind, 3)
            low = -1 if batch_kind == "bad_index" else 0
            g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
            batch = torch.randint(low, high, (rows + (batch_kind == "shape"),), generator=g)
            batch = batch.to(torch.int32 if batch_kind == "dtype" else torch.int64).to(device)
        requires_grad = features_op and draw(st.booleans()) and points.is_floating_point() and not huge
        if requires_grad:
            points.requires_grad_(True)
        reduce = draw(s["mostly"](["mean", "sum", "max"], ["median", None]))
        module = draw(st.booleans())
        return dict(points=points, voxel_size=voxel_size, point_range=point_range, max_points_per_voxel=max_points,
                    max_voxels=max_voxels, batch=batch, padded=padded, reduce=reduce, module=module)

    return case()


def grid_dims(voxel_size, point_range):
    from pointops.voxelize import _check_grid, _floats
    return _check_grid(_floats(voxel_size, "voxel_size"), _floats(point_range, "point_range"))


def check_coords(torch, coords, num_points, batch, dims):
    cols = 3 if batch is None else 4
    assert coords.dim() == 2 and coords.shape[1] == cols and coords.dtype == torch.int32, (coords.shape, coords.dtype)
    real = coords[num_points > 0]
    upper = torch.tensor(([2**31 - 1] if batch is not None else []) + dims[::-1], device=coords.device)  # (b,) z, y, x
    assert bool(((real >= 0) & (real < upper)).all()), f"coords outside the grid {dims}: {real}"


def check_voxel_outputs(torch, out, points, batch, c):
    """The fields voxelize and voxel_features both return: shapes, dtypes, coords inside the grid,
    point_to_voxel in [-1, V). Returns V."""
    N, F = points.shape
    V = out.features.shape[0]
    assert out.features.shape == (V, F) and out.features.dtype == points.dtype
    assert out.num_points.shape == (V,) and out.num_points.dtype == torch.int32
    assert out.point_to_voxel.shape == (N,) and out.point_to_voxel.dtype == torch.int64
    check_coords(torch, out.coords, out.num_points, batch, grid_dims(c["voxel_size"], c["point_range"]))
    p2v = out.point_to_voxel
    assert bool(((p2v >= -1) & (p2v < V)).all()), f"point_to_voxel out of range: {p2v}"
    return V


def fuzz_voxelize():
    s = strategies()
    torch = s["torch"]
    import pointops

    def body(c):
        record_case(c)
        points, batch = c["points"], c["batch"]
        args = (points, c["voxel_size"], c["point_range"], c["max_points_per_voxel"], c["max_voxels"])

        def call():
            if c["module"]:
                return pointops.Voxelizer(*args[1:], padded=c["padded"])(points, batch)
            return pointops.voxelize(*args, batch=batch, padded=c["padded"])

        def check(out):
            P, cap = c["max_points_per_voxel"], c["max_voxels"]
            V = check_voxel_outputs(torch, out, points, batch, c)
            assert out.voxels.shape == (V, P, points.shape[1]) and out.voxels.dtype == points.dtype
            assert bool(((out.num_points >= 0) & (out.num_points <= P)).all())
            if c["padded"]:
                count = int(out.num_voxels)
                assert V == cap and out.num_voxels.dtype == torch.int64 and 0 <= count <= cap
                assert bool((out.num_points[:count] >= 1).all()) and bool((out.num_points[count:] == 0).all())
            else:
                assert out.num_voxels is None and V <= cap and bool((out.num_points >= 1).all())

        attempt(call, VOXEL_ARGUMENTS, check)

    return voxel_strategy(s, features_op=False), body


def fuzz_voxel_features():
    s = strategies()
    torch = s["torch"]
    import pointops

    def body(c):
        record_case(c)
        points, batch = c["points"], c["batch"]

        def call():
            out = pointops.voxel_features(points, c["voxel_size"], c["point_range"], c["reduce"], batch=batch)
            backward_through([out.features], [points])
            return out

        def check(out):
            check_voxel_outputs(torch, out, points, batch, c)
            p2v = out.point_to_voxel
            assert bool((out.num_points >= 1).all()) and int(out.num_points.sum()) == int((p2v >= 0).sum())

        attempt(call, VOXEL_ARGUMENTS, check)

    return voxel_strategy(s, features_op=True), body


# ---------------------------------------------------------------- particle_sum / ParticleSum
def fuzz_particle_sum():
    s = strategies()
    st, torch = s["st"], s["torch"]
    import pointops

    arguments = {"targets", "sources", "weights", "kernel", "sigma", "wavenumber"}
    complex_of = {torch.float32: torch.complex64, torch.float64: torch.complex128}

    @st.composite
    def case(draw):
        device = draw(st.sampled_from(s["devices"]))
        dtype = draw(s["dtypes"]())
        batched = draw(st.booleans())
        lead = (draw(s["sizes"](3)),) if batched else ()
        M, N, C = draw(s["sizes"]()), draw(s["sizes"]()), draw(s["sizes"](3))
        kernel = draw(s["mostly"](["gaussian", "laplace", "helmholtz"], ["cauchy", "Gaussian", None]))
        D = draw(s["mostly"]([1, 2, 3, 4] if kernel == "gaussian" else [3], [0, 2]))
        rank = draw(s["mostly"]([len(lead) + 2], [1, 4]))
        t_shape = lead + (M, D) if rank == len(lead) + 2 else draw(s["shapes"](rank))
        s_shape = lead + (N + draw(s["mostly"]([0], [1])), D + draw(s["mostly"]([0], [1])))
        vector = draw(st.booleans())
        w_shape = lead + ((N,) if vector else (N, C))
        w_shape = w_shape + draw(s["mostly"]([()], [(2,)]))  # or the wrong rank
        w_dtype = draw(s["mostly"]([dtype] + ([complex_of[dtype]] if dtype in complex_of else []),
                                   [torch.int64, torch.complex64, torch.complex128]))
        scale = draw(st.sampled_from([1.0, 1e-20, 1e20]))
        targets = draw(s["tensors"](t_shape, dtype, device, scale))
        sources = draw(s["tensors"](s_shape, dtype, device, scale))
        weights = draw(s["tensors"](w_shape, w_dtype, device))
        weights = draw(s["mostly"]([weights], [None, "weights"]))
        # Each parameter: mostly what the kernel needs (a value or None), else anything.
        anything = [None, 0.1, 1e-300, 1e300, 5e-324, 0.0, -1.0, math.nan, math.inf, True]
        sigma = draw(s["mostly"]([0.1, 1.0, 1e-30, 1e30] if kernel == "gaussian" else [None], anything))
        wavenumber = draw(s["mostly"]([0.0, 3.0, -20.0, 1e8] if kernel == "helmholtz" else [None], anything))
        requires_grad = draw(st.booleans())
        for t in (targets, sources, weights):
            if requires_grad and isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
                t.requires_grad_(True)
        return dict(targets=targets, sources=sources, weights=weights, kernel=kernel, sigma=sigma,
                    wavenumber=wavenumber, module=draw(st.booleans()))

    def body(c):
        record_case(c)
        targets, sources, weights = c["targets"], c["sources"], c["weights"]

        def call():
            if c["module"]:
                out = pointops.ParticleSum(c["kernel"], sigma=c["sigma"], wavenumber=c["wavenumber"])(
                    targets, sources, weights)
            else:
                out = pointops.particle_sum(targets, sources, weights, c["kernel"], sigma=c["sigma"],
                                            wavenumber=c["wavenumber"])
            backward_through([out], [targets, sources, weights])
            return out

        def check(out):
            batched = targets.dim() == 3
            shape = targets.shape[:-1] + weights.shape[1 + batched:]
            complex_out = weights.is_complex() or c["kernel"] == "helmholtz"
            dtype = targets.dtype
            if complex_out:
                dtype = torch.complex128 if targets.dtype == torch.float64 else torch.complex64
            assert out.shape == shape and out.dtype == dtype, (out.shape, shape, out.dtype, dtype)

        attempt(call, arguments, check)

    return case(), body


FUZZERS = {
    "nearest_neighbor": fuzz_clouds("nearest_neighbor"),
    "chamfer": fuzz_clouds("chamfer"),
    "chamfer_distance": fuzz_chamfer_distance,
    "fscore": fuzz_fscore,
    "voxelize": fuzz_voxelize,
    "voxel_features": fuzz_voxel_features,
    "particle_sum": fuzz_particle_sum,
}


def describe(case) -> str:
    """A short, allocation-free description of a case (tensors by shape, dtype, device, strides)."""
    import torch

    def one(v):
        if isinstance(v, torch.Tensor):
            return f"tensor{tuple(v.shape)} {v.dtype} {v.device} stride={v.stride()} grad={v.requires_grad}"
        return repr(v)
    return "{" + ", ".join(f"{k}: {one(v)}" for k, v in case.items()) + "}"


if __name__ == "__main__":
    child_main(sys.argv[1])
