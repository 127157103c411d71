"""Data-parallel training with torch.distributed and a pointops Chamfer loss.

A small generator (an MLP from a per-sample shape code to a (P, 3) point set) learns to draw
spheres and tori: its loss is ``pointops.chamfer_distance`` between the generated cloud and a
target cloud sampled on the shape the code describes. The model is wrapped in
``torch.nn.parallel.DistributedDataParallel`` (DDP); torch.distributed does all the communication
(NCCL on GPUs, gloo on CPUs). pointops needs nothing special for it: its ops run on the tensors'
own device and their backward produces ordinary gradients for DDP to average.

Launch (torchrun sets RANK, LOCAL_RANK and WORLD_SIZE for every process):

    torchrun --nproc_per_node=2 examples/ddp_chamfer.py                    # 2 GPUs, NCCL
    torchrun --nproc_per_node=2 examples/ddp_chamfer.py --backend gloo --device cpu   # CPU, gloo
    python examples/ddp_chamfer.py                                         # 1 process, no DDP
    torchrun --nproc_per_node=2 examples/ddp_chamfer.py --time --steps 200 --batch 64 --points 4096

Without torchrun's environment the script runs as one plain process: no process group and no DDP
wrapper (a process group of one would only add a no-op allreduce). Under
``torchrun --nproc_per_node=1`` it does use DDP with one rank, which is what to time as "1 GPU".

The global batch (``--batch``) is the same whatever the number of processes: rank r trains on its
contiguous slice ``[r * b, (r + 1) * b)`` with b = batch / world size, so N processes compute the
same updates as one process on the whole batch, up to float rounding (tests/test_ddp.py checks
this). ``--save PATH`` writes rank 0's final state_dict; ``--time`` prints the median step time
after ``--warmup`` steps (CUDA events on GPUs, perf_counter on CPUs), slowest rank.
"""
import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import pointops

CODE_DIM = 6  # is_torus, centre (3), radius (sphere) or major radius (torus), minor radius (0 for spheres)


