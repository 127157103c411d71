"""Particle (kernel) sums: pointops.particle_sum vs the torch chunked way, and KeOps when installed.

f(x_i) = sum_j g(|x_i - y_j|) c_j for the Gaussian exp(-r^2 / (2 sigma^2)), Laplace 1 / (4 pi r) and
Helmholtz exp(i k r) / (4 pi r) kernels; float32, D = 3, targets and sources uniform in the unit cube
(two independent clouds), weights randn (mixed sign).

Correctness first: for 256 random targets the result of each implementation is compared with a
float64 direct sum over all sources (relative l2 error); pointops above 1e-5 (Helmholtz 1e-4) raises
instead of timing. The forward + backward row also checks the three gradients (256 random targets
for d/dx, 256 random sources for d/dy and d/dc) against float64.

The torch chunked way is what people write without a fused op: `torch.cdist(x_chunk, y)`, the
kernel on the (chunk, N) matrix, `@ w`, over chunks of targets whose matrix is <= 1 GiB. At
10^6 x 10^6 (10^12 pairs) it is timed on a subset of the targets and scaled to all of them ("est.").
KeOps (pykeops.torch.LazyTensor) is probed on a small case in a subprocess first (it compiles at
run time; the probe also fills its build cache), so an unusable install gives "-" and a note instead
of an error; set POINTOPS_BENCH_KEOPS=0 to skip it. On a machine that cannot download, carry the
wheels made by scripts/keops_wheels.sh (.whl/) and put them on PYTHONPATH.
"""
import gc
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import markdown_table, time_ms  # noqa: E402

import pointops  # noqa: E402

SIGMA = 0.1
WAVENUMBER = 20.0
BOUND = 4.2e12                 # pairs/s: one MUFU exp2 (Gaussian) or rsqrt (Laplace) per pair on an H100
CHUNK_BYTES = 1 << 30          # the torch baseline's (chunk, N) kernel matrix is at most this
CHECK_TARGETS = 256
TOL = {"gaussian": 1e-5, "laplace": 1e-5, "helmholtz": 1e-4}
GRAD_TOL = 1e-5
INV_4PI = 1.0 / (4.0 * math.pi)

# Sizes. "torch_targets": the torch baseline runs on this many targets and is scaled to all ("est.").
FULL = dict(big=100_000, huge=1_000_000, huge_torch_targets=100_000, fb_torch_targets=10_000,
            seed=(480_000, 50), few=(50, 1_000_000), cpu=20_000)
QUICK = dict(big=2_000, huge=4_000, huge_torch_targets=1_000, fb_torch_targets=500,
             seed=(4_800, 50), few=(50, 20_000), cpu=2_000)


# ----------------------------------------------------------------------------- helpers
def params(kernel):
    return {"gaussian": dict(sigma=SIGMA), "laplace": {}, "helmholtz": dict(wavenumber=WAVENUMBER)}[kernel]


def make_inputs(M, N, C=None, complex_weights=False, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.rand(M, 3, device=device, generator=g)
    y = torch.rand(N, 3, device=device, generator=g)
    shape = (N,) if C is None else (N, C)
    w = torch.randn(shape, device=device, generator=g,
                    dtype=torch.complex64 if complex_weights else torch.float32)
    return x, y, w


def check_indices(M, count=CHECK_TARGETS, seed=123):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(M, generator=g)[:min(count, M)]


def rel_l2(got, ref):
    got = got.detach().to(ref.device, ref.dtype)
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp(min=1e-300)).item()


def free_memory():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timer(device):
    """time_ms for work on `device` (CUDA events on the GPU, the host clock on the CPU)."""
    return lambda fn, warmup, repeat: time_ms(fn, warmup, repeat, cuda=device == "cuda")


def with_extra_memory(fn, device):
    """(fn(), bytes allocated by the call beyond its inputs and its output) on CUDA; (fn(), None) on the CPU."""
    if device != "cuda":
        return fn(), None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    out_bytes = out.numel() * out.element_size()
    return out, torch.cuda.max_memory_allocated() - before - out_bytes


