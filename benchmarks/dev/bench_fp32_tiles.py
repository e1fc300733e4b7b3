"""Exact-FP32 tile configurations of the tiled forward kernel against each other and F.linear.

For M = 32768 rows and C = D = 4c: forward latency of F.linear and of our op with each tile forced
(FLASH_EQLINEAR_DEBUG=fp32_tile=big|small|small4, the narrow kernel off) and with the default rule. CUDA
graphs over rotated inputs, as bench_op.py. This is what sets kSmallMaxC in eq_linear_fwd_fp32.cu.

Usage: python benchmarks/dev/bench_fp32_tiles.py [--cs 64,128,256,512,1024] [--out NAME.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent  # benchmarks/
sys.path.insert(0, str(ROOT.parent))  # the package from the repository root
sys.path.insert(0, str(ROOT))  # common.py, bench_op.py
from bench_op import graphed_ms  # noqa: E402
from common import environment, n_buffers, save_json  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear import reference  # noqa: E402

OP = torch.ops.flash_eqlinear.eq_linear_fwd
TILES = ("default", "big", "small", "small4")


def timed(fn, xs, tile: str) -> float:
    """ms per call of fn over xs with the FP32 tile forced (the narrow kernel off)."""
    return graphed_ms(fn, xs, {"narrow": "0", "fp32_tile": tile})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cs", default="64,128,256,512,1024,2048")
    ap.add_argument("--M", type=int, default=32768)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    env = environment()
    rows = []
    print("| c | F.linear ms | " + " | ".join(f"{t} ms" for t in TILES) + " | default x F.linear |")
    print("|---" * (len(TILES) + 3) + "|")
    for c in map(int, args.cs.split(",")):
        M = args.M
        planes = torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5
        bias = torch.randn(c, device="cuda")
        W = reference.dense_weight(fe.planes_to_naive(planes.double())).float()
        B = bias.repeat_interleave(4)
        xs = [(torch.randn(M, 4 * c, device="cuda"),) for _ in range(n_buffers(32 * M * c))]
        with torch.no_grad():
            lin = timed(lambda x, W=W, B=B: F.linear(x, W, B), xs, "default")
            ours = {t: timed(lambda x, p=planes, b=bias: OP(x, p, b), xs, t) for t in TILES}
        rows.append({"c": c, "d": c, "M": M, "F.linear_ms": lin, **{f"{t}_ms": v for t, v in ours.items()}})
        cells = " | ".join(f"{ours[t]:.4f}" for t in TILES)
        print(f"| {c} | {lin:.4f} | {cells} | {lin / ours['default']:.2f}x |", flush=True)
    out = args.out or "op_fwd_fp32_tiles.json"
    print(save_json(out, {"environment": env, "rows": rows}))


if __name__ == "__main__":
    main()
