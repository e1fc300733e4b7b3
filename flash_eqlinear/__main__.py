"""``python -m flash_eqlinear``: check and time a p4 layer on whatever device is present.

Builds a naive p4 EQ-Linear and the equivalent FlashEQLinear, checks that they agree (relative L2
against a float64 reference) and that the layer is equivariant, times nn.Linear, the naive layer
and ours, and prints a table saying which backend ran. The pure-PyTorch Fourier path is checked too
(it is what the layer runs off the fused kernels for larger layers on the CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

from . import FlashEQLinear, NaiveEQLinear, kernels_available, reference
from .models.layers import roll_group
from .ops import backend_for, kernel_import_error, reference_form

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def time_ms(fn, device: torch.device, warmup: int, iters: int) -> float:
    """Median milliseconds per call (CUDA events on GPUs, a synchronised host clock elsewhere)."""
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
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flash_eqlinear", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    ap.add_argument("--rows", type=int, default=None, help="rows M (default: 32768 on GPU, 4096 on CPU)")
    ap.add_argument("--channels", type=int, default=None, help="C = D (default: 2048 on GPU, 512 on CPU)")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--iters", type=int, default=None)
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
    gpu = device.type == "cuda"
    dtype, T = DTYPES[args.dtype], args.group_size
    M = 32768 if gpu and args.rows is None else 4096 if args.rows is None else args.rows
    C = 2048 if gpu and args.channels is None else 512 if args.channels is None else args.channels
    if C % T:
        ap.error(f"the channel count C = {C} (--channels) must be a multiple of --group-size = {T}")
    iters = args.iters or (50 if gpu else 10)
    torch.manual_seed(0)

    # Inference (eval mode, no gradients): the naive layer, and ours off the fused kernels, keep their
    # expanded weight.
    naive = NaiveEQLinear(C, C, group_size=T, device=device, dtype=dtype).eval()
    flash = FlashEQLinear.from_naive(naive.weight.detach(), naive.bias.detach()).eval()
    dense = nn.Linear(C, C, device=device, dtype=dtype).eval()
    x = torch.randn(M, C, device=device, dtype=dtype)
    backend = backend_for(x, T)
    if backend == "reference":  # which pure-PyTorch form: the Fourier path or the dense expansion
        backend += f"/{reference_form(x, T, C // T, C // T, dense_kept=True)}"

    with torch.no_grad():
        ref = reference.naive_eq_linear(x.double(), naive.weight.double(), naive.bias.double(), T)
        y_flash, y_naive = flash(x), naive(x)
        err_flash, err_naive = rel_l2(y_flash, ref), rel_l2(y_naive, ref)
        equi = rel_l2(flash(roll_group(x, T)), roll_group(y_flash, T))
        err_fourier = rel_l2(reference.fourier_eq_linear(x, flash.weight, flash.bias, T), ref)
        rows = [
            ("nn.Linear", time_ms(lambda: dense(x), device, 5, iters), None),
            ("NaiveEQLinear", time_ms(lambda: naive(x), device, 5, iters), err_naive),
            (f"FlashEQLinear [{backend}]", time_ms(lambda: flash(x), device, 5, iters), err_flash),
        ]

    name = torch.cuda.get_device_name(device) if gpu else "CPU"
    print(f"flash-eqlinear on {name}: M={M}, C=D={C}, group_size={T}, {args.dtype}, backend={backend}")
    if not kernels_available():
        print(f"(fused kernels not available: {kernel_import_error()})")
    base = rows[0][1]
    print(f"{'layer':<34}{'ms':>10}{'vs nn.Linear':>14}{'rel L2 vs fp64':>16}")
    for label, ms, err in rows:
        e = "-" if err is None else f"{err:.2e}"
        print(f"{label:<34}{ms:>10.3f}{base / ms:>13.2f}x{e:>16}")
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 4e-2}[dtype]
    ok = err_flash <= tol and equi <= tol and err_fourier <= tol
    print(f"pure-PyTorch Fourier path: rel L2 vs fp64 {err_fourier:.2e}")
    print(f"equivariance f(r.x) vs r.f(x): rel L2 {equi:.2e}; exactness {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
