"""Training throughput on one GPU and under DDP on several: EQ-ViT flash against the plain ViT.

Each run is ``examples/train.py`` (bf16 autocast, fused AdamW, synthetic data made on the GPU, eager)
under ``torchrun --standalone --nproc_per_node N``, with the same per-GPU batch for every N, so that the
ideal N-GPU throughput is N times the one-GPU figure. The figure is the images of all processes per
second over the steps after the warm-up (``throughput`` line of the example). Runs go one at a time, each
in processes of its own. Prints a table (images/s; scaling = N-GPU / one-GPU throughput of the same
model; flash / plain at the same N) and writes ``benchmarks/results/scaling.json``.

Usage:
  python benchmarks/bench_scaling.py [--scales B,L] [--gpus 1,2] [--batch 128] [--steps 100] [--warmup 30]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import environment, save_json  # noqa: E402

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train.py"


def throughput(scale: str, variant: str, gpus: int, args) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    cmd += [str(TRAIN), "--dist", "ddp" if gpus > 1 else "none", "--scale", scale, "--variant", variant]
    cmd += ["--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--log-every", str(args.steps)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = re.findall(r"^throughput ([0-9.]+) images/s", res.stdout, re.M)
    if res.returncode != 0 or not found:
        raise RuntimeError(
            f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
        )
    return float(found[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="B,L")
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--variants", default="flash,plain")
    ap.add_argument("--batch", type=int, default=128, help="images per GPU and step")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--out", default="scaling.json")
    args = ap.parse_args()
    gpus = [int(n) for n in args.gpus.split(",")]
    if torch.cuda.device_count() < max(gpus):
        print(f"needs {max(gpus)} GPUs, found {torch.cuda.device_count()}")
        return 2
    rows = []
    for scale in args.scales.split(","):
        for variant in args.variants.split(","):
            for n in gpus:
                rate = throughput(scale, variant, n, args)
                rows.append({"scale": scale, "variant": variant, "gpus": n, "images_per_s": rate})
                print(f"vit-{scale} {variant} {n} GPU: {rate:.1f} images/s", flush=True)
    by_run = {(r["scale"], r["variant"], r["gpus"]): r["images_per_s"] for r in rows}
    print("\n| model | GPUs | variant | images/s | scaling | flash / plain |\n|---|---|---|---|---|---|")
    for r in rows:
        scaling = r["images_per_s"] / by_run[(r["scale"], r["variant"], gpus[0])]
        plain = by_run.get((r["scale"], "plain", r["gpus"]))
        vs = f"{r['images_per_s'] / plain:.2f}x" if plain and r["variant"] != "plain" else ""
        cells = [
            f"vit-{r['scale']}",
            r["gpus"],
            r["variant"],
            f"{r['images_per_s']:.1f}",
            f"{scaling:.2f}x",
            vs,
        ]
        print("| " + " | ".join(map(str, cells)) + " |")
    settings = {k: getattr(args, k) for k in ("batch", "steps", "warmup")}
    path = save_json(args.out, {"env": environment(), "settings": settings, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
