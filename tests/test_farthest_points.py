"""Farthest point sampling: an exact float64 oracle, ragged clouds, per-cloud counts, start indices,
duplicates, non-finite points, every dtype, CPU vs CUDA bit for bit on every kernel path, the public
wrapper, errors, opcheck, torch.compile and CUDA graphs."""
import math

import pytest
import torch

import pointops
from conftest import DEVICES, HAS_CUDA, requires_cuda

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
fps = torch.ops.pointops.sample_farthest_points


def compute_unit(dtype):
    """Unit roundoff of the type the distances are computed in (half types compute in float32)."""
    return 2.0**-53 if dtype == torch.float64 else 2.0**-24


def cloud_facts(points, b, lengths, K, max_K, start_idx):
    """(n, samples asked for, finite mask, the start point or None) of cloud b, by the rule."""
    n = points.shape[1] if lengths is None else int(lengths[b])
    k = max_K if K is None else min(max(int(K[b]), 0), max_K)
    cloud = points[b, :n].detach().cpu().double()
    finite = torch.isfinite(cloud).all(-1)
    start = None
    if n > 0:
        st = 0 if start_idx is None else int(start_idx[b]) % n  # Python's modulo
        start = next((p for p in [(st + q) % n for q in range(n)] if finite[p]), None)
    return cloud, k, finite, start


def reference_fps(points, lengths=None, K=None, max_K=50, start_idx=None):
    """The rule, step by step, in float64 on the exact input values: the start is the first finite
    point at or after start_idx (mod n), cyclically; then the unselected finite point with the
    largest squared distance to the samples so far, ties to the smallest index (torch.argmax
    returns the first maximum); -1 once K samples are taken or the finite points run out.
    For points whose squared distances are exact in float32 (small integers) this is exactly what
    the kernels compute."""
    B = points.shape[0]
    out = torch.full((B, max_K), -1, dtype=torch.int64)
    for b in range(B):
        cloud, k, finite, s = cloud_facts(points, b, lengths, K, max_K, start_idx)
        mind = torch.where(finite, math.inf, -1.0)
        t = 0
        while s is not None and t < k:
            out[b, t] = s
            t += 1
            mind[s] = -1
            d = ((cloud - cloud[s]) ** 2).sum(-1)
            mind = torch.where(mind >= 0, torch.minimum(mind, d), mind)  # selected / non-finite stay -1
            s = int(mind.argmax()) if (mind >= 0).any() else None
    return out


def assert_farthest_point_rule(idx, points, lengths=None, K=None, max_K=50, start_idx=None):
    """For inputs whose distances round in the compute type: everything that does not depend on
    rounding holds exactly (the counts, -1 padding, distinct finite indices, the start), and each
    sample's float64 distance to the earlier samples is the largest among the remaining points up
    to the rounding of two computed distances: each is (dim + 2) roundings of the compute type
    from the exact value (x - y rounded once, each square and fused add once)."""
    idx = idx.cpu()
    B, dim = points.shape[0], points.shape[2]
    assert idx.shape == (B, max_K) and idx.dtype == torch.int64
    slack = 2 * (dim + 2) * compute_unit(points.dtype)
    for b in range(B):
        cloud, k, finite, start = cloud_facts(points, b, lengths, K, max_K, start_idx)
        count = min(k, int(finite.sum()))
        row = idx[b]
        assert (row[count:] == -1).all() and (row[:count] >= 0).all(), (b, row)
        taken = row[:count].tolist()
        assert len(set(taken)) == count and all(bool(finite[p]) for p in taken)
        if count == 0:
            continue
        assert taken[0] == start
        mind = torch.where(finite, math.inf, -1.0)
        for t in range(1, count):
            mind[taken[t - 1]] = -1
            mind = torch.where(mind >= 0, torch.minimum(mind, ((cloud - cloud[taken[t - 1]]) ** 2).sum(-1)), mind)
            assert mind[taken[t]] >= mind.max() * (1 - slack), (b, t)


