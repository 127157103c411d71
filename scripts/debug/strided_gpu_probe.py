"""The strided family alone on a GPU, for a session short on device time.

JIT-builds only csrc/pointops.cpp (the schemas) and csrc/strided/* as the pointops extension (the
other families' ops then have no kernels), then:

    python scripts/debug/strided_gpu_probe.py test [pytest args]   # tests/test_strided.py
    python scripts/debug/strided_gpu_probe.py cases                # scripts/sanitize_cases.py strided_cases()
    compute-sanitizer --tool racecheck python scripts/debug/strided_gpu_probe.py cases
    python scripts/debug/strided_gpu_probe.py bench [parts]        # benchmarks/bench_strided.py, CUDA rows

The full build (`scripts/gpu_check.sh`) remains the real check.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_probe import ROOT, restrict_sources  # noqa: E402  (sets POINTOPS_JIT, the paths)

restrict_sources(["strided"])

import torch  # noqa: E402

import pointops  # noqa: E402


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "cases"
    print(pointops.build_info(), torch.cuda.get_device_name(), flush=True)
    if mode == "test":
        import pytest

        sys.exit(pytest.main([str(ROOT / "tests" / "test_strided.py"), "-p", "no:cacheprovider"] + sys.argv[2:]))
    elif mode == "cases":
        sys.path.insert(0, str(ROOT / "scripts"))
        from sanitize_cases import strided_cases

        strided_cases()
    elif mode == "bench":
        import bench_strided

        parts = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else bench_strided.PARTS
        print(bench_strided.run(quick=False, devices=["cuda"], parts=parts))


if __name__ == "__main__":
    main()
