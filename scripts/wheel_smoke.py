"""Smoke test of an installed pointops (run by scripts/check_wheel.sh in a fresh virtual
environment, from a directory outside the checkout): the prebuilt module loads, and every op family
runs on the CPU and agrees with a brute-force torch reference on tiny inputs.

Usage: python wheel_smoke.py [SOURCE_TREE]  -- with SOURCE_TREE, also fail when any imported module
comes from there (the installed package must not lean on the checkout).
"""
import math
import sys
from pathlib import Path

import torch

import pointops

torch.manual_seed(0)
failures = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}")
    if not ok:
        failures.append(name)


def close(a, b, rtol=1e-5, atol=1e-6) -> bool:
    return a.shape == b.shape and torch.allclose(a.to(b.dtype), b, rtol=rtol, atol=atol)


def check_installed_module() -> None:
    info = pointops.build_info()
    check("loaded the prebuilt module (not a JIT build)", info["loaded"] == "prebuilt", str(info))
    check("build_info torch_version is the running torch's major.minor",
          info["torch_version"].split(".")[:2] == torch.__version__.split(".")[:2], str(info))
    if len(sys.argv) > 1:
        tree = Path(sys.argv[1]).resolve()
        # Real module files only: __main__ (alias __mp_main__) is this script, and torch.ops and
        # torch.classes carry a bare "_ops.py"-style __file__ that would resolve against the cwd.
        files = {name: getattr(module, "__file__", None) for name, module in list(sys.modules.items())
                 if name not in ("__main__", "__mp_main__")}
        files = {name: Path(file) for name, file in files.items() if isinstance(file, str) and Path(file).is_absolute()}
        from_tree = sorted(name for name, file in files.items() if file.resolve().is_relative_to(tree))
        check(f"no module imported from the source tree {tree}", not from_tree, ", ".join(from_tree))


def squared_distances(x, y):
    return torch.cdist(x.double(), y.double()) ** 2  # (B, N, M), fine at this size


def check_chamfer() -> None:
    x = torch.rand(2, 37, 3, requires_grad=True)
    y = torch.rand(2, 29, 3, requires_grad=True)
    ref = squared_distances(x, y)
    dist, idx = pointops.nearest_neighbor(x, y)
    check("nearest_neighbor distances", close(dist, ref.min(2).values))
    check("nearest_neighbor indices", torch.equal(idx, ref.argmin(2)))

    dist1, dist2, idx1, idx2 = pointops.chamfer(x, y)
    check("chamfer both directions",
          close(dist1, ref.min(2).values) and close(dist2, ref.min(1).values)
          and torch.equal(idx1, ref.argmin(2)) and torch.equal(idx2, ref.argmin(1)))

    # Backward: the gradient of the summed distances equals autograd through the matched pairs.
    (dist1.sum() + 2 * dist2.sum()).backward()
    xd, yd = x.detach().double().requires_grad_(), y.detach().double().requires_grad_()
    matched_xy = (xd - torch.gather(yd, 1, idx1[..., None].expand(-1, -1, 3))).pow(2).sum()
    matched_yx = (yd - torch.gather(xd, 1, idx2[..., None].expand(-1, -1, 3))).pow(2).sum()
    (matched_xy + 2 * matched_yx).backward()
    check("chamfer gradients", close(x.grad, xd.grad) and close(y.grad, yd.grad))


def reference_voxels(points, size, low):
    """Cells (z, y, x) numbered by first point, the point -> voxel map, counts and means."""
    cells = torch.floor((points[:, :3].double() - torch.tensor(low)) / torch.tensor(size)).long()
    order = {}
    point_to_voxel = torch.tensor([order.setdefault(tuple(c.tolist()), len(order)) for c in cells])
    coords = torch.tensor([list(reversed(c)) for c in order], dtype=torch.int32)
    counts = torch.bincount(point_to_voxel, minlength=len(order)).to(torch.int32)
    sums = torch.zeros(len(order), points.shape[1], dtype=torch.float64).index_add_(0, point_to_voxel, points.double())
    return coords, point_to_voxel, counts, sums / counts[:, None]


def check_voxelize() -> None:
    size, box = [0.25, 0.25, 0.5], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    points = torch.cat([torch.rand(300, 3) * 0.999, torch.rand(300, 1)], 1)  # x, y, z, intensity
    coords, point_to_voxel, counts, means = reference_voxels(points, size, box[:3])

    v = pointops.voxelize(points, size, box, max_points_per_voxel=300, max_voxels=1000)
    check("voxelize coords (first-appearance order)", torch.equal(v.coords, coords), f"{v.coords} vs {coords}")
    check("voxelize point_to_voxel and counts",
          torch.equal(v.point_to_voxel, point_to_voxel) and torch.equal(v.num_points, counts))
    check("voxelize features (voxel means)", close(v.features, means))
    first_row = torch.stack([points[point_to_voxel == k][0] for k in range(len(counts))])
    check("voxelize voxels (first kept point)", torch.equal(v.voxels[:, 0], first_row))

    points.requires_grad_()
    features, f_coords, f_counts, f_map = pointops.voxel_features(points, size, box, reduce="mean")
    check("voxel_features mean", close(features, means) and torch.equal(f_coords, coords)
          and torch.equal(f_counts, counts) and torch.equal(f_map, point_to_voxel))
    features.sum().backward()
    check("voxel_features gradient (1 / count per point)",
          close(points.grad, (1.0 / counts[point_to_voxel].double())[:, None].expand(-1, 4)))


def check_particle_sum() -> None:
    targets, sources = torch.rand(23, 3, dtype=torch.float64), torch.rand(31, 3, dtype=torch.float64)
    weights = torch.randn(31, dtype=torch.float64)
    r = torch.cdist(targets, sources)
    sigma = 0.3
    gaussian = pointops.particle_sum(targets, sources, weights, "gaussian", sigma=sigma)
    check("particle_sum gaussian", close(gaussian, torch.exp(-r**2 / (2 * sigma**2)) @ weights, 1e-10, 1e-12))
    laplace = pointops.particle_sum(targets, sources, weights, "laplace")
    check("particle_sum laplace", close(laplace, (1 / (4 * math.pi * r)) @ weights, 1e-10, 1e-12))
    k = 5.0
    helmholtz = pointops.particle_sum(targets, sources, weights, "helmholtz", wavenumber=k)
    check("particle_sum helmholtz",
          close(helmholtz, (torch.exp(1j * k * r) / (4 * math.pi * r)) @ weights.to(torch.complex128), 1e-10, 1e-12))
    # float32 and a batched, multi-column call through the module form.
    module_out = pointops.ParticleSum("gaussian", sigma=sigma)(targets[None].float(), sources[None].float(),
                                                               weights[None, :, None].float().repeat(1, 1, 2))
    check("ParticleSum batched float32", close(module_out[0, :, 1], gaussian.float(), 1e-5, 1e-5))


if __name__ == "__main__":
    check_installed_module()
    check_chamfer()
    check_voxelize()
    check_particle_sum()
    print(f"pointops {pointops.__version__} from {Path(pointops.__file__).parent}: "
          f"{'all checks passed' if not failures else f'{len(failures)} FAILED: ' + ', '.join(failures)}")
    sys.exit(1 if failures else 0)
