"""Run the peers' own, unchanged test files against pointops: PyTorch3D's tests of knn_points /
knn_gather / ball_query / sample_farthest_points and torch_cluster's tests of knn / radius / fps /
nearest / grid_cluster, with pointops as the implementation. Prints passed / failed / skipped per file and the one-line
reason of every failure; exits non-zero if any test failed or errored.

    python scripts/peer_suites.py [--suite pytorch3d|torch_cluster|all] [--peers DIR] [-k EXPR]
                                  [--keep] [extra pytest args...]

How: each suite is staged in a temporary directory (the peers' test files copied byte for byte)
and run by `python -m pytest -p peer_suites` in a subprocess whose PYTHONPATH is that directory,
then scripts/, then the repository root (so the working tree's pointops is the one tested). This
file is also that pytest plugin: before any test module is imported it puts pointops in place.

- PyTorch3D: their whole Python package is copied in. Its compiled `pytorch3d._C` does not exist;
  a stub module takes its place. The stub implements, with plain torch ops and the semantics of
  PyTorch3D's CPU kernels, only what these tests reach without going through a replaced op:
  `face_areas_normals_forward` and `packed_to_padded` (sample_points_from_meshes, used by
  test_ball_query's test_ball_query_output_simple), plus the constants `MAX_UINT` and `EPS` that
  the pulsar renderer reads at import. Any other `_C.<name>` raises NotImplementedError naming it,
  except `knn_check_version`, which is absent as in a build without CUDA: test_knn_check_version
  then returns early (it passes without checking anything; it probes PyTorch3D's own kernels).
  `knn_points`, `knn_gather`, `ball_query` and `sample_farthest_points` are replaced by pointops'
  in every loaded pytorch3d module that binds them; their oracles (`_knn_points_naive` in the
  test, `sample_farthest_points_naive`, `masked_gather`, `_KNN`, `ico_sphere`, `load_obj`,
  `sample_points_from_meshes`) stay PyTorch3D's. Without CUDA, tests named `*cuda*` are skipped
  and `get_random_cuda_device()` answers "cpu", so the device-agnostic tests that call it
  (test_knn_gather, test_invalid_norm, test_ball_query_output_simple, ...) run on the CPU; with
  CUDA nothing of theirs is changed.
- torch_cluster: a package `torch_cluster` is written whose `__init__` re-exports pointops' knn,
  knn_graph, radius, radius_graph, fps, nearest and grid_cluster; a name pointops lacks becomes a
  function raising NotImplementedError, so the test file still imports and only the tests of that
  name fail. Their `testing.py` is copied in unchanged. Their tests need scipy;
  PyTorch3D's need pillow and iopath (the script says what to pip install).

The header of each pytest run shows where every replaced name now comes from, and after
collection, what each test module actually bound; the end shows which `_C` functions were called.

Peer sources (git-ignored, repository root): `.peers/pytorch3d-full` from facebookresearch/pytorch3d
at 9381c4016376345bb795b97c45a6c2de66db354a (v0.7.9 + 38), `.peers/torch_cluster` from
rusty1s/pytorch_cluster at 3d1d9e3967c77c757a68d8aad37d0171e93018e2 (1.6.3 + 19; __version__ 1.6.3):

    git clone --bare https://github.com/facebookresearch/pytorch3d /tmp/pytorch3d.git
    mkdir -p .peers/pytorch3d-full && git --git-dir=/tmp/pytorch3d.git archive 9381c4016376 \\
        pytorch3d 'tests/*.py' docs/tutorials/data/cow_mesh | tar -x -C .peers/pytorch3d-full
    git clone --bare https://github.com/rusty1s/pytorch_cluster /tmp/pytorch_cluster.git
    mkdir -p .peers/torch_cluster && git --git-dir=/tmp/pytorch_cluster.git archive 3d1d9e3967c7 \\
        csrc torch_cluster test | tar -x -C .peers/torch_cluster
"""
import argparse
import collections
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SUITES = {  # suite -> (folder under --peers, staged layout: source path -> path in the temp dir)
    "pytorch3d": ("pytorch3d-full", {
        "pytorch3d": "pytorch3d",
        "docs/tutorials/data/cow_mesh": "docs/tutorials/data/cow_mesh",  # test_cuda_vs_cpu's cow
        "tests/__init__.py": "tests/__init__.py",  # their tests are a package (relative imports)
        "tests/common_testing.py": "tests/common_testing.py",
        "tests/test_knn.py": "tests/test_knn.py",
        "tests/test_ball_query.py": "tests/test_ball_query.py",
        "tests/test_sample_farthest_points.py": "tests/test_sample_farthest_points.py",
    }),
    "torch_cluster": ("torch_cluster", {
        "torch_cluster/testing.py": "torch_cluster/testing.py",
        "test/test_knn.py": "test/test_knn.py",
        "test/test_radius.py": "test/test_radius.py",
        "test/test_fps.py": "test/test_fps.py",
        "test/test_nearest.py": "test/test_nearest.py",
        "test/test_grid.py": "test/test_grid.py",
    }),
}
# What the peers' files import beyond torch and pytest (module -> pip package).
NEEDS = {"pytorch3d": {"numpy": "numpy", "PIL": "pillow", "iopath": "iopath"},
         "torch_cluster": {"scipy": "scipy"}}
