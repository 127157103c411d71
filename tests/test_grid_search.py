"""The spatial-grid search (algorithm="grid") against brute force (algorithm="brute"):
bit for bit, distances (NaN positions included) and indices, for every op that takes `algorithm`,
on inputs chosen to break a grid: clustered and duplicate points, degenerate boxes (a point, a
line, a plane), far-from-origin and tiny coordinates, non-finite points, disjoint clouds, queries
in empty space, ragged and empty batches, every dtype, D = 2 and 3, both norms."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pointops
from conftest import DeterministicAlgorithms, DEVICES, data_dir, requires_cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
         torch.float64: torch.int64}


def assert_same(got, want):
    """Bitwise equality of two results (tuples of tensors): the float ones compared exactly with
    NaN == NaN, and as raw bits (so -0.0 vs 0.0 or another NaN would fail too); the rest equal."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
            assert torch.equal(g.view(_BITS[g.dtype]), w.view(_BITS[w.dtype]))
        else:
            assert torch.equal(g, w)


# ---------------------------------------------------------------- inputs
KINDS = ["uniform", "clustered", "point", "line", "plane", "far", "tiny", "nonfinite", "disjoint", "hollow",
         "overflow"]


def cloud(kind, B, n, D, dtype, g):
    """(B, n, D) points of one kind, built in float64 and rounded once to dtype."""
    u = torch.rand(B, n, D, generator=g, dtype=torch.float64)
    if kind == "uniform":
        p = u
    elif kind == "clustered":  # most points within 1e-4 of one spot, many exact duplicates, a few spread
        p = 0.3 + 1e-4 * u
        p[:, : n // 3] = p[:, :1]
        spread = torch.rand(B, n, generator=g) < 0.1
        p[spread] = u[spread]
    elif kind == "point":  # every point equal
        p = torch.full_like(u, 0.25)
    elif kind == "line":
        p = torch.zeros_like(u)
        p[..., 0] = u[..., 0]
        p[..., 1:] = 0.5
    elif kind == "plane":
        p = u.clone()
        p[..., -1] = -2.0
    elif kind == "far":  # LiDAR-like: ~1e5 with 1e-2 structure (float32 steps of ~8e-3 there: many ties)
        p = 1e5 + 1e-2 * torch.round(u * 100)
    elif kind == "tiny":  # 1e-30: squared differences underflow, every distance ties at 0
        p = 1e-30 * u
    elif kind == "nonfinite":
        p = u.clone()
        bad = torch.rand(B, n, generator=g)
        p[bad < 0.1, 0] = math.nan
        p[(bad >= 0.1) & (bad < 0.15), -1] = math.inf
        p[(bad >= 0.15) & (bad < 0.2), 0] = -math.inf
    elif kind == "disjoint":  # placed by the caller: x near 0, y 10 away
        p = u
    elif kind == "hollow":  # a sphere's surface
        v = torch.randn(B, n, D, generator=g, dtype=torch.float64)
        p = 0.5 + 0.5 * v / v.norm(dim=-1, keepdim=True)
    elif kind == "overflow":  # squared distances overflow to +inf: never neighbours
        scale = 1e200 if dtype == torch.float64 else (1e25 if dtype != torch.float16 else 1e4)
        p = scale * (u - 0.5)
    else:
        raise ValueError(kind)
    return p.to(dtype)


def pair(kind, B=2, N=150, M=170, D=3, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = cloud(kind, B, N, D, dtype, g)
    y = cloud(kind, B, M, D, dtype, g)
    if kind == "disjoint":
        y = y + 10
    if kind == "hollow":  # queries inside the empty ball, the references on its surface
        x = (0.5 + 0.2 * (x.double() - 0.5)).to(dtype)
    return x.to(device), y.to(device)


def ragged(B, N, M, seed, device):
    g = torch.Generator().manual_seed(seed)
    xl = torch.randint(0, N + 1, (B,), generator=g)
    yl = torch.randint(0, M + 1, (B,), generator=g)
    xl[0], yl[-1] = 0, 0  # an empty query cloud and an empty reference cloud
    return xl.to(device), yl.to(device)


# POINTOPS_GRID_BALL_TILES settings a ball test runs under: CUDA's shared lists at any size for every
# group ("1": a test's small inputs would otherwise not reach them), the same over the device-wide
# radix sort instead of the per-cloud block sort ("1 device-sort": POINTOPS_GRID_BLOCK_SORT=0), and
# the warp per query alone ("0"); the CPU has one ball search.
TILES = {"cpu": ("1",), "cuda": ("1", "1 device-sort", "0")}


def use_tiles(monkeypatch, tiles):
    """Sets the environment for one TILES entry."""
    value, _, sort = tiles.partition(" ")
    monkeypatch.setenv("POINTOPS_GRID_BALL_TILES", value)
    if sort:
        monkeypatch.setenv("POINTOPS_GRID_BLOCK_SORT", "0")
    else:
        monkeypatch.delenv("POINTOPS_GRID_BLOCK_SORT", raising=False)


def both(fn):
    """fn(algorithm) for the grid and for brute force, compared bitwise."""
    assert_same(fn("grid"), fn("brute"))


# ---------------------------------------------------------------- nearest_neighbor / chamfer
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_chamfer_grid_equals_brute(kind, dtype, device):
    for D in (2, 3):
        x, y = pair(kind, D=D, dtype=dtype, seed=D, device=device)
        for norm in (1, 2):
            both(lambda a: pointops.chamfer(x, y, norm=norm, algorithm=a))
            both(lambda a: pointops.nearest_neighbor(y, x, norm=norm, algorithm=a))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nearest_in_runs_of_every_length(dtype, device):
    """CUDA's K = 1 search takes a cell's run 8 points at a time while 8 or more remain, then one
    by one (csrc/grid/grid_cuda.cuh, knn_load_batch): clusters of 1 to 20 points 1 apart (a cell
    each), indices shuffled so a run's order is not the order the points were made in, a query
    near every point of every cluster (the nearest at each position of its run, inside and after
    the batches), and duplicated tails whose distance-0 exit ends a run inside a batch."""
    g = torch.Generator().manual_seed(3)
    refs, queries = [], []
    for length in range(1, 21):
        center = torch.tensor([float(length), float(length % 3), 0.0], dtype=torch.float64)
        points = center + 1e-3 * torch.rand(length, 3, generator=g, dtype=torch.float64)
        if length % 4 == 0:
            points[length // 2:] = points[length // 2]  # duplicates from the middle of the run on
        refs.append(points)
        queries.append(points + 1e-5 * torch.randn(length, 3, generator=g, dtype=torch.float64))
        queries.append(points[length // 2:length // 2 + 1])  # exactly on a point: distance 0
    y = torch.cat(refs)
    y = y[torch.randperm(len(y), generator=g)][None].to(dtype).to(device)
    x = torch.cat(queries)[None].to(dtype).to(device)
    for norm in (1, 2):
        both(lambda a: pointops.chamfer(x, y, norm=norm, algorithm=a))
        both(lambda a: pointops.knn_points(x, y, K=1, norm=norm, algorithm=a)[:2])


@requires_cuda
def test_grid_chamfer_directions_side_by_side():
    """chamfer on the grid runs its two directions on two streams (chamfer_cuda.cu,
    run_side_by_side): brute force's bits on the default stream, on a user's stream, when its
    outputs are consumed and freed call after call, and in a CUDA graph replay."""
    from conftest import check_cuda_graph

    g = torch.Generator().manual_seed(41)
    x = torch.rand(2, 30000, 3, generator=g).cuda()
    y = (torch.rand(2, 20000, 3, generator=g) ** 3).cuda()  # crowded towards a corner
    want = pointops.chamfer(x, y, algorithm="brute")
    assert_same(pointops.chamfer(x, y, algorithm="grid"), want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sums = []
        for _ in range(8):  # outputs freed at once: their memory goes back while the next call runs
            d1, d2, i1, i2 = pointops.chamfer(x, y, algorithm="grid")
            sums.append(torch.stack([d1.double().sum(), d2.double().sum(), i1.sum().double(), i2.sum().double()]))
            del d1, d2, i1, i2
        on_stream = pointops.chamfer(x, y, algorithm="grid")
    torch.cuda.synchronize()
    assert_same(on_stream, want)
    expected = torch.stack([want[0].double().sum(), want[1].double().sum(), want[2].sum().double(),
                            want[3].sum().double()])
    for s in sums:
        assert torch.equal(s, expected)

    def refill(seed):
        gen = torch.Generator().manual_seed(seed)
        x.copy_(torch.rand(2, 30000, 3, generator=gen))
        y.copy_(torch.rand(2, 20000, 3, generator=gen) ** 3)

    check_cuda_graph(lambda: pointops.chamfer(x, y, algorithm="grid"), refill, exact=(0, 1, 2, 3))


@requires_cuda
def test_grid_chamfer_side_stream_keeps_memory_bounded():
    """The side stream is the same on every call (chamfer_cuda.cu, side_stream): 40 calls queued
    without a sync reserve no more memory than the first three did, give or take one 20 MiB segment
    of the caching allocator. (Taking the pool's next stream on each call left one call's temporaries
    on each of the pool's 32 streams: KITTI's reserved memory went from 76 to 780 MB.)"""
    g = torch.Generator().manual_seed(43)
    x = torch.rand(1, 100000, 3, generator=g).cuda()
    y = torch.rand(1, 100000, 3, generator=g).cuda()
    for _ in range(3):
        pointops.chamfer(x, y, algorithm="grid")
    torch.cuda.synchronize()
    after_three = torch.cuda.memory_reserved()
    for _ in range(40):
        pointops.chamfer(x, y, algorithm="grid")
    torch.cuda.synchronize()
    grown = torch.cuda.memory_reserved() - after_three
    assert grown <= 20 * 2**20, f"reserved memory grew by {grown / 2**20:.0f} MiB over 40 calls"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["uniform", "clustered", "nonfinite", "point"])
def test_ragged_and_empty(kind, device, monkeypatch):
    """Ragged lengths with an empty query cloud and an empty reference cloud, and empty shapes; the
    ball query on CUDA with and without its shared lists (POINTOPS_GRID_BALL_TILES)."""
    x, y = pair(kind, B=5, N=90, M=110, seed=3, device=device)
    xl, yl = ragged(5, 90, 110, seed=4, device=device)
    both(lambda a: pointops.chamfer(x, y, xl, yl, algorithm=a))
    both(lambda a: pointops.knn_points(x, y, xl, yl, K=4, algorithm=a)[:2])
    both(lambda a: pointops.knn_points(x, y, xl, yl, K=1, algorithm=a)[:2])
    for tiles in TILES[device]:
        use_tiles(monkeypatch, tiles)
        both(lambda a: pointops.ball_query(x, y, xl, yl, K=6, radius=0.2, algorithm=a)[:2])
    for shapes in [(0, 5, 7), (2, 0, 7), (2, 5, 0), (2, 0, 0)]:  # B = 0, N = 0, M = 0
        B, N, M = shapes
        a_, b_ = torch.rand(B, N, 3, device=device), torch.rand(B, M, 3, device=device)
        both(lambda a: pointops.chamfer(a_, b_, algorithm=a))
        both(lambda a: pointops.knn_points(a_, b_, K=3, algorithm=a)[:2])
        for tiles in TILES[device]:
            use_tiles(monkeypatch, tiles)
            both(lambda a: pointops.ball_query(a_, b_, K=3, radius=0.5, algorithm=a)[:2])


def test_chamfer_function_and_packed_faces():
    x, y = pair("uniform", B=1, N=60, M=50, seed=5)
    assert_same(pointops.ChamferFunction.apply(x[0:1], y[0:1], "grid"), pointops.chamfer(x, y, algorithm="brute"))
    points_x, points_y = pair("clustered", B=1, N=120, M=90, seed=6)
    batch_x, batch_y = torch.arange(120) // 50, torch.arange(90) // 40  # three clouds of each
    both(lambda a: (pointops.knn(points_x[0], points_y[0], 4, batch_x, batch_y, algorithm=a),))
    both(lambda a: (pointops.radius(points_x[0], points_y[0], 0.2, batch_x, batch_y, algorithm=a),))


# ---------------------------------------------------------------- knn_points / ball_query
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
def test_knn_points_grid_equals_brute(kind, dtype, device):
    for D in (2, 3):
        p1, p2 = pair(kind, N=80, M=60, D=D, dtype=dtype, seed=10 + D, device=device)
        for K in (1, 2, 5, 16, 75):  # 75 > M: the extra slots stay empty
            for norm in (1, 2):
                both(lambda a: pointops.knn_points(p1, p2, K=K, norm=norm, algorithm=a)[:2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
def test_ball_query_grid_equals_brute(kind, dtype, device, monkeypatch):
    """Every kind of cloud, D = 2 and 3, radii from below the spacing to +inf once squared, K below and
    above M; on CUDA with and without the shared lists (float64 computes without them)."""
    for tiles in TILES[device]:
        use_tiles(monkeypatch, tiles)
        for D in (2, 3):
            p1, p2 = pair(kind, N=80, M=200, D=D, dtype=dtype, seed=20 + D, device=device)
            extent = 1e-30 if kind == "tiny" else 1.0
            for radius in (0.01, 0.1, 0.3, 2.0, 1e30):
                for K in (1, 4, 50, 100, 150):  # CUDA: a warp per query up to 128 (buffers of 64..160), passes above
                    both(lambda a: pointops.ball_query(p1, p2, K=K, radius=radius * extent, algorithm=a)[:2])


@pytest.mark.parametrize("device", DEVICES)
def test_ball_query_grid_crowded_balls(device):
    """Balls holding more points than K and than the CUDA warp's buffer (64..160 slots), while the
    cells within the radius hold well under a quarter of the cloud: the CUDA grid path cuts its
    buffer to the K smallest indices several times per query, for every buffer size (K up to 32,
    64, 96, 128; grid_ball_warp_cuda.cuh), and K = 129 takes the thread-per-query passes. The CPU
    grid keeps its own list."""
    g = torch.Generator().manual_seed(31)
    p1 = torch.rand(1, 300, 3, generator=g).to(device)
    p2 = torch.rand(1, 4000, 3, generator=g).to(device)  # radius 0.2: ~130 inside, ~860 in the cells
    for K in (1, 8, 40, 64, 100, 128, 129):
        both(lambda a: pointops.ball_query(p1, p2, K=K, radius=0.2, algorithm=a)[:2])
    p2 = torch.rand(1, 40000, 3, generator=g).to(device)  # radius 0.15: ~570 inside, ~2800 in the cells
    for K in (1, 8, 32, 64, 80, 96, 100, 128):
        both(lambda a: pointops.ball_query(p1, p2, K=K, radius=0.15, algorithm=a)[:2])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cell", ["1", "0.5"])
def test_ball_query_grid_cell_groups(cell, device, monkeypatch):
    """Ball queries over the grid against brute force, with ragged clouds and queries outside the
    references' box (clamped cells), over the regimes that decide the grid's work: with cells of
    edge r (cell "1"), radius 0.1 finds ~80 candidates in a query's cells, 0.15 ~270 and 0.2 ~650
    (more than the CUDA warp's 64..160-slot buffer: cuts to the K smallest); with cells of half the
    radius (cell "0.5", POINTOPS_GRID_BALL_CELL; the density rule's 0.087 where larger) a query
    reaches 4-5 cells per axis, more than the 32 one batch of lanes looks up (CUDA: no index
    windows). D = 2: ~25 and ~100 candidates. K = 128 takes the largest CUDA buffer.

    On CUDA both searches run (TILES): the shared lists of a cell's queries (grid_ball_tile_cuda.cuh;
    cells of edge r: ~80 and ~270 candidates per list fit its 480, ~650 go to the work list of the
    warp per query; cells of half the radius: a cell's union box of 4-6 cells per axis is over the
    64 cells a list takes when its queries spread over it) and the warp per query alone
    (POINTOPS_GRID_BALL_TILES=0)."""
    monkeypatch.setenv("POINTOPS_GRID_BALL_CELL", cell)
    g = torch.Generator().manual_seed(41)
    p1 = (1.2 * torch.rand(2, 700, 3, generator=g) - 0.1).to(device)
    p2 = torch.rand(2, 3000, 3, generator=g).to(device)
    l1, l2 = torch.tensor([700, 517], device=device), torch.tensor([2900, 3000], device=device)
    p1_2d, p2_2d = p1[..., :2].contiguous(), p2[..., :2].contiguous()
    for tiles in TILES[device]:
        use_tiles(monkeypatch, tiles)
        for radius in (0.1, 0.15, 0.2):
            for K in (1, 16, 64, 128):
                both(lambda a: pointops.ball_query(p1, p2, l1, l2, K=K, radius=radius, algorithm=a)[:2])
        for radius in (0.03, 0.06):
            both(lambda a: pointops.ball_query(p1_2d, p2_2d, l1, l2, K=32, radius=radius, algorithm=a)[:2])


@pytest.mark.parametrize("device", DEVICES)
def test_ball_query_grid_list_sizes(device, monkeypatch):
    """Cloud sizes around the CUDA shared lists' bitmap of reference indices (grid_ball_tile_cuda.cuh:
    clouds of <= 32768 references, each lane owning a power of two of 32-bit words): 1 and 31
    references (one word), 1025 with 1000 valid (two words per lane), 32768 with 32767 valid (the
    largest bitmap, its last word partly used) and 32769 (the warp per query alone); 16384 with 16383
    valid and 16385: the largest cloud the per-cloud block sort takes, and the smallest it leaves to
    the device-wide sort. K = 4 stops each query's scan early, K = 64 at ~20 hits takes them all. The
    same bounds on the query side: 16384 queries (16383 valid) and 16385 against 100 references. On
    CUDA also with POINTOPS_GRID_BLOCK_SORT=0 and POINTOPS_GRID_BALL_TILES=0."""
    g = torch.Generator().manual_seed(61)
    queries = (1.1 * torch.rand(2, 150, 3, generator=g) - 0.05).to(device)
    few_refs = torch.rand(2, 100, 3, generator=g).to(device)
    for tiles in TILES[device]:
        use_tiles(monkeypatch, tiles)
        for M, valid, radius in ((1, 1, 0.5), (31, 31, 0.5), (1025, 1000, 0.17), (16384, 16383, 0.07),
                                 (16385, 16385, 0.07), (32768, 32767, 0.055), (32769, 32769, 0.055)):
            refs = torch.rand(2, M, 3, generator=g).to(device)
            lengths = torch.tensor([valid, M], device=device)
            for K in (4, 64):
                both(lambda a: pointops.ball_query(queries, refs, None, lengths, K=K, radius=radius, algorithm=a)[:2])
        for N in (16384, 16385):
            many = torch.rand(2, N, 3, generator=g).to(device)
            lengths = torch.tensor([N - 1, N], device=device)
            both(lambda a: pointops.ball_query(many, few_refs, lengths, None, K=8, radius=0.2, algorithm=a)[:2])


@pytest.mark.parametrize("device", DEVICES)
def test_ball_query_grid_dense_cells(device, monkeypatch):
    """Dense cells, as in the benchmarks' ball row: ~12 references and ~24 queries per cell of edge r, so
    32 consecutive sorted queries (a CUDA warp's worth) share one or two cells; ragged clouds whose
    sizes are not multiples of 32; K = 8, which every ball fills early (the index-window early exit),
    and 50 / 64, about the ~50 hits of a ball. D = 2 too. On CUDA with and without the shared lists
    (POINTOPS_GRID_BALL_TILES)."""
    g = torch.Generator().manual_seed(53)
    p1 = torch.rand(3, 3000, 3, generator=g).to(device)
    p2 = torch.rand(3, 1500, 3, generator=g).to(device)
    l1, l2 = torch.tensor([3000, 2011, 997], device=device), torch.tensor([1500, 1500, 1203], device=device)
    p1_2d, p2_2d = p1[..., :2].contiguous(), p2[..., :2].contiguous()
    for tiles in TILES[device]:
        use_tiles(monkeypatch, tiles)
        for K in (1, 8, 50, 64):
            both(lambda a: pointops.ball_query(p1, p2, l1, l2, K=K, radius=0.2, algorithm=a)[:2])
        both(lambda a: pointops.ball_query(p1_2d, p2_2d, l1, l2, K=32, radius=0.05, algorithm=a)[:2])


@requires_cuda
def test_ball_query_grid_lists_by_default_rule(monkeypatch):
    """The CUDA shared lists as "grid" takes them without the override (>= 65536 queries, groups of
    >= 4 queries; smaller groups and lists over 480 candidates to the work list): dense queries in
    half the box (~80 per cell of edge r = 0.1), 300 queries spread over the other half (~0.6 per
    cell: groups of 1-3, to the work list), 500 beyond the references' box (clamped into its corner
    cells), and radii whose lists overflow (0.13) or whose cells hold ~2 queries (0.05)."""
    monkeypatch.delenv("POINTOPS_GRID_BALL_TILES", raising=False)
    g = torch.Generator().manual_seed(71)
    p1 = torch.rand(2, 40000, 3, generator=g)
    p1[:, :, 0] *= 0.5  # the dense half
    p1[:, 500:800, 0] += 0.5  # sparse queries in the other half
    p1[:, :500] = 1.0 + 0.5 * p1[:, :500]  # beyond the references' box
    p1, p2 = p1.cuda(), torch.rand(2, 16384, 3, generator=g).cuda()
    for K, radius in ((16, 0.1), (64, 0.1), (64, 0.13), (8, 0.05)):
        both(lambda a: pointops.ball_query(p1, p2, K=K, radius=radius, algorithm=a)[:2])


@requires_cuda
def test_ball_query_grid_routes(monkeypatch, capfd):
    """Which CUDA path the ball queries take (POINTOPS_GRID_BALL_DEBUG=1 prints how many went to the
    shared lists' work list), so that a change sending every group to the work list fails here.
    Uniform: 2 x 40000 queries, 16384 references, cells of edge r = 0.1 (~40 queries and ~16
    references a cell): a list averages ~442 candidates (27 cells), over 480 in ~4% of the groups
    (a Poisson tail), and the groups of < 4 are warps' edge fragments, ~2% of the queries; so at
    most a quarter of the queries to the work list is a loose bound. Crowded: every reference in a
    cube of edge 0.05 (one cell), so every list is over 480 and every query goes to the work list.
    Sparse: about one query per cell, mostly groups of < 4. All still equal brute force. The line
    also names the sort behind the lists: the per-cloud block sort for the sparse case (64 clouds of
    <= 16384 points: 128 blocks, one wave on a GPU of >= 128 SMs, and shared memory that compute
    capability 7.5 cannot give a block), the device-wide sort for 40000 queries a cloud and for 256
    clouds (more blocks than a wave), and the block sort again for 2 clouds with the lists forced on
    (one wave on any GPU: every GPU whose blocks can opt in to the shared memory asserts it)."""
    monkeypatch.delenv("POINTOPS_GRID_BALL_TILES", raising=False)
    monkeypatch.delenv("POINTOPS_GRID_BLOCK_SORT", raising=False)
    monkeypatch.setenv("POINTOPS_GRID_BALL_DEBUG", "1")
    g = torch.Generator().manual_seed(73)
    uniform_q, refs = torch.rand(2, 40000, 3, generator=g).cuda(), torch.rand(2, 16384, 3, generator=g).cuda()
    crowded = (0.5 + 0.05 * torch.rand(2, 16384, 3, generator=g)).cuda()
    near_crowd = (0.45 + 0.15 * torch.rand(2, 40000, 3, generator=g)).cuda()

    def routed(p1, p2, K, radius):
        capfd.readouterr()
        pointops.ball_query(p1, p2, K=K, radius=radius, algorithm="grid")
        torch.cuda.synchronize()
        lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("grid ball:")]
        assert len(lines) == 1, lines
        queries, listed = (int(w) for w in lines[0].replace(",", "").split() if w.isdigit())
        assert queries == p1.shape[0] * p1.shape[1]
        B, N, M = p1.shape[0], p1.shape[1], p2.shape[1]
        props = torch.cuda.get_device_properties(p1.device)
        # the kernel's ~67.7 KB of shared memory (sizeof(BlockSortStorage)) against the opt-in limit
        # where torch reports it (64 KB on compute capability 7.5, >= 96 KB on 7.0 and 8.0+, so any
        # bound between them decides alike); else the capability
        optin = getattr(props, "shared_memory_per_block_optin", None)
        fits = optin >= 68 * 1024 if optin is not None else (props.major, props.minor) != (7, 5)
        block = max(N, M) <= 16384 and 2 * B <= props.multi_processor_count and fits
        assert lines[0].endswith("block sort" if block else "device-wide sort"), lines[0]
        both(lambda a: pointops.ball_query(p1, p2, K=K, radius=radius, algorithm=a)[:2])
        return listed / queries

    assert routed(uniform_q, refs, 64, 0.1) < 0.25
    assert routed(near_crowd, crowded, 64, 0.1) == 1.0
    # 64 clouds of 1024 queries (65536 in all) and 16384 references: ~1 query per cell of edge 0.1,
    # so only ~8% of the queries are in groups of >= 4 (Poisson(1), size-biased: P(X >= 3))
    sparse_q = torch.rand(64, 1024, 3, generator=g).cuda()
    sparse_refs = torch.rand(64, 16384, 3, generator=g).cuda()
    assert routed(sparse_q, sparse_refs, 16, 0.1) > 0.75
    # 256 clouds of 256 queries and references: 512 blocks, more than a wave, so the device-wide sort
    # (routed checks the line's sort; the share listed is not the point here)
    routed(torch.rand(256, 256, 3, generator=g).cuda(), torch.rand(256, 256, 3, generator=g).cuda(), 16, 0.1)
    # 2 clouds (4 blocks: one wave on any GPU), the lists forced on: the block sort wherever the
    # shared memory fits, so some case asserts it also on GPUs of fewer than 128 SMs
    monkeypatch.setenv("POINTOPS_GRID_BALL_TILES", "1")
    routed(torch.rand(2, 3000, 3, generator=g).cuda(), torch.rand(2, 2000, 3, generator=g).cuda(), 16, 0.1)
    monkeypatch.setenv("POINTOPS_GRID_BALL_TILES", "0")  # the warp per query alone: no work list, no line
    capfd.readouterr()
    pointops.ball_query(uniform_q, refs, K=64, radius=0.1, algorithm="grid")
    torch.cuda.synchronize()
    assert "grid ball:" not in capfd.readouterr().err


@requires_cuda
@pytest.mark.parametrize("target", ["0", "8", "96", "1000"])
def test_crowding_refinement_cuda(target, monkeypatch):
    """The CUDA grid's crowding refinement (POINTOPS_GRID_CROWDING: 96 by default for K = 1, 0 turns
    it off) changes only the cell size, so the grid still equals brute force bit for bit: clouds that crowd
    (a LiDAR-like ground plane with rings, clusters with duplicates) and one that does not, K = 1 and
    K = 8 (which the variable turns on too), ragged."""
    monkeypatch.setenv("POINTOPS_GRID_CROWDING", target)
    g = torch.Generator().manual_seed(41)
    rings = torch.rand(2, 6000, 3, generator=g, dtype=torch.float64)
    radius = 2.0 + 60.0 * rings[..., 0] ** 2  # dense near the sensor, sparse far away
    angle = 2 * math.pi * rings[..., 1]
    scan = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle), 0.05 * rings[..., 2]], -1).float()
    moved = scan + torch.tensor([0.3, -0.1, 0.02])
    clustered = pair("clustered", B=2, N=3000, M=4000)
    uniform = pair("uniform", B=2, N=3000, M=4000)
    lengths = torch.tensor([6000, 2500]).cuda(), torch.tensor([1000, 6000]).cuda()
    for x, y, l1, l2 in [(moved, scan, None, None), (moved, scan, *lengths), (*clustered, None, None),
                         (*uniform, None, None)]:
        x, y = x.cuda(), y.cuda()
        both(lambda a: pointops.chamfer(x, y, l1, l2, algorithm=a))
        both(lambda a: pointops.knn_points(x, y, l1, l2, K=8, algorithm=a)[:2])


# ---------------------------------------------------------------- chamfer_distance (the loss)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["uniform", "clustered", "far", "plane", "point"])
def test_chamfer_distance_and_gradients(kind, dtype, device):
    x0, y0 = pair(kind, B=3, N=70, M=90, D=3, dtype=dtype, seed=30, device=device)
    xl, yl = ragged(3, 70, 90, seed=31, device=device)
    xl[0] = 50  # keep one direction of every cloud non-trivial
    weights = torch.tensor([1.0, 0.5, 2.0], device=device, dtype=dtype)
    options = [dict(), dict(point_reduction="sum", norm=1), dict(single_directional=True),
               dict(squared=False), dict(point_reduction="max"), dict(batch_reduction=None, weights=weights),
               dict(x_lengths=xl, y_lengths=yl)]
    for kwargs in options:
        def run(algorithm):
            x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
            loss, _ = pointops.chamfer_distance(x, y, algorithm=algorithm, **kwargs)
            loss.sum().backward()
            return loss.detach(), x.grad, y.grad
        # CUDA's default backward scatters with float atomics (not repeatable bit for bit even on
        # one path); deterministic algorithms take the sort-based gather, whose gradients depend
        # only on the indices and so must match bit for bit.
        with DeterministicAlgorithms(device == "cuda"):
            both(run)
    criterion = {a: pointops.ChamferLoss(point_reduction="sum", algorithm=a) for a in ("grid", "brute")}
    both(lambda a: (criterion[a](x0, y0)[0],))
    assert "algorithm='grid'" in repr(criterion["grid"])


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    # Strided views (every other point of a transposed (B, D, N) buffer): the grid on the views
    # gives what brute force gives on contiguous copies, bit for bit.
    g = torch.Generator().manual_seed(40)
    x = torch.rand(2, 3, 120, generator=g).to(device).transpose(1, 2)[:, ::2]
    y = torch.rand(2, 3, 150, generator=g).to(device).transpose(1, 2)[:, 1::2]
    assert not x.is_contiguous() and not y.is_contiguous()
    xc, yc = x.contiguous(), y.contiguous()
    assert_same(pointops.chamfer(x, y, algorithm="grid"), pointops.chamfer(xc, yc, algorithm="brute"))
    assert_same(pointops.knn_points(x, y, K=5, algorithm="grid")[:2],
                pointops.knn_points(xc, yc, K=5, algorithm="brute")[:2])
    assert_same(pointops.ball_query(x, y, K=8, radius=0.3, algorithm="grid")[:2],
                pointops.ball_query(xc, yc, K=8, radius=0.3, algorithm="brute")[:2])


# ---------------------------------------------------------------- randomized
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 3), N=st.integers(0, 40), M=st.integers(0, 40),
       D=st.sampled_from([2, 3]), K=st.integers(1, 8), norm=st.sampled_from([1, 2]),
       dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]), levels=st.sampled_from([2, 5, 1000]),
       scale=st.sampled_from([1e-20, 1.0, 1e4]), nan_rate=st.sampled_from([0.0, 0.2]),
       radius=st.floats(1e-3, 3.0), with_lengths=st.booleans())
