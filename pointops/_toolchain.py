"""Choosing a C++ toolchain whose extension shares the process's C++ runtime (Linux).

Why: an extension that carries its own copy of libstdc++ (a compiler configured to link it
statically, or -static-libstdc++ in Python's build flags) has a second C++ runtime whose locale
facets are never initialised, because the process started on the shared libstdc++ that libtorch
loaded. The first integer formatted into an error message (every TORCH_CHECK that prints a size)
then dereferences an uninitialised facet: a segfault instead of a RuntimeError. This was the GPU
image's case: its Python was built with /opt/gcc/bin/g++, so both setuptools (through sysconfig)
and torch's JIT (through `c++` on the PATH) picked a toolchain that links libstdc++ statically.

What: before building, link a two-line C++ shared object with exactly the toolchain the build would
use and read its dynamic section (`readelf -d`): a healthy toolchain lists libstdc++.so as NEEDED.
If it does not, try the system g++ (which links libstdc++ dynamically on every distribution we
know) and, when that one is healthy, use it, saying so, even over CC/CXX/LDSHARED from the
environment (the GPU image exports its /opt/gcc compilers); POINTOPS_KEEP_TOOLCHAIN=1 keeps them. Shared by setup.py and the JIT loader; imports nothing
from the package.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

_PROBE_SOURCE = """
#include <sstream>
#include <string>
std::string pointops_probe(long n) { std::ostringstream s; s << "n = " << n; return s.str(); }
"""
# The system compiler, tried when the default one links libstdc++ statically.
SYSTEM_CXX = ("/usr/bin/g++", "/usr/bin/c++")
_USER_VARIABLES = ("CC", "CXX", "LDSHARED")


def _needed_libraries(shared_object: Path) -> Optional[List[str]]:
    readelf = shutil.which("readelf")
    if readelf is None:
        return None
    out = subprocess.run([readelf, "-d", str(shared_object)], capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def _links_libstdcxx_dynamically(link_command: List[str], workdir: Path) -> Optional[bool]:
    """Compile and link the probe with `link_command` (a compiler driver and its flags).
    None: could not tell (no readelf, or the command does not work at all)."""
    source = workdir / "probe.cpp"
    source.write_text(_PROBE_SOURCE)
    target = workdir / "probe.so"
    try:
        result = subprocess.run(link_command + ["-fPIC", "-shared", str(source), "-o", str(target)],
                                capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):  # no such compiler, or it hangs
        return None
    if result.returncode != 0 or not target.exists():
        return None
    needed = _needed_libraries(target)
    if needed is None:
        return None
    return any(name.startswith("libstdc++.so") for name in needed)


def _setuptools_link_command() -> List[str]:
    """The driver and flags setuptools links a C++ extension with: sysconfig's LDSHARED (or the
    environment's), its first word replaced by the C++ compiler, as distutils does for C++."""
    from setuptools._distutils import ccompiler, sysconfig as distutils_sysconfig

    compiler = ccompiler.new_compiler()
    distutils_sysconfig.customize_compiler(compiler)
    linker = list(getattr(compiler, "linker_so_cxx", None) or compiler.linker_so)  # setuptools >= 72 has _cxx
    if getattr(compiler, "compiler_cxx", None):
        linker[0] = compiler.compiler_cxx[0]
    return [word for word in linker if word != "-shared"]


def _jit_link_command() -> List[str]:
    """torch.utils.cpp_extension.load compiles and links with $CXX, else `c++`."""
    return [os.environ.get("CXX", "c++")]


def choose(for_jit: bool, log=print) -> Dict[str, str]:
    """Environment variables to set so the build links libstdc++ dynamically ({} if the default
    toolchain is fine, could not be probed, or the user chose the toolchain). Logs what it chose."""
    if not sys.platform.startswith("linux") or os.environ.get("POINTOPS_SKIP_TOOLCHAIN_CHECK") == "1":
        return {}
    with tempfile.TemporaryDirectory(prefix="pointops-toolchain-") as tmp:
        default = _jit_link_command() if for_jit else _setuptools_link_command()
        verdict = _links_libstdcxx_dynamically(default, Path(tmp))
        if verdict is not False:
            return {}
        # CC/CXX may come from the environment rather than the user (the GPU image exports its
        # /opt/gcc compilers): a module known to crash is not what anyone asked for, so they are
        # replaced too, saying so, unless POINTOPS_KEEP_TOOLCHAIN=1.
        user_set = [name for name in _USER_VARIABLES if name in os.environ]
        if user_set and os.environ.get("POINTOPS_KEEP_TOOLCHAIN") == "1":
            log(f"pointops: WARNING: {' '.join(default)} links libstdc++ statically into extensions; kept because "
                "POINTOPS_KEEP_TOOLCHAIN=1: the module's error paths may crash.")
            return {}
        for candidate in SYSTEM_CXX:
            if os.path.exists(candidate) and _links_libstdcxx_dynamically([candidate], Path(tmp)):
                c_compiler = candidate.replace("g++", "gcc").replace("c++", "cc")
                chosen = {"CXX": candidate, "LDSHARED": f"{candidate} -shared"}
                if os.path.exists(c_compiler):
                    chosen["CC"] = c_compiler
                overridden = f" (replacing {', '.join(user_set)} from the environment; POINTOPS_KEEP_TOOLCHAIN=1 " \
                    "keeps them)" if user_set else ""
                log(f"pointops: {' '.join(default)} links libstdc++ statically into extensions (a second C++ "
                    f"runtime whose error paths crash); building with {candidate} instead{overridden}")
                return chosen
        log(f"pointops: WARNING: {' '.join(default)} links libstdc++ statically into extensions and no system "
            f"g++ that links it dynamically was found ({', '.join(SYSTEM_CXX)}); the module's error paths may "
            "crash. Set CXX and LDSHARED to a compiler that links libstdc++ dynamically.")
        return {}
