"""Where the C++/CUDA sources are and how they are compiled.

Shared by setup.py and the JIT loader so that both build exactly the same thing. It imports
nothing from the package, so setup.py can load it by path before the package is built.
"""
import os
import re
import sys
from pathlib import Path

# csrc/ sits next to the package in a source checkout (and in an editable install).
CSRC = Path(__file__).resolve().parent.parent / "csrc"


def source_files(with_cuda: bool, root: Path = CSRC):
    """Sorted sources: every .cpp, plus every .cu for a CUDA build."""
    files = sorted(str(p) for p in root.rglob("*.cpp"))
    if with_cuda:
        files += sorted(str(p) for p in root.rglob("*.cu"))
    return files


def define_macros(version: str, with_cuda: bool):
    """Build facts compiled into the module, so that ``_C.build_info()`` describes the binary itself
    (a prebuilt module and a JIT build alike). Values carry no spaces or semicolons: ninja hands
    them to a shell."""
    import torch

    macros = [("POINTOPS_VERSION", f'"{version}"'), ("POINTOPS_TORCH_VERSION", f'"{torch.__version__}"')]
    if with_cuda:
        macros += [("POINTOPS_WITH_CUDA", None), ("POINTOPS_CUDA_VERSION", f'"{torch.version.cuda}"'),
                   ("POINTOPS_CUDA_ARCHS", f'"{",".join(cuda_arch_targets())}"')]
    return macros


def cuda_arch_targets():
    """The GPU code the CUDA build embeds, e.g. ["sm_80", "sm_90", "compute_90"] (compute_XX is
    PTX, compiled for newer GPUs at load). Taken from the same torch function that turns
    TORCH_CUDA_ARCH_LIST (or, unset, the visible GPUs / the CUDA toolkit's list) into the
    -gencode flags that the build passes to nvcc, so the two cannot disagree."""
    try:
        from torch.utils.cpp_extension import _get_cuda_arch_flags  # private: guarded below
        flags = _get_cuda_arch_flags()
    except Exception:  # a torch without that helper: report the request, not a guess
        return [f"requested:{os.environ.get('TORCH_CUDA_ARCH_LIST', 'default').replace(';', ',').replace(' ', '')}"]
    targets = {flag.split("code=")[-1] for flag in flags if "code=" in flag}
    # Machine code (sm_) before PTX (compute_), each by compute capability.
    return sorted(targets, key=lambda t: (t.startswith("compute_"), int(re.sub(r"\D", "", t) or 0), t))


def cxx_flags():
    flags = ["-O3"]  # the C++ standard is torch's choice (c++17 or c++20 by version)
    if sys.platform != "win32":
        # at::parallel_for is a header template: without -fopenmp it silently runs serially.
        # sqrt may set errno for negative inputs; that possibility alone stops loops calling it
        # from vectorising, and no code here reads errno.
        flags += ["-fopenmp", "-fno-math-errno"]
    return flags


def nvcc_flags():
    return ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]


def link_flags():
    return ["-fopenmp"] if sys.platform != "win32" else []


def want_cuda() -> bool:
    """CUDA build when torch has CUDA and a CUDA compiler is found, or when FORCE_CUDA=1."""
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    if os.environ.get("FORCE_CUDA", "0") == "1":
        return True
    if os.environ.get("POINTOPS_CPU_ONLY", "0") == "1":
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None