def test_random_bitwise(seed, B, N, M, D, K, norm, dtype, levels, scale, nan_rate, radius, with_lengths):
    g = torch.Generator().manual_seed(seed)

    def points(n):  # few levels: duplicates and exact ties
        p = torch.randint(0, levels, (B, n, D), generator=g).double() / levels * scale + scale
        p[torch.rand(B, n, D, generator=g) < nan_rate / D] = math.nan
        return p.to(dtype)

    p1, p2 = points(N), points(M)
    l1 = torch.randint(0, N + 1, (B,), generator=g) if with_lengths else None
    l2 = torch.randint(0, M + 1, (B,), generator=g) if with_lengths else None
    both(lambda a: pointops.knn_points(p1, p2, l1, l2, K=K, norm=norm, algorithm=a)[:2])
    both(lambda a: pointops.chamfer(p1, p2, l1, l2, norm=norm, algorithm=a))
    both(lambda a: pointops.ball_query(p1, p2, l1, l2, K=K, radius=radius * scale, algorithm=a)[:2])


# ---------------------------------------------------------------- auto, errors, op checks
def test_auto_equals_brute_above_the_threshold():
    g = torch.Generator().manual_seed(7)
    x, y = torch.rand(1, 3000, 3, generator=g), torch.rand(1, 5000, 3, generator=g)
    assert_same(pointops.chamfer(x, y), pointops.chamfer(x, y, algorithm="brute"))
    assert_same(pointops.knn_points(x, y, K=4)[:2], pointops.knn_points(x, y, K=4, algorithm="brute")[:2])
    x4, y4 = torch.rand(1, 3000, 4, generator=g), torch.rand(1, 3000, 4, generator=g)  # D = 4: auto is brute force
    assert_same(pointops.chamfer(x4, y4), pointops.chamfer(x4, y4, algorithm="brute"))


