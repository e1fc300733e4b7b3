"""Where the backward's time goes: each part of the CUDA backward timed on its own (CUDA graphs).

python benchmarks/dev/profile_bwd.py [--dtypes fp16,bf16] [--cs 512,1024,2048] [--rows 32768] [--cpu]

Per (dtype, c), C = D = 4c, milliseconds: F.linear's forward and its two backward GEMMs, our
grad_x (the forward kernel on the adjoint planes; gx_port: without the Hopper kernels; gx_gemm: from
grad_y's Fourier planes, its group DFT included), the fused weight-gradient kernel, the GEMM form's
parts (both group DFTs, the plane GEMMs), the whole weight gradient per mode and the whole backward
op with the GEMM-form weight gradient (FLASH_EQLINEAR_DEBUG=weight_grad=gemm; bwd_port: without the
Hopper kernels); and, without graphs, the eager autograd backward of
F.linear and of the layer (lin_bwd_eager, bwd_eager: EAGER_CALLS calls back to back per sample; the
_1 columns: one isolated call per sample, its host latency included).
--cpu: the host (Python + dispatch) microseconds per call of the eager backward and its parts.
--trace: the kernels of the layer's eager autograd backward (the training path: kept planes where
ops.plan(...)["train"] is "keep_planes") under torch.profiler, microseconds per call each, their sum
against the wall time per call (the difference: the GPU waiting for the host).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent  # benchmarks/
sys.path.insert(0, str(ROOT.parent))  # the package from the repository root
sys.path.insert(0, str(ROOT))  # common.py, bench_op.py
from bench_op import EAGER_CALLS, graphed, portable  # noqa: E402
from common import bench, debug_switch, host_us  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear import reference  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def gemm_grad_x(op, *args):
    """op(*args) with fp16 / bf16 grad_x taken from grad_y's Fourier planes (FLASH_EQLINEAR_DEBUG
    products=gemm beside weight_grad=gemm: the plan takes that grad_x only with the GEMM-form weight
    gradient)."""
    with debug_switch("products", "gemm"), debug_switch("weight_grad", "gemm"):
        return op(*args)


def gemm_weight_grad(op, *args):
    """op(*args) with the GEMM-form weight gradient (FLASH_EQLINEAR_DEBUG=weight_grad=gemm)."""
    with debug_switch("weight_grad", "gemm"):
        return op(*args)


def timed(fn, *args) -> float:
    return bench(graphed(fn, [args]), [()], min_time_s=0.2, max_samples=50)


def case(dt, M: int, c: int) -> dict:
    eqf = torch.ops.flash_eqlinear
    x = torch.randn(M, 4 * c, device="cuda", dtype=dt)
    gy = torch.randn(M, 4 * c, device="cuda", dtype=dt)
    planes = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt)
    w = fe.planes_to_naive(planes.float()).to(dt)
    W = reference.dense_weight(w)
    idx = reference.circulant_index(4, "cuda")
    adj = reference.adjoint_planes(planes).contiguous()
    xf = eqf.eq_group_dft(x, True, False)[0]
    gf = eqf.eq_group_dft(gy, False, True)[0]

    all_grads = (True, True, True)  # needs_x, needs_p, needs_b
    grad_x_only = (True, False, False)

    # The weight gradient's GEMMs, close to the op's: the complex pair as one product with FP32 output.
    # (The op reads column blocks, runs P0 / P2 as one batched GEMM and combines q in one kernel; here
    # the planes layout, two GEMMs and two adds.)
    g_ri, x_ri = gf[2:4].permute(1, 0, 2).reshape(M, 2 * c), xf[2:4].permute(1, 0, 2).reshape(M, 2 * c)

    def gemms():
        q = torch.mm(g_ri.t(), x_ri, out_dtype=torch.float32)
        return gf[0].t() @ xf[0], gf[1].t() @ xf[1], q[:c, :c] + q[c:, c:], q[c:, :c] - q[:c, c:]

    # The eager autograd backward of the layer and of F.linear (no graphs: what bench_op.py times),
    # next to the graphed parts above, shows what the eager path adds.
    xr, pr = x.clone().requires_grad_(), planes.clone().requires_grad_()
    br = torch.zeros(c, device="cuda", dtype=dt, requires_grad=True)
    Wr, Br = W.clone().requires_grad_(), torch.zeros(4 * c, device="cuda", dtype=dt, requires_grad=True)
    y_flash, y_lin = fe.flash_eq_linear(xr, pr, br), F.linear(xr, Wr, Br)

    def eager(y, inputs, calls=EAGER_CALLS):
        return bench(lambda: torch.autograd.grad(y, inputs, gy, retain_graph=True), [()], 0.2, 50, calls)

    return {
        "lin_bwd_eager": eager(y_lin, (xr, Wr, Br)),
        "bwd_eager": eager(y_flash, (xr, pr, br)),
        # one isolated call per sample: its host latency before the first kernel timed too
        "lin_bwd_eager_1": eager(y_lin, (xr, Wr, Br), 1),
        "bwd_eager_1": eager(y_flash, (xr, pr, br), 1),
        "expand": timed(lambda w: reference.dense_weight(w, idx), w),
        "lin_fwd": timed(F.linear, x, W),
        "naive_fwd": timed(lambda x: reference.naive_eq_linear(x, w, None, 4, idx), x),
        "lin_bwd": timed(lambda g, x: (g @ W, g.t() @ x, g.sum(0)), gy, x),
        "gx": timed(lambda g: eqf.eq_linear_fwd(g, adj, None), gy),
        "gx_port": timed(lambda g: portable(eqf.eq_linear_fwd, g, adj, None), gy),
        # grad_x from grad_y's planes (its group DFT included), as the portable GEMM-form backward
        "gx_gemm": timed(lambda g: gemm_grad_x(eqf.eq_linear_bwd, g, x, planes, *grad_x_only), gy),
        "gw_fused": timed(eqf.eq_linear_bwd_weight, x, gy),
        "gw_gemm": timed(
            lambda x, g: gemm_weight_grad(eqf.eq_linear_bwd, g, x, planes, False, True, True), x, gy
        ),
        "dft_x": timed(lambda x: eqf.eq_group_dft(x, True, False), x),
        "dft_gy": timed(lambda g: eqf.eq_group_dft(g, False, True), gy),
        "gemms": timed(gemms),
        "bwd_op": timed(lambda x, g: gemm_weight_grad(eqf.eq_linear_bwd, g, x, planes, *all_grads), x, gy),
        "bwd_port": timed(
            lambda x, g: portable(gemm_weight_grad, eqf.eq_linear_bwd, g, x, planes, *all_grads), x, gy
        ),
    }


def cpu_overhead(dt) -> None:
    """Host cost of one backward (autograd.grad of all three gradients) and of its parts (the GEMM form's
    with FLASH_EQLINEAR_DEBUG=weight_grad=gemm set around their timing)."""
    M, c = 256, 64
    x = torch.randn(M, 4 * c, device="cuda", dtype=dt, requires_grad=True)
    gy = torch.randn(M, 4 * c, device="cuda", dtype=dt)
    planes = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt).requires_grad_()
    bias = torch.zeros(c, device="cuda", dtype=dt, requires_grad=True)
    W = reference.dense_weight(fe.planes_to_naive(planes.detach().float())).to(dt).requires_grad_()
    B = torch.zeros(4 * c, device="cuda", dtype=dt, requires_grad=True)
    y_lin = F.linear(x, W, B)
    y = fe.flash_eq_linear(x, planes, bias)
    eqf = torch.ops.flash_eqlinear
    parts = {
        "F.linear bwd": lambda: torch.autograd.grad(y_lin, (x, W, B), gy, retain_graph=True),
        "flash bwd": lambda: torch.autograd.grad(y, (x, planes, bias), gy, retain_graph=True),
        "flash fwd": lambda: fe.flash_eq_linear(x.detach(), planes.detach(), bias.detach()),
        "gx op": lambda: eqf.eq_linear_fwd(gy, planes.detach(), None),
        "gw gemm form": lambda: eqf.eq_linear_bwd(gy, x.detach(), planes.detach(), False, True, True),
        "whole bwd op": lambda: eqf.eq_linear_bwd(gy, x.detach(), planes.detach(), True, True, True),
        "gw fused op": lambda: eqf.eq_linear_bwd_weight(x.detach(), gy),
    }
    gemm_form = {"gw gemm form", "whole bwd op"}

    def us(name, fn) -> float:
        with debug_switch("weight_grad", "gemm") if name in gemm_form else contextlib.nullcontext():
            return host_us(fn)

    print(" | ".join(f"{k} {us(k, f):.0f} us" for k, f in parts.items()), flush=True)


def trace(dt, M: int, c: int, calls: int = 20) -> None:
    """Per-kernel GPU time of the eager backward of one layer (C = D = 4c), and the wall time per call."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(M, 4 * c, device="cuda", dtype=dt, requires_grad=True)
    planes = (torch.randn(4, c, c, device="cuda") / (4 * c) ** 0.5).to(dt).requires_grad_()
    bias = torch.zeros(c, device="cuda", dtype=dt, requires_grad=True)
    gy = torch.randn(M, 4 * c, device="cuda", dtype=dt)
    y = fe.flash_eq_linear(x, planes, bias)
    step = lambda: torch.autograd.grad(y, (x, planes, bias), gy, retain_graph=True)  # noqa: E731
    wall = bench(step, [()], 0.2, 50, EAGER_CALLS)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    rows.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in rows) / calls
    print(f"{dt} c={c}: eager backward {wall * 1e3:.0f} us per call, kernels {total:.0f} us:", flush=True)
    for e in rows:
        print(f"  {e.self_device_time_total / calls:8.1f} us  x{e.count / calls:.0f}  {e.key[:110]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--cs", default="512,1024,2048")
    ap.add_argument("--rows", type=int, default=32768)
    ap.add_argument("--cpu", action="store_true", help="host cost per call instead (tiny tensors)")
    ap.add_argument("--trace", action="store_true", help="kernels of the eager backward instead")
    a = ap.parse_args()
    if a.trace:
        for name in a.dtypes.split(","):
            for c in map(int, a.cs.split(",")):
                trace(DTYPES[name], a.rows, c)
        return
    if a.cpu:
        for name in a.dtypes.split(","):
            cpu_overhead(DTYPES[name])
        return
    for i, name in enumerate(a.dtypes.split(",")):
        for j, c in enumerate(map(int, a.cs.split(","))):
            t = case(DTYPES[name], a.rows, c)
            if i == j == 0:
                print(f"{'case':>14} " + " ".join(f"{k:>9}" for k in t))
            print(f"{name + ' c=' + str(c):>14} " + " ".join(f"{v:9.4f}" for v in t.values()), flush=True)


if __name__ == "__main__":
    main()
