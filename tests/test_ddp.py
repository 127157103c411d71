"""examples/ddp_chamfer.py under torch.distributed (gloo, CPU): two processes, each training on half
of the global batch with DistributedDataParallel, end with the parameters of one plain process
training on the whole batch."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import pointops

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ddp_chamfer.py"
TIMEOUT_S = 180
# float64 so that the comparison can be tight (see test_two_processes_match_one_process).
TRAINING = ["--backend", "gloo", "--device", "cpu", "--dtype", "float64", "--steps", "8", "--batch", "8",
            "--points", "256", "--hidden", "64", "--batches", "2", "--seed", "3", "--lr", "0.05", "--log-every", "1"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc, *args):
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(EXAMPLE), *args]


def proc_stat(stat):
    """The fields of a /proc/<pid>/stat file after the command name: [state, ppid, ...]; None once the
    process is gone (the name, in parentheses, may itself hold spaces or parentheses)."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid):
    """Every process below pid, from /proc (Linux; elsewhere none are found)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = proc_stat(stat)
        if fields is not None:  # else exited meanwhile
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def run(cmd, timeout_s=TIMEOUT_S):
    """(returncode, stdout, stderr) of cmd, killed (with every process it started) after timeout_s."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    # The processes import the same pointops as this test process.
    package_root = str(Path(pointops.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # torchrun starts each worker in a session of its own, so killing the session started above
        # misses them; a worker left alive holds the output pipes, and communicate() would wait for ever.
        for pid in descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", "(no output: a process outside this tree still holds the pipes)"
        raise AssertionError(f"timed out after {timeout_s} s: {' '.join(cmd)}\n{report(stdout, stderr)}") from None
    return proc.returncode, stdout, stderr


def report(stdout, stderr):
    return f"--- stdout (end):\n{stdout[-4000:]}\n--- stderr (end):\n{stderr[-6000:]}"


def run_ok(cmd):
    returncode, stdout, stderr = run(cmd)
    assert returncode == 0, f"{' '.join(cmd)} exited with {returncode}\n{report(stdout, stderr)}"
    return stdout


def logged_losses(stdout):
    """{step: global-batch loss} from rank 0's "step N loss L" lines."""
    return {int(step): float(loss) for step, loss in re.findall(r"^step\s+(\d+) loss (\S+)$", stdout, re.M)}


def test_two_processes_match_one_process_on_the_whole_batch(tmp_path):
    ddp_out = run_ok(torchrun(2, *TRAINING, "--save", str(tmp_path / "ddp.pt"), "--time", "--warmup", "2"))
    single_out = run_ok([sys.executable, str(EXAMPLE), *TRAINING, "--save", str(tmp_path / "single.pt")])

    assert "world size 2 (gloo)" in ddp_out and "global batch 8 (4 per rank)" in ddp_out, ddp_out
    assert "world size 1 (no process group)" in single_out, single_out
    assert re.search(r"^step time: median \d+\.\d+ ms over 6 steps", ddp_out, re.M), ddp_out

    ddp_losses, single_losses = logged_losses(ddp_out), logged_losses(single_out)
    assert sorted(ddp_losses) == sorted(single_losses) == list(range(8)), (ddp_out, single_out)
    # Training did something: the loss on the same global batch (steps 0, 2, 4, 6 see batch 0) fell.
    assert single_losses[6] < 0.8 * single_losses[0], single_losses
    for step, loss in single_losses.items():
        assert abs(ddp_losses[step] - loss) <= 1e-12 * loss, (step, ddp_losses, single_losses)

    ddp_params = torch.load(tmp_path / "ddp.pt")
    single_params = torch.load(tmp_path / "single.pt")
    assert ddp_params.keys() == single_params.keys()
    # Tolerance from the numerics. The two runs differ only in summation order: DDP sums two
    # half-batch gradients (each already divided by 2) where one process reduces the whole batch
    # in one pass, and the matrix products see batches of 4 instead of 8. Each gradient entry is a
    # float64 sum of at most ~10^3 terms, so it differs by <= ~10^3 * 2^-53 ~ 1e-13 relative. SGD
    # with momentum 0.9 turns a gradient error e into at most lr * e / (1 - 0.9) per step, and over
    # 8 steps (too few for the loss surface to amplify it) the parameters differ by
    # <= 8 * 0.05 * 10 * 1e-13 * |g| ~ 4e-13 for gradients |g| <~ 1 (measured: ~6e-17, two ulps of
    # the parameters). We allow 1e-12. A real error (a sum-reduced loss, a wrong or overlapping
    # shard, ranks not averaged) moves the parameters by ~lr * |g| ~ 1e-3 after one step.
    for name, single in single_params.items():
        assert single.dtype == torch.float64
        diff = (ddp_params[name] - single).abs().max().item()
        assert diff <= 1e-12, f"{name}: 2 processes and 1 process differ by {diff:.3e}"


def test_failed_process_is_reported():
    # A global batch that does not split evenly is refused by every rank (unequal shards would not
    # average to the whole batch's gradient); torchrun must then fail and pass the reason on.
    returncode, stdout, stderr = run(torchrun(2, *TRAINING, "--batch", "3"))  # the last --batch wins
    assert returncode != 0, f"torchrun succeeded with --batch 3 on 2 processes\n{report(stdout, stderr)}"
    assert "--batch 3 must be a positive multiple of the world size 2" in stderr, report(stdout, stderr)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_a_run_past_its_time_is_killed_with_every_process_it_started():
    # The timeout path itself (a hang here hung the whole suite): a child in a session of its own, as
    # torchrun's workers are, holding the output pipes; run() must kill it and fail within seconds.
    child = "import time; time.sleep(120)"
    parent = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', {child!r}], start_new_session=True); "
              "print(p.pid, flush=True); time.sleep(120)")
    with pytest.raises(AssertionError, match="timed out after 3 s") as failure:
        run([sys.executable, "-c", parent], timeout_s=3)
    child_pid = int(re.search(r"stdout \(end\):\n(\d+)", str(failure.value)).group(1))
    for _ in range(50):  # SIGKILL is asynchronous: wait until the process is gone (or a zombie)
        fields = proc_stat(Path(f"/proc/{child_pid}/stat"))
        if fields is None or fields[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {child_pid} still runs after run() returned")