def test_auto_hands_far_queries_back_to_brute_force_on_the_cpu():
    # A blob of queries at the centre of a sphere of references: every query is ~1 from its
    # neighbour, and the grid search walks thousands of empty cells per query (measured 2.8x brute
    # force's time at these sizes, 10-14x at 20k-50k points). "auto" builds the grid, probes a sample
    # of the queries and hands the search back to brute force; cloud 1 is near its references (the
    # probe keeps the grid there, and decides over the whole call). Either way the results are
    # brute force's bit for bit, lengths included.
    g = torch.Generator().manual_seed(11)
    sphere = torch.randn(2, 2000, 3, generator=g)
    sphere = sphere / sphere.norm(dim=-1, keepdim=True)
    blob = torch.randn(2, 2000, 3, generator=g) * 0.02
    near = sphere * 1.001
    lengths = torch.tensor([2000, 1500])
    for x, y in ((blob, sphere), (torch.stack([blob[0], near[1]]), sphere)):
        assert_same(pointops.chamfer(x, y), pointops.chamfer(x, y, algorithm="brute"))
        assert_same(pointops.nearest_neighbor(x, y, lengths, lengths),
                    pointops.nearest_neighbor(x, y, lengths, lengths, algorithm="brute"))
        for K in (1, 4):
            assert_same(pointops.knn_points(x, y, lengths, lengths, K=K)[:2],
                        pointops.knn_points(x, y, lengths, lengths, K=K, algorithm="brute")[:2])


