"""Operator benchmark of the p4 EQ-Linear forward, backward or training step (forward + backward), and of
the forward for group sizes 2 and 8 (``--group-size``).

For M = B*N rows (default 32 x 1024), T = 4 (or --group-size), C = D = T c: forward latency of F.linear
(cuBLAS, the dense block-circulant weight), NaiveEQLinear (expansion + F.linear), the reference Fourier path
(stock torch ops) and the fused kernel; TFLOP/s, % of the measured peak, the floors, speedups
over F.linear; and a precision table against float64. All timings in one run, CUDA graphs of
rotated inputs (several times L2), medians of CUDA-event samples.

Usage: python benchmarks/bench_op.py [--direction fwd|bwd|train] [--dtypes fp32,fp16,bf16] [--cs 16,...]
                                    [--group-size 4|2|8] [--out NAME.json]
(dtypes: fp32, tf32, 3xtf32, fp16, bf16; "tf32": float32 with torch.backends.cuda.matmul.allow_tf32 on, for
F.linear and ours alike.) Writes benchmarks/results/NAME.json and NAME.md (the commit and GPU inside the
JSON's "env"); NAME without --out: op_<direction>, plus the run's TF32 modes (_tf32, _3xtf32) where it has
any, or _fp32 for a run of fp32 alone, and _c<T> for group sizes 2 and 8 (default_name): op_fwd.json,
op_fwd_tf32.json, op_bwd_fp32.json, op_fwd_c8.json, ... (T = 2, 8: the forward only, ours being
``flash_eqlinear::eq_linear_fwd_t``; c defaults to C / T for C = 256 .. 8192.)
The backward mode times all three gradients (autograd.grad over retained graphs, no CUDA graphs)
and reports the worst gradient's relative error in its table (all three in the JSON); the train
mode times the forward and that backward together (no CUDA graphs). Both time at least
EAGER_CALLS calls back to back per sample (steady state, as in training: one call's host latency
overlaps the previous call's GPU work); `--eager-calls 1` times isolated calls (latency). On Hopper
in fp16 / bf16 all three modes also time the portable kernels.
Then: python benchmarks/plot.py benchmarks/results/NAME.json (writes NAME.png beside it)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench, env_switch, environment, measure_ceilings, n_buffers, save_json, switch  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear import reference  # noqa: E402

# "tf32": float32 tensors with torch.backends.cuda.matmul.allow_tf32 on (F.linear and ours both use TF32);
# "3xtf32": float32, TF32 off, ours with FLASH_EQLINEAR_FP32=3xtf32 (F.linear exact FP32)
DTYPES = {
    "fp32": torch.float32,
    "tf32": torch.float32,
    "3xtf32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def peak_tflops(ceilings: dict, dtype_name: str) -> float:
    """The tensor rate a dtype's floor is computed from (3xTF32: three TF32 passes)."""
    return ceilings["tf32_tflops"] / 3 if dtype_name == "3xtf32" else ceilings[f"{dtype_name}_tflops"]


CS = [16, 32, 64, 128, 256, 512, 1024, 2048]
EAGER_CALLS = 4  # eager (bwd / train) calls per timed sample, at least


