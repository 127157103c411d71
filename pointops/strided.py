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

__all__ = ["map", "zip", "reduce", "matmul", "MAP_FNS", "ZIP_FNS", "REDUCE_FNS"]

MAP_FNS = ("id", "neg", "exp", "log", "sigmoid", "relu", "inv", "tanh")
ZIP_FNS = ("add", "sub", "mul", "div", "max", "min", "pow", "lt", "eq", "is_close",
           "relu_back", "log_back", "inv_back")
REDUCE_FNS = ("sum", "prod", "max", "min")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_ops = torch.ops.pointops


def _refuse_grad_with_out(name: str, *tensors: Tensor) -> None:
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise RuntimeError(f"{name}(): out= does not support automatic differentiation (an input or out "
                           "requires grad); call it without out= or under torch.no_grad()")


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
        return _ops.strided_map(x, fn)
    _refuse_grad_with_out("map", x, out)
    _ops.strided_map_out(x, fn, out)
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
        return _ops.strided_zip(a, b, fn)
    _refuse_grad_with_out("zip", a, b, out)
    _ops.strided_zip_out(a, b, fn, out)
    return out


def reduce(x: Tensor, dim: Union[int, Sequence[int], None] = None, fn: str = "sum",
           keepdim: bool = False) -> Tensor:
    """Reduces x over `dim` with fn ("sum", "prod", "max", "min"), as torch.sum / prod / amax / amin.

    dim: an int (negative counts from the end), a tuple of distinct ints, or None for every dim.
    keepdim keeps the reduced dims with size 1. Deterministic (see the module docstring).
    """
    if isinstance(dim, int):
        dim = [dim]
    elif dim is not None:
        dim = list(dim)
    return _ops.strided_reduce(x, dim, fn, keepdim)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """(..., n, k) @ (..., k, m) -> (..., n, m), batch dims broadcast, as torch.matmul.

    Operands are read through their strides (a transposed view runs like a contiguous one); k = 0
    gives zeros. float32 is IEEE float32 (no TF32), half types accumulate in float32.
    """
    return _ops.strided_matmul(a, b)


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
def _zip(a, b, fn):
    return _ops.strided_zip(a, b, fn)


def _const(like, value):
    return torch.full((), value, dtype=like.dtype, device=like.device)


def _sum_to(g, shape):
    """g summed over the dims that broadcasting added or expanded, to `shape` (a zip/matmul input's)."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.dim() - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    if not dims:
        return g.reshape(shape)
    return _ops.strided_reduce(g, dims, "sum", True).reshape(shape)


def _map_setup(ctx, inputs, output):
    x, fn = inputs
    ctx.fn = fn
    ctx.save_for_backward(x if fn in ("log", "relu", "inv") else None,
                          output if fn in ("exp", "sigmoid", "tanh") else None)


def _map_backward(ctx, g):
    x, y = ctx.saved_tensors
    fn = ctx.fn
    if fn == "id":
        gx = g
    elif fn == "neg":
        gx = _ops.strided_map(g, "neg")
    elif fn == "exp":
        gx = _zip(g, y, "mul")
    elif fn == "log":
        gx = _zip(x, g, "log_back")
    elif fn == "relu":
        gx = _zip(x, g, "relu_back")
    elif fn == "inv":
        gx = _zip(x, g, "inv_back")
    elif fn == "sigmoid":  # g * (s - s^2)
        gx = _zip(g, _zip(y, _zip(y, y, "mul"), "sub"), "mul")
    else:  # tanh: g - g * t^2
        gx = _zip(g, _zip(g, _zip(y, y, "mul"), "mul"), "sub")
    return gx, None


def _zip_setup(ctx, inputs, output):
    a, b, fn = inputs
    ctx.fn = fn
    ctx.a_shape, ctx.b_shape = a.shape, b.shape
    ctx.save_for_backward(a, b, output if fn == "pow" else None)


def _max_min_weights(a, b, fn):
    """torch.maximum's gradient weights (minimum's with the comparison reversed): 1 where a wins,
    0 where it loses, 1/2 on ties; NaN pairs give 1 to both, as torch's formula does."""
    first, second = (a, b) if fn == "max" else (b, a)
    half_ties = _zip(_zip(a, b, "eq"), _const(a, 0.5), "mul")
    one = _const(a, 1.0)
    wa = _zip(_zip(one, _zip(first, second, "lt"), "sub"), half_ties, "sub")
    wb = _zip(_zip(one, _zip(second, first, "lt"), "sub"), half_ties, "sub")
    return wa, wb


