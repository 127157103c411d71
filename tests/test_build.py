"""The package as a user meets it: build facts, the JIT fallback, the demo command, and the refusal
of a build made for another torch."""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pointops
from conftest import HAS_CUDA_BUILD
from pointops import _build_record, _loader

REPO = Path(__file__).resolve().parents[1]


def test_build_info():
    info = pointops.build_info()
    assert info["version"] == pointops.__version__
    assert isinstance(info["cuda"], bool)
    assert info["cuda"] == HAS_CUDA_BUILD
    assert (info["cuda_version"] is not None) == info["cuda"]
    assert info["torch_version"].split(".")[:2] == torch.__version__.split("+")[0].split(".")[:2]
    assert isinstance(info["cuda_archs"], list) and bool(info["cuda_archs"]) == info["cuda"]
    assert all(re.fullmatch(r"(sm|compute)_\d+a?", arch) for arch in info["cuda_archs"]), info["cuda_archs"]
    assert info["loaded"] in ("prebuilt", "jit")
    assert Path(info["path"]).is_file()
    if info["loaded"] == "prebuilt":  # the module inside the package, not a JIT cache
        assert Path(info["path"]).parent == Path(pointops.__file__).parent


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
    assert result.returncode == 0, result.stdout + result.stderr
    info = pointops.build_info()
    lines = result.stdout.splitlines()
    assert lines[0] == f"pointops {pointops.__version__}"
    kind = f"CUDA {info['cuda_version']}, GPU code for {info['cuda_archs'][0]}" if info["cuda"] else "CPU-only"
    assert any(line.startswith("build:") and kind in line for line in lines), result.stdout
    assert f"built against:  torch {info['torch_version']}" in lines, result.stdout
    assert any(line.startswith(f"running:        torch {torch.__version__} ") for line in lines), result.stdout
    assert f"loaded:         {info['loaded']} from {info['path']}" in lines, result.stdout


# ---- A build for another torch: refused with the reason, never an undefined-symbol trace ----

CPU_2_13 = {"torch_version": "2.13.0+cpu", "cuda": False, "cuda_version": None, "cxx11_abi": True}
CUDA_2_13 = {"torch_version": "2.13.0+cu130", "cuda": True, "cuda_version": "13.0", "cxx11_abi": True}


def _installed(version, cuda_version=None, cxx11_abi=True):
    return {"torch_version": version, "cuda_version": cuda_version, "cxx11_abi": cxx11_abi}


@pytest.mark.parametrize("built, running", [
    (CPU_2_13, _installed("2.13.0+cpu")),
    (CPU_2_13, _installed("2.13.1+cpu")),                 # patch releases keep the ABI
    (CPU_2_13, _installed("2.13.0+cu130", "13.0")),       # a CPU build needs no CUDA from torch
    (CPU_2_13, _installed("2.13.0")),                     # no local tag (a source build of torch)
    (CUDA_2_13, _installed("2.13.0+cu130", "13.0")),
    (CUDA_2_13, _installed("2.13.1+cu131", "13.1")),      # same CUDA major: same libcudart.so.13
], ids=["same", "patch", "cpu-build-cuda-torch", "no-local-tag", "cuda-same", "cuda-minor"])
def test_compatible_torch_is_accepted(built, running):
    assert _build_record.incompatibility(built, running) is None


@pytest.mark.parametrize("built, running, why", [
    (CPU_2_13, _installed("2.12.0+cpu"), "C++ ABI changes between minor releases"),
    (CPU_2_13, _installed("2.14.0.dev20260101+cpu"), "C++ ABI changes between minor releases"),
    (CPU_2_13, _installed("3.13.0+cpu"), "C++ ABI changes between minor releases"),
    (CUDA_2_13, _installed("2.13.0+cpu"), "needs libtorch_cuda, which a torch without CUDA lacks"),
    (CUDA_2_13, _installed("2.13.0+cu126", "12.6"),
     "links the CUDA 13 runtime (libcudart.so.13) and this torch uses CUDA 12.6"),
    (CPU_2_13, _installed("2.13.0+cpu", cxx11_abi=False), "_GLIBCXX_USE_CXX11_ABI=1 and this torch uses 0"),
], ids=["older-minor", "newer-nightly", "major", "cuda-build-cpu-torch", "cuda-major", "cxx11-abi"])
def test_incompatible_torch_is_refused_with_the_reason(built, running, why):
    message = _build_record.incompatibility(built, running)
    assert message is not None
    assert message.startswith(f"pointops was built against torch {built['torch_version']} but torch "
                              f"{running['torch_version']} is installed")
    assert why in message