# ----------------------------------------------------------------------------- float64 oracle
def _kernel64(d2, kernel):
    if kernel == "gaussian":
        return torch.exp(d2 * (-0.5 / SIGMA ** 2))
    r = d2.sqrt()
    inv = torch.where(d2 > 0, INV_4PI / r.clamp(min=1e-300), torch.zeros_like(r))  # r = 0: dropped
    if kernel == "laplace":
        return inv
    return torch.polar(inv, WAVENUMBER * r)


def oracle_sum(x, y, w, kernel, idx, src_chunk=32768):
    """Float64 direct sum for the targets x[idx] over all sources, sources in chunks (never M x N)."""
    out_dtype = torch.complex128 if (kernel == "helmholtz" or w.is_complex()) else torch.float64
    xs = x[idx.to(x.device)].double()
    yd = y.double()
    wd = w.to(out_dtype)
    acc = None
    for s in range(0, y.shape[0], src_chunk):
        diff = xs[:, None, :] - yd[None, s:s + src_chunk, :]
        part = _kernel64((diff * diff).sum(-1), kernel).to(out_dtype) @ wd[s:s + src_chunk]
        acc = part if acc is None else acc + part
    return acc


def oracle_gaussian_moments(a, b, v, src_chunk=32768):
    """Float64: s_i = sum_j g(a_i, b_j) v_j and m_i = sum_j g(a_i, b_j) v_j (b_j - a_i), g Gaussian."""
    a, b, v = a.double(), b.double(), v.double()
    s_acc = torch.zeros(a.shape[0], dtype=torch.float64, device=a.device)
    m_acc = torch.zeros(a.shape[0], 3, dtype=torch.float64, device=a.device)
    for s in range(0, b.shape[0], src_chunk):
        diff = b[None, s:s + src_chunk, :] - a[:, None, :]              # (S, c, 3): b_j - a_i
        gv = torch.exp((diff * diff).sum(-1) * (-0.5 / SIGMA ** 2)) * v[s:s + src_chunk]
        s_acc += gv.sum(1)
        m_acc += (gv[:, :, None] * diff).sum(1)
    return s_acc, m_acc


def gaussian_grad_errors(x, y, w, G, grads, idx_t, idx_s):
    """Relative l2 errors of (d/dx, d/dy, d/dc) of loss = sum_i G_i f_i against float64, on the
    targets idx_t (d/dx) and sources idx_s (d/dy, d/dc). grads = (gx, gy, gw), full tensors or None."""
    dev = x.device
    it, js = idx_t.to(dev), idx_s.to(dev)
    inv_s2 = 1.0 / SIGMA ** 2
    _, mx = oracle_gaussian_moments(x[it], y, w)                     # sum_j g c_j (y_j - x_i)
    ref_gx = G[it].double()[:, None] * mx * inv_s2
    sy, my = oracle_gaussian_moments(y[js], x, G)                    # sum_i g G_i (x_i - y_j)
    ref_gy = w[js].double()[:, None] * my * inv_s2
    ref_gw = sy
    gx, gy, gw = grads
    return (rel_l2(gx[it], ref_gx) if gx is not None else None,
            rel_l2(gy[js], ref_gy) if gy is not None else None,
            rel_l2(gw[js], ref_gw) if gw is not None else None)


