"""Loads the compiled extension: the prebuilt ``pointops._C`` when present, else a JIT build.

Exactly one of the two is ever loaded (both would register the same ``TORCH_LIBRARY``).

Environment:
  POINTOPS_JIT=1          always JIT-build, even when ``pointops._C`` exists.
  POINTOPS_JIT_CUDA=0|1   JIT: build without / with the CUDA sources (default: with, when torch has
                          CUDA and a CUDA compiler is found).
  TORCH_EXTENSIONS_DIR    JIT: the build cache (torch's own setting).
"""
import importlib
import os

from . import _sources, _toolchain
from ._version import __version__


def _jit_build():
    import torch
    from torch.utils.cpp_extension import load

    flag = os.environ.get("POINTOPS_JIT_CUDA")
    with_cuda = _sources.want_cuda() if flag is None else flag == "1"
    if not _sources.CSRC.is_dir():
        raise ImportError(
            f"pointops: the compiled extension pointops._C is missing and the sources for a JIT "
            f"build are not at {_sources.CSRC}; reinstall with `pip install --no-build-isolation .`")
    # A distinct module name per variant so a CPU and a CUDA build never share a cache entry.
    name = "pointops_C_cuda" if with_cuda else "pointops_C_cpu"
    macros = _sources.define_macros(__version__, with_cuda)
    # ninja hands flags to a shell: string literals keep their quotes only when escaped.
    defines = [f"-D{k}" if v is None else f"-D{k}={v}".replace('"', '\\"') for k, v in macros]
    # The same toolchain check as setup.py (pointops/_toolchain.py), for this build only.
    chosen = _toolchain.choose(for_jit=True)
    saved = {key: os.environ.get(key) for key in chosen}
    os.environ.update(chosen)
    try:
        return load(
            name=name,
            sources=_sources.source_files(with_cuda),
            extra_cflags=_sources.cxx_flags() + defines,
            extra_cuda_cflags=_sources.nvcc_flags() + defines if with_cuda else None,
            extra_ldflags=_sources.link_flags(),
            extra_include_paths=[str(_sources.CSRC)],
            with_cuda=with_cuda,
            is_python_module=True,
            verbose=os.environ.get("POINTOPS_JIT_VERBOSE", "0") == "1",
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load_extension():
    if os.environ.get("POINTOPS_JIT", "0") != "1":
        try:
            return importlib.import_module("pointops._C"), "prebuilt"
        except ImportError:
            pass
    return _jit_build(), "jit"
