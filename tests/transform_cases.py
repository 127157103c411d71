"""The registry of public ops that tests/test_transforms.py runs under every way PyTorch
differentiates (forward mode, the torch.func transforms, vmap with its fallback disabled, gradcheck).

A new public op is covered by adding a Case here: test_every_public_op_is_registered fails until
every public function of pointops (and of pointops.strided) is named by a case's ``covers``.

Each case builds, for a device, the float64 inputs its op is differentiable in, the op as a function
of them (returning a tuple of floating tensors), and a dense reference: the same outputs written
with torch ops over the full pairwise matrices, the neighbours / voxels / samples chosen by the
oracles of the family tests (no pointops call), so its derivatives are computed without pointops.
Inputs are random float64 and kept away from the points where the ops are not differentiable (no
near ties between neighbours, no point near a voxel boundary or the ball's radius), so the
finite-difference checks and the dense references agree.
"""
import math
from dataclasses import dataclass
from typing import Callable, Tuple

import torch
import torch.nn.functional as F

import pointops
from pointops import strided
from test_neighbors import candidates, reference_ball, reference_knn
from test_neighbors_packed import packed_candidates
from test_particle_sum import dense_sum
from test_voxelize import reference_voxel_features, reference_voxelize

DT = torch.float64


@dataclass
class Case:
    """name: the test id; covers: the public function it exercises; build(device) -> (inputs, op,
    reference); vmap: whether vmap batches it (else it must raise a clear error naming vmap);
    second_order: "yes" (hessian equals the reference's), or a regex of the RuntimeError that a
    second derivative raises; differentiable: False for outputs that are piecewise constant
    (derivative 0 everywhere: they need no tangent)."""
    name: str
    covers: str
    build: Callable[[str], Tuple[tuple, Callable, Callable]]
    vmap: bool = True
    second_order: str = "yes"
    differentiable: bool = True


def rand(*shape, seed, device, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=DT)).to(device)


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


# ---------------------------------------------------------------- nearest neighbours
def gathered(q, r, idx, norm=2):
    """d(q[b, i], r[b, idx]) as torch ops, with the indices fixed; 0 where idx is -1."""
    index = idx.clamp(min=0)
    squeeze = idx.dim() == 2
    if squeeze:
        index = index[..., None]
    nbr = torch.gather(r[:, None].expand(-1, q.shape[1], -1, -1), 2,
                       index[..., None].expand(-1, -1, -1, r.shape[-1]))
    diff = q[:, :, None] - nbr
    d = (diff**2).sum(-1) if norm == 2 else diff.abs().sum(-1)
    d = d[..., 0] if squeeze else d
    valid = idx >= 0
    return torch.where(valid, d, torch.zeros((), dtype=d.dtype, device=d.device))


def oracle_nearest(x, y, xl=None, yl=None, norm=2):
    cand = candidates(x, y, xl, yl, norm)
    _, idx = reference_knn(cand, 1)
    return idx[..., 0].to(x.device)


def separated_clouds(device, seed, B=2, N=7, M=6, D=3):
    """Two batches of clouds whose nearest and second-nearest neighbours are well apart (random
    float64 points; seeds re-drawn until every gap exceeds 1e-3): smooth for finite differences."""
    for s in range(seed, seed + 100):
        x, y = rand(B, N, D, seed=s, device=device), rand(B, M, D, seed=s + 1000, device=device)
        gaps = []
        for p, q in ((x, y), (y, x)):
            d = torch.cdist(p.cpu(), q.cpu()).sort(-1).values
            if d.shape[-1] > 1:
                gaps.append((d[..., 1:] - d[..., :-1]).min())
        if min(gaps) > 1e-3:
            return x, y
    raise AssertionError("no well separated clouds")


def nearest_case(norm, ragged):
    def build(device):
        x, y = separated_clouds(device, seed=10 + norm)
        xl = torch.tensor([7, 4], device=device) if ragged else None
        yl = torch.tensor([6, 3], device=device) if ragged else None
        idx = oracle_nearest(x, y, xl, yl, norm)

        def op(a, b):
            return (pointops.nearest_neighbor(a, b, xl, yl, norm=norm)[0],)

        def ref(a, b):
            return (gathered(a, b, idx, norm),)
        return (x, y), op, ref
    return Case(f"nearest_neighbor-norm{norm}{'-ragged' if ragged else ''}", "nearest_neighbor", build)


