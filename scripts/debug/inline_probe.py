"""Build one-function extensions with different flags; does formatting an int in TORCH_CHECK crash?"""
import os, subprocess, sys, tempfile
SRC = r'''
#include <torch/extension.h>
at::Tensor f(int64_t n) { TORCH_CHECK(n == 0, "n must be 0, got ", n); return at::zeros({1}); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("f", &f); }
'''
VARIANTS = {"plain": ([], []), "fopenmp": (["-fopenmp"], ["-fopenmp"]), "O3": (["-O3"], [])}
root = tempfile.mkdtemp()
for name, (cflags, ldflags) in VARIANTS.items():
    code = f"""
import torch
from torch.utils.cpp_extension import load_inline
m = load_inline(name='probe_{name}', cpp_sources=[{SRC!r}], extra_cflags={cflags!r}, extra_ldflags={ldflags!r}, build_directory={root!r} + '/{name}', verbose=False)
try:
    m.f(3)
except RuntimeError as e:
    print('raised', str(e).splitlines()[0])
"""
    os.makedirs(f"{root}/{name}", exist_ok=True)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    print(f"{name}: rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()[-200:] if r.returncode else ''}")
