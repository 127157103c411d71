"""torch_cluster's face (knn_graph, radius_graph, cosine knn, ignore_same_index, nearest, fps with
tensor ratios and ptr, grid_cluster): against float64 oracles written here from torch_cluster's
definitions (no pointops call); TorchScript and torch.compile of every packed function against
eager; torch_cluster's own expected numbers where its tests state them. knn / radius / fps /
knn_interpolate themselves: test_neighbors_packed.py."""
import warnings

import pytest
import torch

import pointops
from conftest import DEVICES
from test_neighbors_packed import packed_candidates, shuffled_batch

PACKED = [pointops.knn, pointops.knn_graph, pointops.radius, pointops.radius_graph, pointops.nearest, pointops.fps,
          pointops.grid_cluster, pointops.knn_interpolate]


def random_clouds(device, sizes=(40, 1, 25, 33), D=3, seed=0, dtype=torch.float32, sort=True):
    """Points in [0, 1)^D with a batch vector (sorted, as torch_cluster requires, unless sort=False)."""
    g = torch.Generator().manual_seed(seed)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    if not sort:
        batch = shuffled_batch(list(sizes), g)
    return torch.rand(len(batch), D, generator=g).to(dtype).to(device), batch.to(device)


def edge_set(edges):
    return set(map(tuple, edges.t().tolist()))


def oracle_knn_rows(cand, k):
    """(Ny, Nx) float64 distances (+inf: not a candidate) -> each query's k nearest, ties by index."""
    order = torch.sort(cand, dim=1, stable=True)
    return [[j for j, d in zip(order.indices[i, :k].tolist(), order.values[i, :k].tolist()) if d != float("inf")]
            for i in range(cand.shape[0])]


def oracle_knn_graph(x, batch, k, loop):
    """torch_cluster's definition: knn of x with itself, k + 1 neighbours and the self edge dropped
    unless loop; edges (neighbour, point) as flow='source_to_target' gives them."""
    rows = oracle_knn_rows(packed_candidates(x, x, batch, batch)[0], k if loop else k + 1)
    return {(j, i) for i, row in enumerate(rows) for j in row if loop or j != i}


def oracle_radius(x, y, batch_x, batch_y, r, max_num, ignore_same_index=False):
    """torch_cluster's CUDA rule: for each y, the first max_num points of x (index order) of its
    cloud with squared distance < r^2 (r^2 in float64), itself left out when ignore_same_index."""
    cand = packed_candidates(x, y, batch_x, batch_y)[0]
    edges = set()
    for i in range(cand.shape[0]):
        inside = [j for j in range(cand.shape[1]) if cand[i, j] < r * r and not (ignore_same_index and i == j)]
        edges |= {(i, j) for j in inside[:max_num]}
    return edges


def assert_no_near_ties(cand, k):
    values = cand.sort(1).values[:, : k + 1]
    gaps = (values[:, 1:] - values[:, :-1])[torch.isfinite(values[:, 1:])]
    assert (gaps > 1e-6).all(), "test input has near ties: pick another seed"


