"""``particle_sum`` under forward-mode AD and the torch.func transforms.

The plain path's autograd is C++ (csrc/particle_sum/particle_sum_autograd.cpp): fast, but functorch
refuses a C++ autograd::Function and forward mode ignores one. Under a transform (and inside a
forward-mode AD level) :func:`pointops.particle_sum` calls :class:`ParticleSumFunction` instead: the
same kernel forward, the same fused passes backward, tangents from the moments, and a vmap rule that
torch generates over the ops' own batching rules (the vmapped dimension becomes the sums' batch).

Every derivative is computed through this class again, so it can itself be differentiated:

* gaussian: to any order. The moments sum_j h(r_ij) w_j (x_i - y_j), with h = g'(r) / r = -g / sigma^2,
  are two more gaussian sums, -(x_i S(w) - S(w y)) / sigma^2, computed with the coordinates shifted so
  the sources' mean is at the origin (the subtraction then loses about log10(cloud radius / sigma)
  digits, not log10(|x| / sigma)).
* laplace, helmholtz: first derivatives of every argument, and derivatives of the weights' gradient
  (a particle sum). The moments come from the fused kernel, which has no derivative (that needs
  g'(r)/r's own derivative, a kernel pointops does not have): differentiating through them raises a
  RuntimeError, never a silent zero.

With G the output's gradient (PyTorch's conjugate Wirtinger convention for complex values):
  weights: conj(S_j),                      (S, M) = sums and moments of (sources, targets, conj(G))
  sources: Re sum_c c_j^c M_j^c
  targets: Re sum_c conj(G_i^c) m_i^c,     m = moments of (targets, sources, weights)
and the tangent of f_i for tangents (dx, dy, dc):
  S(x, y, dc)_i + m_i . dx_i - sum_d moments(x, y, c dy_d)_i,d
"""
import torch

_SUM = torch.ops.pointops.particle_sum.default
_MOMENTS = torch.ops.pointops._particle_sum_moments.default
_HALF = (torch.float16, torch.bfloat16)


def _real_part(t):
    return t.real if t.is_complex() else t


def particle_sum(targets, sources, weights, params):
    """The differentiable sum (through ParticleSumFunction, so any transform can differentiate it)."""
    return ParticleSumFunction.apply(targets, sources, weights, *params)


# reshape rather than flatten / unflatten: torch's legacy vmap (gradcheck's batched gradients) has no
# rule for those.
def _merge_last(t):
    return t.reshape(*t.shape[:-2], t.shape[-2] * t.shape[-1])


def _split_last(t, rows, cols):
    return t.reshape(*t.shape[:-1], rows, cols)


def _computable(a, b, w):
    """Half coordinates in float32 (complex weights need float32 or float64 coordinates, and the
    composite moments need the range), weights to match when real."""
    if a.dtype in _HALF:
        a, b = a.float(), b.float()
        if not w.is_complex():
            w = w.float()
    return a, b, w


def moments(a, b, w, params):
    """sum_j h(r_ij) w_j (a_i - b_j): (..., M, [C,] D) for weights (..., N[, C])."""
    kernel, sigma, _ = params
    a, b, w = _computable(a, b, w)
    if kernel != "gaussian":
        return SingularMomentsFunction.apply(a, b, w, *params)
    # Only differences enter the sums: a shift of both clouds changes nothing but the rounding.
    origin = b.detach().mean(-2, keepdim=True) if b.shape[-2] > 0 else b.detach().sum(-2, keepdim=True)
    a, b = a - origin, b - origin
    sums = particle_sum(a, b, w, params)
    if w.dim() == a.dim():  # columns: weights w_j^c b_j flattened to (..., N, C * D)
        wb = _merge_last(w.unsqueeze(-1) * b.unsqueeze(-2))
        weighted = _split_last(particle_sum(a, b, wb, params), w.shape[-1], b.shape[-1])
        a_sums = a.unsqueeze(-2) * sums.unsqueeze(-1)
    else:
        weighted = particle_sum(a, b, w.unsqueeze(-1) * b, params)
        a_sums = a * sums.unsqueeze(-1)
    return (a_sums - weighted) * (-1.0 / (sigma * sigma))