P3D_REPLACED = ("knn_points", "knn_gather", "ball_query", "sample_farthest_points")
TC_NAMES = ("knn", "knn_graph", "radius", "radius_graph", "fps", "nearest", "grid_cluster")
# Names whose provenance is shown per test module: the replaced ones and the oracles kept.
WATCHED = P3D_REPLACED + TC_NAMES + ("sample_farthest_points_naive", "masked_gather", "_KNN",
                                     "sample_points_from_meshes", "ico_sphere", "load_obj")

NOTES = {"test_knn_check_version": "passes without checking: pytorch3d._C.knn_check_version is "
                                   "absent here, as in PyTorch3D builds without CUDA"}

TORCH_CLUSTER_INIT = f'''"""pointops as torch_cluster, for its own tests (scripts/peer_suites.py)."""
import pointops

__version__ = "1.6.3"


def _missing(name):
    def missing(*args, **kwargs):
        raise NotImplementedError(f"pointops has no {{name}} (torch_cluster.{{name}}) yet")
    missing.__name__ = missing.__qualname__ = name
    missing.__module__ = "<not in pointops>"
    return missing


for _name in {TC_NAMES!r}:
    globals()[_name] = getattr(pointops, _name, None) or _missing(_name)
'''


# ----------------------------------------------------------------------------- the pytest plugin
# Imported by the pytest subprocess through `-p peer_suites`; PEER_SUITE says which suite it is.

_C_CALLS = collections.Counter()  # pytorch3d._C functions reached during the run
_REPLACED = {}  # name -> number of pytorch3d modules whose binding was replaced


def _counted(name, fn):
    def wrapper(*args, **kwargs):
        _C_CALLS[name] += 1
        return fn(*args, **kwargs)
    return wrapper


def _face_areas_normals_forward(verts, faces):
    # PyTorch3D's FaceAreasNormalsForwardCpu: area = |(v1 - v0) x (v2 - v0)| / 2 and the unit
    # normal with the norm clamped below at 1e-6.
    v0, v1, v2 = verts[faces].unbind(1)
    cross = (v1 - v0).cross(v2 - v0, dim=1)
    norm = cross.norm(dim=1)
    return norm / 2, cross / norm.clamp(min=1e-6)[:, None]


def _packed_to_padded(inputs, first_idxs, max_size):
    # PyTorch3D's PackedToPaddedCpu: row b of the (B, max_size, D) output takes inputs[first_idxs[b]
    # : first_idxs[b + 1]] (the last element runs to the end), zeros elsewhere.
    B, ends = first_idxs.shape[0], first_idxs.tolist()[1:] + [inputs.shape[0]]
    out = inputs.new_zeros((B, max_size, inputs.shape[1]))
    for b, (start, end) in enumerate(zip(first_idxs.tolist(), ends)):
        out[b, :end - start] = inputs[start:end]
    return out


class _PyTorch3DCStub(types.ModuleType):
    MAX_UINT = 4294967295  # pulsar/constants.h; read at import as default arguments
    EPS = 1e-6
    face_areas_normals_forward = staticmethod(_counted("face_areas_normals_forward",
                                                       _face_areas_normals_forward))
    packed_to_padded = staticmethod(_counted("packed_to_padded", _packed_to_padded))

    def __getattr__(self, name):
        # knn_check_version exists only in PyTorch3D's CUDA builds; its test returns on ImportError.
        if name.startswith("__") or name == "knn_check_version":
            raise AttributeError(name)
        _C_CALLS["NOT PROVIDED: " + name] += 1
        raise NotImplementedError(f"pytorch3d._C.{name}: PyTorch3D's compiled op is neither replaced "
                                  "by pointops nor provided by scripts/peer_suites.py's stub")


