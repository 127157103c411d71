"""Farthest point sampling on its own, JIT-built in about a minute instead of the whole extension's
six (H100 machine, 16 jobs), for iterating on csrc/neighbors/farthest_points_cuda.cu:

    python scripts/debug/fps_probe.py [check] [sanitize] [time] [profile fps|fps1m]

It builds the schemas (csrc/pointops.cpp), the checks and both FPS kernels into a module of its own,
named after the sources' contents (it does not import pointops, whose _C would register the same
ops), then
  check:   CUDA == CPU bit for bit on each kernel path (the sizes of tests/test_farthest_points.py),
  sanitize: the same on one case per kernel kind with K = 16 (for compute-sanitizer),
  time:    the benchmark's two sizes (16 x 65536 -> 4096, 1 x 2^20 -> 16384), CUDA events, median,
  profile: one call of the named size after a warm-up (for ncu --launch-skip 1 --launch-count 1).
Extra nvcc flags (a variant's -D switches) come from FPS_PROBE_NVCC_FLAGS.
"""
import hashlib
import importlib.util
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
SOURCES = [CSRC / "pointops.cpp", CSRC / "chamfer" / "chamfer_checks.cpp", CSRC / "neighbors" / "neighbors_checks.cpp",
           CSRC / "neighbors" / "farthest_points_cpu.cpp", CSRC / "neighbors" / "farthest_points_cuda.cu"]


def by_path(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "pointops" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build():
    from torch.utils.cpp_extension import load

    sources, toolchain = by_path("_sources"), by_path("_toolchain")
    extra = os.environ.get("FPS_PROBE_NVCC_FLAGS", "").split()
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in SOURCES) + " ".join(extra).encode()).hexdigest()[:10]
    macros = sources.define_macros("probe", True)
    defines = [f"-D{k}" if v is None else f"-D{k}={v}".replace('"', '\\"') for k, v in macros]
    os.environ.update(toolchain.choose(for_jit=True))
    load(name=f"fps_probe_{digest}", sources=[str(p) for p in SOURCES], extra_cflags=sources.cxx_flags() + defines,
         extra_cuda_cflags=sources.nvcc_flags() + defines + extra, extra_ldflags=sources.link_flags(),
         extra_include_paths=[str(CSRC)], with_cuda=True, is_python_module=True)


def fps(points, K, lengths=None, start=None):
    return torch.ops.pointops.sample_farthest_points(points, lengths, None, K, start)


def check(small=False):
    cases = {"block": (3, 4000, 3, torch.float32), "block-d5": (2, 4000, 5, torch.float32),
             "cluster": (2, 40000, 3, torch.float32), "cluster-f64-d2": (2, 20000, 2, torch.float64),
             "cluster-smem-tier": (1, 100000, 3, torch.float32), "cluster-d64": (2, 3000, 64, torch.float32),
             "grid": (1, 130000, 3, torch.float32), "grid-f64": (1, 70000, 3, torch.float64),
             "grid-smem-tier": (1, 1600000, 3, torch.float32), "grid-d64": (2, 9000, 64, torch.float32),
             "grid-overflow": (1, 9000, 1000, torch.float32)}
    if small:  # for compute-sanitizer: one case per kernel kind, fewer steps
        cases = {k: cases[k] for k in ("block", "cluster", "cluster-smem-tier", "grid-f64", "grid-d64")}
    K = 16 if small else 64
    bad = 0
    for name, (B, N, dim, dtype) in cases.items():
        g = torch.Generator().manual_seed(N + dim)
        points = torch.rand(B, N, dim, generator=g, dtype=torch.float64).to(dtype)
        lengths = torch.tensor([N - 7 * b for b in range(B)])
        start = torch.tensor([-1 - 1000 * b for b in range(B)])
        cpu = fps(points, K, lengths, start)
        gpu = fps(points.cuda(), K, lengths.cuda(), start.cuda()).cpu()
        ties = torch.randint(-2, 3, (B, N, dim), generator=g).to(dtype)  # many equal distances
        same = torch.equal(gpu, cpu) and torch.equal(fps(ties.cuda(), K).cpu(), fps(ties, K))
        bad += not same
        print(f"check {name}: {'ok' if same else 'MISMATCH'}")
    print(f"check: {len(cases) - bad} of {len(cases)} paths equal to the CPU")


def sizes(which):
    return {"fps": (16, 65536, 4096), "fps1m": (1, 2**20, 16384)}[which]


def cloud(which):
    B, N, K = sizes(which)
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.rand(B, N, 3, generator=g, device="cuda"), K


def time_size(which, repeats):
    points, K = cloud(which)
    fps(points, K)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fps(points, K)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    B, N, _ = sizes(which)
    ms = statistics.median(times)
    print(f"time {B} x {N} -> {K}: {ms:.3f} ms median of {repeats} ({1000 * ms / K:.2f} us per step; "
          f"min {min(times):.3f} max {max(times):.3f})")


if __name__ == "__main__":
    build()
    args = sys.argv[1:] or ["check", "time"]
    if "check" in args or "sanitize" in args:
        check(small="sanitize" in args)
    if "time" in args:
        time_size("fps", 10)
        time_size("fps1m", 5)
    if "profile" in args:
        points, K = cloud(args[args.index("profile") + 1])
        for _ in range(2):
            fps(points, K)
        torch.cuda.synchronize()