def sphere_and_blob(B, n, g, device):
    """References on a unit sphere; queries in a blob at its centre (every query ~1 from its
    neighbour: the grid walks thousands of empty cells) for the even clouds, 0.001 off the sphere
    for the odd ones."""
    sphere = torch.randn(B, n, 3, generator=g)
    sphere = sphere / sphere.norm(dim=-1, keepdim=True)
    queries = sphere * 1.001
    queries[0::2] = 0.02 * torch.randn(queries[0::2].shape, generator=g)
    return queries.to(device), sphere.to(device)


@requires_cuda
@pytest.mark.parametrize("scale", ["default", "0", "1e30"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_auto_probes_far_queries_on_cuda(scale, dtype, monkeypatch):
    # Sizes above the K = 1 rule's thresholds (65536 references, 2^33 pairs), so "auto" builds the
    # grids and probes each cloud on the device: a far cloud (a blob in a sphere) goes to brute
    # force, a near one stays on the grid, in the same call. POINTOPS_GRID_PROBE_SCALE scales the
    # grid's estimate: 0 gives every cloud to the grid, 1e30 every cloud to brute force, so all
    # three ways through the merge run. Results are brute force's bit for bit, lengths included.
    if scale != "default":
        monkeypatch.setenv("POINTOPS_GRID_PROBE_SCALE", scale)
    g = torch.Generator().manual_seed(23)
    x, y = sphere_and_blob(2, 65536, g, "cuda")
    x, y = x.to(dtype), y.to(dtype)
    lengths1, lengths2 = torch.tensor([65536, 60000]).cuda(), torch.tensor([50000, 65536]).cuda()
    assert_same(pointops.chamfer(x, y), pointops.chamfer(x, y, algorithm="brute"))
    assert_same(pointops.chamfer(x, y, lengths1, lengths2), pointops.chamfer(x, y, lengths1, lengths2, algorithm="brute"))
    assert_same(pointops.nearest_neighbor(x, y, lengths1, lengths2),
                pointops.nearest_neighbor(x, y, lengths1, lengths2, algorithm="brute"))
    assert_same(pointops.knn_points(x, y, lengths1, lengths2, K=1)[:2],
                pointops.knn_points(x, y, lengths1, lengths2, K=1, algorithm="brute")[:2])
    # non-contiguous views (coordinates stored first)
    xt, yt = x.transpose(1, 2).contiguous().transpose(1, 2), y.transpose(1, 2).contiguous().transpose(1, 2)
    assert not xt.is_contiguous() and not yt.is_contiguous()
    assert_same(pointops.chamfer(xt, yt), pointops.chamfer(x, y, algorithm="brute"))
    # a cloud with no valid queries, one with no valid references
    empty1, empty2 = torch.tensor([0, 60000]).cuda(), torch.tensor([65536, 0]).cuda()
    assert_same(pointops.chamfer(x, y, empty1, empty2), pointops.chamfer(x, y, empty1, empty2, algorithm="brute"))


@requires_cuda
@pytest.mark.parametrize("scale", ["default", "0", "1e30"])
def test_auto_probe_in_2d_and_one_direction(scale, monkeypatch):
    # D = 2 (the probe's 3 x 3 neighbour cells): a blob in a circle and points near the circle.
    # Then a chamfer whose one direction passes the size rule (4096 queries against 262144
    # references: probed) and whose other does not (262144 against 4096: brute force alone).
    if scale != "default":
        monkeypatch.setenv("POINTOPS_GRID_PROBE_SCALE", scale)
    g = torch.Generator().manual_seed(31)
    circle = torch.randn(2, 65536, 2, generator=g)
    circle = circle / circle.norm(dim=-1, keepdim=True)
    queries = circle * 1.001
    queries[0] = 0.02 * torch.randn(65536, 2, generator=g)
    x, y = queries.cuda(), circle.cuda()
    assert_same(pointops.chamfer(x, y), pointops.chamfer(x, y, algorithm="brute"))
    assert_same(pointops.knn_points(x, y, K=1)[:2], pointops.knn_points(x, y, K=1, algorithm="brute")[:2])
    few, many = sphere_and_blob(2, 262144, g, "cuda")
    few = few[:, :4096].contiguous()
    assert_same(pointops.chamfer(few, many), pointops.chamfer(few, many, algorithm="brute"))


@requires_cuda
@pytest.mark.parametrize("scale", ["default", "0", "1e30"])
@pytest.mark.parametrize("K,dtype", [(4, torch.float32), (16, torch.float16), (16, torch.float64),
                                     (32, torch.float32), (32, torch.float64)])
def test_auto_probes_far_queries_for_lists_on_cuda(K, dtype, scale, monkeypatch, capfd):
    # knn_points with 2 <= K <= 16 at sizes the list rule gives to the grid (8192 references, 5.4e8
    # pairs): "auto" probes each cloud as for K = 1. The blob clouds (even) go to brute force, the
    # near ones (odd) stay on the grid, and brute force writes its clouds into the grid's outputs.
    # Scale 0 gives every cloud to the grid, 1e30 every cloud to brute force. K = 32 is brute force
    # alone under "auto" (no grid, no probe). Results are brute force's bit for bit.
    if scale != "default":
        monkeypatch.setenv("POINTOPS_GRID_PROBE_SCALE", scale)
    g = torch.Generator().manual_seed(37)
    x, y = sphere_and_blob(8, 8192, g, "cuda")
    x, y = x.to(dtype), y.to(dtype)
    lengths1 = torch.tensor([8192, 8000, 0, 8192, 5000, 8192, 8192, 1]).cuda()
    lengths2 = torch.tensor([8192, 8192, 8192, 0, 8192, 4000, 8192, K - 1]).cuda()
    monkeypatch.setenv("POINTOPS_GRID_PROBE_DEBUG", "1")  # the choices of clouds 0-3 on stderr (a host sync)
    capfd.readouterr()
    got = pointops.knn_points(x, y, K=K)[:2]
    printed = capfd.readouterr().err
    monkeypatch.delenv("POINTOPS_GRID_PROBE_DEBUG")
    assert_same(got, pointops.knn_points(x, y, K=K, algorithm="brute")[:2])
    if K > 16:
        assert "grid probe" not in printed
    elif scale == "default":
        assert "cloud 0 of 8" in printed and "cloud 1 of 8" in printed, printed
        choices = [line.rsplit(" ", 1)[-1] for line in printed.splitlines() if line.startswith("grid probe: cloud")]
        assert choices[:4] == ["brute", "grid", "brute", "grid"], printed
    assert_same(pointops.knn_points(x, y, lengths1, lengths2, K=K)[:2],
                pointops.knn_points(x, y, lengths1, lengths2, K=K, algorithm="brute")[:2])
    assert_same(pointops.knn_points(x, y, K=K, norm=1)[:2], pointops.knn_points(x, y, K=K, norm=1, algorithm="brute")[:2])
    # non-contiguous views (coordinates stored first): converted once, searched by both paths
    xt, yt = x.transpose(1, 2).contiguous().transpose(1, 2), y.transpose(1, 2).contiguous().transpose(1, 2)
    assert not xt.is_contiguous() and not yt.is_contiguous()
    assert_same(pointops.knn_points(xt, yt, K=K)[:2], pointops.knn_points(x, y, K=K, algorithm="brute")[:2])


@requires_cuda
def test_probed_auto_lists_in_a_cuda_graph():
    # knn_points K > 1: the probe's choice on the device, brute force behind it; captured and replayed
    # with the far cloud moved, each replay equals an eager call bit for bit.
    from conftest import check_cuda_graph

    g = torch.Generator().manual_seed(41)
    x, y = sphere_and_blob(8, 8192, g, "cuda")

    def refill(seed):
        xs, ys = sphere_and_blob(8, 8192, torch.Generator().manual_seed(seed), "cuda")
        x.copy_(xs.roll(seed, 0))
        y.copy_(ys.roll(seed, 0))

    check_cuda_graph(lambda: pointops.knn_points(x, y, K=8)[:2], refill, exact=(0, 1))
    assert_same(pointops.knn_points(x, y, K=8)[:2], pointops.knn_points(x, y, K=8, algorithm="brute")[:2])


@requires_cuda
def test_probed_auto_in_a_cuda_graph():
    # The probe's choice lives on the device: "auto" captures in a CUDA graph (no host sync) and a
    # replay after moving the queries far away (or back) chooses again.
    from conftest import check_cuda_graph

    g = torch.Generator().manual_seed(29)
    x, y = sphere_and_blob(2, 65536, g, "cuda")

    def refill(seed):
        gen = torch.Generator().manual_seed(seed)
        xs, ys = sphere_and_blob(2, 65536, gen, "cuda")
        if seed % 2:
            xs = xs.flip(0)  # the far cloud is now cloud 1
        x.copy_(xs)
        y.copy_(ys)

    check_cuda_graph(lambda: pointops.chamfer(x, y), refill, exact=(0, 1, 2, 3))
    assert_same(pointops.chamfer(x, y), pointops.chamfer(x, y, algorithm="brute"))


@pytest.mark.parametrize("device", DEVICES)
def test_grid_refuses_other_dimensions_and_unknown_names(device):
    for D in (1, 4):
        x = torch.rand(1, 5, D, device=device)
        calls = [lambda a: pointops.nearest_neighbor(x, x, algorithm=a), lambda a: pointops.chamfer(x, x, algorithm=a),
                 lambda a: pointops.knn_points(x, x, K=2, algorithm=a)[:2],
                 lambda a: pointops.ball_query(x, x, K=2, algorithm=a)[:2],
                 lambda a: pointops.chamfer_distance(x, x, algorithm=a)[:1],
                 lambda a: pointops.chamfer_distance(x, x, point_reduction="max", algorithm=a)[:1]]
        for call in calls:
            with pytest.raises(RuntimeError, match=rf"algorithm='grid' needs points of dimension 2 or 3, got D = {D}"):
                call("grid")
            assert_same(call("auto"), call("brute"))  # "auto" never picks the grid there
    x = torch.rand(1, 5, 3, device=device)
    for call in [lambda: pointops.chamfer(x, x, algorithm="kdtree"),
                 lambda: pointops.knn_points(x, x, algorithm="Grid"), lambda: pointops.ball_query(x, x, algorithm=""),
                 lambda: pointops.chamfer_distance(x, x, algorithm="x")]:
        with pytest.raises(RuntimeError, match=r"algorithm must be 'auto', 'brute' or 'grid', got '"):
            call()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_with_grid(device):
    g = torch.Generator().manual_seed(9)
    a0, b0 = torch.rand(2, 17, 3, generator=g).to(device), torch.rand(2, 13, 3, generator=g).to(device)
    lengths = (torch.tensor([17, 5], device=device), torch.tensor([0, 13], device=device))
    ops = torch.ops.pointops
    for requires_grad in (False, True):
        a, b = a0.clone().requires_grad_(requires_grad), b0.clone().requires_grad_(requires_grad)
        torch.library.opcheck(ops.nearest_neighbor.default, (a, b, *lengths, 2, "grid"))
        torch.library.opcheck(ops.chamfer.default, (a, b, None, None, 1, "grid"))
        torch.library.opcheck(ops.knn_points.default, (a, b, *lengths, 4, 2, "grid"))
        torch.library.opcheck(ops.ball_query.default, (a, b, None, None, 5, 0.4, "grid"))
        torch.library.opcheck(ops._chamfer_distance.default,
                              (a, b, None, None, None, "mean", "mean", 2, False, True, "grid"))


def test_compile_with_grid():
    x, y = torch.rand(2, 40, 3), torch.rand(2, 30, 3)
    fn = torch.compile(lambda a, b: pointops.chamfer(a, b, algorithm="grid"), fullgraph=True, backend="eager")
    assert_same(fn(x, y), pointops.chamfer(x, y, algorithm="brute"))


# ---------------------------------------------------------------- real LiDAR
def load_scan(name):
    import numpy as np
    root = data_dir()
    path = None if root is None else root / "lidar" / name
    if path is None or not path.exists():
        pytest.skip(f"../shared/data/lidar/{name} is not present")
    if name.startswith("ff9e"):  # nuScenes: float16 x 5 (x, y, z, intensity, time lag)
        return torch.from_numpy(np.fromfile(path, np.float16).reshape(-1, 5)[:, :3].astype(np.float32))
    return torch.from_numpy(np.fromfile(path, np.float32).reshape(-1, 4)[:, :3].copy())  # KITTI: float32 x 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["0000000000.bin", "ff9eff4389a740848f9a56ad749a4ae8.bin"])
def test_lidar_scan_grid_equals_brute(name, device):
    scan = load_scan(name)
    stride = 1 if device == "cuda" else max(1, scan.shape[0] // 6000)  # CPU brute force: ~6k points
    y = scan[::stride].contiguous()
    angle = math.radians(1.0)  # the scan against itself after a small rigid motion
    rotation = torch.tensor([[math.cos(angle), -math.sin(angle), 0.0], [math.sin(angle), math.cos(angle), 0.0],
                             [0.0, 0.0, 1.0]])
    x = (scan[1::stride] @ rotation.T + torch.tensor([0.3, -0.1, 0.02])).contiguous()
    x, y = x[None].to(device), y[None].to(device)
    both(lambda a: pointops.chamfer(x, y, algorithm=a))
    both(lambda a: pointops.knn_points(x, y, K=8, algorithm=a)[:2])
    both(lambda a: pointops.ball_query(x, y, K=16, radius=0.5, algorithm=a)[:2])
    xh, yh = x.half(), y.half()  # the nuScenes coordinates are float16 to begin with
    both(lambda a: pointops.chamfer(xh, yh, algorithm=a))
