"""The 16-bit weight gradient and one layer's training step at the shapes of EQ-ViT-B / -L (M = 128 x 197
rows) and of bench_op (M = 32768, c = d), on a CUDA GPU.

Per shape (us per call, CUDA-graph replays, medians): the fused weight-gradient op (the Hopper kernel
where it runs, and with FLASH_EQLINEAR_SM90=0 the mma.sync kernel), the dense weight gradient of
nn.Linear (gy^T x) for scale; the whole backward op with the fused weight gradient
(FLASH_EQLINEAR_DEBUG=weight_grad=fused) and the GEMM form's (from the training forward's kept planes); the
forward and the plane-keeping training forward. The last columns add them up: one layer's forward + backward
with either method, against three dense GEMMs.
Writes benchmarks/results/weight_grad.{json,md} (--out NAME.json: NAME.{json,md}; the commit and GPU inside
the JSON's "env"). With --ab NAME=VALUE only the fused weight gradient is timed, with and without that switch
in alternating rounds (weight_grad_ab_<name>.json, or --out; NAME one of FLASH_EQLINEAR_DEBUG's names, e.g.
wgrad_swap, or a variable of its own, e.g. FLASH_EQLINEAR_SM90). With --fused-only only the fused weight
gradient, one line per shape ("<dtype> <shape> <us> us"), nothing written: what benchmarks/dev/ab_builds.sh
compares across builds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_op import graphed_ms  # noqa: E402
from common import RESULTS, environment, save_json  # noqa: E402

import flash_eqlinear  # noqa: E402, F401  (registers the ops)

VIT = 128 * 197
SHAPES = {
    "vitB-qkv": (VIT, 192, 576),
    "vitB-proj": (VIT, 192, 192),
    "vitB-fc1": (VIT, 192, 768),
    "vitB-fc2": (VIT, 768, 192),
    "vitL-qkv": (VIT, 256, 768),
    "vitL-proj": (VIT, 256, 256),
    "vitL-fc1": (VIT, 256, 1024),
    "vitL-fc2": (VIT, 1024, 256),
    "c64": (32768, 64, 64),
    "c256": (32768, 256, 256),
    "c512": (32768, 512, 512),
    "c1024": (32768, 1024, 1024),
    "c2048": (32768, 2048, 2048),
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def us(fn, sm90: str = "1", switches: dict | None = None) -> float:
    """us per call of fn, replayed from a CUDA graph captured with FLASH_EQLINEAR_SM90=sm90 and the given
    other switches (graphed_ms: FLASH_EQLINEAR_DEBUG names or variables of their own)."""
    return graphed_ms(fn, [()], {"FLASH_EQLINEAR_SM90": sm90, **(switches or {})}, min_time_s=0.15) * 1e3


def run_shape(M: int, c: int, d: int, dt: torch.dtype) -> dict:
    op = torch.ops.flash_eqlinear
    g = torch.Generator(device="cuda").manual_seed(0)
    gy = torch.randn(M, 4 * d, device="cuda", dtype=dt, generator=g)
    x = torch.randn(M, 4 * c, device="cuda", dtype=dt, generator=g)
    planes = (torch.randn(4, d, c, device="cuda", generator=g) / (4 * c) ** 0.5).to(dt)
    _, xf = op.eq_linear_fwd_xf(x, planes, None)
    r = {
        "wgrad_fused": us(lambda: op.eq_linear_bwd_weight(x, gy)),
        "wgrad_mma": us(lambda: op.eq_linear_bwd_weight(x, gy), "0"),
        "wgrad_dense": us(lambda: torch.mm(gy.t(), x)),
        "bwd_fused": us(
            lambda: op.eq_linear_bwd(gy, x, planes, True, True, True), switches={"weight_grad": "fused"}
        ),
        "bwd_gemm": us(lambda: op.eq_linear_bwd_xf(gy, xf, planes, True, True, True)),
        "fwd": us(lambda: op.eq_linear_fwd(x, planes, None)),
        "fwd_xf": us(lambda: op.eq_linear_fwd_xf(x, planes, None)),
    }
    r["wgrad_fused_tflops"] = 12 * M * c * d / r["wgrad_fused"] / 1e6
    r["train_fused"] = r["fwd"] + r["bwd_fused"]
    r["train_gemm"] = r["fwd_xf"] + r["bwd_gemm"]
    r["train_dense"] = 3 * r["wgrad_dense"]
    return r


def wgrad_inputs(shapes: list[str], dtypes: list[str]):
    """Per dtype and shape: (dtype name, shape name, (M, c, d), x, grad_y), seeded."""
    for dname in dtypes:
        for shape in shapes:
            M, c, d = SHAPES[shape]
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(M, 4 * c, device="cuda", dtype=DTYPES[dname], generator=g)
            gy = torch.randn(M, 4 * d, device="cuda", dtype=DTYPES[dname], generator=g)
            yield dname, shape, (M, c, d), x, gy


def ab_rows(switch: str, shapes: list[str], dtypes: list[str], rounds: int = 3) -> list[dict]:
    """The fused weight gradient with and without the switch NAME=VALUE, in alternating rounds (the switch
    holds while each graph is captured, which is when the kernels read it): us per call, medians."""
    name, value = switch.split("=", 1)
    op = torch.ops.flash_eqlinear.eq_linear_bwd_weight
    rows = []
    for dname, shape, (M, c, d), x, gy in wgrad_inputs(shapes, dtypes):
        base, switched = [], []
        for _ in range(rounds):
            base.append(us(lambda: op(x, gy)))  # noqa: B023
            switched.append(us(lambda: op(x, gy), switches={name: value}))  # noqa: B023
        r = {"dtype": dname, "shape": shape, "M": M, "c": c, "d": d, "switch": switch}
        r.update(default_us=statistics.median(base), switched_us=statistics.median(switched))
        r["ratio"] = r["switched_us"] / r["default_us"]
        print(
            f"{dname} {shape}: default {r['default_us']:.1f} us, {switch} {r['switched_us']:.1f} us, "
            f"ratio {r['ratio']:.3f}",
            flush=True,
        )
        rows.append(r)
    return rows


def fused_times(shapes: list[str], dtypes: list[str], rounds: int = 3) -> None:
    """Prints the fused weight gradient's us per call per shape (median of `rounds` graphed timings)."""
    op = torch.ops.flash_eqlinear.eq_linear_bwd_weight
    for dname, shape, _, x, gy in wgrad_inputs(shapes, dtypes):
        t = statistics.median(us(lambda: op(x, gy)) for _ in range(rounds))  # noqa: B023
        print(f"{dname} {shape} {t:.1f} us", flush=True)


