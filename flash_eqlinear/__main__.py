"""python -m flash_eqlinear: check and time an equivariant layer on this machine.

Builds a naive EQ-Linear and the equivalent FlashEQLinear, checks that they compute the same function
(relative L2 against a float64 reference), that the layer is equivariant and that the pure-PyTorch
Fourier path agrees, then times nn.Linear, the naive layer and ours, printing each step as it goes and a
one-line verdict last. Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

DESCRIPTION = (
    "Check that FlashEQLinear computes the same function as a naive equivariant linear layer (against a "
    "float64 reference), that it is equivariant, and time it beside nn.Linear and the naive layer on this "
    "machine's GPU (or CPU). Prints each step as it runs and a one-line verdict; exits 0 when the checks "
    "pass."
)


def say(*args) -> None:
    print(*args, flush=True)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def time_ms(fn, device: torch.device, warmup: int, iters: int) -> list[float]:
    """Milliseconds per call, one value per call (CUDA events on GPUs, a host clock elsewhere)."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m flash_eqlinear", description=DESCRIPTION)
    add = ap.add_argument
    add("--device", default=None, help="cuda or cpu (default: cuda when a CUDA GPU is visible)")
    add("--dtype", choices=sorted(DTYPES), default="fp32", help="the layers' dtype (default: fp32)")
    add("--rows", type=int, default=None, help="input rows M (default: 32768 on a GPU, 4096 on CPU)")
    add("--channels", type=int, default=None, help="in and out features C = D (default: 2048 GPU, 512 CPU)")
    add("--group-size", type=int, default=4, help="rotation group size T; fused kernels: T = 4 (default 4)")
    add("--iters", type=int, default=None, help="timed calls per layer (default: 50 on a GPU, 10 on CPU)")
    args = ap.parse_args(argv)
    for name in ("rows", "channels", "group_size", "iters"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as e:
        ap.error(f"--device: {e}")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch build sees no CUDA GPU")
    if device.type not in ("cuda", "cpu"):
        ap.error(f"--device must be cuda or cpu, got {args.device}")
    C = args.channels or (2048 if device.type == "cuda" else 512)
    if C % args.group_size:
        T = args.group_size
        ap.error(f"C = {C} (--channels) must be a multiple of the group size {T} (--group-size)")
    return args, device, C


def main(argv=None) -> int:
    args, device, C = parse_args(argv)
    gpu = device.type == "cuda"
    dtype, T = DTYPES[args.dtype], args.group_size
    M = args.rows or (32768 if gpu else 4096)
    iters = args.iters or (50 if gpu else 10)
    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    say(f"flash-eqlinear on {name}: M = {M} rows, C = D = {C}, group size {T}, {args.dtype}")

    from . import FlashEQLinear, NaiveEQLinear, kernels_available, reference
    from .models.layers import roll_group
    from .ops import backend_for, kernel_import_error, reference_form

    torch.manual_seed(0)
    # Inference (eval mode, no gradients): the naive layer, and ours off the fused kernels, keep their
    # expanded weight.
    naive = NaiveEQLinear(C, C, group_size=T, device=device, dtype=dtype).eval()
    flash = FlashEQLinear.from_naive(naive.weight.detach(), naive.bias.detach()).eval()
    dense = torch.nn.Linear(C, C, device=device, dtype=dtype).eval()
    x = torch.randn(M, C, device=device, dtype=dtype)
    backend = backend_for(x, T)
    if backend == "cuda":
        say("path: the fused CUDA kernels")
    else:
        form = reference_form(x, T, C // T, C // T, dense_kept=True)
        why = kernel_import_error() if not kernels_available() else "not covered by the fused kernels here"
        say(f"path: pure PyTorch, {form} form; {why}")
        if form == "dense":
            say("  (the naive layer and ours then run the same dense computation: the speedup needs the CUDA")
            say("  kernels, on a GPU)")

    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}[dtype]
    with torch.no_grad():
        say("checking against a float64 reference ...")
        ref = reference.naive_eq_linear(x.double(), naive.weight.double(), naive.bias.double(), T)
        fourier = reference.fourier_eq_linear
        y_flash = flash(x)
        checks = [
            ("FlashEQLinear vs float64", rel_l2(y_flash, ref)),
            ("NaiveEQLinear vs float64", rel_l2(naive(x), ref)),
            ("pure-PyTorch Fourier path vs float64", rel_l2(fourier(x, flash.weight, flash.bias, T), ref)),
            ("equivariance f(r.x) vs r.f(x)", rel_l2(flash(roll_group(x, T)), roll_group(y_flash, T))),
        ]
        ok = True
        for label, err in checks:
            passed = err <= tol or label.startswith("Naive")
            ok &= passed
            say(f"  {label:<40} rel L2 {err:.2e}  {'ok' if passed else f'FAILED (> {tol:.0e})'}")

        say(f"timing {iters} calls per layer (median, and min-max over the calls) ...")
        say(f"  {'layer':<28}{'ms':>9}{'min-max':>20}{'vs nn.Linear':>14}")
        rows = []
        for label, layer in (("nn.Linear", dense), ("NaiveEQLinear", naive), ("FlashEQLinear", flash)):
            t = time_ms(lambda layer=layer: layer(x), device, 5, iters)
            med = statistics.median(t)
            rows.append((label, med))
            speed = rows[0][1] / med
            say(f"  {label:<28}{med:>9.3f}{f'{min(t):.3f}-{max(t):.3f}':>20}{speed:>13.2f}x")

    speedup = rows[0][1] / rows[2][1]
    verdict = "checks passed" if ok else "CHECKS FAILED"
    say(f"verdict: {verdict}; FlashEQLinear runs at {speedup:.2f}x nn.Linear here ({backend} path)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
