"""pointops.strided (map / zip / reduce / matmul) against torch, on every kind of strided view.

torch is the oracle, evaluated in float64 on the same input values (inputs widen exactly). The
tolerances follow from the numerics:
* float64: 1e-12 relative (a few roundings; transcendental functions differ by ~1 ulp between libm
  and torch's vector math);
* float32: 1e-6 relative (ours and float64 differ by the float32 roundings: ~1 ulp for the
  elementwise functions, 6e-8);
* float16 / bfloat16: computed in float32 and rounded once: unit roundoff 2^-11 / 2^-8, so 2e-3 /
  1e-2 relative.
Reductions over n terms add the blocked-summation error (on the CPU blocks of 1024 in the compute
type as 32 interleaved sums of 32 then a 5-level tree, block sums in float64; on CUDA runs of up to
8 terms summed pairwise in the compute type, at most 3 u, then float64 per thread): at worst
(31 + 5) u = 2.1e-6 of the sum of magnitudes, in practice a few u (random rounding errors grow as a
square root), hence 1e-6; matmul's float32 dot products of length k are within
k u of the sum of |a||b|.
"""
import builtins
import math

import pytest
import torch

from pointops import strided
from conftest import DEVICES, check_cuda_graph, requires_cuda

RTOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
ATOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

MAP_ORACLE = {
    "id": lambda x: x, "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sigmoid": torch.sigmoid,
    "relu": torch.relu, "inv": torch.reciprocal, "tanh": torch.tanh,
}
ZIP_ORACLE = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "pow": torch.pow,
    "lt": lambda a, b: (a < b).to(a.dtype), "eq": lambda a, b: (a == b).to(a.dtype),
    "is_close": lambda a, b: ((a - b).abs() < 1e-2).to(a.dtype),
    "relu_back": lambda a, b: torch.where(a > 0, b, torch.zeros_like(b)),
    "log_back": lambda a, b: b / a, "inv_back": lambda a, b: -b / (a * a),
}
# Inputs kept away from zero where the function has a pole or needs a positive argument.
POSITIVE_MAP = {"log", "inv"}
POSITIVE_ZIP_A = {"pow", "log_back", "inv_back"}
NONZERO_ZIP_B = {"div"}


def reduce_oracle(x, dims, fn, keepdim):
    """torch.sum / prod / amax / amin over the tuple of dims (prod one dim at a time)."""
    if fn == "sum":
        return torch.sum(x, dims, keepdim=keepdim)
    if fn == "max":
        return torch.amax(x, dims, keepdim=keepdim)
    if fn == "min":
        return torch.amin(x, dims, keepdim=keepdim)
    out = x
    for d in sorted(dims, reverse=True):
        out = torch.prod(out, d, keepdim=keepdim)
    return out


# ------------------------------------------------------------------------------------ layouts
def make(shape, layout, dtype=torch.float32, device="cpu", gen=None, positive=False, requires_grad=False):
    """A tensor of `shape` in the given layout (values randn, or in [0.5, 2) when positive)."""
    shape = list(shape)
    gen = gen or torch.Generator().manual_seed(0)

    def values(s):
        v = torch.randn(s, generator=gen, dtype=torch.float64)
        if positive:
            v = 0.5 + 1.5 * torch.rand(s, generator=gen, dtype=torch.float64)
        return v.to(dtype).to(device)

    if layout == "contiguous" or len(shape) == 0:
        t = values(shape)
    elif layout == "permuted":  # dims stored in reverse order
        t = values(shape[::-1]).permute(*reversed(range(len(shape))))
    elif layout == "stepped":  # every second element of a larger tensor, with a storage offset
        big = values([2 * s + 1 for s in shape])
        t = big[tuple(slice(1, 1 + 2 * s, 2) for s in shape)]
    elif layout == "transposed":  # last two dims swapped
        if len(shape) < 2:
            t = values(shape)
        else:
            t = values(shape[:-2] + [shape[-1], shape[-2]]).transpose(-1, -2)
    elif layout == "expanded":  # the first dim of size > 1 is a zero-stride expansion
        small = list(shape)
        for i, s in enumerate(small):
            if s > 1:
                small[i] = 1
                break
        t = values(small).expand(shape)
    else:
        raise ValueError(layout)
    if requires_grad:
        t.requires_grad_(True)
    return t


LAYOUTS = ["contiguous", "permuted", "stepped", "transposed", "expanded"]


def check_close(got, ref, dtype):
    assert got.dtype == dtype
    assert tuple(got.shape) == tuple(ref.shape)
    torch.testing.assert_close(got.detach().cpu().double(), ref.detach().cpu().double(), rtol=RTOL[dtype],
                               atol=ATOL[dtype], equal_nan=True)


