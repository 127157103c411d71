"""Command line: ``python -m pointops demo`` (the main job) and ``python -m pointops info``."""
import argparse
import pathlib

import torch

import pointops


def describe_build(info: dict) -> str:
    """``pointops.build_info()`` as lines for a person (and a bug report)."""
    if info["cuda"]:
        archs = " ".join(f"{a} (PTX)" if a.startswith("compute_") else a for a in info["cuda_archs"])
        kind = f"CUDA {info['cuda_version']}, GPU code for {archs or 'unknown archs'}"
    else:
        kind = "CPU-only (no CUDA kernels)"
    gpu = (f"{torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})"
           if torch.cuda.is_available() else "none")
    return "\n".join([
        f"pointops {info['version']}",
        f"build:          {kind}",
        f"built against:  torch {info['torch_version']}",
        f"running:        torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), GPU: {gpu}",
        f"loaded:         {info['loaded']} from {info['path']}",
    ])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pointops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="fit a cloud by Chamfer descent, time a large exact Chamfer (spatial grid "
                          "against brute force), voxelize a generated LiDAR scan, and evaluate Gaussian "
                          "particle sums on three planes (timed against torch)")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    demo.add_argument("--steps", type=int, default=200, help="Adam steps of the Chamfer fit")
    demo.add_argument("--points", type=int, default=8192, help="points per cloud in the Chamfer fit")
    demo.add_argument("--out", default="pointops_demo", help="folder for the pictures (with matplotlib)")
    sub.add_parser("info", help="print how the extension was built")
    args = parser.parse_args(argv)

    info = pointops.build_info()
    if args.command == "info":
        print(describe_build(info))
        return
    if args.device is None:
        args.device = "cuda" if info["cuda"] and torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"pointops {info['version']} ({'CUDA' if info['cuda'] else 'CPU'} build, loaded {info['loaded']}) "
          f"on {name}; torch {torch.__version__}")
    from .demo import run_demo

    run_demo(device, pathlib.Path(args.out), steps=args.steps, points=args.points)


if __name__ == "__main__":
    main()