def chamfer_case(norm, through_function=False):
    def build(device):
        x, y = separated_clouds(device, seed=20 + norm)
        i1, i2 = oracle_nearest(x, y, norm=norm), oracle_nearest(y, x, norm=norm)

        def op(a, b):
            out = pointops.ChamferFunction.apply(a, b) if through_function else pointops.chamfer(a, b, norm=norm)
            return out[0], out[1]

        def ref(a, b):
            return gathered(a, b, i1, norm), gathered(b, a, i2, norm)
        return (x, y), op, ref
    if through_function:
        return Case("ChamferFunction", "ChamferFunction", build)
    return Case(f"chamfer-norm{norm}", "chamfer", build)


def dense_chamfer_distance(x, y, xl=None, yl=None, xn=None, yn=None, weights=None, batch_reduction="mean",
                           point_reduction="mean", norm=2, single=False, abs_cosine=True, squared=True):
    """PyTorch3D's chamfer_distance as masked dense torch ops (differentiable in the points, normals
    and weights), the nearest neighbours fixed by the oracle."""
    B, P1, P2 = x.shape[0], x.shape[1], y.shape[1]
    dev = x.device
    xl = torch.full((B,), P1, device=dev) if xl is None else xl
    yl = torch.full((B,), P2, device=dev) if yl is None else yl

    def direction(p, q, pl, ql, pn, qn):
        idx = oracle_nearest(p, q, pl, ql, norm)
        d = gathered(p, q, idx, norm)
        if not squared:
            pos = d > 0
            d = torch.where(pos, torch.where(pos, d, torch.ones_like(d)).sqrt(), d)
        valid = (torch.arange(p.shape[1], device=dev)[None] < pl[:, None]) & (ql[:, None] > 0)
        d = torch.where(valid, d, torch.zeros_like(d))
        normal = None
        if pn is not None and qn is not None:
            near = torch.gather(qn, 1, idx.clamp(min=0)[..., None].expand(-1, -1, qn.shape[-1]))
            cos = F.cosine_similarity(pn, near, dim=2, eps=1e-6)
            normal = torch.where(valid, 1 - (cos.abs() if abs_cosine else cos), torch.zeros_like(cos))
        if weights is not None:
            d = d * weights[:, None]
            normal = None if normal is None else normal * weights[:, None]
        return d, normal, pl

    def points(t, n):
        if point_reduction == "sum":
            return t.sum(1)
        if point_reduction == "max":
            return t.amax(1)
        return t.sum(1) / n.clamp(min=1).to(t.dtype)

    dirs = [direction(x, y, xl, yl, xn, yn)]
    if not single:
        dirs.append(direction(y, x, yl, xl, yn, xn))
    if point_reduction is None:
        return dirs[0][0] if single else (dirs[0][0], dirs[1][0])
    loss = points(dirs[0][0], dirs[0][2])
    normals = None if dirs[0][1] is None else points(dirs[0][1], dirs[0][2])
    if not single:
        other = points(dirs[1][0], dirs[1][2])
        loss = torch.maximum(loss, other) if point_reduction == "max" else loss + other
        if normals is not None:
            normals = normals + points(dirs[1][1], dirs[1][2])
    if batch_reduction is not None:
        def batch(v):
            if batch_reduction == "sum":
                return v.sum()
            return v.sum() / (weights.sum() if weights is not None else B)
        loss = batch(loss)
        normals = None if normals is None else batch(normals)
    return loss if normals is None else (loss, normals)


def chamfer_distance_case(name, normals=False, weights=None, ragged=False, **options):
    def build(device):
        x, y = separated_clouds(device, seed=30)
        xl = torch.tensor([7, 5], device=device) if ragged else None
        yl = torch.tensor([4, 6], device=device) if ragged else None
        inputs = [x, y]
        if normals:
            inputs += [rand(2, 7, 3, seed=31, device=device), rand(2, 6, 3, seed=32, device=device)]
        if weights == "differentiable":
            inputs.append(torch.tensor([0.5, 2.0], dtype=DT, device=device))
        fixed_w = torch.tensor([0.5, 2.0], dtype=DT, device=device) if weights == "fixed" else None

        def split(args):
            a, b = args[0], args[1]
            na, nb = (args[2], args[3]) if normals else (None, None)
            w = args[-1] if weights == "differentiable" else fixed_w
            return a, b, na, nb, w

        def op(*args):
            a, b, na, nb, w = split(args)
            loss, loss_normals = pointops.chamfer_distance(a, b, xl, yl, na, nb, w, **options)
            return as_tuple(loss) + (() if loss_normals is None else as_tuple(loss_normals))

        def ref(*args):
            a, b, na, nb, w = split(args)
            opts = dict(options)
            opts["single"] = opts.pop("single_directional", False)
            return as_tuple(dense_chamfer_distance(a, b, xl, yl, na, nb, w, **opts))
        return tuple(inputs), op, ref
    return Case(f"chamfer_distance-{name}", "chamfer_distance", build)


