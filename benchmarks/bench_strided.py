"""Strided kernels: pointops.strided map / zip / reduce / matmul vs the torch op on the same views.

Each row runs the pointops op and the torch equivalent (torch.exp, torch.add, torch.sum,
torch.matmul, ...) on the same inputs in the same process: on the CPU with torch's threads (wall
time, the two calls alternating, median of repeats), on the GPU with CUDA events. Correctness first: every row compares
the two results (float32: relative error 1e-5 against torch for the elementwise ops and the
reductions, matmul within k * 2^-24 of the sum of |a||b| from a float64 product) and raises
instead of timing a wrong kernel.

Columns: the times, torch / pointops (>= 1 means pointops is faster; the CPU target for map, zip and
reduce is >= 0.7), and on the GPU the achieved bandwidth (bytes read + written / time) next to a
plain device-to-device copy of the same bytes, and matmul TFLOP/s next to cuBLAS with TF32 off.

    python benchmarks/bench_strided.py [--quick] [--device cpu|cuda]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, time_ms  # noqa: E402

import pointops  # noqa: E402
from pointops import strided  # noqa: E402

# GPU: the target sizes (2^25 float32 elements as 4096 x 8192, matmul 4096^3, bmm 16 x 1024^3)
FULL = dict(elems=(4096, 8192), mm=4096, bmm=(16, 1024), cpu_elems=(2048, 4096), cpu_mm=1024, cpu_bmm=(4, 256))
QUICK = dict(elems=(1024, 1024), mm=512, bmm=(4, 256), cpu_elems=(1024, 1024), cpu_mm=256, cpu_bmm=(2, 128))
CALLS = 10  # GPU: calls per timed sample, back to back


def time_pair(ours, theirs, repeat, cuda):
    """Median times (ms) of ours and theirs. On the CPU the two alternate call by call, so that a
    machine shared with other work loads both alike. On the GPU, CUDA events around CALLS calls
    issued back to back, divided by CALLS: the GPU time per call once the queue is full, without
    the host's dispatch time in front of a lone call (which would dominate a 50 us kernel)."""
    if cuda:
        def batch(fn):
            return lambda: [fn() for _ in range(CALLS)]
        return (time_ms(batch(ours), repeat=repeat, cuda=True) / CALLS,
                time_ms(batch(theirs), repeat=repeat, cuda=True) / CALLS)
    for _ in range(3):
        ours(), theirs()
    t_ours, t_theirs = [], []
    for _ in range(repeat):
        for fn, times in ((ours, t_ours), (theirs, t_theirs)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(t_ours), statistics.median(t_theirs)


def check(got, ref, what, rtol=1e-5):
    """Elementwise ops against torch, relative to the largest value."""
    err = ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp(min=1e-30)).item()
    if not err <= rtol:
        raise AssertionError(f"{what}: pointops differs from torch by {err:.3g} (relative to the max), > {rtol}")


def check_reduction(got, x, dim, fn, what, rtol=1e-6):
    """Against the float64 reduction of the same values, relative to the sum of magnitudes."""
    xd = x.double()
    ref = xd.sum(dim) if fn == "sum" else xd.amax(dim)
    scale = xd.abs().sum(dim) if fn == "sum" else ref.abs()
    if not ((got.double() - ref).abs() <= rtol * scale).all():
        raise AssertionError(f"{what}: pointops differs from the float64 {fn} by more than {rtol} of the magnitudes")


def bandwidth(nbytes, t_ours, t_torch, repeat):
    """'pointops TB/s (torch ..., copy ...), the fraction of the copy': the copy is torch's
    device-to-device clone of nbytes / 2 bytes (it reads and writes nbytes), timed like the ops
    and next to each row (the same byte counts recur, but a copy timed beside the row follows the
    GPU's clock and temperature as the row does)."""
    buf = torch.empty(nbytes // 8, device="cuda")
    t_copy = time_ms(lambda: [buf.clone() for _ in range(CALLS)], repeat=repeat, cuda=True) / CALLS
    tbs = lambda t: nbytes / t / 1e9  # noqa: E731
    return (f"{tbs(t_ours):.2f} TB/s = {t_copy / t_ours:.0%} of copy "
            f"(torch {tbs(t_torch):.2f}, copy {tbs(t_copy):.2f})")


def elementwise_cases(shape, device):
    """(name, pointops fn, torch fn, bytes moved) for map / zip on a (rows, cols) float32 matrix;
    the transposed operands are (cols, rows) tensors viewed with .t()."""
    rows, cols = shape
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, cols, device=device, generator=g)
    y = torch.randn(rows, cols, device=device, generator=g)
    yt = torch.randn(cols, rows, device=device, generator=g).t()
    xt = torch.randn(cols, rows, device=device, generator=g).t()
    row = torch.randn(cols, device=device, generator=g)
    b = x.numel() * 4
    return [
        ("map exp, contiguous", lambda: strided.map(x, "exp"), lambda: torch.exp(x), 2 * b),
        ("map exp, transposed", lambda: strided.map(xt, "exp"), lambda: torch.exp(xt), 2 * b),
        ("map relu, contiguous", lambda: strided.map(x, "relu"), lambda: torch.relu(x), 2 * b),
        ("zip add, contiguous", lambda: strided.zip(x, y, "add"), lambda: torch.add(x, y), 3 * b),
        ("zip add, a contiguous + b transposed", lambda: strided.zip(x, yt, "add"), lambda: torch.add(x, yt), 3 * b),
        ("zip mul, row broadcast", lambda: strided.zip(x, row, "mul"), lambda: torch.mul(x, row), 2 * b + row.numel() * 4),
        ("zip max, a transposed", lambda: strided.zip(xt, y, "max"), lambda: torch.maximum(xt, y), 3 * b),
    ]