def _gradients(grad, targets, sources, weights, params, needs):
    need_targets, need_sources, need_weights = needs
    columns = weights.dim() == targets.dim()
    g = grad.conj() if grad.is_complex() else grad  # the weights of the swapped pass

    def combine(factor, m):  # sum over the weight columns of a (..., C, D) product
        product = factor.unsqueeze(-1) * m
        return _real_part(product.sum(-2) if columns else product)

    grad_targets = grad_sources = grad_weights = None
    if need_targets:
        grad_targets = combine(g, moments(targets, sources, weights, params)).to(targets.dtype)
    if need_sources:
        grad_sources = combine(weights, moments(sources, targets, g, params)).to(sources.dtype)
    if need_weights:
        s = particle_sum(*_computable(sources, targets, g), params)
        s = s.conj() if s.is_complex() else s
        grad_weights = (s if weights.is_complex() else _real_part(s)).to(weights.dtype)
    return grad_targets, grad_sources, grad_weights


def _tangent(targets, sources, weights, params, tangents, out_dtype):
    d_targets, d_sources, d_weights = tangents
    columns = weights.dim() == targets.dim()
    terms = []
    if d_weights is not None:
        terms.append(particle_sum(targets, sources, d_weights, params))
    if d_targets is not None:
        m = moments(targets, sources, weights, params)
        terms.append((m * (d_targets.unsqueeze(-2) if columns else d_targets)).sum(-1))
    if d_sources is not None:
        # sum_j h_ij c_j (x_i - y_j) . dy_j, one column of weights c_j dy_jd per coordinate d
        if columns:
            w = _merge_last(weights.unsqueeze(-1) * d_sources.unsqueeze(-2))
            m = moments(targets, sources, w, params)
            m = m.reshape(*m.shape[:-2], weights.shape[-1], sources.shape[-1], m.shape[-1])
        else:
            m = moments(targets, sources, weights.unsqueeze(-1) * d_sources, params)
        terms.append(-m.diagonal(dim1=-2, dim2=-1).sum(-1))
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total.to(out_dtype)


class ParticleSumFunction(torch.autograd.Function):
    """particle_sum(targets, sources, weights, kernel, sigma, wavenumber) with a backward, a jvp
    and a generated vmap rule (see the module docstring)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(targets, sources, weights, kernel, sigma, wavenumber):
        return _SUM(targets, sources, weights, kernel, sigma, wavenumber)

    @staticmethod
    def setup_context(ctx, inputs, output):
        targets, sources, weights, kernel, sigma, wavenumber = inputs
        ctx.save_for_backward(targets, sources, weights)
        ctx.save_for_forward(targets, sources, weights)
        ctx.params = (kernel, sigma, wavenumber)
        ctx.out_dtype = output.dtype

    @staticmethod
    def backward(ctx, grad):
        targets, sources, weights = ctx.saved_tensors
        return (*_gradients(grad, targets, sources, weights, ctx.params, ctx.needs_input_grad[:3]), None, None, None)

    @staticmethod
    def jvp(ctx, d_targets, d_sources, d_weights, *_):
        targets, sources, weights = ctx.saved_tensors
        return _tangent(targets, sources, weights, ctx.params, (d_targets, d_sources, d_weights), ctx.out_dtype)


class SingularMomentsFunction(torch.autograd.Function):
    """The fused moments of the laplace / helmholtz kernels, which have no derivative here: used
    inside derivatives, so differentiating it means a second derivative through the coordinates."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a, b, w, kernel, sigma, wavenumber):
        return _MOMENTS(a, b, w, kernel, sigma, wavenumber)[1]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.kernel = inputs[3]

    @staticmethod
    def _refuse(kernel):
        raise RuntimeError(
            f"particle_sum: second derivatives through the targets' or sources' gradient are implemented for "
            f"kernel='gaussian' only, got kernel={kernel!r} (they need the derivative of g'(r)/r, a kernel "
            f"pointops does not have yet). First derivatives, and derivatives of the weights' gradient, work for "
            f"every kernel.")

    @staticmethod
    def backward(ctx, grad):
        SingularMomentsFunction._refuse(ctx.kernel)

    @staticmethod
    def jvp(ctx, *tangents):
        SingularMomentsFunction._refuse(ctx.kernel)
