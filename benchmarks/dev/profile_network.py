"""Where a network's time goes, per variant: device time per step grouped by kind of kernel.

For one model and scale, each variant (plain, naive, flash) runs a few warm-up steps, then
``--steps`` steps under ``torch.profiler``; the kernels' device time is summed per category
(EQ-Linear kernels, cuBLAS GEMMs, attention, LayerNorm, elementwise, copies / gathers, reductions,
optimizer, convolution, other) and reported in milliseconds per step, next to the variants'
differences and each variant's most expensive kernels. Step = a training step (forward, backward,
AdamW) under bf16 autocast (``--mode train``) or an inference forward (``--mode infer``, ``--dtype``
fp32 / tf32 / fp16); ``--compile`` wraps each model in ``torch.compile`` first.

Usage:
  python benchmarks/dev/profile_network.py --model vit --scale B --mode train
  python benchmarks/dev/profile_network.py --model swin --scale B --mode infer --dtype fp16
  python benchmarks/dev/profile_network.py --dry-run  # tiny models on CPU (CPU op time): checks the script
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent  # benchmarks/
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
import bench_network as bn  # noqa: E402
from common import save_json  # noqa: E402

# First match wins: (category, pattern on the kernel / op name, case-insensitive).
CATEGORIES = [
    ("eq-linear", r"eq_linear|group_dft|group_idft|flash_eqlinear"),
    ("optimizer", r"multi_tensor|adam|_foreach"),
    ("inductor", r"^triton_"),  # Inductor's generated kernels (--compile): fused pointwise, norms, casts
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("layernorm", r"layer_?norm"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|addmm|aten::mm|matmul|linear|bmm"),
    ("conv", r"conv|implicit"),
    ("copy/gather", r"copy|cat|gather|scatter|index|roll|flip|stack|clone|transpose|permute"),
    ("reduction", r"reduce|sum|mean"),
    ("elementwise", r"elementwise|add|mul|gelu|fill|neg|cast|div|sub"),
]
ORDER = [c for c, _ in CATEGORIES] + ["other"]


def category(name: str) -> str:
    for cat, pat in CATEGORIES:
        if re.search(pat, name, re.IGNORECASE):
            return cat
    return "other"


def kernel_times(prof, device: torch.device) -> dict[str, float]:
    """Self time (microseconds, summed over the profiled steps) per kernel name on the device (CUDA:
    kernels; CPU: aten ops' self CPU time)."""
    out: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        if device.type == "cuda":
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = e.self_cuda_time_total
            if t and e.device_type == torch.autograd.DeviceType.CUDA:
                out[e.key] += t
        elif e.self_cpu_time_total and e.key.startswith("aten::"):
            out[e.key] += e.self_cpu_time_total
    return out


def make_step(model, args, device):
    S = bn.img_size(args.model, args)
    x = torch.randn(args.batch, 3, S, S, device=device)
    if args.mode == "infer":
        model.eval()
        if args.dtype == "fp16":
            model.half()
            x = x.half()

        def step():
            with torch.inference_mode():
                model(x)

        return step
    y = torch.randint(0, args.num_classes, (args.batch,), device=device)
    return bn.training_step(model, x, y, device)


def profile_variant(variant: str, args, device) -> dict:
    torch.manual_seed(0)
    model = bn.build(args.model, args.scale, variant, args, device)
    if args.compile:
        torch._dynamo.reset()  # each variant compiles afresh
        model = torch.compile(model)
    step = make_step(model, args, device)
    for _ in range(args.warmup):
        step()
    bn._sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(args.steps):
            step()
        bn._sync(device)
    per_kernel = {k: v / args.steps / 1e3 for k, v in kernel_times(prof, device).items()}  # ms per step
    cats: dict[str, float] = defaultdict(float)
    for k, ms in per_kernel.items():
        cats[category(k)] += ms
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[: args.top]
    del model, step
    bn.free(device)
    return {"variant": variant, "ms_per_step": dict(cats), "total_ms": sum(cats.values()), "top": top}


def table(recs: list[dict]) -> str:
    names = [r["variant"] for r in recs]
    lines = ["| category | " + " | ".join(f"{n} ms" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for cat in ORDER + ["total"]:
        vals = [r["total_ms"] if cat == "total" else r["ms_per_step"].get(cat, 0.0) for r in recs]
        if cat != "total" and not any(vals):
            continue
        lines.append(f"| {cat} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    for r in recs:
        lines += ["", f"Top kernels, {r['variant']} (ms per step):"]
        lines += [f"  {ms:8.3f}  {category(k):12s} {k[:110]}" for k, ms in r["top"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="vit", choices=sorted(bn.MODELS))
    ap.add_argument("--scale", default="B", choices=list(bn.SCALES))
    ap.add_argument("--variants", default=",".join(bn.VARIANTS))
    ap.add_argument("--mode", default="train", choices=("train", "infer"))
    ap.add_argument("--dtype", default="fp16", choices=("fp32", "tf32", "fp16"), help="inference dtype")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=12, help="kernels listed per variant")
    ap.add_argument("--compile", action="store_true", help="each model wrapped in torch.compile")
    ap.add_argument("--dry-run", action="store_true", help="tiny models on CPU, batch 2")
    args = ap.parse_args(argv)
    variants = bn._csv(args.variants)
    bad = [v for v in variants if v not in bn.VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {bad}; choose from {list(bn.VARIANTS)}")
    if args.dry_run:
        args.batch, args.warmup, args.steps = 2, 1, 1
    device = bn.pick_device(args.dry_run)
    if device is None:
        return 2
    tf32 = args.mode == "infer" and args.dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    recs = []
    for v in variants:
        recs.append(profile_variant(v, args, device))
        print(
            f"{args.model}-{args.scale} {args.mode} {v}: {recs[-1]['total_ms']:.3f} ms of kernels per step",
            flush=True,
        )
    out = table(recs)
    print(out)
    if not args.dry_run:
        tag = f"{args.model}{args.scale}_{args.mode}{'' if args.mode == 'train' else '_' + args.dtype}"
        tag += "_compiled" if args.compile else ""
        env = bn.environment(device)
        path = save_json(f"profile_net_{tag}.json", {"env": env, "args": vars(args), "rows": recs})
        path.with_suffix(".md").write_text(out + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