def _install_pytorch3d():
    import pointops
    import pytorch3d
    import torch
    stub = _PyTorch3DCStub("pytorch3d._C", "stub for PyTorch3D's compiled extension")
    sys.modules["pytorch3d._C"] = pytorch3d._C = stub
    import pytorch3d.ops  # noqa: F401  (loads knn, ball_query, sample_farthest_points and their users)
    home = {"knn_points": "knn", "knn_gather": "knn", "ball_query": "ball_query",
            "sample_farthest_points": "sample_farthest_points"}  # their defining modules
    originals = {name: vars(sys.modules["pytorch3d.ops." + home[name]])[name] for name in P3D_REPLACED}
    # Every loaded module that bound an original (pytorch3d.ops re-exports, loss.chamfer, ...).
    # vars(), not getattr: a lookup must not reach the stub's __getattr__.
    for mod in [m for n, m in sys.modules.items() if n.startswith("pytorch3d") and m is not stub]:
        for name, orig in originals.items():
            if vars(mod).get(name) is orig:
                setattr(mod, name, getattr(pointops, name))
                _REPLACED[name] = _REPLACED.get(name, 0) + 1
    if not torch.cuda.is_available():
        import tests.common_testing
        tests.common_testing.get_random_cuda_device = lambda: "cpu"


def _origin(obj):
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def pytest_configure(config):
    if os.environ.get("PEER_SUITE") == "pytorch3d":
        _install_pytorch3d()


def pytest_report_header(config):
    import pointops
    import torch
    cuda = "available" if torch.cuda.is_available() else "not available"
    lines = [f"peer suite {os.environ.get('PEER_SUITE')}: pointops from "
             f"{Path(pointops.__file__).parent}, CUDA {cuda}"]
    if os.environ.get("PEER_SUITE") == "pytorch3d":
        import pytorch3d.ops as ops
        import tests
        lines.append(f"pytorch3d from {Path(sys.modules['pytorch3d'].__file__).parent}, tests from "
                     f"{Path(tests.__file__).parent}, pytorch3d._C is "
                     f"{type(sys.modules['pytorch3d._C']).__name__}")
        for name in P3D_REPLACED:
            lines.append(f"  pytorch3d.ops.{name} -> {_origin(getattr(ops, name))} "
                         f"(replaced in {_REPLACED.get(name, 0)} pytorch3d modules)")
    else:
        import torch_cluster
        lines.append(f"torch_cluster from {Path(torch_cluster.__file__).parent}")
        lines += [f"  torch_cluster.{n} -> {_origin(getattr(torch_cluster, n))}" for n in TC_NAMES]
    return lines


def pytest_collection_modifyitems(config, items):
    import pytest
    import torch
    if os.environ.get("PEER_SUITE") == "pytorch3d" and not torch.cuda.is_available():
        for item in items:
            if "cuda" in item.name:
                item.add_marker(pytest.mark.skip(reason="needs CUDA"))


def pytest_collection_finish(session):
    # What the test modules really bound: proof that the substitution preceded their imports.
    write = session.config.pluginmanager.get_plugin("terminalreporter").write_line
    for mod in {item.module for item in session.items if getattr(item, "module", None)}:
        bound = [f"{n} <- {_origin(mod.__dict__[n])}" for n in WATCHED if n in mod.__dict__]
        write(f"{mod.__name__}: " + ", ".join(bound))


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("PEER_SUITE") == "pytorch3d":
        calls = ", ".join(f"{n} x{c}" for n, c in sorted(_C_CALLS.items())) or "none"
        terminalreporter.write_line(f"pytorch3d._C calls: {calls}")


# ----------------------------------------------------------------------------- the runner