# ---------------------------------------------------------------- graphs
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loop", [False, True])
def test_knn_graph_matches_oracle(device, loop):
    x, batch = random_clouds(device, seed=1)
    for k in (1, 4, 30):  # 30: more than cloud 1 and 2 hold
        assert_no_near_ties(packed_candidates(x, x, batch, batch)[0], k + 1)
        edges = pointops.knn_graph(x, k, batch, loop=loop)
        assert edges.dtype == torch.int64 and edges.shape[0] == 2
        assert edge_set(edges.cpu()) == oracle_knn_graph(x.cpu(), batch.cpu(), k, loop)
        swapped = pointops.knn_graph(x, k, batch, loop, "target_to_source")
        assert torch.equal(swapped, edges.flip(0))
        # unsorted batch: the same graph (torch_cluster requires sorted input; pointops does not)
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(2)).to(device)
        unsorted = pointops.knn_graph(x[perm], k, batch[perm], loop=loop)
        assert edge_set(perm[unsorted].cpu()) == edge_set(edges.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_knn_graph_duplicates_keep_torch_clusters_rule(device):
    # five copies of one point: knn with k + 1 = 3 finds the three copies of smallest index, so
    # copies 3 and 4 do not find themselves and keep 3 edges (torch_cluster's result, by its code)
    x = torch.zeros(5, 2, device=device)
    edges = pointops.knn_graph(x, 2, flow="target_to_source")
    want = {(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2)}
    assert edge_set(edges.cpu()) == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loop", [False, True])
def test_radius_graph_matches_oracle(device, loop):
    x, batch = random_clouds(device, seed=3)
    for r, max_num in ((0.3, 32), (0.5, 4), (2.0, 1)):
        edges = pointops.radius_graph(x, r, batch, loop, max_num, "target_to_source")
        assert edge_set(edges.cpu()) == oracle_radius(x.cpu(), x.cpu(), batch.cpu(), batch.cpu(), r, max_num,
                                                      ignore_same_index=not loop)
        assert torch.equal(pointops.radius_graph(x, r, batch, loop, max_num), edges.flip(0))


@pytest.mark.parametrize("device", DEVICES)
def test_radius_ignore_same_index(device):
    x, batch = random_clouds(device, seed=4)
    y, by = x[:50], batch[:50]  # the first 50 points: index i of y is index i of x
    for max_num in (1, 3, 64):
        edges = pointops.radius(x, y, 0.4, batch, by, max_num, 1, None, True)
        assert edge_set(edges.cpu()) == oracle_radius(x.cpu(), y.cpu(), batch.cpu(), by.cpu(), 0.4, max_num, True)


@pytest.mark.parametrize("device", DEVICES)
def test_batch_size_and_num_workers_are_accepted(device):
    x, batch = random_clouds(device, seed=5)
    base = pointops.knn(x, x, 3, batch, batch)
    assert torch.equal(pointops.knn(x, x, 3, batch, batch, False, 4, 4), base)
    assert torch.equal(pointops.knn(x, x, 3, batch, batch, False, 1, 6), base)  # clouds 4, 5 empty
    assert torch.equal(pointops.radius_graph(x, 0.3, batch, False, 8, "source_to_target", 2, 4),
                       pointops.radius_graph(x, 0.3, batch, max_num_neighbors=8))


# ---------------------------------------------------------------- cosine
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_cosine_knn_matches_oracle(device, dtype):
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(60, 5, generator=g) * torch.rand(60, 1, generator=g) * 10).to(dtype)
    y = torch.randn(20, 5, generator=g).to(dtype)
    x[7] = 0  # no direction: never a neighbour
    y[3] = 0  # and has none
    bx = torch.repeat_interleave(torch.arange(2), torch.tensor([35, 25]))
    by = torch.repeat_interleave(torch.arange(2), torch.tensor([12, 8]))
    xd, yd = x.double(), y.double()
    cos = (yd @ xd.t()) / (yd.norm(dim=1)[:, None] * xd.norm(dim=1)[None, :])
    cand = (1 - cos).masked_fill(by[:, None] != bx[None, :], float("inf"))
    cand = cand.masked_fill(torch.isnan(cand), float("inf"))
    assert_no_near_ties(cand, 6)
    for k in (1, 6):
        edges = pointops.knn(x.to(device), y.to(device), k, bx.to(device), by.to(device), cosine=True)
        want = oracle_knn_rows(cand, k)
        assert edges.cpu().tolist() == [[i for i, row in enumerate(want) for _ in row], sum(want, [])]
    # cosine ignores length: a scaled copy of a query is its nearest neighbour
    x2 = torch.cat([x, 3 * y[:1]]).to(device)
    assert pointops.knn(x2, y[:1].to(device), 1, cosine=True).tolist() == [[0], [60]]