def _import_pointops(prelude: str) -> subprocess.CompletedProcess:
    """`import pointops` in a fresh interpreter after ``prelude``, prebuilt module requested."""
    env = {k: v for k, v in os.environ.items() if k != "POINTOPS_JIT"}
    return subprocess.run([sys.executable, "-c", prelude + "\nimport pointops\nprint('imported')\n"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


requires_prebuilt = pytest.mark.skipif(pointops.build_info()["loaded"] != "prebuilt",
                                       reason="checks the prebuilt pointops._C, and this run uses a JIT build")


@requires_prebuilt
def test_import_refuses_a_build_record_for_another_torch():
    """The loader reads the build record before it imports pointops._C. Here the record (swapped in
    through sys.modules, the package is untouched) says the previous minor release of torch."""
    built = dict(_build_record.recorded() or _build_record.build_facts(HAS_CUDA_BUILD))
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    built["torch_version"] = f"{major}.{minor - 1}.0" if minor > 0 else f"{major - 1}.99.0"
    prelude = ("import sys, types\n"
               f"sys.modules['pointops._build_config'] = types.SimpleNamespace(BUILT_AGAINST={built!r})")
    result = _import_pointops(prelude)
    assert result.returncode != 0 and "imported" not in result.stdout
    assert "ImportError: pointops was built against torch " \
        f"{built['torch_version']} but torch {torch.__version__} is installed" in result.stderr, result.stderr
    assert f"The compiled module: {pointops._C.__file__}" in result.stderr
    assert "rebuild pointops against the installed torch: pip install --no-build-isolation" in result.stderr
    assert f"install the torch it was built for: pip install torch=={built['torch_version']}" in result.stderr
    assert "undefined symbol" not in result.stderr  # refused before the module was loaded


@requires_prebuilt
def test_import_explains_an_undefined_symbol(tmp_path):
    """A compiled module whose C++ symbols the installed torch lacks (what a build for another
    torch without a record looks like): a real shared library that needs a symbol no library
    defines, served as pointops._C. The loader must explain it and must not fall back to a JIT build."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in module")
    (tmp_path / "stub.c").write_text("extern void symbol_from_another_torch(void);\n"
                                     "void *PyInit__C(void) { symbol_from_another_torch(); return 0; }\n")
    library = tmp_path / "_C.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(tmp_path / "stub.c")], check=True)
    prelude = ("import sys, importlib.machinery, importlib.util\n"
               "class StandIn:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name == 'pointops._C':\n"
               f"            loader = importlib.machinery.ExtensionFileLoader(name, {str(library)!r})\n"
               "            return importlib.util.spec_from_loader(name, loader)\n"
               "sys.meta_path.insert(0, StandIn())\n")
    result = _import_pointops(prelude)
    assert result.returncode != 0 and "imported" not in result.stdout
    assert f"pointops: the compiled module {library} cannot load: it was most likely compiled against" \
        in result.stderr, result.stderr
    assert f"not the installed torch {torch.__version__} (a C++ symbol it needs is missing)" in result.stderr
    assert "pip install --no-build-isolation" in result.stderr
    assert "undefined symbol: symbol_from_another_torch" in result.stderr  # the loader's own words, kept


@pytest.fixture
def loader_stubs(monkeypatch):
    """The loader's two ways out, stubbed: which one load_extension takes, and with what."""
    monkeypatch.delenv("POINTOPS_JIT", raising=False)
    monkeypatch.setattr(_loader, "_jit_build", lambda: "jit module")
    monkeypatch.setattr(_loader, "_import_prebuilt", lambda path: f"prebuilt module at {path}")
    real_find_spec = importlib.util.find_spec

    def prebuilt_at(origin):
        spec = None if origin is None else importlib.util.spec_from_loader("pointops._C", loader=None, origin=origin)
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *args: spec if name == "pointops._C" else real_find_spec(name, *args))
    return monkeypatch, prebuilt_at


def test_an_existing_prebuilt_module_is_imported_never_jit(loader_stubs):
    _, prebuilt_at = loader_stubs
    prebuilt_at("/site-packages/pointops/_C.so")
    assert _loader.load_extension() == ("prebuilt module at /site-packages/pointops/_C.so", "prebuilt")


def test_jit_when_no_prebuilt_module_exists(loader_stubs):
    _, prebuilt_at = loader_stubs
    prebuilt_at(None)  # a checkout that was never built
    assert _loader.load_extension() == ("jit module", "jit")


def test_pointops_jit_forces_jit(loader_stubs):
    monkeypatch, prebuilt_at = loader_stubs
    prebuilt_at("/site-packages/pointops/_C.so")
    monkeypatch.setenv("POINTOPS_JIT", "1")
    assert _loader.load_extension() == ("jit module", "jit")
