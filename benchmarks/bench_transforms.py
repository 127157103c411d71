"""Derivatives under torch.func, beside the plain training step (CUDA; a CPU run times the same rows).

* The Chamfer training step, ``chamfer_distance(x, y)[0]`` and its gradients, against PyTorch3D's
  own ``chamfer_distance`` (its Python over its CUDA kernels, built from its sources in this
  process: benchmarks/peers.py), at 32 x 2048^2 and 8 x 8192^2 float32. Both gradients agree first.
* vmap of a per-cloud loss over V samples of B clouds against one call on the B * V clouds
  (``batch_reduction=None``, then each sample's mean): the batching rules fold the samples into the
  kernels' batch, so what the ratio adds is host time, the transform's machinery and ours.
* Per-sample gradients, ``vmap(grad(loss))`` over the clouds of a batch, against the plain step on
  the batch (forward and backward), which gives the same numbers scaled by 1 / B.
Both have a floor that no op can go under: torch's own transform machinery, measured in the same
run on the same tensors with a trivial per-cloud function, ``((x - y) ** 2).mean()``.

CUDA events, warm-up, median of repeats; correctness checked before timing.

    python benchmarks/bench_transforms.py [--quick]
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.func import grad, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import environment_line, markdown_table, time_ms  # noqa: E402

import pointops  # noqa: E402
import peers  # noqa: E402

STEP_SIZES = [(32, 2048), (8, 8192)]
QUICK_STEP_SIZES = [(4, 512)]


def clouds(B, N, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.rand(B, N, 3, device=device, generator=g), torch.rand(B, N, 3, device=device, generator=g))


def step(loss_fn, x, y):
    def run():
        return torch.autograd.grad(loss_fn(x, y)[0], (x, y))
    return run


def step_rows(device, sizes):
    """The training step, pointops and PyTorch3D, with the gradients compared first."""
    theirs = peers.load_pytorch3d_chamfer_distance() if device == "cuda" else None
    rows = []
    for B, N in sizes:
        x, y = (t.requires_grad_() for t in clouds(B, N, device))
        ours_step = step(pointops.chamfer_distance, x, y)
        t_ours = time_ms(ours_step, warmup=10, repeat=50)
        if theirs is None:
            rows.append([f"{B} x {N}^2", f"{t_ours:.3f}", "n/a (PyTorch3D's CUDA sources absent)", "-"])
            continue
        for g_ours, g_theirs in zip(ours_step(), step(theirs, x, y)()):
            torch.testing.assert_close(g_ours, g_theirs, rtol=1e-4, atol=1e-7)
        t_theirs = time_ms(step(theirs, x, y), warmup=10, repeat=50)
        rows.append([f"{B} x {N}^2", f"{t_ours:.3f}", f"{t_theirs:.3f}", f"{t_theirs / t_ours:.1f}x"])
    return rows


def trivial(a, b):
    """The floor: torch's vmap / grad machinery around one elementwise op and a mean."""
    return ((a - b) ** 2).mean()


def vmap_rows(device, quick):
    """vmap over V samples of B clouds against one call on B * V clouds."""
    rows = []
    for V, B, N in ((2, 2, 512),) if quick else ((8, 4, 2048), (32, 1, 2048), (8, 1, 8192)):
        x, y = clouds(V * B, N, device, seed=1)
        xs, ys = x.view(V, B, N, 3), y.view(V, B, N, 3)
        per_sample = vmap(lambda a, b: pointops.chamfer_distance(a, b)[0])

        def batched():
            return pointops.chamfer_distance(x, y, batch_reduction=None)[0].view(V, B).mean(1)
        torch.testing.assert_close(per_sample(xs, ys), batched(), rtol=1e-5, atol=1e-7)
        t_vmap = time_ms(lambda: per_sample(xs, ys), warmup=10, repeat=50)
        t_batched = time_ms(batched, warmup=10, repeat=50)
        floor = vmap(trivial)
        t_floor = time_ms(lambda: floor(xs, ys), warmup=10, repeat=50)
        rows.append([f"V = {V} samples of {B} x {N}^2", f"{t_vmap:.3f}", f"{t_batched:.3f}",
                     f"{t_vmap / t_batched:.2f}x", f"{t_floor:.3f}", "≤ 1.3x"])
    return rows


def per_sample_rows(device, quick):
    """vmap(grad(per-cloud loss)) over B clouds against the plain step on the batch."""
    return [per_sample_row(device, B, N) for B, N in (((8, 512),) if quick else ((32, 2048), (32, 8192)))]


def per_sample_row(device, B, N):
    x, y = clouds(B, N, device, seed=2)

    def cloud_loss(a, b):
        return pointops.chamfer_distance(a[None], b[None])[0]
    per_sample = vmap(grad(cloud_loss, argnums=(0, 1)))
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    plain = step(pointops.chamfer_distance, xg, yg)
    for got, want in zip(per_sample(x, y), plain()):  # the batch mean scales each cloud's gradient by 1 / B
        torch.testing.assert_close(got, want * B, rtol=1e-4, atol=1e-6)
    t_per_sample = time_ms(lambda: per_sample(x, y), warmup=10, repeat=50)
    t_plain = time_ms(plain, warmup=10, repeat=50)
    floor = vmap(grad(trivial, argnums=(0, 1)))
    t_floor = time_ms(lambda: floor(x, y), warmup=10, repeat=50)
    return [f"{B} x {N}^2", f"{t_per_sample:.3f}", f"{t_plain:.3f}", f"{t_per_sample / t_plain:.2f}x",
            f"{t_floor:.3f}", "≤ 1.5x"]


def run(quick: bool = False) -> str:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    text = f"## Derivatives under torch.func (`benchmarks/bench_transforms.py`)\n\n{environment_line()}\n\n"
    text += ("The Chamfer training step (`chamfer_distance(x, y)[0]`, forward and both gradients, float32), "
             "against PyTorch3D's own `chamfer_distance` in the same process:\n\n")
    text += markdown_table(["B x N^2", "pointops ms", "PyTorch3D ms", "speed-up"],
                           step_rows(device, QUICK_STEP_SIZES if quick else STEP_SIZES))
    text += "\n\nvmap of the per-cloud loss over V samples, against one call on the B * V clouds:\n\n"
    text += markdown_table(["samples", "vmap ms", "one batched call ms", "ratio", "vmap of the trivial function ms",
                            "target"], vmap_rows(device, quick))
    text += ("\n\nPer-sample gradients, `vmap(grad(loss))` over the clouds, against the plain step on the "
             "batch:\n\n")
    text += markdown_table(["B x N^2", "vmap(grad) ms", "plain step ms", "ratio", "vmap(grad) of the trivial function ms",
                            "target"], per_sample_rows(device, quick))
    return text + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    print(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