# ----------------------------------------------------------------------------- torch chunked baseline
def torch_chunked(x, y, w, kernel):
    """The torch-native way: cdist on a chunk of targets, the kernel on the (chunk, N) matrix, @ w."""
    M, N = x.shape[0], y.shape[0]
    complex_out = kernel == "helmholtz" or w.is_complex()
    elem = 8 if complex_out else 4
    chunk = max(1, min(M, CHUNK_BYTES // max(1, N * elem)))
    outs = []
    for s in range(0, M, chunk):
        r = torch.cdist(x[s:s + chunk], y)
        if kernel == "gaussian":
            kmat = torch.exp(r.pow(2) * (-0.5 / SIGMA ** 2))
        elif kernel == "laplace":
            kmat = torch.where(r > 0, INV_4PI / r, 0.0)
        else:
            kmat = torch.polar(torch.where(r > 0, INV_4PI / r, 0.0), r * WAVENUMBER)
        outs.append(kmat @ (w.to(kmat.dtype) if complex_out else w))
        del r, kmat
    return torch.cat(outs)


# ----------------------------------------------------------------------------- KeOps
KEOPS_PROBE = r"""
import torch, pykeops
pykeops.set_verbose(False)
from pykeops.torch import LazyTensor
x = torch.rand(1000, 3, device="cuda"); y = torch.rand(1500, 3, device="cuda"); w = torch.randn(1500, device="cuda")
K = (-(LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])).sqnorm2() * 50.0).exp()
f = K @ w
ref = torch.exp(-torch.cdist(x, y).pow(2) * 50.0) @ w
err = ((f - ref).norm() / ref.norm()).item()
assert err < 1e-4, err
print(pykeops.__version__)
"""
_KEOPS = {"checked": False, "ok": False, "note": ""}


def keops_status(device):
    """(usable, note). Probes KeOps once in a subprocess (which also fills its build cache)."""
    if _KEOPS["checked"]:
        return _KEOPS["ok"], _KEOPS["note"]
    _KEOPS["checked"] = True
    if os.environ.get("POINTOPS_BENCH_KEOPS", "1") == "0":
        _KEOPS["note"] = "skipped (POINTOPS_BENCH_KEOPS=0)"
    elif device != "cuda":
        _KEOPS["note"] = "not run (no CUDA)"
    else:
        try:
            import pykeops  # noqa: F401
        except Exception as e:  # noqa: BLE001
            _KEOPS["note"] = f"not installed ({type(e).__name__})"
        else:
            t0 = time.perf_counter()
            try:
                proc = subprocess.run([sys.executable, "-c", KEOPS_PROBE], capture_output=True, text=True,
                                      timeout=300)
                if proc.returncode == 0:
                    _KEOPS["ok"] = True
                    _KEOPS["note"] = (f"pykeops {proc.stdout.strip().splitlines()[-1]} "
                                      f"(probe with compilation: {time.perf_counter() - t0:.0f} s)")
                else:
                    lines = (proc.stdout + "\n" + proc.stderr).strip().splitlines()
                    warnings = [ln.strip()[:160] for ln in lines if "[KeOps] Warning" in ln][:3]
                    _KEOPS["note"] = "probe failed: " + "; ".join(
                        warnings + [lines[-1][:200] if lines else f"exit {proc.returncode}"])
            except subprocess.TimeoutExpired:
                _KEOPS["note"] = "probe timed out (300 s)"
    if _KEOPS["ok"]:
        import pykeops
        pykeops.set_verbose(False)
    return _KEOPS["ok"], _KEOPS["note"]


def keops_sum(x, y, w, kernel):
    from pykeops.torch import LazyTensor

    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    d2 = (x_i - y_j).sqnorm2()
    if kernel == "gaussian":
        return (-d2 * (0.5 / SIGMA ** 2)).exp() @ w
    if kernel == "laplace":
        return (d2.rsqrt() @ w) * INV_4PI  # KeOps' Rsqrt is 0 at 0: coincident pairs drop out
    # helmholtz, 1-D complex weights: Re/Im by hand on real LazyTensors (KeOps' Rsqrt(0) = 0)
    rinv = d2.rsqrt()
    kr = d2.sqrt() * WAVENUMBER
    c, s = kr.cos() * rinv, kr.sin() * rinv
    ab = LazyTensor(torch.view_as_real(w)[None, :, :])
    a, b = ab.elem(0), ab.elem(1)
    out = (c * a - s * b).concat(s * a + c * b).sum(dim=1)
    return torch.view_as_complex(out.contiguous()) * INV_4PI


def keops_try(fn):
    """Run a KeOps call, turning failures into a short note (KeOps compiles at run time)."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:120] if str(e).strip() else ''}"


# ----------------------------------------------------------------------------- formatting
def fmt_ms(t):
    return "-" if t is None else (f"{t:.4f}" if t < 0.1 else f"{t:.3f}" if t < 10 else f"{t:.1f}")


def fmt_err(e):
    return "-" if e is None else f"{e:.1e}"


def fmt_speed(ratio, est=False):
    text = f"{ratio:.0f}x" if ratio >= 10 else f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2g}x"
    return ("est. " if est else "") + text


# ----------------------------------------------------------------------------- one forward row
def forward_row(case, device, quick, keops_ok, notes, memory):
    kernel, M, N, C = case["kernel"], case["M"], case["N"], case.get("C")
    x, y, w = make_inputs(M, N, C, case.get("complex", False), device, seed=case["seed"])
    ps = lambda: pointops.particle_sum(x, y, w, kernel, **params(kernel))  # noqa: E731

    # correctness before timing
    idx = check_indices(M)
    ref = oracle_sum(x, y, w, kernel, idx)
    out, extra = with_extra_memory(ps, device)
    err = rel_l2(out[idx.to(out.device)], ref)
    if not err <= TOL[kernel]:
        raise RuntimeError(f"particle_sum {case['label']} ({M} x {N}): relative l2 error {err:.2e} > "
                           f"{TOL[kernel]:.0e} against float64; not timing")
    del out

    Mt = case.get("torch_targets") or M
    xt = x[:Mt]
    base, base_extra = with_extra_memory(lambda: torch_chunked(xt, y, w, kernel), device)
    idx_t = check_indices(Mt)
    base_err = rel_l2(base[idx_t.to(base.device)], oracle_sum(xt, y, w, kernel, idx_t))
    del base
    free_memory()

    k_out = k_err = k_extra = k_note = None
    if keops_ok:
        res, k_note = keops_try(lambda: with_extra_memory(lambda: keops_sum(x, y, w, kernel), device))
        if res is not None:
            k_out, k_extra = res
            k_err = rel_l2(k_out[idx.to(k_out.device)], ref)
            del k_out
        free_memory()

    # timing
    w_ps, r_ps = case["reps"]
    t = timer(device)(ps, w_ps, r_ps)
    w_b, r_b = case["torch_reps"]
    t_base = timer(device)(lambda: torch_chunked(xt, y, w, kernel), w_b, r_b) * (M / Mt)
    free_memory()
    t_keops = None
    if keops_ok and k_note is None:
        t_keops = timer(device)(lambda: keops_sum(x, y, w, kernel), *case["reps"])
    if k_note:
        notes.append(f"KeOps, {case['label']}: {k_note}")

    est = Mt < M
    if memory is not None:
        memory.append([f"{case['label']}, {M:,} x {N:,}", extra, base_extra, k_extra, Mt])
    del x, y, w
    free_memory()

    pairs = M * N
    rhs = 1 if C is None else C
    if rhs > 1:
        rate = f"{pairs * rhs / (t * 1e-3):.2e} pair·rhs/s"
        value = pairs * rhs / (t * 1e-3)
    else:
        rate = f"{pairs / (t * 1e-3):.2e}"
        value = pairs / (t * 1e-3)
    of_bound = f"{100 * pairs / (t * 1e-3) / BOUND:.0f}%" if case.get("bound") and device == "cuda" else "-"
    base_cell = (f"est. {fmt_ms(t_base)} (from {Mt:,} targets)" if est else fmt_ms(t_base))
    speed = fmt_speed(t_base / t, est)
    return [case["label"], f"{M:,} x {N:,}", fmt_ms(t), rate, of_bound, base_cell, speed,
            fmt_ms(t_keops), fmt_speed(t_keops / t) if t_keops else "-",
            f"{fmt_err(err)} / {fmt_err(base_err)} / {fmt_err(k_err)}",
            target_cell(case, value if case["target_on"] == "rate" else t, quick, device)]


def target_cell(case, value, quick, device):
    text, ok = case["target"]
    if quick or device != "cuda":
        return text
    return f"{text}: {'yes' if ok(value) else 'NO'}"


# ----------------------------------------------------------------------------- forward + backward row
def fwdbwd_row(case, device, quick, keops_ok, notes):
    M, N = case["M"], case["N"]
    x, y, w = make_inputs(M, N, None, False, device, seed=case["seed"])
    G = torch.randn(M, device=device, generator=torch.Generator(device=device).manual_seed(7))
    xg, yg, wg = (t.clone().requires_grad_() for t in (x, y, w))

    def step(fn, a, b, c, g):
        a.grad = b.grad = c.grad = None
        (fn(a, b, c) * g).sum().backward()

    ps = lambda a, b, c: pointops.particle_sum(a, b, c, "gaussian", sigma=SIGMA)  # noqa: E731
    base = lambda a, b, c: torch_chunked(a, b, c, "gaussian")  # noqa: E731

    idx_t, idx_s = check_indices(M), check_indices(N, seed=321)
    step(ps, xg, yg, wg, G)
    errs = gaussian_grad_errors(x, y, w, G, (xg.grad, yg.grad, wg.grad), idx_t, idx_s)
    f_err = rel_l2(ps(x, y, w)[idx_t.to(device)], oracle_sum(x, y, w, "gaussian", idx_t))
    if not max(errs + (f_err,)) <= GRAD_TOL:
        raise RuntimeError(f"particle_sum fwd+bwd ({M} x {N}): errors f {f_err:.2e}, d/dx {errs[0]:.2e}, "
                           f"d/dy {errs[1]:.2e}, d/dc {errs[2]:.2e} > {GRAD_TOL:.0e} against float64; not timing")

    # torch: the same chunked sum under autograd, on the first Mt targets (autograd keeps every
    # chunk's matrices: ~2 x 4 x M x N bytes, 80 GB at 1e5 x 1e5), scaled to M
    Mt = case.get("torch_targets") or M
    xs, Gs = x[:Mt].clone().requires_grad_(), G[:Mt]
    yb, wb = y.clone().requires_grad_(), w.clone().requires_grad_()
    step(base, xs, yb, wb, Gs)
    idx_b = check_indices(Mt)
    base_err = gaussian_grad_errors(x[:Mt], y, w, Gs, (xs.grad, None, None), idx_b, idx_s)[0]
    free_memory()

    k_errs, k_note = None, None
    if keops_ok:
        xk, yk, wk = (t.clone().requires_grad_() for t in (x, y, w))
        _, k_note = keops_try(lambda: step(lambda a, b, c: keops_sum(a, b, c, "gaussian"), xk, yk, wk, G))
        if k_note is None:
            k_errs = gaussian_grad_errors(x, y, w, G, (xk.grad, yk.grad, wk.grad), idx_t, idx_s)
        free_memory()

    t = timer(device)(lambda: step(ps, xg, yg, wg, G), *case["reps"])
    t_base = timer(device)(lambda: step(base, xs, yb, wb, Gs), *case["torch_reps"]) * (M / Mt)
    free_memory()
    t_keops = None
    if keops_ok and k_note is None:
        t_keops = timer(device)(lambda: step(lambda a, b, c: keops_sum(a, b, c, "gaussian"), xk, yk, wk, G),
                                *case["reps"])
    if k_note:
        notes.append(f"KeOps, {case['label']}: {k_note}")
    del x, y, w, xg, yg, wg, xs, yb, wb
    if keops_ok:
        del xk, yk, wk
    free_memory()

    est = Mt < M
    grads = lambda e: f"dx {fmt_err(e[0])}, dy {fmt_err(e[1])}, dc {fmt_err(e[2])}"  # noqa: E731
    err_cell = (f"f {fmt_err(f_err)}, {grads(errs)} / dx {fmt_err(base_err)} / "
                + (grads(k_errs) if k_errs else "-"))
    return [case["label"], f"{M:,} x {N:,}", fmt_ms(t), f"{M * N / (t * 1e-3):.2e} (fwd+bwd)", "-",
            f"est. {fmt_ms(t_base)} (from {Mt:,} targets)" if est else fmt_ms(t_base),
            fmt_speed(t_base / t, est),
            fmt_ms(t_keops), fmt_speed(t_keops / t) if t_keops else "-", err_cell,
            target_cell(case, t, quick, device)]


# ----------------------------------------------------------------------------- CPU section
def cpu_section(quick):
    n = (QUICK if quick else FULL)["cpu"]
    threads = torch.get_num_threads()
    rows = []
    for kernel in ("gaussian", "laplace"):
        x, y, w = make_inputs(n, n, None, False, "cpu", seed=11)
        ps = lambda: pointops.particle_sum(x, y, w, kernel, **params(kernel))  # noqa: E731
        idx = check_indices(n)
        ref = oracle_sum(x, y, w, kernel, idx)
        err = rel_l2(ps()[idx], ref)
        if not err <= TOL[kernel]:
            raise RuntimeError(f"particle_sum CPU {kernel} ({n} x {n}): relative l2 error {err:.2e} > "
                               f"{TOL[kernel]:.0e} against float64; not timing")
        base_err = rel_l2(torch_chunked(x, y, w, kernel)[idx], ref)
        t = time_ms(ps, 1, 5, cuda=False)
        t_base = time_ms(lambda: torch_chunked(x, y, w, kernel), 1, 3, cuda=False)
        speed = t_base / t
        rows.append([kernel, f"{n:,} x {n:,}", fmt_ms(t), f"{n * n / (t * 1e-3):.2e}", fmt_ms(t_base),
                     fmt_speed(speed), f"{fmt_err(err)} / {fmt_err(base_err)}",
                     f">= 3x: {'yes' if speed >= 3 else 'NO'}" + (" (quick sizes)" if quick else "")])
        del x, y, w
    header = ["kernel", "M x N", "pointops ms", "pairs/s", "torch chunked ms", "speed-up",
              "rel l2 err pointops / torch", "target"]
    text = (f"### CPU ({threads} threads, torch.get_num_threads())\n\n"
            "pointops' CPU kernel against the torch chunked way on the CPU, same threads; median of 5 "
            "(torch: 3) wall-clock runs after one warm-up.\n\n")
    return text + markdown_table(header, rows)


# ----------------------------------------------------------------------------- the section
def cases(quick, device):
    s = QUICK if quick else FULL
    big, huge = s["big"], s["huge"]
    fast, large, tiny = (10, 50), (1, 3), (20, 200)
    tb_fast, tb_large = ((1, 5), (0, 3)) if device == "cuda" else ((1, 3), (0, 2))
    if quick:
        fast, large, tiny = (2, 5), (1, 3), (3, 20)
    pairs_target = lambda v: v >= 3.5e12  # noqa: E731
    return [
        dict(label="Gaussian", kernel="gaussian", M=big, N=big, seed=1, reps=fast, torch_reps=tb_fast,
             bound=True, target=(">= 3.5e12 pairs/s", pairs_target), target_on="rate"),
        dict(label="Gaussian", kernel="gaussian", M=huge, N=huge, seed=2, reps=large, torch_reps=tb_large,
             torch_targets=s["huge_torch_targets"], bound=True, memory=True,
             target=(">= 3.5e12 pairs/s", pairs_target), target_on="rate"),
        dict(label="Laplace", kernel="laplace", M=big, N=big, seed=3, reps=fast, torch_reps=tb_fast,
             bound=True, target=(">= 3.5e12 pairs/s", pairs_target), target_on="rate"),
        dict(label="Laplace", kernel="laplace", M=huge, N=huge, seed=4, reps=large, torch_reps=tb_large,
             torch_targets=s["huge_torch_targets"], bound=True, memory=True,
             target=(">= 3.5e12 pairs/s", pairs_target), target_on="rate"),
        dict(label=f"Helmholtz k={WAVENUMBER:g}, complex64 weights", kernel="helmholtz", M=big, N=big,
             complex=True, seed=5, reps=fast, torch_reps=tb_fast,
             target=(">= 1.0e12 pairs/s", lambda v: v >= 1.0e12), target_on="rate"),
        dict(label="Gaussian, weights (N, 16)", kernel="gaussian", M=big, N=big, C=16, seed=6, reps=fast,
             torch_reps=tb_fast, target=(">= 1.8e13 pair·rhs/s", lambda v: v >= 1.8e13), target_on="rate"),
        dict(label="Gaussian fwd+bwd (x, y, c)", kind="fwdbwd", M=big, N=big, seed=7, reps=fast,
             torch_reps=tb_fast, torch_targets=s["fb_torch_targets"],
             target=("<= 10 ms", lambda t: t <= 10), target_on="ms"),
        dict(label="Gaussian, seed case (whole call)", kernel="gaussian", M=s["seed"][0], N=s["seed"][1],
             seed=8, reps=tiny, torch_reps=(3, 20), bound=True,
             target=("<= 0.03 ms", lambda t: t <= 0.03), target_on="ms"),
        dict(label="Gaussian, few targets", kernel="gaussian", M=s["few"][0], N=s["few"][1], seed=9,
             reps=tiny, torch_reps=(3, 20), bound=True,
             target=("<= 0.1 ms", lambda t: t <= 0.1), target_on="ms"),
    ]


def run(quick: bool = False) -> str:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    keops_ok, keops_note = keops_status(device)
    rows, notes, memory = [], [], []
    for case in cases(quick, device):
        if case.get("kind") == "fwdbwd":
            rows.append(fwdbwd_row(case, device, quick, keops_ok, notes))
        else:
            rows.append(forward_row(case, device, quick, keops_ok, notes,
                                    memory if case.get("memory") else None))
        print("| " + " | ".join(str(c) for c in rows[-1]) + " |", flush=True)  # progress
        free_memory()

    header = ["case", "M x N", "pointops ms", "pairs/s", "of 4.2e12 bound", "torch chunked ms", "speed-up",
              "KeOps ms", "KeOps / pointops", "rel l2 err pointops / torch / KeOps", "target"]
    text = "## Particle sums (`pointops.particle_sum`)\n\n"
    text += (f"Device: {device}. float32, D = 3, targets and sources uniform in the unit cube, weights "
             f"randn; Gaussian sigma = {SIGMA:g}, Helmholtz k = {WAVENUMBER:g}. pointops ms: median of the "
             "whole call (CUDA events on a GPU) after warm-up. pairs/s = M x N / time (pair·rhs/s for 16 "
             "right-hand sides); the bound, 4.2e12 pairs/s, is one MUFU exp2 (Gaussian) or rsqrt (Laplace) "
             "per pair on an H100 (given for those kernels only). torch chunked: `torch.cdist(x_chunk, y)`, "
             "`.pow(2)`, `exp` (Laplace `1/(4 pi r)`, Helmholtz `torch.polar(1/(4 pi r), k r)`, r = 0 "
             "masked), `@ w`, in target chunks whose matrix is <= 1 GiB; \"est.\" = timed on the first "
             "targets named and scaled linearly to all M (at 10^12 pairs a full run takes minutes; under "
             "autograd every chunk's matrices are kept, 80 GB at 1e5 x 1e5). KeOps: `LazyTensor` "
             "`(-(x_i - y_j).sqnorm2() / (2 sigma^2)).exp() @ w`, Laplace `sqnorm2().rsqrt() @ w / (4 pi)` "
             "(KeOps' Rsqrt is 0 at 0, so r = 0 drops out), Helmholtz real and imaginary parts with "
             f"`cos`/`sin`; KeOps here: {keops_note}. Errors: relative l2 against a float64 direct sum on "
             "256 random targets (fwd+bwd: the output f, then d/dx on 256 targets and d/dy, d/dc on 256 "
             "sources; torch: d/dx of its targets). fwd+bwd: `(f * g).sum().backward()`, g fixed random, "
             "gradients to targets, sources and weights.\n\n")
    text += markdown_table(header, rows)
    if memory and device == "cuda":
        mb = lambda b: "-" if b is None else f"{b / 2 ** 20:.1f}"  # noqa: E731
        text += ("\n\n### Extra GPU memory of one forward call\n\nPeak allocated by the call (PyTorch's "
                 "allocator, `max_memory_allocated`) minus what was allocated before it and minus the "
                 "output. torch chunked: measured on its (subset) run; the peak is set by the chunk, so it "
                 "is the same for all targets. KeOps: only what it allocates through PyTorch."
                 + (" Target: O(M + N), < 64 MB." if not quick else "") + "\n\n")
        mem_rows = [[label, mb(a), mb(b), mb(c),
                     (f"< 64 MB: {'yes' if a < 64 * 2 ** 20 else 'NO'}" if a is not None and not quick else "-")]
                    for label, a, b, c, _ in memory]
        text += markdown_table(["case", "pointops MB", "torch chunked MB", "KeOps MB", "target"], mem_rows)
    if notes:
        text += "\n\n" + "\n".join(f"- {n}" for n in notes)
    text += "\n\n" + cpu_section(quick)
    return text
