"""Command line: ``python -m pointops demo`` (the main job) and ``python -m pointops info``."""
import argparse
import pathlib

import torch

import pointops


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pointops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="fit a cloud by Chamfer descent, voxelize a generated LiDAR scan, and "
                          "evaluate Gaussian particle sums on three planes (timed against torch)")
    demo.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    demo.add_argument("--steps", type=int, default=200, help="Adam steps of the Chamfer fit")
    demo.add_argument("--points", type=int, default=8192, help="points per cloud in the Chamfer fit")
    demo.add_argument("--out", default="pointops_demo", help="folder for the pictures (with matplotlib)")
    sub.add_parser("info", help="print how the extension was built")
    args = parser.parse_args(argv)

    info = pointops.build_info()
    if args.command == "info":
        print(info)
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
