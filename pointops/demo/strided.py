"""Demo: a small MLP written only with pointops.strided ops, on non-contiguous views.

A two-layer perceptron (relu hidden layer, squared-error loss) whose inputs and weights are all
strided views (a transposed batch, transposed and stepped weights, a stepped bias): the forward pass
uses only strided.matmul / zip / map / reduce, the backward pass is autograd through their
gradients. Loss and gradients are checked against the same network in plain torch (float64), then
the matmul throughput and the elementwise bandwidth of this machine are printed next to torch's.
Generates its own data.
"""
from __future__ import annotations

import pathlib

import torch

from .. import strided
from ._common import time_ms


def _views(device, batch, inputs, hidden, outputs, seed):
    """The MLP's tensors as non-contiguous views of fresh storage."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(inputs, batch, generator=g).to(device).t()                 # (batch, inputs), transposed
    y = torch.randn(batch, outputs, generator=g).to(device)
    w1 = (torch.randn(hidden, inputs, generator=g) / inputs**0.5).to(device).t()  # (inputs, hidden), transposed
    b1 = torch.randn(2 * hidden, generator=g).to(device)[::2]                  # stepped
    w2 = (torch.randn(hidden, 2 * outputs, generator=g) / hidden**0.5).to(device)[:, 1::2]  # stepped, offset
    params = [t.requires_grad_() for t in (w1, b1, w2)]
    return x, y, params


def mlp_loss_strided(x, y, w1, b1, w2):
    h = strided.map(strided.zip(strided.matmul(x, w1), b1, "add"), "relu")
    d = strided.zip(strided.matmul(h, w2), y, "sub")
    return strided.reduce(strided.zip(d, d, "mul"), None)


def mlp_loss_torch(x, y, w1, b1, w2):
    return ((torch.relu(x @ w1 + b1) @ w2 - y) ** 2).sum()


def demo_strided(device: torch.device, outdir: pathlib.Path | None = None, batch: int = 256, inputs: int = 64,
                 hidden: int = 128, outputs: int = 10, seed: int = 0) -> None:
    device = torch.device(device)
    x, y, params = _views(device, batch, inputs, hidden, outputs, seed)
    print(f"[strided] MLP {inputs} -> {hidden} (relu) -> {outputs}, batch {batch}, on {device}: every tensor a "
          f"non-contiguous view (strides x {x.stride()}, w1 {params[0].stride()}, b1 {params[1].stride()}, "
          f"w2 {params[2].stride()})")
    loss = mlp_loss_strided(x, y, *params)
    grads = torch.autograd.grad(loss, params)
    ref_params = [p.detach().double().requires_grad_() for p in params]
    ref_loss = mlp_loss_torch(x.double(), y.double(), *ref_params)
    ref_grads = torch.autograd.grad(ref_loss, ref_params)
    loss_err = abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())
    grad_err = max(((g.double() - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, ref_grads))
    print(f"[strided] loss {loss.item():.6f} (torch float64 {ref_loss.item():.6f}, relative difference "
          f"{loss_err:.1e}); gradients of w1, b1, w2: max relative difference {grad_err:.1e}")
    if loss_err > 1e-5 or grad_err > 1e-4:
        raise RuntimeError("pointops.strided MLP disagrees with torch beyond float32 rounding")

    # Figures of this machine: float32 matmul (TF32 off for torch too) and elementwise bandwidth.
    n = 2048 if device.type == "cuda" else 512
    g = torch.Generator().manual_seed(seed + 1)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device).t()
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _, ms = time_ms(lambda: strided.matmul(a, b), device, repeat=10)
        _, ms_torch = time_ms(lambda: torch.matmul(a, b), device, repeat=10)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    flops = 2 * n**3
    print(f"[strided] matmul {n} x {n} x {n} float32 (b transposed): {flops / ms / 1e9:.3f} TFLOP/s "
          f"(torch.matmul, TF32 off: {flops / ms_torch / 1e9:.3f})")
    m = 1 << (24 if device.type == "cuda" else 22)
    u = torch.randn(m, generator=g).to(device)
    v = torch.randn(m, generator=g).to(device)
    _, ms = time_ms(lambda: strided.zip(u, v, "add"), device, repeat=10)
    _, ms_torch = time_ms(lambda: torch.add(u, v), device, repeat=10)
    nbytes = 3 * 4 * m
    print(f"[strided] zip add of {m:,} float32: {nbytes / ms / 1e6:.1f} GB/s (torch.add {nbytes / ms_torch / 1e6:.1f})")