def reduction_cases(shape, device):
    """(name, x, dim, fn, bytes read)."""
    g = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(*shape, device=device, generator=g)
    b = x.numel() * 4
    return [("reduce sum, all", x, None, "sum", b), ("reduce sum, rows (dim 1)", x, 1, "sum", b),
            ("reduce sum, columns (dim 0)", x, 0, "sum", b), ("reduce max, dim 1", x, 1, "max", b),
            ("reduce sum, dim 1 of transposed", x.t(), 1, "sum", b)]


def matmul_cases(n, bmm, device):
    """(name, a, b): float32 square products, one operand transposed, a batched product; on the
    GPU also bfloat16 (torch then uses tensor cores; pointops's half types accumulate in float32)."""
    g = torch.Generator(device=device).manual_seed(1)
    a = torch.randn(n, n, device=device, generator=g)
    bm = torch.randn(n, n, device=device, generator=g)
    at_ = torch.randn(n, n, device=device, generator=g).t()
    nb, s = bmm
    ba = torch.randn(nb, s, s, device=device, generator=g)
    bb = torch.randn(nb, s, s, device=device, generator=g)
    cases = [
        (f"matmul {n}^3, contiguous", a, bm),
        (f"matmul {n}^3, a transposed", at_, bm),
        (f"matmul {n}^3, b transposed", a, bm.t()),
        (f"bmm {nb} x {s}^3", ba, bb),
    ]
    if device == "cuda":
        odd = n - 96  # not a multiple of the 128 x 128 tile: the kernel with bounds checks
        cases.append((f"matmul {odd}^3, partial tiles", a[:odd, :odd], bm[:odd, :odd]))
        cases.append((f"matmul {n}^3, bfloat16", a.bfloat16(), bm.bfloat16()))
    return cases


PARTS = ("elementwise", "reduce", "matmul")


def bench_device(device, sizes, quick, parts=PARTS):
    cuda = device == "cuda"
    repeat = 10 if quick else 50
    n = sizes["elems"] if cuda else sizes["cpu_elems"]
    rows = []

    def add_row(name, t_ours, t_torch, extra):
        rows.append([device, name, f"{t_ours:.3f}", f"{t_torch:.3f}", f"{t_torch / t_ours:.2f}", extra])
        print(rows[-1], flush=True)

    for name, ours, theirs, nbytes in elementwise_cases(n, device) if "elementwise" in parts else []:
        check(ours(), theirs(), name)
        t_ours, t_torch = time_pair(ours, theirs, repeat, cuda)
        add_row(name, t_ours, t_torch, bandwidth(nbytes, t_ours, t_torch, repeat) if cuda else "")
    for name, x, dim, fn, nbytes in reduction_cases(n, device) if "reduce" in parts else []:
        check_reduction(strided.reduce(x, dim, fn), x, tuple(range(x.dim())) if dim is None else dim, fn, name)
        torch_fn = torch.sum if fn == "sum" else torch.amax
        t_ours, t_torch = time_pair(lambda: strided.reduce(x, dim, fn),
                                    lambda: torch_fn(x) if dim is None else torch_fn(x, dim), repeat, cuda)
        add_row(name, t_ours, t_torch, bandwidth(nbytes, t_ours, t_torch, repeat) if cuda else "")
    mm = sizes["mm"] if cuda else sizes["cpu_mm"]
    bmm = sizes["bmm"] if cuda else sizes["cpu_bmm"]
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in IEEE float32, as pointops
    try:
        for name, a, b in matmul_cases(mm, bmm, device) if "matmul" in parts else []:
            got = strided.matmul(a, b)
            k = a.shape[-1]
            ref = a.double() @ b.double()
            # float32 accumulation of k products: |error| <= k u sum|a||b| (u = 2^-24); the
            # bfloat16 result adds one rounding to bfloat16 (u = 2^-8) of the value
            bound = k * 2**-24 * (a.double().abs() @ b.double().abs())
            if a.dtype == torch.bfloat16:
                bound = bound + 2**-8 * ref.abs()
            if not ((got.double() - ref).abs() <= bound).all():
                raise AssertionError(f"{name}: pointops exceeds the float32 error bound")
            del ref, bound
            t_ours, t_torch = time_pair(lambda: strided.matmul(a, b), lambda: torch.matmul(a, b),
                                        max(5, repeat // 5), cuda)
            flops = 2 * a.shape[-2] * k * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
            add_row(name, t_ours, t_torch,
                    f"{flops / t_ours / 1e9:.2f} TFLOP/s = {t_torch / t_ours:.0%} of torch ({flops / t_torch / 1e9:.2f})")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return rows


def run(quick=False, devices=None, parts=PARTS):
    sizes = QUICK if quick else FULL
    if devices is None:
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and pointops.build_info()["cuda"] else [])
    rows = []
    for device in devices:
        rows += bench_device(device, sizes, quick, parts)
    header = ["device", "case (float32)", "pointops ms", "torch ms", "torch / pointops", "throughput"]
    threads = torch.get_num_threads()
    return (f"## Strided kernels\n\nCPU rows use {threads} torch threads. Elementwise cases: "
            f"{sizes['cpu_elems']} float32 on the CPU, {sizes['elems']} on the GPU.\n\n"
            + markdown_table(header, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ", ".join(PARTS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(run(args.quick, None if args.device is None else [args.device], tuple(args.parts.split(","))))