def _zip_backward(ctx, g):
    a, b, y = ctx.saved_tensors
    fn = ctx.fn
    ga = gb = None
    if fn == "add":
        ga, gb = g, g
    elif fn == "sub":
        ga, gb = g, _ops.strided_map(g, "neg")
    elif fn == "mul":
        ga, gb = _zip(g, b, "mul"), _zip(g, a, "mul")
    elif fn == "div":
        ga, gb = _zip(g, b, "div"), _zip(b, _zip(g, a, "mul"), "inv_back")
    elif fn in ("max", "min"):
        wa, wb = _max_min_weights(a, b, fn)
        ga, gb = _zip(g, wa, "mul"), _zip(g, wb, "mul")
    elif fn == "pow":  # torch.pow's formulas (derivatives.yaml), masks included
        ga = torch.where(b == 0, torch.zeros_like(g), g * b * torch.pow(a, b - 1))
        gb = g * torch.where((a == 0) & (b >= 0), torch.zeros_like(y), y * torch.log(a))
    elif fn == "relu_back":  # b * [a > 0]
        gb = _zip(a, g, "relu_back")
    elif fn == "log_back":  # b / a
        ga, gb = _zip(a, _zip(g, b, "mul"), "inv_back"), _zip(a, g, "log_back")
    elif fn == "inv_back":  # -b / a^2: d/da = 2 b / a^3 = -2 * inv_back(a, g b) / a
        ga = _zip(_zip(_zip(a, _zip(g, b, "mul"), "inv_back"), a, "div"), _const(a, -2.0), "mul")
        gb = _zip(a, g, "inv_back")
    # lt, eq, is_close: piecewise constant, zero gradient (None)
    ga = None if ga is None else _sum_to(ga, ctx.a_shape)
    gb = None if gb is None else _sum_to(gb, ctx.b_shape)
    return ga, gb, None


def _reduce_setup(ctx, inputs, output):
    x, dim, fn, keepdim = inputs
    ctx.fn = fn
    ctx.dims = _reduced_dims(x, dim)
    ctx.keepdim = keepdim
    ctx.x_shape = x.shape
    ctx.save_for_backward(x if fn != "sum" else None, output if fn in ("max", "min") else None)


def _prod_of_others(x, dims):
    """For every element, the product of the other elements of its reduction (exact with zeros):
    exclusive prefix and suffix products along the reduced dims, permuted to the inside."""
    kept = [d for d in range(x.dim()) if d not in dims]
    perm = kept + list(dims)
    xt = x.permute(perm)
    flat = xt.reshape(list(xt.shape[:len(kept)]) + [-1])
    work = flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat
    ones = torch.ones_like(work[..., :1])
    pre = torch.cat([ones, work[..., :-1].cumprod(-1)], -1)
    suf = torch.cat([work[..., 1:].flip(-1).cumprod(-1).flip(-1), ones], -1)
    others = (pre * suf).to(x.dtype).reshape(xt.shape)
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return others.permute(inverse)


def _reduce_backward(ctx, g):
    x, y = ctx.saved_tensors
    dims, shape = ctx.dims, ctx.x_shape
    if not dims:  # nothing reduced (0-dim x): the identity
        return g.reshape(shape), None, None, None
    keep_shape = [1 if d in dims else s for d, s in enumerate(shape)]
    gk = g.reshape(keep_shape)
    if ctx.fn == "sum":
        gx = gk.expand(shape)
    elif ctx.fn == "prod":
        gx = _zip(_prod_of_others(x, dims), gk, "mul")
    else:  # max / min: shared evenly between the elements equal to the result (torch.amax's rule)
        mask = _zip(x, y.reshape(keep_shape), "eq")
        count = _ops.strided_reduce(mask, dims, "sum", True)
        gx = _zip(mask, _zip(gk, count, "div"), "mul")
    return gx, None, None, None


def _matmul_setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, g):
    a, b = ctx.saved_tensors
    ga = gb = None
    if ctx.needs_input_grad[0]:
        ga = _sum_to(_ops.strided_matmul(g, b.transpose(-1, -2)), a.shape)
    if ctx.needs_input_grad[1]:
        gb = _sum_to(_ops.strided_matmul(a.transpose(-1, -2), g), b.shape)
    return ga, gb


torch.library.register_autograd("pointops::strided_map", _map_backward, setup_context=_map_setup)
torch.library.register_autograd("pointops::strided_zip", _zip_backward, setup_context=_zip_setup)
torch.library.register_autograd("pointops::strided_reduce", _reduce_backward, setup_context=_reduce_setup)
torch.library.register_autograd("pointops::strided_matmul", _matmul_backward, setup_context=_matmul_setup)
