"""The package as a user meets it: build facts, the JIT fallback, the demo command."""
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import pointops
from conftest import HAS_CUDA_BUILD

REPO = Path(__file__).resolve().parents[1]


def test_build_info():
    info = pointops.build_info()
    assert info["version"] == pointops.__version__
    assert isinstance(info["cuda"], bool)
    assert info["cuda"] == HAS_CUDA_BUILD
    assert (info["cuda_version"] is not None) == info["cuda"]
    assert info["torch_version"].split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
    assert info["loaded"] in ("prebuilt", "jit")


def test_jit_build_from_clean_cache(tmp_path):
    """POINTOPS_JIT=1 builds the CPU sources with torch.utils.cpp_extension.load into an empty
    cache, loads that (never the prebuilt module as well) and runs an op."""
    code = (
        "import torch, pointops\n"
        "info = pointops.build_info()\n"
        "assert info['loaded'] == 'jit' and info['cuda'] is False, info\n"
        "x, y = torch.rand(2, 50, 3), torch.rand(2, 40, 3)\n"
        "dist, idx = pointops.nearest_neighbor(x, y)\n"
        "ref = ((x[:, :, None] - y[:, None]) ** 2).sum(-1).min(-1)\n"
        "assert torch.allclose(dist, ref.values, rtol=1e-5, atol=1e-7)\n"
        "v = pointops.voxelize(torch.rand(100, 4), [0.5] * 3, [0, 0, 0, 1, 1, 1], 4, 10)\n"
        "assert int(v.num_points.sum()) > 0\n"
        "print('jit ok', info)\n"
    )
    env = dict(os.environ, POINTOPS_JIT="1", POINTOPS_JIT_CUDA="0", TORCH_EXTENSIONS_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "jit ok" in result.stdout
    assert any((tmp_path / "cache").rglob("pointops_C_cpu*.so")), "the JIT build did not land in the given cache"


def test_demo_command_fits(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pointops", "demo", "--device", "cpu", "--steps", "30", "--points", "1024",
         "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(v) for v in re.findall(r"chamfer ([0-9.]+)", result.stdout)]
    assert len(losses) >= 3 and losses[-1] < 0.25 * losses[0], result.stdout
    assert "bitwise identical: True" in result.stdout


def test_info_command():
    result = subprocess.run([sys.executable, "-m", "pointops", "info"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "'version'" in result.stdout