def parse_args(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl" if cuda else "gloo",
                   help="torch.distributed backend (default: nccl when CUDA is available, else gloo)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if cuda else "cpu",
                   help="cuda: each process uses GPU LOCAL_RANK")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--batch", type=int, default=32, help="global batch size (split evenly across processes)")
    p.add_argument("--points", type=int, default=1024, help="points per generated and per target cloud")
    p.add_argument("--hidden", type=int, default=256, help="width of the generator's hidden layers")
    p.add_argument("--batches", type=int, default=4, help="distinct global batches in the data set (cycled)")
    p.add_argument("--seed", type=int, default=0, help="seeds the data set and the initial parameters")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="parameters and data")
    p.add_argument("--log-every", type=int, default=20, help="print the loss every this many steps")
    p.add_argument("--save", metavar="PATH", help="rank 0 writes the final state_dict here (torch.save)")
    p.add_argument("--time", action="store_true", help="print the median step time after --warmup steps")
    p.add_argument("--warmup", type=int, default=10, help="steps left out of --time")
    p.add_argument("--algorithm", choices=["auto", "brute", "grid"], default="auto",
                   help="chamfer_distance's nearest-neighbour search (default: auto)")
    args = p.parse_args(argv)
    for name in ("steps", "points", "hidden", "batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.backend == "nccl" and args.device != "cuda":
        p.error("--backend nccl needs --device cuda (use --backend gloo on CPUs)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA GPU (use --device cpu --backend gloo)")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.batch < world_size or args.batch % world_size:
        # Unequal shards would weight the samples of small shards more (see shard_loss_note below).
        p.error(f"--batch {args.batch} must be a positive multiple of the world size {world_size}")
    if args.time and args.steps <= args.warmup:
        p.error(f"--time needs --steps ({args.steps}) > --warmup ({args.warmup})")
    return args


# ---------------------------------------------------------------- data
def make_shapes(count, points, generator, dtype):
    """``count`` random shapes (half spheres, half tori on average): their codes (count, CODE_DIM)
    and P points sampled on each surface (count, P, 3). A pure function of the generator's state,
    computed on the CPU, so every process and every world size sees the same data."""
    g = dict(generator=generator, dtype=torch.float64)
    is_torus = torch.rand(count, **g) < 0.5
    centre = (torch.rand(count, 3, **g) - 0.5) * 1.0
    sphere_radius = 0.3 + 0.5 * torch.rand(count, **g)
    major = 0.4 + 0.3 * torch.rand(count, **g)
    minor = 0.1 + 0.15 * torch.rand(count, **g)

    direction = torch.randn(count, points, 3, **g)
    sphere = sphere_radius[:, None, None] * direction / direction.norm(dim=2, keepdim=True)
    u, v = (2 * math.pi * torch.rand(count, points, **g) for _ in range(2))
    ring = major[:, None] + minor[:, None] * torch.cos(v)
    torus = torch.stack([ring * torch.cos(u), ring * torch.sin(u), minor[:, None] * torch.sin(v)], dim=2)
    clouds = centre[:, None, :] + torch.where(is_torus[:, None, None], torus, sphere)

    codes = torch.cat([is_torus[:, None].to(torch.float64), centre,
                       torch.where(is_torus, major, sphere_radius)[:, None],
                       torch.where(is_torus, minor, torch.zeros_like(minor))[:, None]], dim=1)
    return codes.to(dtype), clouds.to(dtype)


def rank_batches(args, rank, world_size, dtype, device):
    """[(codes, clouds)] for each of the ``--batches`` global batches: this rank's contiguous slice,
    moved to the device once (the training loop then does no data work)."""
    codes, clouds = make_shapes(args.batches * args.batch, args.points,
                                torch.Generator().manual_seed(args.seed), dtype)
    per_rank = args.batch // world_size
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    return [(codes[k * args.batch:(k + 1) * args.batch][lo:hi].to(device),
             clouds[k * args.batch:(k + 1) * args.batch][lo:hi].to(device)) for k in range(args.batches)]


# ---------------------------------------------------------------- model
class PointSetGenerator(nn.Module):
    """MLP: shape code (B, CODE_DIM) -> point set (B, P, 3). No batch-dependent layers (BatchNorm
    would use per-rank statistics and break the equivalence with one process)."""

    def __init__(self, points, hidden):
        super().__init__()
        self.points = points
        self.net = nn.Sequential(nn.Linear(CODE_DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 3 * points))

    def forward(self, codes):
        return self.net(codes).view(codes.shape[0], self.points, 3)


# ---------------------------------------------------------------- distributed set-up
def init_distributed(args):
    """(rank, world_size, device, distributed). Plain ``python`` (no torchrun environment): one
    process, no process group."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu"), False
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} CUDA GPUs are visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)  # NCCL and every allocation of this process on its own GPU
    else:
        device = torch.device("cpu")
    if args.backend == "nccl":
        # NVLink multicast (NVLS) must stay off on our GPU host; the user's setting wins.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device, True


def global_mean(value, distributed):
    """The mean over ranks of a per-rank scalar tensor: the loss on the whole global batch (equal
    shards). One collective and one host sync: for logging only."""
    value = value.detach().clone()
    if distributed:
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


def slowest_rank(seconds, device, distributed):
    if not distributed:
        return seconds
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads per process)"


# ---------------------------------------------------------------- training
def train(args):
    """Trains as the arguments say; returns the model (DDP-wrapped under torchrun) and whether a
    process group was used. The caller keeps the model until the process leaves (see __main__)."""
    rank, world_size, device, distributed = init_distributed(args)
    try:
        dtype = getattr(torch, args.dtype)
        batches = rank_batches(args, rank, world_size, dtype, device)
        # Same seed on every rank, initialised on the CPU: identical parameters whatever the device
        # and world size (DDP also broadcasts rank 0's parameters when it wraps the model).
        torch.manual_seed(args.seed)
        model = PointSetGenerator(args.points, args.hidden).to(dtype).to(device)
        if distributed:
            model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        # SGD: the update is linear in the gradient, so the float rounding by which DDP's averaged
        # gradient differs from one process's gradient stays rounding-sized in the parameters
        # (Adam divides by sqrt(v) and would magnify it for near-zero gradient entries).
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        if rank == 0:
            params = sum(p.numel() for p in model.parameters())
            print(f"world size {world_size} ({args.backend if distributed else 'no process group'}), "
                  f"{device_name(device)}, global batch {args.batch} ({args.batch // world_size} per rank), "
                  f"{args.points} points, {params} parameters, {args.dtype}", flush=True)

        use_events = args.time and device.type == "cuda"
        step_seconds, events = [], []
        for step in range(args.steps):
            codes, targets = batches[step % len(batches)]
            if use_events:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t0 = time.perf_counter()

            # shard_loss_note: DDP averages the ranks' gradients, (1/W) sum_r grad L_r. With L_r the
            # *mean* over rank r's b = B/W samples, that is (1/W) sum_r (1/b) sum_{i in r} grad l_i
            # = (1/B) sum_i grad l_i: exactly the gradient of the mean loss over the global batch.
            # A sum-reduced loss would come out W times too small, and unequal shards would weight
            # the samples of the smaller shards more.
            loss, _ = pointops.chamfer_distance(model(codes), targets, batch_reduction="mean",
                                                point_reduction="mean", algorithm=args.algorithm)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP's allreduce of the gradients overlaps with this backward
            optimizer.step()

            if use_events:
                end.record()
                events.append((start, end))
            elif args.time:
                step_seconds.append(time.perf_counter() - t0)  # CPU ops and gloo's allreduce are synchronous
            if step == 0 or step == args.steps - 1 or (args.log_every > 0 and step % args.log_every == 0):
                mean_loss = global_mean(loss, distributed)  # the loss before this step's update
                if rank == 0:
                    print(f"step {step:5d} loss {mean_loss:.12e}", flush=True)

        if args.time:
            if use_events:
                torch.cuda.synchronize(device)
                step_seconds = [s.elapsed_time(e) / 1e3 for s, e in events]
            timed = step_seconds[args.warmup:]
            median = slowest_rank(statistics.median(timed), device, distributed)
            if rank == 0:
                print(f"step time: median {median * 1e3:.3f} ms over {len(timed)} steps after {args.warmup} "
                      f"warm-up (slowest rank), {args.batch / median:.1f} samples/s; world size {world_size}, "
                      f"global batch {args.batch}, {args.points} points, {args.dtype}, algorithm {args.algorithm}, "
                      f"{device_name(device)}"
                      f"{f' ({args.backend})' if distributed else ''}", flush=True)

        if args.save and rank == 0:
            module = model.module if distributed else model
            torch.save({k: v.detach().cpu() for k, v in module.state_dict().items()}, args.save)
    finally:
        if distributed:
            dist.destroy_process_group()
    return model, distributed


if __name__ == "__main__":
    # Under torchrun the model is held here until the process leaves, and the process leaves without
    # the interpreter's teardown (one process without a group exits normally). Under DDP the model's
    # Reducer holds the last reference to the process group (destroy_process_group shuts it down and
    # unregisters it, but gloo's threads live on), so freeing the model destroys the group, and
    # gloo's destructor joins its worker threads while Python holds the GIL. A worker still dropping
    # its reference to the last tensor it reduced (here: the logged loss or the step time) needs the
    # GIL for that, so both wait for ever: 8 of 40 runs on 2 CPU cores hung there when train()
    # returned (gdb: ~ProcessGroupGloo in thread::join, the worker in take_gil from
    # ~AsyncAllreduceWork; pytorch/pytorch#56297). At interpreter teardown the same worker aborts
    # the process instead ("terminate called without an active exception": pytorch/pytorch#179291).
    # Everything is written and the group is unregistered by now.
    model, distributed = train(parse_args())
    if distributed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
