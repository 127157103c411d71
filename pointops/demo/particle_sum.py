"""Demo: the Gaussian field of 50 weighted particles on three planes through the unit cube.

480,000 targets (three 400 x 400 grids, on the planes x = 0.5, y = 0.5 and z = 0.5) x 50 sources in
one ``pointops.particle_sum`` call, timed against the torch chunked way (cdist + exp + matmul), with
the difference between the two; then the same targets with the laplace and helmholtz kernels; and
(with matplotlib) the three planes saved as one picture. Generates its own data.
"""
from __future__ import annotations

import pathlib

import torch

from ..particle_sum import particle_sum
from ._common import pyplot, save_figure, time_ms

SIGMA = 0.1  # the Gaussian's width
WAVENUMBER = 20.0  # k of the helmholtz kernel (a wavelength of about 0.31)
CHUNK = 65536  # targets per chunk in the torch way
# Per plane: its name, then the axes (0 = x, 1 = y, 2 = z) along the picture's width and height.
PLANES = (("x = 0.5", 1, 2), ("y = 0.5", 0, 2), ("z = 0.5", 0, 1))


def plane_targets(resolution: int = 400) -> torch.Tensor:
    """(3 * resolution**2, 3) float32 points: a resolution x resolution grid over [0, 1]^2 on each of
    the planes x = 0.5, y = 0.5 and z = 0.5 (in that order, as in PLANES). Within a plane the points
    run row by row, a row along the plane's width axis, rows going up its height axis, so that
    ``field.reshape(3, resolution, resolution)[p]`` is plane p as an image for imshow(origin="lower")."""
    lin = torch.linspace(0.0, 1.0, resolution)
    height, width = torch.meshgrid(lin, lin, indexing="ij")
    planes = []
    for _, w_axis, h_axis in PLANES:
        grid = torch.full((resolution, resolution, 3), 0.5)
        grid[..., w_axis] = width
        grid[..., h_axis] = height
        planes.append(grid.reshape(-1, 3))
    return torch.cat(planes)


def gaussian_torch_chunked(targets: torch.Tensor, sources: torch.Tensor, weights: torch.Tensor, sigma: float,
                           chunk: int = CHUNK, compute_mode: str = "use_mm_for_euclid_dist_if_necessary"
                           ) -> torch.Tensor:
    """The same Gaussian sum without pointops, the way it is usually written in torch: a (chunk, N)
    kernel matrix at a time from torch.cdist, exp, and a matrix product with the weights."""
    return torch.cat([torch.cdist(part, sources, compute_mode=compute_mode).pow(2).div(-2 * sigma**2).exp() @ weights
                      for part in targets.split(chunk)])


def demo_particle_sum(device: torch.device, outdir: pathlib.Path | None, resolution: int = 400,
                      num_sources: int = 50, repeat: int = 10, seed: int = 0) -> None:
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    sources = torch.rand(num_sources, 3, generator=g).to(device)  # uniform in the unit cube
    weights = (0.5 + torch.rand(num_sources, generator=g)).to(device)  # strengths in [0.5, 1.5)
    targets = plane_targets(resolution).to(device)
    print(f"[particle_sum] Gaussian field (sigma = {SIGMA}) of {num_sources} weighted sources in the unit cube "
          f"on three {resolution} x {resolution} planes (x, y, z = 0.5): {targets.shape[0]:,} targets x "
          f"{num_sources} sources on {device}")

    field, ms = time_ms(lambda: particle_sum(targets, sources, weights, "gaussian", sigma=SIGMA), device,
                        repeat, per_call=True)
    field_torch, ms_torch = time_ms(lambda: gaussian_torch_chunked(targets, sources, weights, SIGMA), device,
                                    repeat, per_call=True)
    print(f"[particle_sum] pointops.particle_sum, one call: {ms:.3f} ms; torch chunked (cdist + exp + matmul, "
          f"{CHUNK:,} targets a chunk): {ms_torch:.3f} ms; speed-up {ms_torch / ms:.1f}x (median of {repeat})")

    # Differences relative to the largest value of the field. torch.cdist (by default) expands
    # |x - y|^2 = |x|^2 + |y|^2 - 2 x.y, which in float32 loses about 1e-5 of exp(-r^2 / (2 sigma^2));
    # a float64 evaluation with exact differences shows pointops' own error.
    exact = gaussian_torch_chunked(targets.double(), sources.double(), weights.double(), SIGMA,
                                   compute_mode="donot_use_mm_for_euclid_dist")
    scale = exact.abs().max()
    diff_torch = float((field.double() - field_torch.double()).abs().max() / scale)
    diff_exact = float((field.double() - exact).abs().max() / scale)
    print(f"[particle_sum] max relative difference (max |difference| / max |field|): {diff_torch:.1e} from the "
          f"torch chunked result (float32 cdist), {diff_exact:.1e} from a float64 evaluation")

    _, ms_laplace = time_ms(lambda: particle_sum(targets, sources, weights, "laplace"), device, repeat,
                            per_call=True)
    _, ms_helmholtz = time_ms(lambda: particle_sum(targets, sources, weights, "helmholtz", wavenumber=WAVENUMBER),
                              device, repeat, per_call=True)
    print(f"[particle_sum] same targets, other kernels: laplace 1/(4 pi r) {ms_laplace:.3f} ms; "
          f"helmholtz exp(i k r)/(4 pi r), k = {WAVENUMBER:g}, complex output {ms_helmholtz:.3f} ms")

    if outdir is not None:
        _save_picture(field.reshape(3, resolution, resolution).cpu(), num_sources,
                      pathlib.Path(outdir) / "particle_field.png")


def _save_picture(images: torch.Tensor, num_sources: int, path: pathlib.Path) -> None:
    plt = pyplot("[particle_sum]", path)
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    vmax = float(images.max())
    for ax, image, (name, w_axis, h_axis) in zip(axes, images, PLANES):
        im = ax.imshow(image.numpy(), origin="lower", extent=(0.0, 1.0, 0.0, 1.0), vmin=0.0, vmax=vmax,
                       cmap="magma", interpolation="nearest")
        ax.set_title(f"plane {name}")
        ax.set_xlabel("xyz"[w_axis])
        ax.set_ylabel("xyz"[h_axis])
    fig.colorbar(im, ax=list(axes), shrink=0.9, label=r"$f(x) = \sum_j c_j \exp(-|x - y_j|^2 / 2\sigma^2)$")
    fig.suptitle(f"Gaussian field ($\\sigma$ = {SIGMA}) of {num_sources} weighted sources in the unit cube, "
                 f"pointops.particle_sum")
    save_figure(fig, path, "[particle_sum]", dpi=110, bbox_inches="tight")