def knn_points_case(norm, K=3):
    def build(device):
        x, y = separated_clouds(device, seed=40 + norm, N=6, M=7)
        l1, l2 = torch.tensor([6, 4], device=device), torch.tensor([7, 2], device=device)
        _, idx = reference_knn(candidates(x, y, l1, l2, norm), K)
        idx = idx.to(device)

        def op(a, b):
            out = pointops.knn_points(a, b, l1, l2, norm=norm, K=K, return_nn=True)
            return out.dists, out.knn

        def ref(a, b):
            knn = torch.gather(b[:, None].expand(-1, a.shape[1], -1, -1), 2,
                               idx.clamp(min=0)[..., None].expand(-1, -1, -1, b.shape[-1]))
            return gathered(a, b, idx, norm), torch.where((idx >= 0)[..., None], knn, torch.zeros_like(knn))
        return (x, y), op, ref
    return Case(f"knn_points-norm{norm}", "knn_points", build)


def knn_gather_case():
    def build(device):
        x = rand(2, 6, 4, seed=50, device=device)
        g = torch.Generator().manual_seed(51)
        idx = torch.randint(-1, 6, (2, 5, 3), generator=g).to(device)
        lengths = torch.tensor([3, 2], device=device)

        def op(a):
            return (pointops.knn_gather(a, idx, lengths),)

        def ref(a):
            out = a[torch.arange(2, device=device)[:, None, None], idx.clamp(min=0)]
            keep = (idx >= 0) & (torch.arange(3, device=device) < lengths[:, None, None])
            return (torch.where(keep[..., None], out, torch.zeros_like(out)),)
        return (x,), op, ref
    return Case("knn_gather", "knn_gather", build)


def ball_query_case():
    def build(device):
        x, y = separated_clouds(device, seed=60, N=6, M=8)
        cand = candidates(x, y)
        # a radius between two squared distances, well away from every one
        d = cand[torch.isfinite(cand)].sort().values
        gaps = d[1:] - d[:-1]
        mid = len(d) // 3
        j = mid + int(gaps[mid:].argmax())
        radius = math.sqrt((d[j] + d[j + 1]) / 2)
        _, idx = reference_ball(cand, 3, radius)
        idx = idx.to(device)

        def op(a, b):
            out = pointops.ball_query(a, b, K=3, radius=radius)
            return out.dists, out.knn

        def ref(a, b):
            knn = torch.gather(b[:, None].expand(-1, a.shape[1], -1, -1), 2,
                               idx.clamp(min=0)[..., None].expand(-1, -1, -1, b.shape[-1]))
            return gathered(a, b, idx), torch.where((idx >= 0)[..., None], knn, torch.zeros_like(knn))
        return (x, y), op, ref
    return Case("ball_query", "ball_query", build)


def knn_interpolate_case():
    def build(device):
        pos_x, pos_y = rand(9, 3, seed=70, device=device), rand(7, 3, seed=71, device=device)
        batch_x = torch.tensor([0] * 5 + [1] * 4, device=device)
        batch_y = torch.tensor([0] * 4 + [1] * 3, device=device)
        features = rand(9, 2, seed=72, device=device)
        _, idx = reference_knn(packed_candidates(pos_x, pos_y, batch_x, batch_y), 3)
        idx = idx[0].to(device)  # (Ny, 3) into pos_x

        def op(f, px, py):
            return (pointops.knn_interpolate(f, px, py, batch_x, batch_y, k=3),)

        def ref(f, px, py):
            d = ((py[:, None] - px[idx]) ** 2).sum(-1)
            w = 1.0 / d.clamp(min=1e-16)
            return ((w[..., None] * f[idx]).sum(1) / w.sum(1, keepdim=True),)
        return (features, pos_x, pos_y), op, ref
    return Case("knn_interpolate", "knn_interpolate", build)


def farthest_points_case():
    def build(device):
        points = rand(2, 9, 3, seed=80, device=device)
        from test_farthest_points import reference_fps
        idx = reference_fps(points, max_K=4).to(device)

        def op(p):
            return (pointops.sample_farthest_points(p, K=4)[0],)

        def ref(p):
            return (torch.gather(p, 1, idx[..., None].expand(-1, -1, 3)),)
        return (points,), op, ref
    return Case("sample_farthest_points", "sample_farthest_points", build)


