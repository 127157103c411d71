"""Strided tensor kernels: map, zip, reduce and matmul over any strided view, without copies.

The four building blocks of a tensor library (what a minitorch-style course builds by hand), as
torch ops with CPU and CUDA kernels. Every input may be any strided view: permuted, transposed,
sliced with steps, with a storage offset, expanded (zero strides), 0-dim or empty. The kernels read
the caller's strides directly; nothing is made contiguous first.

* ``map(x, fn, *, out=None)``: fn in :data:`MAP_FNS` -- "id", "neg", "exp", "log", "sigmoid",
  "relu", "inv" (1 / x), "tanh".
* ``zip(a, b, fn, *, out=None)``: a and b broadcast as in torch; fn in :data:`ZIP_FNS` -- "add",
  "sub", "mul", "div", "max", "min", "pow", "lt", "eq", "is_close" (|a - b| < 1e-2), and the
  backward helpers "relu_back" (b where a > 0 else 0), "log_back" (b / a), "inv_back" (-b / a^2).
  Comparisons return 1 or 0 in the input dtype.
* ``reduce(x, dim=None, fn="sum", keepdim=False)``: fn in :data:`REDUCE_FNS` -- "sum", "prod",
  "max", "min"; dim an int, a tuple of ints, or None (every dim; so does (), as in torch.sum).
* ``matmul(a, b)``: (..., n, k) @ (..., k, m) -> (..., n, m) with the batch dims broadcast. Both
  operands need at least 2 dims (no 1-D vector forms).

Semantics equal torch's on the same inputs: torch.exp / log / sigmoid / relu / reciprocal / tanh,
torch.add / sub / mul / div / maximum / minimum / pow, torch.sum / prod / amax / amin and
torch.matmul, including NaN and Inf (maximum, amax and relu propagate NaN; comparisons with NaN
give 0). max / min over zero elements are refused, as torch.amax refuses them.

Dtypes: float16, bfloat16, float32, float64 (integer tensors are refused). zip's and matmul's two
operands must have the same dtype: there is no type promotion, a mismatch is refused with a message
naming both. float16 / bfloat16 compute in float32 and round once. matmul: float32 in IEEE float32
(never TF32, whatever torch.backends say), float64 in float64, half types accumulate in float32.

Determinism: reductions and matmul use no atomics and a work split that depends only on the shapes
and strides, so the same input gives bitwise the same output on every run. On the CPU sums are formed
in blocks of 1024 terms in the compute type (32 interleaved sums of 32), the block sums added in
float64; on CUDA each thread adds runs of up to 8 terms pairwise in the compute type and the run
sums in float64, and the threads' sums combine in fixed trees (the same terms in the same order
whatever the input's memory alignment). Either way float32 sums of millions of terms stay within
float32 rounding of the float64 sum.

``out=`` (map and zip): any strided tensor of the result's shape, dtype and device, written in place
(no temporary) and returned. ``out=x`` (in place) works. Refused: an out whose elements share memory
(an expanded tensor), an out that partially overlaps an input (another view of its memory), the
wrong shape / dtype / device, and out= when an input requires grad (as torch refuses it).

Gradients: every op is differentiable (the comparisons have zero gradient). Broadcast dims are summed
back with the strided reduce; matmul's backward is two matmuls over transposed views (no copies).
The backward of map / zip uses these ops themselves (relu_back, log_back, inv_back, ...); pow's and
prod's use torch ops for the masks and the products of the other elements.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from ._entry import eager_entry
from ._transforms import transform_active

__all__ = ["map", "zip", "reduce", "matmul", "MAP_FNS", "ZIP_FNS", "REDUCE_FNS"]

MAP_FNS = ("id", "neg", "exp", "log", "sigmoid", "relu", "inv", "tanh")
ZIP_FNS = ("add", "sub", "mul", "div", "max", "min", "pow", "lt", "eq", "is_close",
           "relu_back", "log_back", "inv_back")
REDUCE_FNS = ("sum", "prod", "max", "min")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_ops = torch.ops.pointops
# The overloads, looked up once (calling an overload packet resolves it on every call), called
# through their C++ entries (pointops/_entry.py): a visible share of a small call's host time.
_MAP, _MAP_OUT = eager_entry(_ops.strided_map.default), eager_entry(_ops.strided_map_out.default)
_ZIP, _ZIP_OUT = eager_entry(_ops.strided_zip.default), eager_entry(_ops.strided_zip_out.default)
_REDUCE, _MATMUL = eager_entry(_ops.strided_reduce.default), eager_entry(_ops.strided_matmul.default)


def _refuse_grad_with_out(name: str, *tensors: Tensor) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(f"{name}(): out= does not support automatic differentiation (an input or out "
                           "requires grad); call it without out= or under torch.no_grad()")
    if transform_active():
        raise RuntimeError(f"{name}(): out= is not supported under torch.func transforms or forward-mode AD "
                           "(it writes in place); call it without out=")


def map(x: Tensor, fn: str, *, out: Optional[Tensor] = None) -> Tensor:
    """fn applied to every element of x: ``map(x, "exp")`` equals ``torch.exp(x)``.

    Args:
        x: any strided tensor (float16, bfloat16, float32, float64), read through its strides.
        fn: one of :data:`MAP_FNS`.
        out: optional tensor of x's shape and dtype, written in place and returned; may be x.

    Returns:
        A new tensor (x's layout when x is dense, else contiguous), or ``out``.
    """
    if out is None:
        return _MAP(x, fn)
    _refuse_grad_with_out("map", x, out)
    _MAP_OUT(x, fn, out)
    return out


def zip(a: Tensor, b: Tensor, fn: str, *, out: Optional[Tensor] = None) -> Tensor:
    """fn applied to the broadcast pairs of a and b: ``zip(a, b, "add")`` equals ``a + b``.

    Args:
        a, b: strided tensors of one dtype that broadcast together (as in torch).
        fn: one of :data:`ZIP_FNS`.
        out: optional tensor of the broadcast shape and the dtype, written in place and returned;
            may be a or b when it has the broadcast shape.
    """
    if out is None:
        return _ZIP(a, b, fn)
    _refuse_grad_with_out("zip", a, b, out)
    _ZIP_OUT(a, b, fn, out)
    return out


def reduce(x: Tensor, dim: Union[int, Sequence[int], None] = None, fn: str = "sum",
           keepdim: bool = False) -> Tensor:
    """Reduces x over `dim` with fn ("sum", "prod", "max", "min"), as torch.sum / prod / amax / amin.

    dim: an int (negative counts from the end), a tuple of distinct ints, or None for every dim.
    keepdim keeps the reduced dims with size 1. Deterministic (see the module docstring).
    """
    # The op's dim is int[1]? (as torch.sum's): a plain int binds to it directly, ~0.3 us less than
    # a one-element tuple (a small call's host time is its cost); a tuple binds faster than a list.
    if type(dim) is not int and dim is not None and type(dim) is not tuple:
        dim = (dim,) if isinstance(dim, int) else tuple(dim)
    return _REDUCE(x, dim, fn, keepdim)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """(..., n, k) @ (..., k, m) -> (..., n, m), batch dims broadcast, as torch.matmul.

    Operands are read through their strides (a transposed view runs like a contiguous one); k = 0
    gives zeros. float32 is IEEE float32 (no TF32), half types accumulate in float32.
    """
    return _MATMUL(a, b)


# ---------------------------------------------------------------- fake kernels (torch.compile)
# The shape and dtype checks of csrc/strided/strided_checks.cpp, for fake tensors.
def _check_fn(fn, known, what):
    torch._check(fn in known, lambda: f"{what}: fn must be one of {', '.join(repr(k) for k in known)}; got {fn!r}")


def _check_dtype(t, name):
    torch._check(t.dtype in _DTYPES,
                 lambda: f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype} (shape {tuple(t.shape)})")


def _zip_shape(a, b, what="zip"):
    _check_dtype(a, "a")
    _check_dtype(b, "b")
    torch._check(a.dtype == b.dtype, lambda: f"{what}: b must have the same dtype as a ({a.dtype}), got {b.dtype}")
    torch._check(a.device == b.device, lambda: f"{what}: b must be on the same device as a ({a.device}), got {b.device}")
    return torch.broadcast_shapes(a.shape, b.shape)


def _reduced_dims(x, dim):
    if isinstance(dim, int):
        dim = (dim,)
    if not dim:
        return list(range(x.dim()))
    rng = max(x.dim(), 1)
    dims = []
    for d in dim:
        torch._check(-rng <= d < rng, lambda: f"reduce: dim {d} is out of range for x of shape {tuple(x.shape)}")
        w = d + rng if d < 0 else d
        torch._check(w not in dims, lambda: f"reduce: dim {w} appears more than once in dim={list(dim)}")
        dims.append(w)
    return sorted(dims) if x.dim() > 0 else []


def _reduce_shape(x, dims, keepdim):
    return [1 if d in dims else s for d, s in enumerate(x.shape) if keepdim or d not in dims]


@torch.library.register_fake("pointops::strided_map")
def _map_fake(x, fn):
    _check_fn(fn, MAP_FNS, "map")
    _check_dtype(x, "x")
    return torch.empty_like(x, memory_format=torch.preserve_format)


@torch.library.register_fake("pointops::strided_map_out")
def _map_out_fake(x, fn, out):
    _check_fn(fn, MAP_FNS, "map")
    _check_dtype(x, "x")
    torch._check(out.shape == x.shape, lambda: f"map: out must have the result's shape {list(x.shape)}")
    return None


@torch.library.register_fake("pointops::strided_zip")
def _zip_fake(a, b, fn):
    _check_fn(fn, ZIP_FNS, "zip")
    return a.new_empty(_zip_shape(a, b))


@torch.library.register_fake("pointops::strided_zip_out")
def _zip_out_fake(a, b, fn, out):
    _check_fn(fn, ZIP_FNS, "zip")
    shape = _zip_shape(a, b)
    torch._check(out.shape == shape, lambda: f"zip: out must have the result's shape {list(shape)}")
    return None


@torch.library.register_fake("pointops::strided_reduce")
def _reduce_fake(x, dim=None, fn="sum", keepdim=False):
    _check_fn(fn, REDUCE_FNS, "reduce")
    _check_dtype(x, "x")
    dims = _reduced_dims(x, dim)
    return x.new_empty(_reduce_shape(x, dims, keepdim))


@torch.library.register_fake("pointops::strided_matmul")
def _matmul_fake(a, b):
    _check_dtype(a, "a")
    _check_dtype(b, "b")
    torch._check(a.dim() >= 2 and b.dim() >= 2, lambda: "matmul: a and b need at least 2 dims")
    torch._check(a.dtype == b.dtype, lambda: f"matmul: b must have the same dtype as a ({a.dtype}), got {b.dtype}")
    torch._check(a.shape[-1] == b.shape[-2], lambda: f"matmul: the inner sizes differ: a has shape "
                 f"{tuple(a.shape)} and b has shape {tuple(b.shape)}")
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.new_empty(list(batch) + [a.shape[-2], b.shape[-1]])


# ---------------------------------------------------------------- autograd
# In C++ (csrc/strided/strided_autograd.cpp): a Python-registered autograd kernel is entered on
# every call, even under no_grad, and costs several times a small op's own host time.
