"""Build pointops._C: the CUDA extension when torch has CUDA and nvcc is present (or FORCE_CUDA=1),
otherwise the CPU extension. Honours TORCH_CUDA_ARCH_LIST and MAX_JOBS (through torch's build_ext).
Beside the module it writes pointops/_build_config.py: the torch it was compiled against, which the
loader checks before importing it (pointops/_build_record.py)."""
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sources = _load("_pointops_sources", ROOT / "pointops" / "_sources.py")
build_record = _load("_pointops_build_record", ROOT / "pointops" / "_build_record.py")


def extensions(with_cuda):
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    version = _load("_pointops_version", ROOT / "pointops" / "_version.py").__version__
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


def build_ext_class(with_cuda):
    from torch.utils.cpp_extension import BuildExtension

    class BuildAndRecord(BuildExtension.with_options(use_ninja=True)):
        def run(self):
            # A toolchain that links libstdc++ statically builds a module whose error paths segfault
            # (pointops/_toolchain.py): probe the one setuptools would use and switch to the system
            # g++ if needed. Here rather than at import: setup.py is evaluated several times per
            # pip build (requirements, metadata, sdist), and only this command compiles;
            # build_ext.run creates the compiler from CC / CXX / LDSHARED after this.
            os.environ.update(_load("_pointops_toolchain", ROOT / "pointops" / "_toolchain.py").choose(for_jit=False))
            if self.editable_mode:
                # setuptools compiles an editable install in a throw-away directory; the regular
                # build/temp.* keeps the objects, so the next `pip install -e .` or `pip wheel .`
                # recompiles only what changed (ninja) instead of everything.
                plat = f"{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
                self.build_temp = str(ROOT / "build" / f"temp.{plat}")
            super().run()
            self._write_build_config()

        def _write_build_config(self):
            # Next to the compiled module: in the source package for an in-place (editable) build,
            # in build_lib (what goes into the wheel) otherwise.
            config = Path(self.get_ext_fullpath("pointops._C")).parent / build_record.CONFIG_FILE
            config.write_text(build_record.render(build_record.build_facts(with_cuda)))
            print(f"pointops: recorded the build's torch in {config}")

    return BuildAndRecord


WITH_CUDA = sources.want_cuda()
setup(ext_modules=extensions(WITH_CUDA), cmdclass={"build_ext": build_ext_class(WITH_CUDA)})