def stage(suite, peers, tmp):
    folder, layout = SUITES[suite]
    src = peers / folder
    missing = [p for p in layout if not (src / p).exists()]
    if missing:
        sys.exit(f"{src}: missing {', '.join(missing)}.\n" + __doc__[__doc__.index("Peer sources"):])
    absent = [pkg for mod, pkg in NEEDS[suite].items() if importlib.util.find_spec(mod) is None]
    if absent:
        sys.exit(f"{suite}'s tests need: pip install {' '.join(absent)}")
    for rel, dest in layout.items():
        (tmp / dest).parent.mkdir(parents=True, exist_ok=True)
        if (src / rel).is_dir():
            shutil.copytree(src / rel, tmp / dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copyfile(src / rel, tmp / dest)
    if suite == "torch_cluster":
        (tmp / "torch_cluster/__init__.py").write_text(TORCH_CLUSTER_INIT)
    # Our own ini pins the rootdir here, away from the repository's pytest settings.
    (tmp / "pytest.ini").write_text("[pytest]\njunit_family = xunit1\n")
    return [d for d in layout.values() if Path(d).name.startswith("test_")]


def reason(elem, files):
    # The exception line: the message attribute, or for collection errors the first "E " line;
    # a line ending in ":" (TorchScript's errors) gets the next one, which says where. Then the
    # last line of the peer's test file in the traceback ("True is not false" says little alone).
    msg = [ln.strip() for ln in (elem.get("message") or "").splitlines() if ln.strip()]
    if not msg or msg[0] == "collection failure":
        msg = [ln[1:].strip() for ln in (elem.text or "").splitlines() if ln.startswith("E ")]
    text = " ".join(msg[:2]) if len(msg) > 1 and msg[0].endswith(":") else (msg or ["?"])[0]
    text = text if len(text) <= 240 else text[:237] + "..."
    frames = [f for f in re.findall(r"^(\S+\.py):(\d+): in \S+\n\s+(.+)$", elem.text or "", re.M)
              if f[0] in files]
    return text + (f"  [at {frames[-1][0]}:{frames[-1][1]}: {frames[-1][2].strip()}]" if frames else "")


def run_suite(suite, peers, tmp, extra):
    files = stage(suite, peers, tmp)
    env = dict(os.environ, PEER_SUITE=suite, PYTHONPATH=os.pathsep.join(
        [str(tmp), str(REPO / "scripts"), str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    junit = tmp / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", "-p", "peer_suites", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "--tb=short", "-rfE",
           "--continue-on-collection-errors", *files, *extra]
    print(f"\n===== {suite}: {' '.join(cmd[1:])}  (in {tmp})", flush=True)
    rc = subprocess.call(cmd, cwd=tmp, env=env)
    per_file = {f: collections.Counter() for f in files}
    problems = {f: [] for f in files}
    if junit.exists():
        for tc in ET.parse(junit).iter("testcase"):
            f = tc.get("file") or tc.get("classname", "").replace(".", "/") + ".py"
            per_file.setdefault(f, collections.Counter())
            problems.setdefault(f, [])
            kind = next((c.tag for c in tc if c.tag in ("failure", "error", "skipped")), "passed")
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(kind, kind)
            per_file[f][kind] += 1
            why = NOTES.get(tc.get("name"), "")
            if kind in ("failed", "error", "skipped"):
                why = reason(next(c for c in tc if c.tag in ("failure", "error", "skipped")), files)
            if why:
                problems[f].append((kind, tc.get("name"), why))
    return rc, per_file, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", choices=["pytorch3d", "torch_cluster", "all"], default="all")
    ap.add_argument("--peers", type=Path, default=REPO / ".peers")
    ap.add_argument("-k", help="pytest -k expression, passed through")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args, extra = ap.parse_known_args()
    extra = (["-k", args.k] if args.k else []) + extra
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    results, bad = {}, False
    for suite in suites:
        tmp = Path(tempfile.mkdtemp(prefix=f"peer_{suite}_"))
        try:
            rc, per_file, problems = run_suite(suite, args.peers.resolve(), tmp, extra)
        finally:
            if args.keep:
                print(f"kept {tmp}")
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        results[suite] = rc, per_file, problems
        # rc 5: nothing selected (-k); anything but 0, 1, 5 means pytest itself did not finish.
        bad |= rc not in (0, 1, 5) or any(c["failed"] + c["error"] for c in per_file.values())

    print("\n===== summary (pointops as the implementation)")
    for suite, (rc, per_file, problems) in results.items():
        print(f"{suite}: pytest exit {rc}")
        for f, c in per_file.items():
            print(f"  {f}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, "
                  f"{c['skipped']} skipped")
            # One line per test function, outcome and reason, with its parametrizations listed.
            groups = collections.defaultdict(list)
            for kind, name, why in problems[f]:
                base, _, params = name.partition("[")
                groups[kind, base, why].append(params.rstrip("]"))
            for (kind, base, why), params in groups.items():
                tag = " [harness stub]" if "peer_suites.py's stub" in why else ""
                params = f" [{', '.join(params)}]" if any(params) else ""
                print(f"    {kind.upper()}{tag} {base}{params}: {why}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
