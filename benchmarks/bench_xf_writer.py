"""What the Hopper kernel's planes writers cost: the graphed forward with them (eq_linear_fwd_xf, which
writes x's Fourier planes as a by-product on Hopper) against the plain forward (eq_linear_fwd).

python benchmarks/bench_xf_writer.py [--cs 512,1024] [--rows 32768] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_op import graphed  # noqa: E402
from common import bench  # noqa: E402

import flash_eqlinear  # noqa: E402, F401  (registers the ops)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cs", default="512,1024")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    eqf = torch.ops.flash_eqlinear
    for dt in (torch.float16, torch.bfloat16):
        for c in map(int, a.cs.split(",")):
            x = torch.randn(a.rows, 4 * c, device="cuda", dtype=dt)
            p = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt)
            b = torch.randn(c, device="cuda", dtype=dt)
            fns = [graphed(op, [(x, p, b)]) for op in (eqf.eq_linear_fwd, eqf.eq_linear_fwd_xf)]
            us = [1e9, 1e9]
            for _ in range(a.rounds):  # rounds, alternating the two: the best of each (clock drift)
                us = [
                    min(u, bench(f, [()], min_time_s=0.1, max_samples=30) * 1e3)
                    for u, f in zip(us, fns, strict=True)
                ]
            extra = us[1] / us[0] * 100 - 100
            print(f"{dt} c={c}: plain {us[0]:.1f} us, with the writers {us[1]:.1f} us (+{extra:.0f}%)")


if __name__ == "__main__":
    main()