# ---------------------------------------------------------------- nearest
@pytest.mark.parametrize("device", DEVICES)
def test_nearest_matches_oracle(device):
    x, bx = random_clouds(device, sizes=(30, 5, 20), seed=7)
    y, by = random_clouds(device, sizes=(6, 1, 9), seed=8)
    cand = packed_candidates(y, x, by, bx)[0]
    want = [row[0] for row in oracle_knn_rows(cand, 1)]
    assert pointops.nearest(x, y, bx, by).tolist() == want
    assert pointops.nearest(x, y).tolist() == [row[0] for row in oracle_knn_rows(packed_candidates(y, x)[0], 1)]
    assert pointops.nearest(x[:0], y).shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_nearest_errors_as_torch_cluster(device):
    x, y = torch.rand(4, 2, device=device), torch.rand(3, 2, device=device)
    with pytest.raises(ValueError, match="'batch_x' is not sorted"):
        pointops.nearest(x, y, torch.tensor([0, 1, 0, 1], device=device), torch.tensor([0, 0, 1], device=device))
    with pytest.raises(ValueError, match="'batch_y' is not sorted"):
        pointops.nearest(x, y, torch.tensor([0, 0, 1, 1], device=device), torch.tensor([1, 0, 1], device=device))
    with pytest.raises(ValueError, match="Some batch indices occur in 'batch_x' that do not occur in 'batch_y'"):
        pointops.nearest(x, y, torch.tensor([0, 0, 1, 2], device=device), torch.tensor([0, 0, 1], device=device))


# ---------------------------------------------------------------- fps: ratio tensors and ptr
@pytest.mark.parametrize("device", DEVICES)
def test_fps_ratio_tensor_and_ptr(device):
    x, batch = random_clouds(device, sizes=(40, 1, 25, 33), seed=9)
    base = pointops.fps(x, batch, 0.3, False)
    counts = torch.tensor([40, 1, 25, 33])
    assert len(base) == int(torch.ceil(counts.float() * torch.tensor(0.3)).sum())  # float32 ceil per cloud
    ptr = [0, 40, 41, 66, 99]
    for ratio in (torch.tensor(0.3), torch.tensor([0.3]), torch.tensor([0.3] * 4)):
        assert torch.equal(pointops.fps(x, batch, ratio.to(device), False), base)
    assert torch.equal(pointops.fps(x, None, 0.3, False, None, ptr), base)
    assert torch.equal(pointops.fps(x, None, 0.3, False, None, torch.tensor(ptr, device=device)), base)
    # per-cloud ratios: each cloud's samples are its first ceil(n * ratio_c) of ratio 1
    ratios = torch.tensor([0.5, 1.0, 0.2, 0.1], device=device)
    full = pointops.fps(x, batch, 1.0, False)
    got = pointops.fps(x, batch, ratios, False)
    want = torch.cat([full[batch[full] == c][: int(torch.ceil(n * r.float().cpu()))]
                      for c, (n, r) in enumerate(zip(counts.tolist(), ratios.cpu()))])
    assert torch.equal(got, want)


# ---------------------------------------------------------------- grid_cluster
GRID_CASES = [  # torch_cluster's test/test_grid.py cases, their expected clusters
    ([2, 6], [5], None, None, [0, 0]),
    ([2, 6], [5], [0], None, [0, 1]),
    ([[0, 0], [11, 9], [2, 8], [2, 2], [8, 3]], [5, 5], None, None, [0, 5, 3, 0, 1]),
    ([[0, 0], [11, 9], [2, 8], [2, 2], [8, 3]], [5, 5], None, [19, 19], [0, 6, 4, 0, 1]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int32, torch.int64])
def test_grid_cluster_torch_cluster_cases(device, dtype):
    for pos, size, start, end, want in GRID_CASES:
        as_t = (lambda v: None if v is None else torch.tensor(v, dtype=dtype, device=device))
        assert pointops.grid_cluster(as_t(pos), as_t(size), as_t(start), as_t(end)).tolist() == want


