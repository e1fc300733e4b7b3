"""Where the host's time goes in an eager training step: the CPU-side profile of a few steps per variant.

Builds the model (``bench_network.build``), runs its training step (bf16 autocast, fused AdamW) a few times,
then profiles ``--steps`` steps with the CPU activity only and prints, per variant, the host time per step
and the ops and autograd nodes with the most self CPU time. Compare with ``bench_network.py``'s host ms.

Usage:
  python benchmarks/dev/profile_host_step.py --model vit --scale B [--variants plain,flash --steps 3 --top 25]
      [--python]   (then also cProfile's Python functions with the most own time per variant)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent  # benchmarks/
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
import bench_network as bn  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="vit", choices=sorted(bn.MODELS))
    ap.add_argument("--scale", default="B", choices=list(bn.SCALES))
    ap.add_argument("--variants", default="plain,flash")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--python", action="store_true", help="also cProfile the steps (Python functions)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_host_step.py needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    net_args = argparse.Namespace(dry_run=False, num_classes=1000, img=224)
    for variant in args.variants.split(","):
        torch.manual_seed(0)
        model = bn.build(args.model, args.scale, variant, net_args, dev)
        x = torch.randn(args.batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (args.batch,), device=dev)
        step = bn.training_step(model, x, y, dev)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        host = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        print(f"\n== {args.model}-{args.scale} {variant}: host ms per step (under the profiler) {host}")
        averages = prof.key_averages()
        table = averages.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=70)
        print(table)
        if args.python:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(args.top)
        model = step = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
