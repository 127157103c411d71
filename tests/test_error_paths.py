"""Bad input raises, never crashes: each op family's error path in a fresh process (a segfault there
kills only the child, and the parent reports the signal), and the toolchain probe that keeps the
build on a compiler whose extensions share the process's C++ runtime (pointops/_toolchain.py)."""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pointops import _toolchain

REPO = Path(__file__).resolve().parents[1]

# One failing TORCH_CHECK per family, each formatting integers into its message: the first integer
# formatted by a second, uninitialised libstdc++ is what crashed on the GPU image.
BAD_CALLS = {
    "nearest_neighbor": ("pointops.nearest_neighbor(torch.rand(1, 3, 3), torch.rand(1, 4, 2))",
                         "same point dimension D"),
    "voxelize": ("pointops.voxelize(torch.rand(10, 2), [0.5] * 3, [0, 0, 0, 1, 1, 1], 4, 10)",
                 "points must have F >= 3 columns (x, y, z first), got shape [10, 2]"),
    "particle_sum": ("pointops.particle_sum(torch.rand(5, 3), torch.rand(4, 3), torch.rand(3), 'gaussian', sigma=1.0)",
                     "weights must have shape (N,) or (N, C) with N = 4"),
}


@pytest.mark.parametrize("family", sorted(BAD_CALLS))
def test_bad_call_raises_runtime_error_in_a_fresh_process(family):
    call, expected = BAD_CALLS[family]
    code = ("import torch, pointops\n"
            f"try:\n    {call}\nexcept RuntimeError as error:\n    print('raised:', str(error).splitlines()[0])\n"
            "else:\n    print('no error')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (f"the child died with {'signal ' + str(-result.returncode) if result.returncode < 0 else 'exit ' + str(result.returncode)}:\n"
                                    + result.stdout + result.stderr)
    assert result.stdout.startswith("raised:") and expected in result.stdout, result.stdout + result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None
                    or shutil.which("g++") is None, reason="the probe reads ELF files with readelf, links with g++")
def test_toolchain_probe_tells_static_from_dynamic_libstdcxx():
    with tempfile.TemporaryDirectory() as tmp:
        assert _toolchain._links_libstdcxx_dynamically(["g++"], Path(tmp)) is True
        assert _toolchain._links_libstdcxx_dynamically(["g++", "-static-libstdc++"], Path(tmp)) is False
        assert _toolchain._links_libstdcxx_dynamically(["no-such-compiler-here"], Path(tmp)) is None


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None
                    or not any(os.path.exists(c) for c in _toolchain.SYSTEM_CXX),
                    reason="needs readelf and a system g++")
def test_toolchain_choice_replaces_a_static_libstdcxx_default(monkeypatch):
    # A default toolchain that links libstdc++ statically (what the GPU image's compiler does).
    monkeypatch.setattr(_toolchain, "_jit_link_command", lambda: ["g++", "-static-libstdc++"])
    for name in ("CC", "CXX", "LDSHARED", "POINTOPS_SKIP_TOOLCHAIN_CHECK", "POINTOPS_KEEP_TOOLCHAIN"):
        monkeypatch.delenv(name, raising=False)
    messages = []
    chosen = _toolchain.choose(for_jit=True, log=messages.append)
    assert chosen["CXX"] in _toolchain.SYSTEM_CXX and chosen["LDSHARED"] == chosen["CXX"] + " -shared"
    assert "links libstdc++ statically" in messages[0] and chosen["CXX"] in messages[0]
    # CXX from the environment (the GPU image exports its compilers) is replaced too, saying so ...
    monkeypatch.setenv("CXX", "g++")
    messages.clear()
    assert _toolchain.choose(for_jit=True, log=messages.append)["CXX"] in _toolchain.SYSTEM_CXX
    assert "replacing CXX from the environment" in messages[0]
    # ... unless the user insists.
    monkeypatch.setenv("POINTOPS_KEEP_TOOLCHAIN", "1")
    messages.clear()
    assert _toolchain.choose(for_jit=True, log=messages.append) == {}
    assert "WARNING" in messages[0] and "POINTOPS_KEEP_TOOLCHAIN=1" in messages[0]
    monkeypatch.delenv("POINTOPS_KEEP_TOOLCHAIN")
    # A healthy default is left alone, silently.
    monkeypatch.delenv("CXX")
    monkeypatch.setattr(_toolchain, "_jit_link_command", lambda: ["g++"])
    messages.clear()
    assert _toolchain.choose(for_jit=True, log=messages.append) == {} and messages == []
