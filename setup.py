"""Build pointops._C: the CUDA extension when torch has CUDA and nvcc is present (or FORCE_CUDA=1),
otherwise the CPU extension. Honours TORCH_CUDA_ARCH_LIST and MAX_JOBS (through torch's build_ext)."""
import importlib.util
import os
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extensions():
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    sources = _load("_pointops_sources", ROOT / "pointops" / "_sources.py")
    version = _load("_pointops_version", ROOT / "pointops" / "_version.py").__version__
    with_cuda = sources.want_cuda()
    print(f"pointops: building the {'CUDA' if with_cuda else 'CPU-only'} extension "
          f"(torch.version.cuda={__import__('torch').version.cuda}, FORCE_CUDA={os.environ.get('FORCE_CUDA', '0')})")
    # Relative paths keep the build reproducible and the compiled file names short.
    files = [os.path.relpath(f, ROOT) for f in sources.source_files(with_cuda, ROOT / "csrc")]
    kwargs = dict(
        name="pointops._C",
        sources=files,
        include_dirs=[str(ROOT / "csrc")],
        define_macros=sources.define_macros(version, with_cuda),
        extra_compile_args={"cxx": sources.cxx_flags(), "nvcc": sources.nvcc_flags()},
        extra_link_args=sources.link_flags(),
    )
    if with_cuda:
        return [CUDAExtension(**kwargs)]
    kwargs["extra_compile_args"] = kwargs["extra_compile_args"]["cxx"]
    return [CppExtension(**kwargs)]


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    return BuildExtension.with_options(use_ninja=True)


# A toolchain that links libstdc++ statically builds a module whose error paths segfault (see
# pointops/_toolchain.py): probe the one setuptools would use and switch to the system g++ if needed.
os.environ.update(_load("_pointops_toolchain", ROOT / "pointops" / "_toolchain.py").choose(for_jit=False))
setup(ext_modules=extensions(), cmdclass={"build_ext": build_ext_class()})
