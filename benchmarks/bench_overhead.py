"""Per-call overhead: host time of every public op on tiny inputs, beside torch.

At the sizes a training loop uses, a call's cost is the host's: argument checks, the dispatcher,
autograd bookkeeping, Python around the op. This measures it directly.

* Host µs: wall time per call on tiny CPU inputs (8 elements / 8 points), perf_counter around a
  batch of CALLS calls, median of BATCHES batches, one torch thread. The unit is one
  ``torch.exp`` call on an 8-element float32 tensor measured in the same run (machines and load
  differ; the ratio travels). Grad mode is on; forward rows take inputs that do not require grad
  (the targets' measure: the torch counterparts then cost 1-1.4 units) and are timed again with
  inputs that do (autograd bookkeeping included); "fwd+bwd" rows always do.
* CUDA ms (GPU only): CUDA-event time of one call at a small training size, the host's dispatch
  included (one call, no queue in front of it); median of repeats.

Every pointops row is checked against its torch counterpart before it is timed.

    python benchmarks/bench_overhead.py [--quick] [--device cpu|cuda]
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, markdown_table, time_ms  # noqa: E402

import pointops  # noqa: E402
from pointops import strided  # noqa: E402

CALLS, BATCHES = 2000, 9
QUICK_CALLS, QUICK_BATCHES = 300, 5


def host_us(fn, calls, batches):
    """Median over batches of the mean wall time (µs) of one fn() call."""
    for _ in range(max(calls // 10, 20)):
        fn()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def cuda_ms(fn, repeat=50):
    """CUDA-event time (ms) of one call, dispatch included: median of repeats."""
    return time_ms(fn, warmup=5, repeat=repeat, cuda=True)


# ---------------------------------------------------------------- the rows
def _g(shape, device, seed, grad=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=dtype).to(device).requires_grad_(grad)


def _cdist_chamfer(x, y):
    d = torch.cdist(x, y).pow(2)
    return d.min(2), d.min(1)


def _torch_chamfer_loss(x, y):
    d = torch.cdist(x, y).pow(2)
    return d.min(2).values.mean(1).add(d.min(1).values.mean(1)).mean()


def _torch_particle_sum(t, s, w, sigma=0.5):
    return torch.exp(torch.cdist(t, s).pow(2) * (-0.5 / sigma**2)) @ w


def _torch_voxel_ids(points, size=0.25):
    cells = torch.floor(points[:, :3] / size).to(torch.int64)
    return torch.unique(cells, dim=0, return_inverse=True)


def _backward(loss_fn):
    def step():
        loss_fn().backward()
    return step


def rows(device, small, grad=False):
    """(name, pointops call, torch call, target in exp units or None, check or None).
    small: tiny (host) inputs when True, the training sizes when False; grad: forward inputs that
    require grad (the fwd+bwd rows' always do)."""
    n = 8 if small else 1 << 16
    B, P = (1, 8) if small else (8, 1024)
    M = 8 if small else 1024
    V = 8 if small else 16384
    a, b = _g((n,), device, 0, grad), _g((n,), device, 1, grad)
    side = 2 if small else 256
    ma, mb = _g((side, side), device, 2, grad), _g((side, side), device, 3, grad)
    x, y = _g((B, P, 3), device, 4, grad), _g((B, P, 3), device, 5, grad)
    xg, yg = _g((B, P, 3), device, 4), _g((B, P, 3), device, 5)
    t, s, w = _g((M, 3), device, 6, grad), _g((M, 3), device, 7, grad), _g((M,), device, 8, grad)
    tg, sg, wg = _g((M, 3), device, 6), _g((M, 3), device, 7), _g((M,), device, 8)
    pts = (_g((V, 4), device, 9, grad=False) * 2)
    vpts = pts.clone().requires_grad_(grad)
    vs, pr = (0.25, 0.25, 0.25), (0.0, 0.0, 0.0, 2.0, 2.0, 2.0)
    d1 = torch.rand(B, P, device=device) * 1e-2
    d2 = torch.rand(B, P, device=device) * 1e-2

    def close(got, want):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    def check_chamfer(got, want):
        (v1, _), (v2, _) = want
        close(got[0], v1), close(got[1], v2)

    return [
        ("strided.map exp", lambda: strided.map(a, "exp"), lambda: torch.exp(a), 2.0, close),
        ("strided.zip add", lambda: strided.zip(a, b, "add"), lambda: torch.add(a, b), 2.0, close),
        ("strided.reduce sum", lambda: strided.reduce(a), lambda: torch.sum(a), 2.0, close),
        ("strided.reduce sum, dim 0", lambda: strided.reduce(ma, 0), lambda: torch.sum(ma, 0), 2.0, close),
        ("strided.matmul", lambda: strided.matmul(ma, mb), lambda: torch.matmul(ma, mb), 2.0, close),
        ("nearest_neighbor", lambda: pointops.nearest_neighbor(x, y),
         lambda: torch.cdist(x, y).pow(2).min(2), 3.5,
         lambda got, want: close(got[0], want.values)),
        ("chamfer", lambda: pointops.chamfer(x, y), lambda: _cdist_chamfer(x, y), 3.5, check_chamfer),
        ("chamfer_distance fwd", lambda: pointops.chamfer_distance(x, y)[0], lambda: _torch_chamfer_loss(x, y), 7.0,
         close),
        ("chamfer_distance fwd+bwd", _backward(lambda: pointops.chamfer_distance(xg, yg)[0]),
         _backward(lambda: _torch_chamfer_loss(xg, yg)), 30.0, None),
        ("fscore", lambda: pointops.fscore(d1, d2, 1e-3), lambda: ((d1 < 1e-3).float().mean(1),), None,
         lambda got, want: close(got[1], want[0])),
        ("particle_sum gaussian", lambda: pointops.particle_sum(t, s, w, sigma=0.5),
         lambda: _torch_particle_sum(t, s, w), 5.0, close),
        ("particle_sum fwd+bwd", _backward(lambda: pointops.particle_sum(tg, sg, wg, sigma=0.5).sum()),
         _backward(lambda: _torch_particle_sum(tg, sg, wg).sum()), None, None),
        ("voxelize", lambda: pointops.voxelize(pts, vs, pr, 4, 100_000), lambda: _torch_voxel_ids(pts), 5.0, None),
        ("voxelize padded", lambda: pointops.voxelize(pts, vs, pr, 4, V, padded=True),
         lambda: _torch_voxel_ids(pts), None, None),
        ("voxel_features mean", lambda: pointops.voxel_features(vpts, vs, pr),
         lambda: _torch_voxel_ids(vpts.detach()), None, None),
        ("knn_points K=1", lambda: pointops.knn_points(x, y, K=1), lambda: torch.cdist(x, y).pow(2).topk(
            1, largest=False), None, lambda got, want: close(got[0], want.values)),
    ]


def run(quick=False, device=None):
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # host overhead, not a parallel kernel: one thread, steadier numbers
    calls, batches = (QUICK_CALLS, QUICK_BATCHES) if quick else (CALLS, BATCHES)
    try:
        plain, with_grad = rows("cpu", small=True), rows("cpu", small=True, grad=True)
        for name, ours, theirs, _, check in plain:
            if check is not None:
                with torch.no_grad():
                    check(ours(), theirs())
        unit_x = torch.rand(8)
        units = [host_us(lambda: torch.exp(unit_x), calls, batches)]
        results = []
        for (name, ours, theirs, target, _), (_, ours_g, theirs_g, _, _) in zip(plain, with_grad):
            t_ours, t_theirs = host_us(ours, calls, batches), host_us(theirs, calls, batches)
            if "bwd" in name:  # already with grad
                t_ours_g = t_theirs_g = None
            else:
                t_ours_g, t_theirs_g = host_us(ours_g, calls, batches), host_us(theirs_g, calls, batches)
            results.append([name, t_ours, t_theirs, t_ours_g, t_theirs_g, target])
        # The fwd+bwd rows' floor: torch's smallest backward (Python's backward(), the engine, one
        # node, one AccumulateGrad), whatever the op does.
        leaf = torch.rand(8, requires_grad=True)
        floor = host_us(lambda: (leaf * 2).sum().backward(), calls, batches)
        units.append(host_us(lambda: torch.exp(unit_x), calls, batches))
        unit = statistics.mean(units)
    finally:
        torch.set_num_threads(threads)
    gpu = {}
    if device == "cuda":
        for name, ours, theirs, _, check in rows("cuda", small=quick, grad=True):
            gpu[name] = (cuda_ms(ours), cuda_ms(theirs))
    table = []
    u = lambda t: "-" if t is None else f"{t:.1f} ({t / unit:.2f})"  # noqa: E731
    for name, t_ours, t_theirs, t_ours_g, t_theirs_g, target in results:
        met = "-" if target is None else ("yes" if t_ours / unit <= target else "no")
        g = gpu.get(name)
        table.append([name, u(t_ours), u(t_theirs), "-" if target is None else f"≤ {target:g}", met,
                      u(t_ours_g), u(t_theirs_g),
                      "n/a" if g is None else f"{g[0]:.3f}", "n/a" if g is None else f"{g[1]:.3f}"])
    header = ["op (tiny inputs)", "host µs (units)", "torch µs (units)", "target (units)", "met",
              "requires grad: µs (units)", "torch, requires grad", "CUDA ms (training size)", "torch CUDA ms"]
    text = (f"## Per-call overhead\n\n{environment_line()}\n\nunit: one `torch.exp` call on 8 "
            f"float32 elements = {unit:.2f} µs (host, this run; mean of a measure before and after the rows). "
            f"Host µs: median of {batches} batches of {calls} calls, one torch thread, grad mode on; "
            "forward rows on inputs that do not require grad, then again on inputs that do. CUDA ms: "
            "one call with CUDA events at the training size (strided 2^16 elements / 256², clouds "
            "8 x 1024 x 1024, particle sums 1024², voxelize 16384 points), inputs requiring grad. "
            f"The fwd+bwd rows' floor, torch's smallest backward (`(w * 2).sum().backward()`, w of 8 "
            f"elements): {floor:.1f} µs ({floor / unit:.2f} units).\n\n")
    return text + markdown_table(header, table)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"])
    args = parser.parse_args()
    print(run(quick=args.quick, device=args.device))


if __name__ == "__main__":
    main()
