"""The strided family alone on a GPU, for a session short on device time.

JIT-builds only csrc/pointops.cpp (the schemas) and csrc/strided/* as the pointops extension (the
other families' ops then have no kernels), then:

    python scripts/debug/strided_gpu_probe.py test [pytest args]   # tests/test_strided.py
    python scripts/debug/strided_gpu_probe.py cases                # every CUDA kernel once, checked
    compute-sanitizer --tool racecheck python scripts/debug/strided_gpu_probe.py cases
    python scripts/debug/strided_gpu_probe.py bench                # benchmarks/bench_strided.py, CUDA rows

The full build (`scripts/gpu_check.sh`) remains the real check.
"""
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
os.environ.setdefault("POINTOPS_JIT", "1")
os.environ.setdefault("POINTOPS_JIT_CUDA", "1")

# Load pointops._sources before the package, and keep only the strided sources.
spec = importlib.util.spec_from_file_location("pointops._sources", ROOT / "pointops" / "_sources.py")
_sources = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_sources)
sys.modules["pointops._sources"] = _sources
_all_sources = _sources.source_files
_sources.source_files = lambda with_cuda, root=_sources.CSRC: [
    f for f in _all_sources(with_cuda, root) if "/strided/" in f or f.endswith("pointops.cpp")]

import torch  # noqa: E402

import pointops  # noqa: E402
from pointops import strided  # noqa: E402


def close(got, ref, rtol):
    got, ref = got.double().cpu(), ref.double().cpu()
    scale = ref.abs().max().clamp(min=1e-30)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = ((got - ref).abs().max() / scale).item() if got.numel() else 0.0
    assert err <= rtol, err


def cases():
    torch.manual_seed(0)
    for dtype, rtol in ((torch.float32, 1e-5), (torch.float64, 1e-12), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
        x = torch.randn(37, 130, dtype=dtype)
        views = [x, x.t(), x[1::2, 3::3], x[:, :128], torch.randn(1, 130, dtype=dtype).expand(37, 130)]
        for v in views:
            for fn in ("exp", "relu", "neg"):
                close(strided.map(v.cuda(), fn), strided.map(v, fn), rtol)
            close(strided.zip(v.cuda(), v[0].cuda(), "add"), strided.zip(v, v[0], "add"), rtol)
            for dim in (0, 1, None, (0, 1)):
                for fn in ("sum", "max"):
                    close(strided.reduce(v.cuda(), dim, fn), strided.reduce(v.double(), dim, fn), rtol)
        long_row = (torch.rand(3, 300_000) / 300_000).to(dtype)  # sums ~0.5: finite in float16 too
        close(strided.reduce(long_row.cuda(), 1), strided.reduce(long_row.double(), 1), rtol)
        long_col = torch.rand(10_000, 70, dtype=dtype)
        close(strided.reduce(long_col.cuda(), 0), strided.reduce(long_col.double(), 0), rtol)
        for sa, sb in (((33, 71), (71, 65)), ((2, 1, 130, 260), (3, 260, 129)), ((5, 0), (0, 4))):
            a, b = torch.randn(sa, dtype=dtype), torch.randn(sb, dtype=dtype)
            for ta, tb in ((a, b), (a.mT.contiguous().mT, b.mT.contiguous().mT)):
                ref = torch.matmul(ta.double(), tb.double())
                close(strided.matmul(ta.cuda(), tb.cuda()), ref, max(rtol, 1e-5) * 10)
    out = torch.empty(130, 37, device="cuda").t()
    strided.map(torch.randn(37, 130, device="cuda"), "tanh", out=out)
    torch.cuda.synchronize()
    print("strided cases ok")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "cases"
    print(pointops.build_info(), torch.cuda.get_device_name(), flush=True)
    if mode == "test":
        import pytest

        sys.exit(pytest.main([str(ROOT / "tests" / "test_strided.py"), "-p", "no:cacheprovider"] + sys.argv[2:]))
    elif mode == "cases":
        cases()
    elif mode == "bench":
        import bench_strided

        print(bench_strided.run(quick=False, devices=["cuda"]))


if __name__ == "__main__":
    main()
