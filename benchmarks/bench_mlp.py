"""flash_eq_mlp's inference path, fused (GELU in fc1's kernel) against unfused
(FLASH_EQLINEAR_DEBUG=fused_mlp=0) and nn.Linear: one MLP and whole EQ-ViTs.

MLP: x (M, C) -> H -> C, GELU between, at the ViT-B / -L / -H shapes (M = 128 images x tokens), in
inference (no_grad; fused, unfused, plain) and training (forward + backward; flash against plain).
Network: EQ-ViT-B / -H fp16 inference, batch 128, the flash model fused and unfused beside the plain one.
Part tf32: the same in FP32 with TF32 allowed (MLP inference, networks); part portable: ViT-B's MLP and
network with the mma.sync kernel (FLASH_EQLINEAR_SM90=0), the path of sm_80 / sm_89 GPUs.
The variants alternate over --rounds rounds, each a median of CUDA-event timed calls; the lines show each
variant's best round median (all rounds in the JSON).

Usage: python benchmarks/bench_mlp.py [--parts mlp,infer,tf32,portable] [--out NAME.json]
Writes benchmarks/results/NAME.json (the commit and GPU inside its "env"); NAME without --out: bench_mlp plus
the optional parts that ran, in this order (default_name): --parts mlp,infer -> bench_mlp.json, mlp,infer,tf32
-> bench_mlp_tf32.json, the default -> bench_mlp_tf32_portable.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from bench_network import environment, time_calls  # noqa: E402
from common import debug_switch, env_switch  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear.models import eq_vit  # noqa: E402

DEV = torch.device("cuda")
MLP_SHAPES = {"ViT-B": (25216, 768, 3072), "ViT-L": (25216, 1024, 4096), "ViT-H": (32896, 1280, 5120)}


def median_ms(fn, warmup, iters) -> float:
    return statistics.median(time_calls(fn, DEV, warmup, iters))


def alternate(calls: dict, rounds: int, warmup: int, iters: int) -> dict:
    """calls: name -> (fn, fused flag); rounds of medians, the variants in turn."""
    out = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, fused) in calls.items():
            with debug_switch("fused_mlp", "1" if fused else "0"):
                out[name].append(median_ms(fn, warmup, iters))
    return out


def mlp_calls(M, C, H, dtype, train):
    g = torch.Generator(device=DEV).manual_seed(0)
    c, h = C // 4, H // 4
    x = torch.randn(M, C, device=DEV, generator=g).to(dtype).requires_grad_(train)
    w1 = (torch.randn(4, h, c, device=DEV, generator=g) / C**0.5).to(dtype).requires_grad_(train)
    b1 = torch.randn(h, device=DEV, generator=g).to(dtype).requires_grad_(train)
    w2 = (torch.randn(4, c, h, device=DEV, generator=g) / H**0.5).to(dtype).requires_grad_(train)
    b2 = torch.randn(c, device=DEV, generator=g).to(dtype).requires_grad_(train)
    lin1, lin2 = (torch.nn.Linear(i, o, device=DEV, dtype=dtype) for i, o in ((C, H), (H, C)))
    gy = torch.randn(M, C, device=DEV, generator=g).to(dtype)

    def run(fn):
        def call():
            if train:
                fn().backward(gy)
            else:
                with torch.no_grad():
                    fn()

        return call

    flash = run(lambda: fe.flash_eq_mlp(x, w1, b1, w2, b2))
    plain = run(lambda: lin2(F.gelu(lin1(x))))
    if train:  # (one path: training runs the layers and GELU as separate passes)
        return {"flash": (flash, True), "plain": (plain, True)}
    return {"flash fused": (flash, True), "flash unfused": (flash, False), "plain": (plain, True)}


def network_calls(scale, dtype):
    torch.manual_seed(0)
    x = torch.randn(128, 3, 224, 224, device=DEV, dtype=dtype)
    steps = {}
    for v in ("plain", "flash"):
        model = eq_vit(scale, v, device=DEV, dtype=dtype).eval()

        def step(model=model):
            with torch.no_grad():
                model(x)

        steps[v] = step
    return {
        "plain": (steps["plain"], True),
        "flash fused": (steps["flash"], True),
        "flash unfused": (steps["flash"], False),
    }


def default_name(parts: list[str]) -> str:
    """The result file's name without --out: bench_mlp, then _tf32 and _portable where those parts ran
    (mlp and infer add nothing)."""
    return "_".join(["bench_mlp", *(p for p in ("tf32", "portable") if p in parts)]) + ".json"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--parts",
        default="mlp,infer,tf32,portable",
        help="comma list of: mlp, infer (fp16 networks), tf32 (FP32 with TF32 allowed), portable (mma.sync)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out",
        default=None,
        help="JSON file name under benchmarks/results/ (default: bench_mlp[_tf32][_portable].json)",
    )
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    rows = []

    def record(what, times):
        best = {k: min(v) for k, v in times.items()}
        rows.append({"case": what, "ms_rounds": times, "ms": best})
        ratios = ", ".join(f"{k} {v:.3f} ms ({best['plain'] / v:.2f}x plain)" for k, v in best.items())
        print(f"{what}: {ratios}", flush=True)

    for name, (M, C, H) in MLP_SHAPES.items() if "mlp" in parts else ():
        dtype = torch.float16 if name == "ViT-H" else torch.bfloat16
        for train in (False, True):
            mode = "training" if train else "inference"
            what = f"MLP {name} (M={M}, C={C}, H={H}, {str(dtype)[6:]}) {mode}"
            record(what, alternate(mlp_calls(M, C, H, dtype, train), args.rounds, 3, 20))
    for scale in ("B", "H") if "infer" in parts else ():
        times = alternate(network_calls(scale, torch.float16), args.rounds, 3, 10)
        record(f"EQ-ViT-{scale} fp16 inference, batch 128", times)
        torch.cuda.empty_cache()
    if "tf32" in parts:  # nn.Linear follows the same switch
        torch.backends.cuda.matmul.allow_tf32 = True
        for name in ("ViT-B", "ViT-H"):
            M, C, H = MLP_SHAPES[name]
            what = f"MLP {name} (M={M}, C={C}, H={H}, float32, TF32 allowed) inference"
            record(what, alternate(mlp_calls(M, C, H, torch.float32, False), args.rounds, 3, 20))
        for scale in ("B", "H"):
            times = alternate(network_calls(scale, torch.float32), args.rounds, 3, 10)
            record(f"EQ-ViT-{scale} FP32 inference with TF32 allowed, batch 128", times)
            torch.cuda.empty_cache()
        torch.backends.cuda.matmul.allow_tf32 = False
    if "portable" in parts:  # the mma.sync kernel (the sm_80 / sm_89 path) on this GPU
        M, C, H = MLP_SHAPES["ViT-B"]
        what = f"MLP ViT-B (M={M}, C={C}, H={H}, bfloat16) inference, mma.sync kernel (FLASH_EQLINEAR_SM90=0)"
        with env_switch("FLASH_EQLINEAR_SM90", "0"):
            record(what, alternate(mlp_calls(M, C, H, torch.bfloat16, False), args.rounds, 3, 20))
            times = alternate(network_calls("B", torch.float16), args.rounds, 3, 10)
        record("EQ-ViT-B fp16 inference, batch 128, mma.sync kernel (FLASH_EQLINEAR_SM90=0)", times)
    path = Path(__file__).parent / "results" / (args.out or default_name(parts))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": environment(DEV), "args": vars(args), "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
