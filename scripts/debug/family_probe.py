"""Some op families alone on a GPU, for a session short on device time.

JIT-builds csrc/pointops.cpp (the schemas) and the sources of the named families only, as the
pointops extension (the other families' ops then have no kernels), then runs pytest or a script in
this process:

    python scripts/debug/family_probe.py grid,chamfer,neighbors pytest tests/test_grid_search.py -m cuda
    python scripts/debug/family_probe.py grid,chamfer,neighbors run scripts/debug/grid_cuda_check.py time
    python scripts/debug/family_probe.py grid,chamfer,neighbors build        # only build (and load)

The JIT build of chamfer + grid + neighbors took 321 s on the H100 machine (MAX_JOBS=16). A build
killed half-way leaves torch's lock file in its build folder, and every later load on that machine
then waits on it for ever: remove ~/.cache/torch_extensions/*/pointops_C_cuda/lock first
(scripts/debug/grid_gpu_session.sh does).

A family is a folder of csrc/ (chamfer, grid, neighbors, particle_sum, strided, voxelize; common
is headers only). The full build (`scripts/gpu_check.sh`) remains the real check.
"""
import importlib.util
import os
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]
os.environ.setdefault("POINTOPS_JIT", "1")
os.environ.setdefault("POINTOPS_JIT_CUDA", "1")


def restrict_sources(families):
    """Before pointops is imported: its JIT build compiles csrc/pointops.cpp and these families'
    folders only (pointops._sources loaded by path and its source_files filtered)."""
    spec = importlib.util.spec_from_file_location("pointops._sources", ROOT / "pointops" / "_sources.py")
    sources = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sources)
    sys.modules["pointops._sources"] = sources
    all_sources = sources.source_files
    sources.source_files = lambda with_cuda, root=sources.CSRC: [
        f for f in all_sources(with_cuda, root)
        if f.endswith("pointops.cpp") or any(f"/{family}/" in f for family in families)]


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ("build", "pytest", "run"):
        sys.exit(__doc__)
    families = sys.argv[1].split(",")
    restrict_sources(families)

    import torch

    start = time.perf_counter()
    import pointops

    print(f"family_probe: built {families} in {time.perf_counter() - start:.0f} s;", pointops.build_info(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU", flush=True)
    if sys.argv[2] == "build":
        return
    if sys.argv[2] == "pytest":
        import pytest

        sys.exit(pytest.main(["-p", "no:cacheprovider"] + sys.argv[3:]))
    script = sys.argv[3]
    sys.argv = sys.argv[3:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