def check_sum(got, x, dim):
    """A float32 sum of x over dim within 1e-6 of the sum of magnitudes of the float64 sum (the
    blocked-sum bound, module docstring): relative to the result it can be any size under
    cancellation."""
    xd = x.detach().cpu().double()
    ref, scale = xd.sum(dim), xd.abs().sum(dim)
    assert got.dtype == torch.float32 and tuple(got.shape) == tuple(ref.shape)
    err = (got.detach().cpu().double() - ref).abs()
    assert (err <= 1e-6 * scale + 1e-30).all(), err.max()


# ------------------------------------------------------------------------------------ map / zip
@pytest.mark.parametrize("fn", strided.MAP_FNS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_map_layouts(fn, layout):
    x = make((3, 4, 5), layout, positive=fn in POSITIVE_MAP)
    check_close(strided.map(x, fn), MAP_ORACLE[fn](x.double()), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", strided.MAP_FNS)
def test_map_dtypes(device, dtype, fn):
    x = make((37, 129), "stepped", dtype, device, positive=fn in POSITIVE_MAP)
    check_close(strided.map(x, fn), MAP_ORACLE[fn](x.double()), dtype)


@pytest.mark.parametrize("fn", strided.ZIP_FNS)
@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
def test_zip_layouts(fn, la, lb):
    g = torch.Generator().manual_seed(1)
    a = make((3, 4, 5), la, gen=g, positive=fn in POSITIVE_ZIP_A)
    b = make((3, 4, 5), lb, gen=g, positive=fn in NONZERO_ZIP_B)
    if fn in ("lt", "eq", "is_close"):
        b = torch.where(torch.rand(b.shape, generator=g) < 0.3, a + 0.005 * (fn == "is_close"), b)
    check_close(strided.zip(a, b, fn), ZIP_ORACLE[fn](a.double(), b.double()), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", strided.ZIP_FNS)
def test_zip_dtypes(device, dtype, fn):
    g = torch.Generator().manual_seed(2)
    a = make((33, 65), "contiguous", dtype, device, g, positive=fn in POSITIVE_ZIP_A)
    b = make((65,), "stepped", dtype, device, g, positive=fn in NONZERO_ZIP_B)
    check_close(strided.zip(a, b, fn), ZIP_ORACLE[fn](a.double(), b.double()), dtype)


BROADCASTS = [
    ((), ()), ((), (3, 4)), ((3, 4), ()), ((3, 1), (1, 4)), ((2, 1, 4), (3, 1)), ((5,), (2, 3, 5)),
    ((0,), (3, 0)), ((2, 0, 3), (1, 3)), ((1,), (0,)), ((4, 1, 1, 3), (1, 5, 2, 1)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sa,sb", BROADCASTS)
def test_zip_broadcasting(device, sa, sb):
    g = torch.Generator().manual_seed(3)
    for la, lb in [("contiguous", "contiguous"), ("stepped", "permuted"), ("expanded", "transposed")]:
        a, b = make(sa, la, device=device, gen=g), make(sb, lb, device=device, gen=g)
        for fn in ("add", "mul", "max", "lt"):
            check_close(strided.zip(a, b, fn), ZIP_ORACLE[fn](a.double(), b.double()), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_map_zero_dim_and_empty(device):
    x = torch.tensor(0.5, device=device)
    assert strided.map(x, "exp").shape == ()
    check_close(strided.map(x, "exp"), torch.exp(x.double()), torch.float32)
    e = torch.empty(3, 0, 2, device=device)
    assert strided.map(e, "exp").shape == (3, 0, 2)
    assert strided.map(e.transpose(0, 2), "neg").shape == (2, 0, 3)


def test_more_than_eight_dims_after_merging():
    # 10 dims that cannot merge (every dim permuted against its neighbours): the contiguous fallback
    g = torch.Generator().manual_seed(4)
    base = torch.randn([2] * 10, generator=g)
    perm = [1, 0, 3, 2, 5, 4, 7, 6, 9, 8]
    x = base.permute(perm)
    b = torch.randn([2] * 10, generator=g)[..., :1].expand([2] * 10).permute(perm)
    check_close(strided.map(x, "tanh"), torch.tanh(x.double()), torch.float32)
    check_close(strided.zip(x, b, "sub"), x.double() - b.double(), torch.float32)
    out = torch.empty([2] * 10).permute([0, 2, 1, 4, 3, 6, 5, 8, 7, 9])
    strided.zip(x, b, "mul", out=out)
    check_close(out, x.double() * b.double(), torch.float32)
    check_close(strided.reduce(x, (0, 3, 5, 9)), x.double().sum((0, 3, 5, 9)), torch.float32)
    y = torch.randn([2] * 10 + [3, 3], generator=g).permute(perm + [11, 10])
    check_close(strided.matmul(y, y), torch.matmul(y.double(), y.double()), torch.float32)


# ------------------------------------------------------------------------------------ NaN / Inf
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite(device, dtype):
    special = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, -2.0]
    a = torch.tensor(special, dtype=dtype, device=device)[:, None].expand(7, 7)
    b = torch.tensor(special, dtype=dtype, device=device)[None, :].expand(7, 7)
    for fn in strided.MAP_FNS:
        ref = MAP_ORACLE[fn](a.double())
        # The specials map to exact values (0, 1, inf, NaN) except for the transcendental
        # functions at 1 and -2, which CUDA's expf/tanhf round within 2 ulp, not correctly.
        rtol = RTOL[dtype] if fn in ("exp", "log", "sigmoid", "tanh") else 0.0
        torch.testing.assert_close(strided.map(a, fn).double(), ref.to(dtype).double(), equal_nan=True, rtol=rtol,
                                   atol=0, msg=lambda m: f"{fn}: {m}")
    for fn in strided.ZIP_FNS:
        ref = ZIP_ORACLE[fn](a.double(), b.double())
        torch.testing.assert_close(strided.zip(a, b, fn).double(), ref.to(dtype).double(), equal_nan=True,
                                   rtol=RTOL[dtype], atol=0, msg=lambda m: f"{fn}: {m}")
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), -1.0, 2.0]], dtype=dtype, device=device)
    for fn in strided.REDUCE_FNS:
        for dim in (0, 1, None):
            dims = tuple(range(2)) if dim is None else (dim,)
            ref = reduce_oracle(x.double(), dims, fn, False)
            torch.testing.assert_close(strided.reduce(x, dim, fn).double(), ref.to(dtype).double(), equal_nan=True,
                                       msg=lambda m: f"{fn} dim={dim}: {m}")


# ------------------------------------------------------------------------------------ out=
@pytest.mark.parametrize("device", DEVICES)
def test_out_strided_and_in_place(device):
    g = torch.Generator().manual_seed(5)
    x = make((6, 7), "stepped", device=device, gen=g)
    out = torch.full((7, 6), 99.0, device=device).t()  # a transposed out
    assert strided.map(x, "exp", out=out) is out
    check_close(out, torch.exp(x.double()), torch.float32)
    big = torch.zeros(20, 30, device=device)
    window = big[3:15:2, 5:26:3]  # stepped, offset
    strided.zip(x, x[0], "sub", out=window)
    check_close(window, x.double() - x[0].double(), torch.float32)
    assert big[0].abs().sum() == 0 and big[4].abs().sum() == 0  # nothing written outside the view
    y = make((6, 7), "permuted", device=device, gen=g)
    ref = torch.sigmoid(y.double())
    assert strided.map(y, "sigmoid", out=y) is y  # in place
    check_close(y, ref, torch.float32)
    a, b = make((6, 7), "transposed", device=device, gen=g), make((7,), "contiguous", device=device, gen=g)
    ref = a.double() * b.double()
    strided.zip(a, b, "mul", out=a)  # in place into the first operand, the other broadcast
    check_close(a, ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_out_refused(device):
    x = torch.randn(4, 5, device=device)
    with pytest.raises(RuntimeError, match=r"out must have the result's shape"):
        strided.map(x, "exp", out=torch.empty(5, 4, device=device))
    with pytest.raises(RuntimeError, match=r"share memory"):
        strided.map(x, "exp", out=torch.empty(1, 5, device=device).expand(4, 5))
    with pytest.raises(RuntimeError, match=r"share memory"):
        strided.zip(x, x, "add", out=torch.empty(8, device=device).as_strided((4, 5), (1, 1)))
    with pytest.raises(RuntimeError, match=r"out must have the result's dtype"):
        strided.map(x, "exp", out=torch.empty(4, 5, device=device, dtype=torch.float64))
    base = torch.randn(5, 5, device=device)
    with pytest.raises(RuntimeError, match=r"partially overlaps"):
        strided.map(base, "exp", out=base.t())
    with pytest.raises(RuntimeError, match=r"partially overlaps"):
        strided.zip(base[:4], base[1:], "add", out=base[1:])
    with pytest.raises(RuntimeError, match=r"out= does not support automatic differentiation"):
        strided.map(x.requires_grad_(), "exp", out=torch.empty(4, 5, device=device))


# ------------------------------------------------------------------------------------ reduce
REDUCE_DIMS = [0, 1, 2, -1, -3, (0, 2), (2, 0), (1, 2), (0, 1, 2), None]


@pytest.mark.parametrize("fn", strided.REDUCE_FNS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_layouts(fn, layout, keepdim):
    x = make((4, 5, 6), layout, dtype=torch.float64, gen=torch.Generator().manual_seed(6))
    if fn == "prod":
        x = x.abs() + 0.5  # keeps the product well scaled
    for dim in REDUCE_DIMS:
        dims = tuple(range(3)) if dim is None else ((dim,) if isinstance(dim, int) else dim)
        got = strided.reduce(x, dim, fn, keepdim)
        check_close(got, reduce_oracle(x, dims, fn, keepdim), torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", strided.REDUCE_FNS)
def test_reduce_dtypes_and_paths(device, dtype, fn):
    # inner (row) reductions, outer (column) reductions over 64+ columns, mixed tuples
    g = torch.Generator().manual_seed(7)
    for shape, dim in [((37, 300), 1), ((300, 97), 0), ((3, 129, 70), (0, 2)), ((50, 3, 80), (0, 1)),
                       ((2, 3, 4, 5), (1, 3)), ((1000,), None)]:
        x = make(shape, "stepped", dtype, device, g)
        if fn == "prod":
            x = (x.abs() * 0.004 + 0.998).to(dtype)  # products near 1 (1000 terms stay in float16 range)
        dims = tuple(range(len(shape))) if dim is None else ((dim,) if isinstance(dim, int) else dim)
        ref = reduce_oracle(x.double(), dims, fn, False)
        n = math.prod(shape[d] for d in dims)
        # sums: the blocked-sum error relative to the sum of magnitudes, then one output rounding
        scale = reduce_oracle(x.double().abs(), dims, "sum", False) if fn == "sum" else ref.abs()
        rtol = {torch.float64: 1e-13, torch.float32: 1e-6}.get(dtype, RTOL[dtype])
        if fn == "prod":
            rtol = max(rtol, n * {torch.float64: 2e-16}.get(dtype, 6e-8))
        err = (strided.reduce(x, dim, fn).double().cpu() - ref.cpu()).abs()
        assert (err <= rtol * scale.cpu() + 1e-30).all(), (shape, dim, err.max())


@pytest.mark.parametrize("device", DEVICES)
def test_reduce_zero_dim_and_empty(device):
    x = torch.tensor(3.0, device=device)
    for fn in strided.REDUCE_FNS:
        assert strided.reduce(x, None, fn).item() == 3.0
        assert strided.reduce(x, 0, fn).shape == () and strided.reduce(x, -1, fn, keepdim=True).shape == ()
    e = torch.empty(3, 0, 4, device=device)  # non-empty results over zero reduced elements
    check_close(strided.reduce(e, 1), torch.zeros(3, 4, dtype=torch.float64), torch.float32)
    check_close(strided.reduce(e, (1, 2), "prod", keepdim=True), torch.ones(3, 1, 1, dtype=torch.float64),
                torch.float32)
    check_close(strided.reduce(e.transpose(1, 2), 2), torch.zeros(3, 4, dtype=torch.float64), torch.float32)
    assert strided.reduce(e, 0, "max").shape == (0, 4)
    assert strided.reduce(e, None).item() == 0.0
    with pytest.raises(RuntimeError, match=r"over zero elements"):
        strided.reduce(e, 1, "max")


@pytest.mark.parametrize("device", DEVICES)
def test_long_row_sum_within_float32_rounding(device):
    # 2^22 terms: a plain float32 running sum is off by ~1e-4 relative here; ours stays within
    # a few float32 ulps of the float64 sum (u = 6e-8).
    g = torch.Generator().manual_seed(8)
    x = torch.rand(1 << 22, generator=g).to(device)
    ref = x.double().sum()
    for got in (strided.reduce(x, None), strided.reduce(x, 0), strided.reduce(x.view(4, -1), 1).sum()):
        assert abs(got.item() - ref.item()) <= 3 * 2**-24 * ref.item()
    xs = torch.rand(3, 1 << 22, generator=g).to(device)
    refs = xs.double().sum(1)
    assert ((strided.reduce(xs, 1).double() - refs).abs() <= 3 * 2**-24 * refs).all()
    col = xs.t()  # (2^22, 3): the reduced dim has stride 1 inside a transposed view
    assert ((strided.reduce(col, 0).double() - refs).abs() <= 3 * 2**-24 * refs).all()


def test_reduce_deterministic_across_thread_counts():
    g = torch.Generator().manual_seed(9)
    x = torch.randn(1 << 20, generator=g)
    y = torch.randn(3000, 700, generator=g)
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            results.append([strided.reduce(x, None), strided.reduce(y, 0), strided.reduce(y, 1),
                            strided.matmul(y[:300], y[:700].t())])
        for other in results[1:]:
            for r0, r in builtins.zip(results[0], other):
                assert torch.equal(r0, r)
    finally:
        torch.set_num_threads(threads)


def test_reduce_errors():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match=r"reduce: fn must be one of 'sum', 'prod', 'max', 'min'; got 'mean'"):
        strided.reduce(x, 0, "mean")
    with pytest.raises(RuntimeError, match=r"dim 2 is out of range for x of shape \[2, 3\]"):
        strided.reduce(x, 2)
    with pytest.raises(RuntimeError, match=r"appears more than once"):
        strided.reduce(x, (1, -1))
    with pytest.raises(RuntimeError, match=r"x must be float16, bfloat16, float32 or float64, got Long"):
        strided.reduce(torch.ones(3, dtype=torch.long), 0)


# ------------------------------------------------------------------------------------ matmul
def check_matmul(got, a, b, unit=2**-24, rounding=0.0):
    """got against the float64 product of a and b (on a's device): within k unit + rounding (the
    one output rounding of the half types) of the sum of |a||b|, per element."""
    ref = torch.matmul(a.double(), b.double()).cpu()
    scale = torch.matmul(a.double().abs(), b.double().abs()).cpu()
    assert got.shape == ref.shape
    assert ((got.double().cpu() - ref).abs() <= (a.shape[-1] * unit + rounding) * scale).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("la", LAYOUTS)
@pytest.mark.parametrize("lb", LAYOUTS)
def test_matmul_layouts(device, la, lb):
    g = torch.Generator().manual_seed(10)
    a = make((2, 33, 71), la, device=device, gen=g)
    b = make((2, 71, 65), lb, device=device, gen=g)
    check_matmul(strided.matmul(a, b), a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_dtypes_and_broadcast(device, dtype):
    g = torch.Generator().manual_seed(11)
    for sa, sb in [((33, 71), (71, 65)), ((2, 1, 5, 7), (3, 7, 4)), ((1, 130, 260), (4, 260, 300)),
                   ((5, 3), (2, 4, 3, 1))]:
        a, b = make(sa, "stepped", dtype, device, g), make(sb, "transposed", dtype, device, g)
        got = strided.matmul(a, b)
        assert got.dtype == dtype
        unit = {torch.float64: 2**-53, torch.float32: 2**-24, torch.float16: 2**-24, torch.bfloat16: 2**-24}[dtype]
        rounding = {torch.float16: 2**-11, torch.bfloat16: 2**-8}.get(dtype, 0)  # the one output rounding
        check_matmul(got, a, b, unit, rounding)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_k_zero_and_empty(device):
    a, b = torch.randn(3, 0, device=device), torch.randn(0, 4, device=device)
    assert torch.equal(strided.matmul(a, b), torch.zeros(3, 4, device=device))
    assert strided.matmul(torch.randn(2, 0, 3, 5, device=device), torch.randn(5, 2, device=device)).shape == (2, 0, 3, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_is_ieee_float32_not_tf32(device):
    # TF32 keeps 10 mantissa bits: products of values with more bits err by ~1e-3 relative. IEEE
    # float32 stays within k u = 512 * 6e-8 = 3e-5 of the float64 product of the same values.
    g = torch.Generator().manual_seed(12)
    a = (1 + torch.rand(64, 512, generator=g)).to(device)  # positive: no cancellation
    b = (1 + torch.rand(512, 64, generator=g)).to(device)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        got = strided.matmul(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    ref = a.double() @ b.double()
    assert ((got.double() - ref).abs() / ref).max() < 1e-5


def test_matmul_errors():
    with pytest.raises(RuntimeError, match=r"inner sizes differ: a has shape \[3, 4\] \(k = 4\) and b has shape \[5, 2\]"):
        strided.matmul(torch.randn(3, 4), torch.randn(5, 2))
    with pytest.raises(RuntimeError, match=r"batch dims of a \(shape \[2, 3, 4\]\) and b \(shape \[3, 4, 2\]\)"):
        strided.matmul(torch.randn(2, 3, 4), torch.randn(3, 4, 2))
    with pytest.raises(RuntimeError, match=r"a must have at least 2 dims"):
        strided.matmul(torch.randn(4), torch.randn(4, 2))
    with pytest.raises(RuntimeError, match=r"b must have the same dtype as a \(Float\), got Double"):
        strided.matmul(torch.randn(2, 2), torch.randn(2, 2, dtype=torch.float64))


# ------------------------------------------------------------------------------------ errors
def test_errors():
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match=r"map: fn must be one of 'id', 'neg', 'exp', 'log', 'sigmoid', 'relu', "
                       r"'inv', 'tanh'; got 'cos'"):
        strided.map(x, "cos")
    with pytest.raises(RuntimeError, match=r"zip: fn must be one of 'add', .*'inv_back'; got 'hypot'"):
        strided.zip(x, x, "hypot")
    with pytest.raises(RuntimeError, match=r"x must be float16, bfloat16, float32 or float64, got Int \(shape \[3\]\)"):
        strided.map(torch.ones(3, dtype=torch.int32), "exp")
    with pytest.raises(RuntimeError, match=r"b must be float16, bfloat16, float32 or float64, got Long"):
        strided.zip(x, torch.ones(3, dtype=torch.long), "add")
    with pytest.raises(RuntimeError, match=r"the shapes of a \[2, 3\] and b \[4\] do not broadcast"):
        strided.zip(x, torch.randn(4), "add")
    with pytest.raises(RuntimeError, match=r"b must have the same dtype as a \(Float\), got Double"):
        strided.zip(x, x.double(), "add")


@requires_cuda
def test_error_mismatched_devices():
    with pytest.raises(RuntimeError, match=r"same device"):
        strided.zip(torch.randn(3), torch.randn(3, device="cuda"), "add")
    with pytest.raises(RuntimeError, match=r"same device"):
        strided.matmul(torch.randn(3, 3), torch.randn(3, 3, device="cuda"))


# ------------------------------------------------------------------------------------ gradients
def gc(fn, *inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", strided.MAP_FNS)
def test_gradcheck_map(device, fn):
    x = make((3, 4), "transposed", torch.float64, device, positive=fn in POSITIVE_MAP, requires_grad=True)
    gc(lambda t: strided.map(t, fn), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", strided.ZIP_FNS)
def test_gradcheck_zip(device, fn):
    g = torch.Generator().manual_seed(13)
    a = make((3, 1, 4), "stepped", torch.float64, device, g, positive=fn in POSITIVE_ZIP_A, requires_grad=True)
    b = make((5, 1), "transposed", torch.float64, device, g, positive=fn in NONZERO_ZIP_B, requires_grad=True)
    gc(lambda u, v: strided.zip(u, v, fn), a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn", strided.REDUCE_FNS)
def test_gradcheck_reduce(device, fn):
    x = make((3, 4, 5), "permuted", torch.float64, device, positive=fn == "prod", requires_grad=True)
    for dim, keepdim in [(1, False), ((0, 2), True), (None, False), (-1, True)]:
        gc(lambda t: strided.reduce(t, dim, fn, keepdim), x)


def test_prod_gradient_with_zeros():
    x = torch.tensor([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]], dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(strided.reduce(x, 1, "prod").sum(), x)
    y = x.detach().clone().requires_grad_()
    (gy,) = torch.autograd.grad(torch.prod(y, 1).sum(), y)
    assert torch.equal(gx, gy)


def test_max_gradient_ties_as_torch():
    x = torch.tensor([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(strided.reduce(x, 1, "max").sum(), x)
    (gt,) = torch.autograd.grad(torch.amax(x, 1).sum(), x)
    assert torch.equal(gx, gt)
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([1.0, 5.0, 0.0], dtype=torch.float64, requires_grad=True)
    ours = torch.autograd.grad(strided.zip(a, b, "max").sum(), (a, b))
    theirs = torch.autograd.grad(torch.maximum(a, b).sum(), (a, b))
    assert all(torch.equal(o, t) for o, t in builtins.zip(ours, theirs))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_matmul(device):
    g = torch.Generator().manual_seed(14)
    a = make((2, 1, 5, 3), "stepped", torch.float64, device, g, requires_grad=True)
    b = make((4, 3, 6), "transposed", torch.float64, device, g, requires_grad=True)
    gc(strided.matmul, a, b)


# ------------------------------------------------------------------------------------ torch.library / compile
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    ops = torch.ops.pointops
    g = torch.Generator().manual_seed(15)
    x = make((4, 6), "stepped", device=device, gen=g, requires_grad=True)
    b = make((6,), "contiguous", device=device, gen=g, requires_grad=True)
    torch.library.opcheck(ops.strided_map.default, (x, "tanh"))
    torch.library.opcheck(ops.strided_zip.default, (x, b, "mul"))
    torch.library.opcheck(ops.strided_zip.default, (x, b, "max"))
    torch.library.opcheck(ops.strided_reduce.default, (x, [0], "sum", False))
    torch.library.opcheck(ops.strided_reduce.default, (x, -1, "sum", True))  # int[1]?: a plain int
    torch.library.opcheck(ops.strided_reduce.default, (x, None, "max", True))
    torch.library.opcheck(ops.strided_matmul.default, (x, make((6, 3), "transposed", device=device, gen=g,
                                                                requires_grad=True)))
    xd = x.detach()
    torch.library.opcheck(ops.strided_map_out.default, (xd, "exp", torch.empty(6, 4, device=device).t()))
    torch.library.opcheck(ops.strided_zip_out.default, (xd, b.detach(), "add", torch.empty(4, 6, device=device)))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    g = torch.Generator().manual_seed(16)
    x = make((8, 5), "transposed", device=device, gen=g, requires_grad=True)
    w = make((5, 3), "stepped", device=device, gen=g, requires_grad=True)

    def f(x, w):
        h = strided.map(strided.matmul(x, w), "relu")
        h = strided.zip(h, strided.reduce(h, 0, "max", keepdim=True), "sub")
        return strided.reduce(strided.map(h, "exp"), None)

    compiled = torch.compile(f, fullgraph=True)
    results = []
    for fn in (f, compiled):
        loss = fn(x, w)
        results.append((loss.detach(), *torch.autograd.grad(loss, (x, w))))
    for e, c in builtins.zip(*results):
        torch.testing.assert_close(c, e)

    def with_out(x, buf):
        strided.map(x, "exp", out=buf)
        return strided.reduce(buf, 1)

    buf = torch.empty(5, 8, device=device).t()
    xd = x.detach()
    got = torch.compile(with_out, fullgraph=True)(xd, buf)
    torch.testing.assert_close(buf, torch.exp(xd))
    torch.testing.assert_close(got, torch.exp(xd).sum(1))


# ------------------------------------------------------------------------------------ CUDA
@requires_cuda
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_matches_cpu(layout):
    g = torch.Generator().manual_seed(17)
    a, b = make((7, 33, 65), layout, gen=g), make((65,), "stepped", gen=g)
    for fn in strided.MAP_FNS:
        x = a.abs() + 0.5 if fn in POSITIVE_MAP else a
        check_close(strided.map(x.cuda(), fn), strided.map(x, fn).double(), torch.float32)
    for fn in strided.ZIP_FNS:
        u = a.abs() + 0.5 if fn in POSITIVE_ZIP_A else a
        check_close(strided.zip(u.cuda(), b.cuda(), fn), strided.zip(u, b, fn).double(), torch.float32)
    for fn in strided.REDUCE_FNS:
        for dim in (0, 1, 2, (0, 2), None):
            x = a.abs() * 0.01 + 0.995 if fn == "prod" else a
            got, ref = strided.reduce(x.cuda(), dim, fn), strided.reduce(x.double(), dim, fn)
            if fn == "prod":  # float32 products of up to 15015 factors: ~sqrt(n) u, at worst n u
                torch.testing.assert_close(got.double().cpu(), ref, rtol=1e-4, atol=0)
            elif fn == "sum":  # the blocked-sum bound: relative to the sum of magnitudes
                check_sum(got, x, dim)
            else:
                check_close(got, ref, torch.float32)
    m = make((7, 65, 40), layout, gen=g)
    check_matmul(strided.matmul(a.cuda(), m.cuda()), a, m)


@requires_cuda
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_cuda_matmul_whole_tiles(ta, tb):
    # n, m multiples of 128 and k of 16 with 16-byte aligned rows: the float32 kernel without
    # bounds checks, one variant per operand order; then the same values one element off 16-byte
    # alignment (the checked kernel's element loads), which must give bitwise the same product
    # (the same k order per element)
    g = torch.Generator().manual_seed(21)

    def operand(rows, cols, transposed, shift):
        base = torch.randn(rows * cols + 1, generator=g).cuda()
        t = base[shift:shift + rows * cols]
        return t.view(cols, rows).t() if transposed else t.view(rows, cols)

    for batch in (None, 3):
        a, b = operand(256, 144, ta, 0), operand(144, 384, tb, 0)
        if batch:
            a, b = a.expand(batch, -1, -1), b.expand(batch, -1, -1)
        got = strided.matmul(a, b)
        check_matmul(got, a, b)
    a1 = operand(256, 144, ta, 1).copy_(a[0])  # a, b, got: the batched ones
    b1 = operand(144, 384, tb, 1).copy_(b[0])
    assert a1.data_ptr() % 16 != 0 and torch.equal(a1, a[0])
    assert torch.equal(strided.matmul(a1, b1), got[0])


@requires_cuda
def test_cuda_reductions_are_bitwise_repeatable_and_alignment_free():
    # the same values give the same bits on every run, and at another 16-byte alignment (the
    # vector and element paths add the same terms in the same order); shapes reach every kernel:
    # warp rows, block rows with chunks, block-combined chunks, outer columns with and without
    # vectors, with chunk partials
    g = torch.Generator().manual_seed(22)
    for shape, dim in [((300, 640), 1), ((3, 300_000), 1), ((1 << 21,), 0), ((10_000, 128), 0),
                       ((10_000, 70), 0), ((64, 48, 40), (0, 2))]:
        vals = torch.randn(*shape, generator=g)
        x = vals.cuda()
        buf = torch.empty(vals.numel() + 1, device="cuda")
        x1 = buf[1:].view(shape).copy_(x)  # 4 bytes off the allocation's alignment
        first = strided.reduce(x, dim)
        assert torch.equal(strided.reduce(x, dim), first) and torch.equal(strided.reduce(x1, dim), first)
        check_sum(first, vals, dim)


@requires_cuda
def test_cuda_non_default_stream():
    x = torch.randn(1 << 20, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    ref_map, ref_sum, ref_mm = strided.map(x, "exp"), strided.reduce(x, None), strided.matmul(w, w.t())
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        got = (strided.map(x, "exp"), strided.reduce(x, None), strided.matmul(w, w.t()))
    s.synchronize()
    assert torch.equal(got[0], ref_map) and torch.equal(got[1], ref_sum) and torch.equal(got[2], ref_mm)


@requires_cuda
def test_cuda_offsets_beyond_2_31():
    # 2^31 + 2^20 float16 elements (4 GiB): offsets past 2^31 elements, in a stepped view too
    n = (1 << 31) + (1 << 20)
    try:
        x = torch.zeros(n, dtype=torch.float16, device="cuda")
    except torch.cuda.OutOfMemoryError:
        pytest.skip("not enough GPU memory for a 4 GiB tensor")
    x[-5:] = 3.0  # the only non-zeros, all beyond 2^31 (a float16 sum of n ones would overflow)
    tail = x[(1 << 31) - 7::3]
    out = strided.map(tail, "neg")
    check_close(out, -tail.double(), torch.float16)
    assert strided.reduce(x, None).item() == 15.0
    assert strided.reduce(x.view(-1, 1 << 20), 1)[-1].item() == 15.0
    assert strided.reduce(x.view(-1, 1 << 20), 0).sum().item() == 15.0
    strided.zip(x[-1024:], x[-1024:], "add", out=x[-1024:])
    assert x[-1].item() == 6.0


@requires_cuda
def test_cuda_graph_capture_and_replay():
    # Every op, forward and backward, on views (transposed, broadcast): nothing syncs with the host.
    g = torch.Generator().manual_seed(3)
    a = torch.randn(64, 48, generator=g).cuda().requires_grad_()
    b = torch.randn(48, 64, generator=g).cuda().requires_grad_()
    row = torch.randn(48, generator=g).cuda().requires_grad_()
    out = torch.empty_like(a, requires_grad=False)

    def step():
        y = strided.map(a, "tanh")
        z = strided.zip(y, row, "mul")
        w = strided.zip(z, b.t(), "max")
        m = strided.matmul(w, b)
        r = strided.reduce(m, 1, "sum") + strided.reduce(w, (0, 1), "max")
        strided.map(a.detach(), "exp", out=out)
        return (r, out) + torch.autograd.grad(r.sum(), (a, b, row))

    def refill(seed):
        g = torch.Generator().manual_seed(seed)
        for t in (a, b, row):
            t.copy_(torch.randn(t.shape, generator=g))

    # deterministic: no atomics in the strided kernels
    check_cuda_graph(step, refill, exact=range(5))


@requires_cuda
def test_cuda_graph_chunked_reductions():
    # Reductions long enough to be split into chunks whose partials a second kernel combines (a
    # programmatic dependent launch on Hopper): inner with <= 64 and > 64 chunks, outer (dim 0).
    g = torch.Generator().manual_seed(4)
    flat = torch.randn(1 << 22, generator=g).cuda()
    tall = torch.randn(1 << 16, 64, generator=g).cuda()

    def step():
        return (strided.reduce(flat, 0, "sum"), strided.reduce(flat[: 1 << 20], 0, "max"),
                strided.reduce(tall, 0, "sum"), strided.reduce(tall.t(), 1, "min"))

    def refill(seed):
        g = torch.Generator().manual_seed(seed)
        for t in (flat, tall):
            t.copy_(torch.randn(t.shape, generator=g))

    check_cuda_graph(step, refill, exact=range(4))
    want = (flat.double().sum(), flat[: 1 << 20].max(), tall.double().sum(0), tall.min(0).values)
    for got, ref in zip(step(), want):
        # float64 sums of float32 terms: the float32 rounding of the result, plus 2^-24 of sum |x|
        atol = 1e-6 * (flat.abs().sum().item() if got.dim() == 0 else tall.abs().sum(0).max().item())
        torch.testing.assert_close(got.double(), ref.double(), rtol=1e-6, atol=atol)