def fscore_case():
    def build(device):
        d1, d2 = rand(2, 7, seed=90, device=device).abs(), rand(2, 6, seed=91, device=device).abs()

        def op(a, b):
            return pointops.fscore(a, b, 0.5)

        def ref(a, b):  # piecewise constant in the distances: derivative 0
            p, r = (a < 0.5).to(DT).mean(1), (b < 0.5).to(DT).mean(1)
            return torch.where(p + r > 0, 2 * p * r / (p + r), 0.0), p, r
        return (d1, d2), op, ref
    return Case("fscore", "fscore", build, differentiable=False)


# ---------------------------------------------------------------- particle sums
def particle_case(kernel, columns=False, complex_weights=False, batched=False):
    params = {"gaussian": dict(sigma=0.8), "laplace": {}, "helmholtz": dict(wavenumber=1.7)}[kernel]

    def build(device):
        lead = (2,) if batched else ()
        x, y = rand(*lead, 5, 3, seed=100, device=device), rand(*lead, 6, 3, seed=101, device=device)
        w = rand(*lead, 6, *((2,) if columns else ()), seed=102, device=device)
        if complex_weights:
            w = torch.complex(w, rand(*w.shape, seed=103, device=device))

        def op(a, b, c):
            return (pointops.particle_sum(a, b, c, kernel, **params),)

        def ref(a, b, c):
            return (dense_sum(a, b, c, kernel, **params),)
        return (x, y, w), op, ref
    name = f"particle_sum-{kernel}{'-columns' if columns else ''}{'-complex' if complex_weights else ''}" \
           f"{'-batched' if batched else ''}"
    second = "yes" if kernel == "gaussian" else "second derivatives through the targets' or sources' gradient"
    return Case(name, "particle_sum", build, second_order=second)


# ---------------------------------------------------------------- voxelization
VOXEL_SIZE, POINT_RANGE = (0.5, 0.5, 0.5), (0.0, 0.0, 0.0, 2.0, 2.0, 2.0)


