"""Loads the compiled extension: the prebuilt ``pointops._C`` when present, else a JIT build.

Exactly one of the two is ever loaded (both would register the same ``TORCH_LIBRARY``).

Environment:
  POINTOPS_JIT=1          always JIT-build, even when ``pointops._C`` exists.
  POINTOPS_JIT_CUDA=0|1   JIT: build without / with the CUDA sources (default: with, when torch has
                          CUDA and a CUDA compiler is found).
  TORCH_EXTENSIONS_DIR    JIT: the build cache (torch's own setting).

A prebuilt module that exists but cannot load (built for another torch, a missing library) is an
error with the reason, never a silent JIT build: that would hide a broken install, and a wheel has
no sources to build from anyway.
"""
import importlib
import importlib.util
import os

from . import _build_record, _sources, _toolchain
from ._version import __version__

PREBUILT = "pointops._C"


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


def _import_prebuilt(path: str):
    import torch

    built = _build_record.recorded()
    if built is not None:
        problem = _build_record.incompatibility(built, _build_record.installed_torch())
        if problem:
            raise ImportError(f"{problem}\nThe compiled module: {path}\n"
                              f"{_build_record.how_to_fix(built['torch_version'])}")
    try:
        return importlib.import_module(PREBUILT)
    except ImportError as e:
        built_torch = built["torch_version"] if built else None
        if "undefined symbol" in str(e):
            against = f"torch {built_torch}" if built_torch else "a different torch"
            reason = (f"it was most likely compiled against {against}, not the installed torch "
                      f"{torch.__version__} (a C++ symbol it needs is missing)")
        else:
            reason = "a library it needs is missing or does not match"
        raise ImportError(f"pointops: the compiled module {path} cannot load: {reason}.\n"
                          f"{_build_record.how_to_fix(built_torch)}\nThe dynamic loader said: {e}") from e


def load_extension():
    """(module, how): the prebuilt pointops._C ("prebuilt"), or a JIT build ("jit") when
    POINTOPS_JIT=1 or when no pointops._C exists (a source checkout that was never built)."""
    if os.environ.get("POINTOPS_JIT", "0") != "1":
        spec = importlib.util.find_spec(PREBUILT)
        if spec is not None:
            return _import_prebuilt(spec.origin), "prebuilt"
    return _jit_build(), "jit"
