"""Run every benchmark and write benchmarks/RESULTS.md.

    python benchmarks/run.py            # all families, the sizes named in the issues
    python benchmarks/run.py --quick    # small sizes (a smoke run, e.g. on the CPU)
    python benchmarks/run.py --only chamfer

Each family module exposes run(quick) -> markdown section (it checks correctness before timing).
"""
import argparse
import datetime
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import environment_line  # noqa: E402

FAMILIES = ["bench_chamfer", "bench_voxelize", "bench_particle_sum", "bench_strided", "bench_neighbors", "bench_grid",
            "bench_overhead", "bench_transforms"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=None, help="substring of a family name")
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "RESULTS.md"))
    args = parser.parse_args()
    sections = []
    for name in FAMILIES:
        if args.only and args.only not in name:
            continue
        module = importlib.import_module(name)
        sections.append(module.run(quick=args.quick))
        print(sections[-1], flush=True)
    text = "# pointops benchmark results\n\n"
    text += f"{environment_line()}  \nrecorded {datetime.date.today()} with `python benchmarks/run.py"
    text += (" --quick" if args.quick else "") + "`\n\n" + "\n\n".join(sections) + "\n"
    Path(args.output).write_text(text)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