@pytest.mark.parametrize("device", DEVICES)
def test_grid_cluster_matches_formula(device):
    g = torch.Generator().manual_seed(10)
    pos = (torch.rand(500, 3, generator=g, dtype=torch.float64) * 7 - 2).to(device)
    size = torch.tensor([0.5, 1.25, 0.75], dtype=torch.float64, device=device)
    got = pointops.grid_cluster(pos, size)
    lo, hi = pos.min(0).values, pos.max(0).values
    cells = ((pos - lo) / size).floor().long()  # pos >= lo: truncation is floor
    dims = ((hi - lo) / size).floor().long() + 1
    assert torch.equal(got, cells[:, 0] + dims[0] * (cells[:, 1] + dims[1] * cells[:, 2]))


# ---------------------------------------------------------------- TorchScript and torch.compile
def call_all(fns, device):
    x, batch = random_clouds(device, seed=11)
    y, by = x[::3].contiguous(), batch[::3].contiguous()
    feats = torch.randn(len(x), 4, generator=torch.Generator().manual_seed(12)).to(device)
    knn, knn_graph, radius, radius_graph, nearest, fps, grid_cluster, knn_interpolate = fns
    return [knn(x, y, 4, batch, by), knn(x, y, 3, batch, by, True), knn_graph(x, 5, batch),
            knn_graph(x, 5, batch, True, "target_to_source"), radius(x, y, 0.3, batch, by, 8),
            radius_graph(x, 0.3, batch, False, 8), nearest(y, x, by, batch), fps(x, batch, 0.5, False),
            fps(x, None, torch.tensor([0.25], device=device), False, None, [0, 40, 41, 66, 99]),
            grid_cluster(x, torch.tensor([0.2, 0.3, 0.25], device=device)),
            knn_interpolate(feats, x, y, batch, by, 3)]


@pytest.mark.parametrize("device", DEVICES)
def test_torchscript_equals_eager(device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation warning
        scripted = [torch.jit.script(f) for f in PACKED]
    for got, want in zip(call_all(scripted, device), call_all(PACKED, device)):
        assert torch.equal(got, want)


@torch.jit.script
def scripted_caller(x: torch.Tensor, batch: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """A TorchScript function that calls the face, as a scripted PyG model does."""
    idx = pointops.fps(x, batch, ratio, False)
    return pointops.knn_graph(x[idx], 4, batch[idx])


def test_scripted_model_calls_the_face():
    x, batch = random_clouds("cpu", seed=13)
    ratio = torch.tensor(0.5)
    idx = pointops.fps(x, batch, ratio, False)
    assert torch.equal(scripted_caller(x, batch, ratio), pointops.knn_graph(x[idx], 4, batch[idx]))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_equals_eager(device):
    torch._dynamo.reset()
    compiled = [torch.compile(f, backend="aot_eager") for f in PACKED]
    for got, want in zip(call_all(compiled, device), call_all(PACKED, device)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_layouts_agree(device):
    """Clouds of one size in a sorted batch are searched as a view of the points; the same clouds
    with a trailing empty cloud (batch_size) through the padded copy; shuffled, through the sort:
    the same edges and samples every way."""
    x, batch = random_clouds(device, sizes=(50, 50, 50, 50), seed=14)
    feats = torch.randn(len(x), 3, generator=torch.Generator().manual_seed(15)).to(device)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(16)).to(device)
    for fn in (lambda p, b, s: pointops.knn_graph(p, 6, b, False, "source_to_target", False, 1, s),
               lambda p, b, s: pointops.radius_graph(p, 0.3, b, False, 64, "source_to_target", 1, s)):  # no cap hit
        regular = fn(x, batch, None)
        assert torch.equal(fn(x, batch, 5), regular)
        assert edge_set(perm[fn(x[perm], batch[perm], None)].cpu()) == edge_set(regular.cpu())
    assert torch.equal(pointops.fps(x, batch, 0.25, False, 5), pointops.fps(x, batch, 0.25, False))
    y = pointops.knn_interpolate(feats, x, x[::7], batch, batch[::7], 3)
    assert torch.equal(pointops.knn_interpolate(feats[perm], x[perm], x[::7], batch[perm], batch[::7], 3), y)