def voxel_points(device, seed, n=30):
    """Points at random cells (several per cell), each within 0.15 of its cell's centre: no point
    near a boundary; a fourth column of features."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.randint(0, 4, (n, 3), generator=g).to(DT)
    xyz = (cells + 0.5 + 0.3 * (torch.rand(n, 3, generator=g, dtype=DT) - 0.5)) * 0.5
    return torch.cat([xyz, torch.randn(n, 1, generator=g, dtype=DT)], 1).to(device)


def voxel_features_case(reduce):
    def build(device):
        pts = voxel_points(device, seed=110)
        p2v = reference_voxel_features(pts, VOXEL_SIZE, POINT_RANGE, reduce)["point_to_voxel"].to(device)
        V = int(p2v.max()) + 1

        def op(p):
            return (pointops.voxel_features(p, VOXEL_SIZE, POINT_RANGE, reduce).features,)

        def ref(p):
            rows = []
            for v in range(V):
                m = p[p2v == v]
                rows.append(m.sum(0) if reduce == "sum" else m.mean(0) if reduce == "mean" else m.amax(0))
            return (torch.stack(rows),)
        return (pts,), op, ref
    return Case(f"voxel_features-{reduce}", "voxel_features", build, vmap=False)


def voxelize_case(padded):
    def build(device):
        pts = voxel_points(device, seed=120, n=40)
        expected = reference_voxelize(pts, VOXEL_SIZE, POINT_RANGE, 2, 64)
        p2v = expected["point_to_voxel"].to(device)
        rows = 64 if padded else len(expected["num_points"])

        def op(p):
            out = pointops.voxelize(p, VOXEL_SIZE, POINT_RANGE, 2, 64, padded=padded)
            return out.voxels, out.features

        def ref(p):
            voxels = [[] for _ in range(rows)]
            for i in range(p.shape[0]):  # each voxel's first 2 points, in input order
                v = int(p2v[i])
                if v >= 0 and len(voxels[v]) < 2:
                    voxels[v].append(p[i])
            zero = torch.zeros(4, dtype=DT, device=device)
            stacked = torch.stack([torch.stack(v + [zero] * (2 - len(v))) for v in voxels])
            counts = torch.tensor([max(len(v), 1) for v in voxels], dtype=DT, device=device)
            return stacked, stacked.sum(1) / counts[:, None]
        return (pts,), op, ref
    return Case(f"voxelize{'-padded' if padded else ''}", "voxelize", build, vmap=False)


# ---------------------------------------------------------------- strided
STRIDED_MAP = {"id": lambda t: t, "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sigmoid": torch.sigmoid,
               "relu": torch.relu, "inv": torch.reciprocal, "tanh": torch.tanh}
STRIDED_ZIP = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
               "min": torch.minimum, "pow": torch.pow, "relu_back": lambda a, b: torch.where(a > 0, b, 0.0),
               "log_back": lambda a, b: b / a, "inv_back": lambda a, b: -b / (a * a)}


def strided_map_case(fn):
    def build(device):
        x = (rand(3, 4, seed=130, device=device).abs() + 0.3).t()  # a transposed view, away from 0
        if fn == "relu":
            x = x - 0.8  # both signs, none near 0
            x = torch.where(x.abs() < 0.05, x + 0.1, x)
        return (x,), (lambda t: (strided.map(t, fn),)), (lambda t: (STRIDED_MAP[fn](t),))
    return Case(f"strided.map-{fn}", "strided.map", build)


def strided_zip_case(fn):
    def build(device):
        a = rand(3, 4, seed=140, device=device).abs() + 0.5
        b = rand(4, seed=141, device=device).abs() + 0.5  # broadcast
        if fn == "relu_back":
            a = a - 1.0
        return (a, b), (lambda s, t: (strided.zip(s, t, fn),)), (lambda s, t: (STRIDED_ZIP[fn](s, t),))
    return Case(f"strided.zip-{fn}", "strided.zip", build)


def strided_reduce_case(fn, dim):
    def build(device):
        x = rand(3, 4, 2, seed=150, device=device) + 0.1

        def ref(t):
            dims = tuple(range(t.dim())) if dim is None else (dim if isinstance(dim, tuple) else (dim,))
            if fn == "prod":
                out = t
                for d in sorted(dims, reverse=True):
                    out = out.prod(d)
                return (out,)
            return ({"sum": torch.sum, "max": torch.amax, "min": torch.amin}[fn](t, dims),)
        return (x,), (lambda t: (strided.reduce(t, dim, fn),)), ref
    return Case(f"strided.reduce-{fn}-{dim}", "strided.reduce", build)


def strided_matmul_case():
    def build(device):
        a, b = rand(2, 3, 4, seed=160, device=device), rand(4, 5, seed=161, device=device).t().contiguous().t()
        return (a, b), (lambda s, t: (strided.matmul(s, t),)), (lambda s, t: (torch.matmul(s, t),))
    return Case("strided.matmul", "strided.matmul", build)


CASES = [
    nearest_case(2, False), nearest_case(1, False), nearest_case(2, True),
    chamfer_case(2), chamfer_case(1), chamfer_case(2, through_function=True),
    chamfer_distance_case("default"),
    chamfer_distance_case("l1-sum-sum", norm=1, point_reduction="sum", batch_reduction="sum"),
    chamfer_distance_case("single", single_directional=True),
    chamfer_distance_case("ragged-weights", ragged=True, weights="fixed"),
    chamfer_distance_case("weights-differentiable", weights="differentiable"),
    chamfer_distance_case("max", point_reduction="max"),
    chamfer_distance_case("normals", normals=True),
    chamfer_distance_case("not-squared", squared=False),
    chamfer_distance_case("no-reduction", point_reduction=None, batch_reduction=None),
    knn_points_case(2), knn_points_case(1), knn_gather_case(), ball_query_case(), knn_interpolate_case(),
    farthest_points_case(), fscore_case(),
    particle_case("gaussian"), particle_case("gaussian", columns=True), particle_case("gaussian", batched=True),
    particle_case("gaussian", complex_weights=True), particle_case("laplace"),
    particle_case("laplace", columns=True), particle_case("helmholtz"),
    voxel_features_case("sum"), voxel_features_case("mean"), voxel_features_case("max"),
    voxelize_case(False), voxelize_case(True),
    *[strided_map_case(fn) for fn in STRIDED_MAP],
    *[strided_zip_case(fn) for fn in STRIDED_ZIP],
    strided_reduce_case("sum", 1), strided_reduce_case("sum", None), strided_reduce_case("prod", (0, 2)),
    strided_reduce_case("max", 0), strided_reduce_case("min", (1, 2)),
    strided_matmul_case(),
]

# Public functions whose outputs are integer only (or that are not ops): no derivative to check.
# The integer-output ops still run inside every transform (test_integer_ops_run_inside_transforms).
INTEGER_OUTPUT_OPS = ("knn", "knn_graph", "radius", "radius_graph", "nearest", "fps", "grid_cluster")
NOT_OPS = ("build_info",)
# Modules, result types and wrappers: each is its function with parameters held (ChamferLoss ->
# chamfer_distance, Voxelizer -> voxelize, ParticleSum -> particle_sum, KNN / Voxels: result tuples).
WRAPPERS = ("ChamferLoss", "Voxelizer", "ParticleSum", "KNN", "Voxels", "strided")