def graphed(fn, args_list):
    """A callable replaying one CUDA graph of fn over all args (launch overhead out of the timing)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for args in args_list:
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for args in args_list:
            fn(*args)
    return g.replay


def graphed_ms(fn, xs, switches: dict | None = None, min_time_s: float = 0.2) -> float:
    """ms per call of fn over the argument tuples xs, replayed from one CUDA graph; the given switches
    hold while it is captured, which is when the kernels are chosen: name -> value, a name either a
    variable of its own (``FLASH_EQLINEAR_SM90``, ``FLASH_EQLINEAR_FP32``) or one of FLASH_EQLINEAR_DEBUG's
    (``pdl``, ``narrow``, ...; :func:`common.switch`)."""
    with contextlib.ExitStack() as stack:
        for name, value in (switches or {}).items():
            stack.enter_context(switch(name, value))
        replay = graphed(fn, xs)
    return bench(replay, [()], min_time_s=min_time_s) / len(xs)


def precision(y, ref) -> dict:
    err = (y.double() - ref).abs()
    r = ref.abs()
    mask = r > 1e-3 * ref.pow(2).mean().sqrt()
    return {
        "rel_l2": (err.norm() / ref.norm()).item(),
        "max_abs": err.max().item(),
        "mean_abs": err.mean().item(),
        "p99_rel": torch.quantile((err[mask] / r[mask]).float()[: 2**24], 0.99).item(),
    }


def portable_kernels():
    """A context with the Hopper kernels switched off (the portable path, for comparison)."""
    return env_switch("FLASH_EQLINEAR_SM90", "0")


def portable(op, *args, **kwargs):
    """op(*args, **kwargs) on the portable path."""
    with portable_kernels():
        return op(*args, **kwargs)


def dense_fraction(T: int) -> float:
    """Our multiply-adds over the dense layer's: one real product per real frequency, four per complex one."""
    real = 2 if T % 2 == 0 else 1
    return (real + 4 * (T - real) // 2) / T**2


def run_case(dtype_name: str, c: int, M: int, ceilings: dict, prec_rows: int, T: int = 4) -> dict:
    dt = DTYPES[dtype_name]
    C = D = T * c
    g = torch.Generator(device="cuda").manual_seed(c)
    planes = (torch.randn(T, c, c, device="cuda", generator=g) / C**0.5).to(dt)
    bias = (torch.randn(c, device="cuda", generator=g) * 0.1).to(dt)
    w = fe.planes_to_naive(planes.double())
    W = reference.dense_weight(w).to(dt)
    B = bias.repeat_interleave(T)
    naive = fe.NaiveEQLinear(C, D, group_size=T, device="cuda", dtype=dt)
    with torch.no_grad():
        naive.weight.copy_(w.to(dt))
        naive.bias.copy_(bias)
    elt = torch.finfo(dt).bits // 8
    nb = n_buffers((M * C + M * D) * elt)
    xs = [(torch.randn(M, C, device="cuda", generator=g).to(dt),) for _ in range(nb)]

    ours = torch.ops.flash_eqlinear.eq_linear_fwd if T == 4 else torch.ops.flash_eqlinear.eq_linear_fwd_t
    fns = {
        "F.linear": lambda x: F.linear(x, W, B),
        "naive": lambda x: naive(x),
        "fourier_ref": lambda x: reference.fourier_eq_linear(x, planes, bias, T),
        "flash": lambda x: ours(x, planes, bias),
    }
    if T == 4 and dt != torch.float32 and torch.cuda.get_device_capability()[0] == 9:
        fns["flash_portable"] = lambda x: portable(torch.ops.flash_eqlinear.eq_linear_fwd, x, planes, bias)
    row = {"dtype": dtype_name, "group_size": T, "c": c, "C": C, "D": D, "M": M, "buffers": nb}
    dense_flops = 2 * M * C * D
    our_flops = dense_flops * dense_fraction(T)
    peak = peak_tflops(ceilings, dtype_name)
    bytes_moved = (M * C + M * D + T * c * c + c) * elt
    row["floor_compute_ms"] = our_flops / (peak * 1e9)
    row["floor_memory_ms"] = bytes_moved / (ceilings["copy_tbps"] * 1e9)
    row["floor_ms"] = max(row["floor_compute_ms"], row["floor_memory_ms"])
    with torch.no_grad():
        for name, fn in fns.items():
            ms = graphed_ms(fn, xs, min_time_s=0.3)
            flops = dense_flops if name in ("F.linear", "naive") else our_flops
            row[name] = {"ms": ms, "tflops": flops / ms / 1e9, "pct_peak": 100 * flops / ms / 1e9 / peak}
        for name in fns:
            row[name]["speedup_vs_linear"] = row["F.linear"]["ms"] / row[name]["ms"]
        row["flash"]["pct_of_floor"] = 100 * row["floor_ms"] / row["flash"]["ms"]
        # What the memory floor is worth at this size: a device copy of x into a y-sized buffer (C = D),
        # same rotation; and ours launched without programmatic dependent launch (sm_90+).
        y_copy = torch.empty(M, D, device="cuda", dtype=dt)
        row["copy_ms"] = graphed_ms(lambda x: y_copy.copy_(x), xs, min_time_s=0.3)
        if T == 4:
            row["flash_no_pdl_ms"] = graphed_ms(fns["flash"], xs, {"pdl": "0"}, min_time_s=0.3)

        x = xs[0][0][:prec_rows]
        ref = reference.naive_eq_linear(x.double(), w, bias.double(), T)
        row["precision"] = {
            "flash": precision(fns["flash"](x), ref),
            "F.linear": precision(fns["F.linear"](x), ref),
        }
    return row


def run_case_bwd(dtype_name: str, c: int, M: int, ceilings: dict, prec_rows: int, train=False, calls=1):
    """Backward (grad input + grad weight + grad bias) of the four implementations; with train, the
    forward and backward together; at least ``calls`` calls per timed sample."""
    dt = DTYPES[dtype_name]
    C = D = 4 * c
    g = torch.Generator(device="cuda").manual_seed(c)
    planes = (torch.randn(4, c, c, device="cuda", generator=g) / C**0.5).to(dt).requires_grad_()
    bias = (torch.randn(c, device="cuda", generator=g) * 0.1).to(dt).requires_grad_()
    w = fe.planes_to_naive(planes.detach().double())
    W = reference.dense_weight(w).to(dt).requires_grad_()
    B = bias.detach().repeat_interleave(4).requires_grad_()
    naive = fe.NaiveEQLinear(C, D, device="cuda", dtype=dt)
    with torch.no_grad():
        naive.weight.copy_(w.to(dt))
        naive.bias.copy_(bias)
    elt = torch.finfo(dt).bits // 8
    nb = n_buffers(3 * M * C * elt)
    xs = [torch.randn(M, C, device="cuda", generator=g).to(dt) for _ in range(nb)]
    gy = torch.randn(M, D, device="cuda", generator=g).to(dt)
    impls = {
        "F.linear": (lambda x: F.linear(x, W, B), (W, B)),
        "naive": (naive, (naive.weight, naive.bias)),
        "fourier_ref": (lambda x: reference.fourier_eq_linear(x, planes, bias, 4), (planes, bias)),
        "flash": (lambda x: fe.flash_eq_linear(x, planes, bias, 4), (planes, bias)),
    }
    row = {"dtype": dtype_name, "c": c, "C": C, "D": D, "M": M, "buffers": nb}
    row["direction"] = "train" if train else "bwd"
    row["calls_per_sample"] = -(-calls // nb) * nb  # whole passes over the nb buffers
    dense_flops = (6 if train else 4) * M * C * D  # (forward +) grad input + grad weight
    our_flops = dense_flops * 6 / 16
    peak = peak_tflops(ceilings, dtype_name)
    row["floor_compute_ms"] = our_flops / (peak * 1e9)
    row["floor_memory_ms"] = ((5 if train else 3) * M * C + 8 * c * c) * elt / (ceilings["copy_tbps"] * 1e9)
    row["floor_ms"] = max(row["floor_compute_ms"], row["floor_memory_ms"])
    contexts = {name: contextlib.nullcontext for name in impls}
    if dt != torch.float32 and torch.cuda.get_device_capability()[0] == 9:  # the portable kernels too
        impls["flash_portable"] = impls["flash"]
        contexts["flash_portable"] = portable_kernels
    for name, (fn, params) in impls.items():
        with contexts[name]():
            if train:
                args = [(x.detach().requires_grad_(),) for x in xs]
                step = lambda x: torch.autograd.grad(fn(x), (x, *params), gy)  # noqa: B023, E731
                ms = bench(step, args, 0.3, min_calls=calls)
            else:  # one retained autograd graph per input buffer; only backward is timed
                graphs = []
                for x in xs:
                    xl = x.detach().requires_grad_()
                    graphs.append((fn(xl), (xl, *params)))
                bwd = lambda y, inp: torch.autograd.grad(y, inp, gy, retain_graph=True)  # noqa: E731
                ms = bench(bwd, graphs, 0.3, min_calls=calls)
                del graphs
        flops = dense_flops if name in ("F.linear", "naive") else our_flops
        row[name] = {"ms": ms, "tflops": flops / ms / 1e9, "pct_peak": 100 * flops / ms / 1e9 / peak}
    for name in impls:
        row[name]["speedup_vs_linear"] = row["F.linear"]["ms"] / row[name]["ms"]
    row["flash"]["pct_of_floor"] = 100 * row["floor_ms"] / row["flash"]["ms"]

    x = xs[0][:prec_rows].detach()
    g_rows = gy[:prec_rows]
    x64, p64, b64 = (t.detach().double().requires_grad_() for t in (x, planes, bias))
    ref = torch.autograd.grad(
        reference.naive_eq_linear(x64, fe.planes_to_naive(p64), b64, 4), (x64, p64, b64), g_rows.double()
    )
    xl = x.clone().requires_grad_()
    ours = torch.autograd.grad(fe.flash_eq_linear(xl, planes, bias, 4), (xl, planes, bias), g_rows)
    W64, B64 = W.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    xd = x.double().requires_grad_()
    lin_ref = torch.autograd.grad(F.linear(xd, W64, B64), (xd, W64, B64), g_rows.double())
    xl = x.clone().requires_grad_()
    lin = torch.autograd.grad(F.linear(xl, W, B), (xl, W, B), g_rows)
    names = ("grad_x", "grad_w", "grad_b")
    row["precision"] = {
        "flash": {n: precision(a, r) for n, a, r in zip(names, ours, ref, strict=True)},
        "F.linear": {n: precision(a, r) for n, a, r in zip(names, lin, lin_ref, strict=True)},
    }
    return row


def markdown(rows, ceilings, env) -> str:
    lines = [
        f"GPU {env['gpu']}, torch {env['torch']}, commit {env['commit']}; ceilings: "
        + ", ".join(f"{k} {v:.1f}" for k, v in ceilings.items()),
        "",
        "| dtype | c | C=D | F.linear ms | naive ms | fourier-ref ms | flash ms | flash TFLOP/s (% peak)"
        " | floor ms | copy ms | flash ms without PDL | flash x F.linear | ref x F.linear | portable flash ms"
        " | rel L2 flash / F.linear |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["precision"]
        if "grad_x" in p["flash"]:  # backward rows: worst of the three gradients
            p = {k: {"rel_l2": max(v["rel_l2"] for v in p[k].values())} for k in p}
        lines.append(
            f"| {r['dtype']} | {r['c']} | {r['C']} | {r['F.linear']['ms']:.4f} | {r['naive']['ms']:.4f} | "
            f"{r['fourier_ref']['ms']:.4f} | {r['flash']['ms']:.4f} | {r['flash']['tflops']:.1f} "
            f"({r['flash']['pct_peak']:.0f}%) | {r['floor_ms']:.4f} | "
            + (f"{r['copy_ms']:.4f} | " if "copy_ms" in r else "- | ")
            + (f"{r['flash_no_pdl_ms']:.4f} | " if "flash_no_pdl_ms" in r else "- | ")
            + f"**{r['flash']['speedup_vs_linear']:.2f}x** | {r['fourier_ref']['speedup_vs_linear']:.2f}x | "
            + (
                f"{r['flash_portable']['ms']:.4f} ({r['flash_portable']['speedup_vs_linear']:.2f}x) | "
                if "flash_portable" in r
                else "- | "
            )
            + f"{p['flash']['rel_l2']:.2e} / {p['F.linear']['rel_l2']:.2e} |"
        )
    return "\n".join(lines)


def default_name(direction: str, dtypes: list[str], group_size: int = 4) -> str:
    """The result file's name without --out: op_<direction>.json, with the run's TF32 modes appended where
    it has any (op_fwd_tf32.json; op_fwd_3xtf32.json for fp32,3xtf32), _fp32 for a run of fp32 alone
    (op_bwd_fp32.json), then _c<T> for a group size other than 4 (op_fwd_c8.json); FP32 beside fp16 / bf16
    and fp16 / bf16 alone add nothing (op_fwd.json)."""
    tags = [d for d in dict.fromkeys(dtypes) if d in ("tf32", "3xtf32")]
    if not tags and list(dict.fromkeys(dtypes)) == ["fp32"]:
        tags = ["fp32"]
    if group_size != 4:
        tags.append(f"c{group_size}")
    return "_".join([f"op_{direction}", *tags]) + ".json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--dtypes",
        default="fp32,fp16,bf16",
        help="comma list of: fp32, tf32, 3xtf32, fp16, bf16 (with tf32 the file is op_<direction>_tf32.json)",
    )
    ap.add_argument(
        "--cs", default=None, help="comma list of c (default: 16 .. 2048; T = 2, 8: C / T, C <= 8192)"
    )
    ap.add_argument(
        "--group-size", type=int, choices=(2, 4, 8), default=4, help="2 and 8: --direction fwd only"
    )
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--prec-rows", type=int, default=4096)
    ap.add_argument("--direction", choices=("fwd", "bwd", "train"), default="fwd")
    ap.add_argument("--eager-calls", type=int, default=EAGER_CALLS, help="bwd / train: calls per sample")
    ap.add_argument(
        "--out",
        default=None,
        help="JSON file name under benchmarks/results/, the .md beside it (default: op_<direction>[_tf32|"
        "_3xtf32|_fp32].json, see default_name)",
    )
    args = ap.parse_args(argv)
    T = args.group_size
    if T != 4 and args.direction != "fwd":
        ap.error("--group-size 2 and 8: --direction fwd only (their backward is the dense form's)")
    if args.cs is None:
        args.cs = ",".join(map(str, CS if T == 4 else [C // T for C in (256, 512, 1024, 2048, 4096, 8192)]))
    if not torch.cuda.is_available() or not fe.kernels_available():
        print("bench_op needs a CUDA GPU and the built extension", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    env = environment()
    ceilings = measure_ceilings()
    M = args.batch * args.tokens
    rows = []
    for dn in args.dtypes.split(","):
        torch.backends.cuda.matmul.allow_tf32 = dn == "tf32"
        if dn == "3xtf32":
            os.environ["FLASH_EQLINEAR_FP32"] = "3xtf32"
        else:
            os.environ.pop("FLASH_EQLINEAR_FP32", None)
        for c in map(int, args.cs.split(",")):
            if args.direction == "fwd":
                r = run_case(dn, c, M, ceilings, args.prec_rows, T)
            else:
                train = args.direction == "train"
                r = run_case_bwd(dn, c, M, ceilings, args.prec_rows, train, args.eager_calls)
            rows.append(r)
            fl, ref = r["flash"], r["fourier_ref"]
            print(
                f"{dn} c={c:5d}: F.linear {r['F.linear']['ms']:.4f} ms, flash {fl['ms']:.4f} ms "
                f"({fl['speedup_vs_linear']:.2f}x), ref {ref['speedup_vs_linear']:.2f}x, "
                f"floor {r['floor_ms']:.4f} ms"
                + (f", copy {r['copy_ms']:.4f}" if "copy_ms" in r else "")
                + (f", no PDL {r['flash_no_pdl_ms']:.4f}" if "flash_no_pdl_ms" in r else "")
                + (f", portable {r['flash_portable']['ms']:.4f} ms" if "flash_portable" in r else ""),
                flush=True,
            )
            torch.cuda.empty_cache()
    kind = {"fwd": "op_forward", "bwd": "op_backward", "train": "op_train_step"}[args.direction]
    payload = {"benchmark": kind, "env": env, "ceilings": ceilings, "M": M, "group_size": T, "rows": rows}
    name = args.out or default_name(args.direction, args.dtypes.split(","), T)
    path = save_json(name, payload)
    table = markdown(rows, ceilings, env)
    path.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
