"""Host (CPU) cost per call of an EQ-Linear layer's forward and of its parts, against nn.Linear.

A training step of a network whose layers are small enough is bound by the host: the Python and
dispatcher work per call, not the GPU. This times, inside one bf16 autocast region, calls on small
tensors (M = 256 rows, so the GPU never holds the host back): wall time per call over a few hundred
calls, after a warm-up, without synchronising in between. Rows: nn.Linear and FlashEQLinear (forward with
an FP32 and a bf16 input, forward + backward, eval-mode inference), ``flash_eq_linear`` without casts,
the registered op with and without autograd, and the Python pieces of the wrapper (casts, checks,
dispatch decisions).

Usage:
  python benchmarks/bench_host.py [--c 192 --d 576 --calls 200 --rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
from common import host_us  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear import ops as O  # noqa: E402
from flash_eqlinear import reference  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--c", type=int, default=192, help="input fields (in_features = 4c)")
    ap.add_argument("--d", type=int, default=576, help="output fields (out_features = 4d)")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5, help="timings per row, taken in turn with the others")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or not fe.kernels_available():
        print("needs a CUDA device and the built kernels", file=sys.stderr)
        return 2
    dev, M, c, d = "cuda", args.rows, args.c, args.d
    lin = nn.Linear(4 * c, 4 * d, device=dev)
    flash = fe.FlashEQLinear(4 * c, 4 * d, device=dev)
    x32 = torch.randn(M, 4 * c, device=dev, requires_grad=True)
    xb = torch.randn(M, 4 * c, device=dev, dtype=torch.bfloat16, requires_grad=True)
    pb = flash.weight.detach().bfloat16().contiguous().requires_grad_()
    bb = flash.bias.detach().bfloat16().requires_grad_()
    xd, pd, bd = xb.detach(), pb.detach(), bb.detach()
    ops = torch.ops.flash_eqlinear
    bf16 = torch.bfloat16
    gy = torch.randn(M, 4 * d, device=dev, dtype=bf16)

    def train_step(layer, x):
        layer(x).backward(gy)

    def inference(layer, x):
        with torch.no_grad():
            layer(x)

    lin_eval, flash_eval = (copy.deepcopy(m).eval() for m in (lin, flash))
    rows = [
        ("nn.Linear forward, FP32 x (weight cast cached by autocast)", lambda: lin(x32)),
        ("FlashEQLinear forward, FP32 x (eq_linear_fwd_cast)", lambda: flash(x32)),
        ("FlashEQLinear forward, bf16 x", lambda: flash(xb)),
        ("nn.Linear forward + backward, FP32 x", lambda: train_step(lin, x32)),
        ("FlashEQLinear forward + backward, FP32 x", lambda: train_step(flash, x32)),
        ("nn.Linear forward + backward, bf16 x", lambda: train_step(lin, xb)),
        ("FlashEQLinear forward + backward, bf16 x", lambda: train_step(flash, xb)),
        ("nn.Linear inference (eval, no_grad), FP32 x", lambda: inference(lin_eval, x32)),
        ("FlashEQLinear inference (eval, no_grad), FP32 x", lambda: inference(flash_eval, x32)),
        ("flash_eq_linear, bf16 x, weight and bias (no casts)", lambda: O.flash_eq_linear(xb, pb, bb)),
        ("op eq_linear_fwd, with autograd", lambda: ops.eq_linear_fwd(xb, pb, bb)),
        ("op eq_linear_fwd_cast, with autograd", lambda: ops.eq_linear_fwd_cast(x32, pb, bb)),
        ("op eq_linear_fwd, no autograd", lambda: ops.eq_linear_fwd(xd, pd, bd)),
        ("weight.to(bf16)", lambda: flash.weight.to(bf16)),
        ("autocast_inputs (weight, bias)", lambda: O.autocast_inputs(x32, flash.weight, flash.bias, False)),
        ("_keeps_fp32_input", lambda: O._keeps_fp32_input(x32, flash.weight, 4)),
        ("check_inputs", lambda: reference.check_inputs(x32, pb, bb, 4, "planes", input_dtype=bf16)),
        ("_gemm_training_forward", lambda: O._gemm_training_forward(bf16, c, d, 0)),
        ("weight_grad_mode", lambda: O.weight_grad_mode(c, d, bf16, 0)),
        ("_autocast_dtype", lambda: O._autocast_dtype(x32)),
    ]
    gpu = torch.cuda.get_device_name()
    print(f"M = {M}, c = {c}, d = {d}, bf16 autocast, {gpu}, torch {torch.__version__}")
    times: list[list[float]] = [[] for _ in rows]
    with torch.autocast(dev, dtype=bf16):
        for _ in range(args.rounds):  # rows in turn, so that a slow spell of the host hits them all alike
            for t, (_, fn) in zip(times, rows, strict=True):
                t.append(host_us(fn, args.calls))
    print(f"\nus per call over {args.calls} calls, {args.rounds} rounds")
    print("| call | min | median |\n|---|---:|---:|")
    for t, (name, _) in zip(times, rows, strict=True):
        print(f"| {name} | {min(t):.1f} | {statistics.median(t):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