def integer_points(B, N, dim, dtype, low=-8, high=8, seed=0):
    """Small integers: exact in every dtype, and so are their squared distances in float32."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (B, N, dim), generator=g).to(dtype)


def random_points(B, N, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, dim, generator=g).to(dtype)


def on(device, *tensors):
    return [t.to(device) if t is not None else None for t in tensors]


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 2, 3, 5])
def test_matches_oracle_on_integer_points(device, dtype, dim):
    # Ragged (one empty cloud), per-cloud K (0, and 40 > the cloud's 17 points: it exhausts them,
    # duplicates included: dim 1 has only 17 distinct values), start indices negative and >= n.
    points = integer_points(5, 50, dim, dtype, seed=dim)
    lengths = torch.tensor([50, 0, 17, 1, 33])
    K = torch.tensor([12, 5, 40, 3, 0])
    start = torch.tensor([3, 2, -5, 7, 1])
    idx = fps(*on(device, points, lengths, K), 20, *on(device, start))
    assert torch.equal(idx.cpu(), reference_fps(points, lengths, K, 20, start))
    # Defaults: K = max_K = 50 for every cloud, start 0.
    assert torch.equal(fps(points.to(device)).cpu(), reference_fps(points))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 2, 3, 5])
def test_random_points_follow_the_rule(device, dtype, dim):
    points = random_points(3, 60, dim, dtype, seed=10 + dim)
    lengths = torch.tensor([60, 25, 59])
    start = torch.tensor([0, 24, -1])
    idx = fps(*on(device, points, lengths), None, 30, start.to(device))
    assert_farthest_point_rule(idx, points, lengths, None, 30, start)
    if device == "cuda":  # the same operations in the same order: the same samples
        assert torch.equal(idx.cpu(), fps(points, lengths, None, 30, start))


@pytest.mark.parametrize("device", DEVICES)
def test_start_index_is_taken_modulo_the_cloud_size(device):
    points = random_points(4, 8, 3, torch.float32, seed=2)
    lengths = torch.tensor([5, 5, 5, 8])
    start = torch.tensor([-1, 7, 13, -17])  # -1 % 5 = 4, 7 % 5 = 2, 13 % 5 = 3, -17 % 8 = 7
    idx = fps(*on(device, points, lengths), None, 3, start.to(device))
    assert idx[:, 0].tolist() == [4, 2, 3, 7]
    assert torch.equal(idx.cpu(), reference_fps(points, lengths, None, 3, start))
    int32 = fps(*on(device, points, lengths.int()), None, 3, start.int().to(device))
    assert torch.equal(int32, idx)


@pytest.mark.parametrize("device", DEVICES)
def test_duplicates_are_distinct_samples_until_exhausted(device):
    same = torch.ones(1, 6, 3, device=device)
    assert fps(same, None, None, 8).tolist() == [[0, 1, 2, 3, 4, 5, -1, -1]]
    assert fps(same, None, None, 8, torch.tensor([3], device=device)).tolist() == [[3, 0, 1, 2, 4, 5, -1, -1]]
    # Two places: the far one (its first copy), then the copies (mind 0) in index order.
    a, b = [0.0, 0.0], [5.0, 1.0]
    two = torch.tensor([[a, a, b, b, a]], device=device)
    assert fps(two, None, None, 5).tolist() == [[0, 2, 1, 3, 4]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_finite_points_are_never_taken(device, dtype):
    points = integer_points(4, 12, 3, torch.float32, seed=5)
    points[0, [0, 1, 5]] = torch.tensor([math.nan, math.inf, -math.inf])[:, None]  # start 0: not finite
    points[1, 3, 2] = math.nan
    points[1, 9:, 0] = math.inf  # start 10 -> wraps around to point 0
    points[2] = math.nan  # nothing finite: no samples at all
    points[3, 7, 1] = -math.inf
    points = points.to(dtype)
    lengths = torch.tensor([12, 12, 12, 9])
    start = torch.tensor([0, 10, 4, 7])
    idx = fps(*on(device, points, lengths), None, 12, start.to(device)).cpu()
    assert torch.equal(idx, reference_fps(points, lengths, None, 12, start))
    assert idx[0, 0] == 2 and idx[1, 0] == 0 and (idx[2] == -1).all() and idx[3, 0] == 8
    assert (idx[0] >= 0).sum() == 9 and (idx[1] >= 0).sum() == 8 and (idx[3] >= 0).sum() == 8  # the finite points


@pytest.mark.parametrize("device", DEVICES)
def test_overflowing_distances_are_infinitely_far(device):
    # Finite float32 points whose squared distances overflow to +inf: +inf is a valid (large) mind,
    # and equal ones go to the smaller index. float64 distances do not overflow and rank differently.
    coords = [[-3e38], [3e38], [1e38], [0.0]]
    f32 = torch.tensor([coords], dtype=torch.float32, device=device)
    assert fps(f32, None, None, 4).tolist() == [[0, 1, 2, 3]]
    assert fps(f32.double(), None, None, 4).tolist() == [[0, 1, 3, 2]]


@pytest.mark.parametrize("device", DEVICES)
def test_per_cloud_counts(device):
    points = random_points(4, 10, 2, torch.float32, seed=3)
    K = torch.tensor([0, -3, 4, 25])  # negative counts as 0; 25 is capped at max_K, then at n = 10
    idx = fps(points.to(device), None, K.to(device), 12).cpu()
    assert (idx[:2] == -1).all()
    assert (idx[2, :4] >= 0).all() and (idx[2, 4:] == -1).all()
    assert (idx[3, :10] >= 0).all() and (idx[3, 10:] == -1).all()
    assert torch.equal(idx, reference_fps(points, None, K, 12))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    def call(B, N, max_K, lengths=None, K=None):
        points = torch.rand(B, N, 3, device=device)
        return fps(points, lengths, K, max_K)

    assert call(0, 5, 4).shape == (0, 4)
    assert call(3, 0, 4).tolist() == [[-1] * 4] * 3
    assert call(3, 5, 0).shape == (3, 0)
    assert call(2, 5, 3, lengths=torch.zeros(2, dtype=torch.long, device=device)).tolist() == [[-1] * 3] * 2
    assert call(2, 5, 3, K=torch.zeros(2, dtype=torch.long, device=device)).tolist() == [[-1] * 3] * 2
    assert fps(torch.rand(1, 1, 3, device=device), None, None, 3).tolist() == [[0, -1, -1]]


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_points(device):
    base = random_points(2, 3, 40, torch.float32, seed=4).to(device)
    points = base.transpose(1, 2)  # (2, 40, 3), strided
    assert not points.is_contiguous()
    assert torch.equal(fps(points, None, None, 10), fps(points.contiguous(), None, None, 10))


def test_cpu_large_cloud_split_across_threads():
    # Large enough (>= 32768 points) that each step is split into chunks across threads when there
    # are fewer clouds than threads; 27 distinct positions, so equal distances span chunks and
    # ties must still go to the smallest index; runs past the distinct positions into duplicates.
    points = integer_points(1, 40000, 3, torch.float32, low=-1, high=1, seed=6)
    expected = reference_fps(points, None, None, 64)
    threads = torch.get_num_threads()
    try:
        for n in sorted({1, 2, threads}):
            torch.set_num_threads(n)
            assert torch.equal(fps(points, None, None, 64), expected)
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------- the public wrapper
@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_gathers_points_and_passes_gradients(device):
    points = random_points(2, 30, 3, torch.float64, seed=8).to(device).requires_grad_()
    lengths = torch.tensor([30, 4], device=device)
    selected, idx = pointops.sample_farthest_points(points, lengths, K=[6, 6])
    assert idx.shape == (2, 6) and selected.shape == (2, 6, 3)
    assert torch.equal(idx, fps(points.detach(), lengths, torch.tensor([6, 6], device=device), 6))
    assert (idx[1, 4:] == -1).all()
    gathered = points.detach()[torch.arange(2, device=device)[:, None], idx.clamp(min=0)]
    expected = torch.where((idx >= 0)[..., None], gathered, 0.0)
    assert torch.equal(selected.detach(), expected)
    selected.sum().backward()
    taken = torch.zeros(2, 30, dtype=torch.float64, device=device)
    taken[0, idx[0]] = 1
    taken[1, idx[1, :4]] = 1
    assert torch.equal(points.grad, taken[..., None].expand(2, 30, 3))
    _, idx_int = pointops.sample_farthest_points(points.detach(), K=5)
    assert torch.equal(idx_int, fps(points.detach(), None, None, 5))


@pytest.mark.parametrize("device", DEVICES)
def test_wrapper_random_start_is_reproducible(device):
    points = random_points(3, 20, 3, torch.float32, seed=9).to(device)
    lengths = torch.tensor([20, 7, 1], device=device)

    def run(seed):
        g = torch.Generator(device=device).manual_seed(seed)
        return pointops.sample_farthest_points(points, lengths, K=5, random_start_point=True, generator=g)[1]

    first = run(123)
    assert torch.equal(first, run(123))
    # The start is floor(uniform * n), drawn in float64 from the generator.
    uniform = torch.rand(3, generator=torch.Generator(device=device).manual_seed(123), device=device,
                         dtype=torch.float64)
    start = (uniform * lengths.double()).floor().long()
    assert torch.equal(first, fps(points, lengths, None, 5, start))
    assert ((first[:, 0] >= 0) & (first[:, 0] < lengths)).all()


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("device", DEVICES)
def test_errors(device):
    points = torch.rand(2, 5, 3, device=device)
    with pytest.raises(RuntimeError, match=r"points must be a 3-D tensor \(B, N, D\), got shape \[5, 3\]"):
        fps(points[0])
    with pytest.raises(RuntimeError, match="points must be float16, bfloat16, float32 or float64, got Long"):
        fps(points.long())
    with pytest.raises(RuntimeError, match="the point dimension D must be at least 1"):
        fps(points[..., :0])
    with pytest.raises(RuntimeError, match="max_K must be >= 0, got -1"):
        fps(points, None, None, -1)
    with pytest.raises(RuntimeError, match=r"lengths must have shape \(B,\) = \(2,\)"):
        fps(points, torch.tensor([1, 2, 3], device=device))
    with pytest.raises(RuntimeError, match="lengths must be an int64 \\(or int32\\) tensor, got Float"):
        fps(points, torch.tensor([1.0, 2.0], device=device))
    with pytest.raises(RuntimeError, match=r"lengths must lie in \[0, 5\].*got values in \[-1, 2\]"):
        fps(points, torch.tensor([-1, 2], device=device))
    with pytest.raises(RuntimeError, match=r"K must have shape \(B,\) = \(2,\)"):
        fps(points, None, torch.tensor([3], device=device))
    with pytest.raises(RuntimeError, match="K must be an int64"):
        fps(points, None, torch.tensor([1.0, 2.0], device=device))
    with pytest.raises(RuntimeError, match=r"start_idx must have shape \(B,\) = \(2,\)"):
        fps(points, None, None, 3, torch.zeros(2, 1, dtype=torch.long, device=device))
    # The wrapper's PyTorch3D-style errors.
    with pytest.raises(ValueError, match=r"points must be a 3-D tensor \(B, N, D\)"):
        pointops.sample_farthest_points(points[0])
    with pytest.raises(ValueError, match="K must be >= 0, got -2"):
        pointops.sample_farthest_points(points, K=-2)
    with pytest.raises(ValueError, match="K must hold counts >= 0"):
        pointops.sample_farthest_points(points, K=[3, -1])
    with pytest.raises(ValueError, match="same batch dimension"):
        pointops.sample_farthest_points(points, K=[3, 1, 2])


@requires_cuda
def test_error_different_devices():
    points = torch.rand(2, 5, 3, device="cuda")
    with pytest.raises(RuntimeError, match="lengths must be on the same device as points"):
        fps(points, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="start_idx must be on the same device as points"):
        fps(points, None, None, 3, torch.tensor([1, 2]))


# ---------------------------------------------------------------- CUDA: every kernel path
# The path each size takes on an H100 (227 KB of shared memory per block, 132 SMs, clusters of up
# to 8 blocks). A shared-memory row is 16 bytes for D = 2, 3 in float32 (32 in float64) and
# 4 * ((D + 1) | 1) bytes for other D in float32, so a block holds ~14,500 float32 points of D = 3,
# ~7,200 float64, ~890 of D = 64, ~58 of D = 1000. Of these, 44 per thread (16 in float64, 256
# threads) live in registers and the rest is read from shared memory every step ("smem tier").
# One block takes a cloud that fits it unless a cluster is expected to be faster (clouds of up to
# ~4,500 points stay in one block); a cluster of 2..8 blocks takes up to 8 blocks' worth; beyond,
# the cooperative grid (132 blocks, one cloud after another), whose slices past shared memory stay
# in global memory ("overflow"). GPUs without clusters run the cluster sizes on the grid path.
CUDA_CASES = {
    "block": (3, 4000, 3, torch.float32),
    "block-d5": (2, 4000, 5, torch.float32),           # any-D rows of 7 elements
    "cluster": (2, 40000, 3, torch.float32),
    "cluster-f64-d2": (2, 20000, 2, torch.float64),
    "cluster-f16": (2, 40000, 3, torch.float16),
    "cluster-smem-tier": (1, 100000, 3, torch.float32),  # G = 7 or 8: slices of 12,500+ points
    "cluster-smem-tier-f64": (1, 50000, 3, torch.float64),
    "cluster-d64": (2, 3000, 64, torch.float32),       # G = 4..8
    "grid": (1, 130000, 3, torch.float32),
    "grid-f64": (1, 70000, 3, torch.float64),
    "grid-smem-tier": (1, 1600000, 3, torch.float32),  # slices of 12,122 points (11,264 in registers)
    "grid-d64": (2, 9000, 64, torch.float32),          # two clouds one after the other
    "grid-overflow": (1, 9000, 1000, torch.float32),
}


@requires_cuda
@pytest.mark.parametrize("case", sorted(CUDA_CASES))
def test_cuda_matches_cpu_on_every_path(case):
    B, N, dim, dtype = CUDA_CASES[case]
    points = random_points(B, N, dim, dtype, seed=len(case))
    lengths = torch.tensor([N - 7 * b for b in range(B)])
    start = torch.tensor([-1 - 1000 * b for b in range(B)])
    cpu = fps(points, lengths, None, 64, start)
    gpu = fps(*on("cuda", points, lengths), None, 64, start.cuda())
    assert torch.equal(gpu.cpu(), cpu)
    if N * dim <= 10**6:  # (the float64 check of larger ones takes seconds; equality with the CPU suffices)
        assert_farthest_point_rule(gpu, points, lengths, None, 64, start)
    # Few distinct positions: many equal distances, across blocks too, go to the smallest index.
    grid = integer_points(B, N, dim, dtype, low=-2, high=2, seed=1)
    assert torch.equal(fps(grid.cuda(), None, None, 64).cpu(), fps(grid, None, None, 64))


@requires_cuda
def test_cuda_non_finite_start_across_blocks():
    # The first finite point after the start lies in another block of the group (and wraps around).
    for N in (40000, 130000):
        points = random_points(1, N, 3, torch.float32, seed=N)
        points[0, 10:] = math.nan
        points[0, 3] = math.inf
        start = torch.tensor([N - 2])
        expected = fps(points, None, None, 20, start)
        assert expected[0, 0] == 0 and (expected[0, :9] >= 0).all() and (expected[0, 9:] == -1).all()
        assert torch.equal(fps(points.cuda(), None, None, 20, start.cuda()).cpu(), expected)


@requires_cuda
def test_cuda_repeated_runs_identical_and_non_default_stream():
    points = random_points(4, 30000, 3, torch.float32, seed=12).cuda()
    expected = fps(points, None, None, 128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = fps(points, None, None, 128)
    stream.synchronize()
    assert torch.equal(got, expected)
    assert torch.equal(fps(points, None, None, 128), expected)


@requires_cuda
@pytest.mark.parametrize("N", [4000, 40000, 130000])  # block, cluster (sm_90), cooperative grid
def test_cuda_graph_capture_and_replay(N):
    points = random_points(2, N, 3, torch.float32, seed=13).cuda()
    K = torch.tensor([16, 9], device="cuda")
    start = torch.tensor([5, -3], device="cuda")
    expected = fps(points, None, K, 16, start)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        fps(points, None, K, 16, start)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fps(points, None, K, 16, start)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, expected)
    points.copy_(random_points(2, N, 3, torch.float32, seed=14).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fps(points, None, K, 16, start))


# ---------------------------------------------------------------- torch.library / torch.compile
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    points = random_points(2, 17, 3, torch.float32, seed=15).to(device)
    lengths = torch.tensor([17, 5], device=device)
    K = torch.tensor([4, 6], device=device)
    start = torch.tensor([3, -1], device=device)
    torch.library.opcheck(torch.ops.pointops.sample_farthest_points.default, (points, None, None, 5, None))
    torch.library.opcheck(torch.ops.pointops.sample_farthest_points.default, (points, lengths, K, 6, start))


def test_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    points = random_points(2, 64, 3, torch.float32, seed=16)

    def fn(p):
        selected, idx = pointops.sample_farthest_points(p, K=8)
        return selected.sum(-1), idx

    compiled = torch.compile(fn, fullgraph=True)
    for got, want in zip(compiled(points), fn(points)):
        assert torch.equal(got, want)


# ---------------------------------------------------------------- property test
from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 3), N=st.integers(0, 40), dim=st.integers(1, 6), max_K=st.integers(0, 45),
       seed=st.integers(0, 2**16), ragged=st.booleans(), per_cloud=st.booleans(), start=st.booleans(),
       non_finite=st.booleans())
def test_property_any_shape_matches_oracle(B, N, dim, max_K, seed, ragged, per_cloud, start, non_finite):
    """Any shape on a coarse integer lattice (many duplicates and equal distances, all exact)."""
    g = torch.Generator().manual_seed(seed)
    points = torch.randint(-2, 3, (B, N, dim), generator=g).float()
    if non_finite:
        points[torch.rand(B, N, generator=g) < 0.2] = math.nan
    lengths = torch.randint(0, N + 1, (B,), generator=g) if ragged else None
    K = torch.randint(-1, max_K + 2, (B,), generator=g) if per_cloud else None
    start_idx = torch.randint(-50, 50, (B,), generator=g) if start else None
    expected = reference_fps(points, lengths, K, max_K, start_idx)
    for device in ["cpu"] + (["cuda"] if HAS_CUDA else []):
        assert torch.equal(fps(*on(device, points, lengths, K), max_K, *on(device, start_idx)).cpu(), expected)