def markdown(rows: list[dict], env: dict) -> str:
    out = [
        f"# Weight gradient and one layer's training step: {env['gpu']}, torch {env['torch']}, "
        f"commit {env['commit']}",
        "",
        "us per call. wgrad: fused (Hopper kernel where it runs) / mma.sync / dense gy^T x; train: forward"
        " + backward with the fused weight gradient / with the GEMM form (plane-keeping forward) / 3 dense"
        " GEMMs.",
        "",
        "| dtype | shape | M, c, d | wgrad fused | TFLOP/s | wgrad mma | wgrad dense | train fused |"
        " train gemm | train dense |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['dtype']} | {r['shape']} | {r['M']}, {r['c']}, {r['d']} | {r['wgrad_fused']:.1f} | "
            f"{r['wgrad_fused_tflops']:.0f} | {r['wgrad_mma']:.1f} | {r['wgrad_dense']:.1f} | "
            f"{r['train_fused']:.1f} | {r['train_gemm']:.1f} | {r['train_dense']:.1f} |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of: {', '.join(SHAPES)}")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument(
        "--ab",
        default=None,
        metavar="NAME=VALUE",
        help="only the fused weight gradient, with and without this switch (a FLASH_EQLINEAR_DEBUG name, "
        "e.g. wgrad_swap=1, or a variable, e.g. FLASH_EQLINEAR_SM90=0)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON file name under benchmarks/results/ (default: weight_grad.json, with --ab "
        "weight_grad_ab_<name>.json)",
    )
    ap.add_argument(
        "--fused-only", action="store_true", help="only the fused weight gradient, printed per shape"
    )
    args = ap.parse_args(argv)
    if args.ab is not None and "=" not in args.ab:
        ap.error("--ab takes NAME=VALUE")
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 1
    if args.fused_only:
        fused_times(args.shapes.split(","), args.dtypes.split(","))
        return 0
    env = environment()
    if args.ab is not None:
        rows = ab_rows(args.ab, args.shapes.split(","), args.dtypes.split(","))
        tag = args.ab.split("=", 1)[0].removeprefix("FLASH_EQLINEAR_").lower()
        path = save_json(args.out or f"weight_grad_ab_{tag}.json", {"env": env, "rows": rows})
        print(f"wrote {path}")
        return 0
    rows = []
    for dname in args.dtypes.split(","):
        for name in args.shapes.split(","):
            M, c, d = SHAPES[name]
            r = {"dtype": dname, "shape": name, "M": M, "c": c, "d": d, **run_shape(M, c, d, DTYPES[dname])}
            rows.append(r)
            times = ", ".join(f"{k} {v:.1f}" for k, v in r.items() if isinstance(v, float))
            print(f"{dname} {name}: {times}", flush=True)
    path = save_json(args.out or "weight_grad.json", {"env": env, "rows": rows})
    md = markdown(rows, env)
    path.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {path} and {path.with_suffix('.md').relative_to(RESULTS.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
