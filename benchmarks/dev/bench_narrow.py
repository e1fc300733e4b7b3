"""Narrow layers (c, d <= 32; FP32 up to 64): the narrow kernel against the tiled kernels and F.linear.

For M = 32768 rows and a grid of (c, d): forward latency of F.linear, of our op with the narrow
kernel and with it switched off (FLASH_EQLINEAR_DEBUG=narrow=0: the tiled kernels), the memory floor
(bytes of x, planes and y over the measured copy bandwidth) and the narrow kernel's share of it.
CUDA graphs over rotated inputs, as bench_op.py. This is what sets kNarrowMaxC / kNarrowMaxCD16.

Usage: python benchmarks/dev/bench_narrow.py [--dtypes fp32,tf32,fp16,bf16] [--out NAME.json]
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
from bench_op import DTYPES, graphed_ms  # noqa: E402
from common import environment, measure_ceilings, n_buffers, save_json  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear import reference  # noqa: E402

OP = torch.ops.flash_eqlinear.eq_linear_fwd
SHAPES = [(8, 8), (16, 16), (16, 32), (32, 16), (24, 24), (32, 32)]
SHAPES_FP32 = [(32, 64), (64, 32), (48, 48), (64, 64)]  # exact FP32 has narrow tiles up to 64


def timed(fn, xs, narrow: bool) -> float:
    """ms per call of fn over xs, with the narrow kernel on or off."""
    return graphed_ms(fn, xs, {"narrow": "1" if narrow else "0"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp32,tf32,fp16,bf16")
    ap.add_argument("--M", type=int, default=32768)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    env = environment()
    ceil = measure_ceilings()
    rows = []
    print("| dtype | c | d | F.linear ms | narrow ms | tiled ms | floor ms | x F.linear | % of floor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.dtypes.split(","):
        dt = DTYPES[name]
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        for c, d in SHAPES + (SHAPES_FP32 if name == "fp32" else []):
            M = args.M
            planes = (torch.randn(4, d, c, device="cuda") / (4 * c) ** 0.5).to(dt)
            bias = torch.randn(d, device="cuda").to(dt)
            W = reference.dense_weight(fe.planes_to_naive(planes.double())).to(dt)
            B = bias.repeat_interleave(4)
            elt = torch.finfo(dt).bits // 8
            nb = n_buffers(4 * M * (c + d) * elt)
            xs = [(torch.randn(M, 4 * c, device="cuda").to(dt),) for _ in range(nb)]
            with torch.no_grad():
                lin = timed(lambda x, W=W, B=B: F.linear(x, W, B), xs, True)
                ours = {n: timed(lambda x, p=planes, b=bias: OP(x, p, b), xs, n) for n in (True, False)}
            floor = (4 * M * (c + d) + 4 * c * d + d) * elt / (ceil["copy_tbps"] * 1e9)
            row = {
                "dtype": name,
                "c": c,
                "d": d,
                "M": M,
                "F.linear_ms": lin,
                "narrow_ms": ours[True],
                "tiled_ms": ours[False],
                "floor_ms": floor,
            }
            rows.append(row)
            print(
                f"| {name} | {c} | {d} | {lin:.4f} | {ours[True]:.4f} | {ours[False]:.4f} | {floor:.4f} | "
                f"{lin / ours[True]:.2f}x | {100 * floor / ours[True]:.0f}% |",
                flush=True,
            )
    torch.backends.cuda.matmul.allow_tf32 = False
    out = args.out or "op_fwd_narrow.json"
    print(save_json(out, {"environment": env, "ceilings": ceil, "rows": rows}))


if __name__ == "__main__":
    main()
