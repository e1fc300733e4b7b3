"""Network benchmark: EQ-ViT and EQ-Swin at five scales, plain vs naive vs flash.

For each model (vit, swin), scale (T, S, B, L, H) and variant (plain: nn.Linear; naive:
NaiveEQLinear; flash: FlashEQLinear) it records:

* parameters;
* FLOPs per image: torch.utils.flop_counter.FlopCounterMode for everything outside the linear
  layers (convolution, attention), plus the linear layers counted analytically from the shapes
  they see: 2*M*C*D for nn.Linear and NaiveEQLinear (which runs the dense expansion), 6/16 of
  that for FlashEQLinear with T = 4 (the group transforms' additions are not counted). Both the
  executed count and the dense-equivalent count are stored;
* inference latency (median of CUDA-event timed forwards after warm-up) and throughput, batch
  128 at 224x224, in FP32 (TF32 off), optionally FP32 with TF32 allowed (--dtypes tf32), FP16
  (the model cast to half) and FP32 under bf16 autocast (--dtypes amp), under inference_mode;
* the time spent in all linear layers and its share of the forward: a second timed pass with CUDA
  events recorded by forward pre/post hooks around every linear layer (also per layer name:
  qkv, proj, fc1, fc2, reduction, head). The flash models' MLPs run their layers one by one in
  that pass (a fused ``flash_eq_mlp`` call would skip the hooks): it times the layers without the
  GELU that the first pass fuses into fc1;
* a training step (forward, backward, AdamW step) under bf16 autocast for ViT-B and ViT-L
  (``--train``): median step time, images/s and peak memory; eager, and with ``--train-modes``
  also with every variant's model wrapped in ``torch.compile`` (Inductor fuses the pointwise ops,
  LayerNorm and casts around the linear layers; cuBLAS and our kernels stay as they are).

A progress line per measurement; at the end a JSON record (env: GPU, torch, CUDA, git commit), a
markdown table and a PNG of the inference ratios under benchmarks/results/, all three with the stem of
--out, or without it (default_name): net, then _infer_<dtypes> where inference ran, then
_<trained models>_train where training ran, with _eager or _compiled where only that mode ran, then
_<--tag>. E.g. --dtypes fp16 --train '' -> net_infer_fp16.json; --no-inference --train vit-B,vit-L
--train-modes eager,compiled -> net_vit_train.json; the same with --train-modes eager ->
net_vit_train_eager.json; the defaults -> net_infer_fp32-fp16_vit_train_eager.json.

Usage:
  python benchmarks/bench_network.py                       # everything (about 10-15 min on an H100)
  python benchmarks/bench_network.py --models vit --scales B,L --variants naive,flash --dtypes fp16
  python benchmarks/bench_network.py --train vit-B --no-inference
  python benchmarks/bench_network.py --train vit-B --no-inference --train-modes eager,compiled
  python benchmarks/bench_network.py --dry-run             # tiny models on CPU: checks the script
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
sys.path.insert(0, str(ROOT.parent))  # run from a checkout without installing
sys.path.insert(0, str(ROOT))
from common import git_commit  # noqa: E402

import flash_eqlinear as fe  # noqa: E402
from flash_eqlinear.models import MODELS, SCALES, VARIANTS, is_linear_layer  # noqa: E402

# "tf32": the FP32 model with TF32 allowed for matmuls and convolutions (what many FP32 users run)
# "amp": FP32 parameters and input, the forward under bf16 autocast (the casts are then part of each call).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "amp": torch.float32}
# Training steps run as written ("eager") or with the model wrapped in torch.compile ("compiled").
TRAIN_MODES = ("eager", "compiled")
# Fraction of the dense multiply-adds a FlashEQLinear performs, by group size (6/16 for p4).
FLASH_MAC_FRACTION = {4: 6 / 16}
# Tiny configs for --dry-run (CPU): same code paths, seconds instead of minutes.
DRY_CONFIGS = {
    "vit": dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2),
    "swin": dict(img_size=32, patch_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4),
}


# ------------------------------------------------------------------------------------ environment


def environment(device: torch.device) -> dict:
    env = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": git_commit(),
        "kernels_available": fe.kernels_available(),
        "backend": fe.ops.BACKEND,
        "allow_tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "allow_tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(
            gpu=p.name,
            capability=f"{p.major}.{p.minor}",
            sm_count=p.multi_processor_count,
            memory_gb=round(p.total_memory / 2**30, 1),
            cudnn=torch.backends.cudnn.version(),
        )
    else:
        env.update(gpu="none (CPU: " + (platform.processor() or platform.machine()) + ")")
    return env


# ----------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stamp:
    """A point in time on the device's timeline: a CUDA event, or perf_counter on the CPU."""

    __slots__ = ("ev", "t")

    def __init__(self, device: torch.device):
        if device.type == "cuda":
            self.ev = torch.cuda.Event(enable_timing=True)
            self.ev.record()
        else:
            self.ev, self.t = None, time.perf_counter()

    def ms_until(self, later: Stamp) -> float:
        if self.ev is not None:
            return self.ev.elapsed_time(later.ev)
        return (later.t - self.t) * 1e3


def time_calls(fn, device: torch.device, warmup: int, iters: int) -> list[float]:
    """Milliseconds of each of ``iters`` calls, after ``warmup`` calls (CUDA events on GPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    stamps = []
    for _ in range(iters):
        a = Stamp(device)
        fn()
        stamps.append((a, Stamp(device)))
    _sync(device)
    return [a.ms_until(b) for a, b in stamps]


def _kind(name: str) -> str:
    return name.rsplit(".", 1)[-1] or name


@contextmanager
def linear_hooks(model: nn.Module, pre, post):
    handles = []
    for name, m in model.named_modules():
        if name and is_linear_layer(m):
            handles.append(m.register_forward_pre_hook(lambda mod, inp, _n=name: pre(_n, mod, inp)))
            handles.append(m.register_forward_hook(lambda mod, inp, out, _n=name: post(_n, mod, inp, out)))
    try:
        yield len(handles) // 2
    finally:
        for h in handles:
            h.remove()


def time_linear_layers(model, x, device, warmup: int, iters: int) -> dict:
    """Per forward: total ms and ms inside linear layers (hook-recorded stamps), medians."""
    calls: list[list] = []
    open_: dict[str, Stamp] = {}

    def pre(name, mod, inp):
        open_[name] = Stamp(device)

    def post(name, mod, inp, out):
        calls[-1].append((name, open_.pop(name), Stamp(device)))

    passes = []
    with linear_hooks(model, pre, post) as n_layers:
        for i in range(warmup + iters):
            calls.append([])
            a = Stamp(device)
            model(x)
            b = Stamp(device)
            if i >= warmup:
                passes.append((a, b, calls[-1]))
            if i == warmup - 1:
                _sync(device)
        _sync(device)
    totals, linears, by_kind = [], [], defaultdict(list)
    for a, b, cs in passes:
        totals.append(a.ms_until(b))
        per_kind = defaultdict(float)
        for name, s, e in cs:
            per_kind[_kind(name)] += s.ms_until(e)
        linears.append(sum(per_kind.values()))
        for k, v in per_kind.items():
            by_kind[k].append(v)
    shares = [lin / tot for lin, tot in zip(linears, totals, strict=True)]
    return {
        "n_linear_layers": n_layers,
        "hooked_total_ms": statistics.median(totals),
        "linear_ms": statistics.median(linears),
        "linear_share": statistics.median(shares),
        "linear_ms_by_kind": {k: statistics.median(v) for k, v in sorted(by_kind.items())},
    }


# ------------------------------------------------------------------------------------------ FLOPs

# The CUDA SDPA kernels have flop formulas; the CPU flash kernel (used by --dry-run) may not.
_CPU_SDPA = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
if _CPU_SDPA is not None and _CPU_SDPA.default not in flop_counter.flop_registry:

    @flop_counter.register_flop_formula(_CPU_SDPA)
    def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(model: nn.Module, x: torch.Tensor) -> dict:
    """FLOPs of one forward of ``x``: counted ops outside the linear layers + analytic linears."""
    lin = {"dense": 0, "executed": 0, "counted_inside": 0}
    starts = {}
    with FlopCounterMode(display=False) as fc:

        def pre(name, mod, inp):
            starts[name] = fc.get_total_flops()

        def post(name, mod, inp, out):
            lin["counted_inside"] += fc.get_total_flops() - starts.pop(name)
            rows = out.numel() // out.shape[-1]
            dense = 2 * rows * inp[0].shape[-1] * out.shape[-1]
            frac = FLASH_MAC_FRACTION.get(mod.group_size, 1.0) if isinstance(mod, fe.FlashEQLinear) else 1.0
            lin["dense"] += dense
            lin["executed"] += dense * frac

        with linear_hooks(model, pre, post), torch.no_grad():
            model(x)
    other = fc.get_total_flops() - lin["counted_inside"]
    by_op = {str(op): n for op, n in fc.get_flop_counts().get("Global", {}).items()}
    return {
        "flops": other + lin["executed"],
        "flops_dense": other + lin["dense"],
        "linear_flops": lin["executed"],
        "linear_flops_dense": lin["dense"],
        "other_flops": other,
        "counted_ops": by_op,
    }


# ------------------------------------------------------------------------------------ experiments


# "swapped": the naive model after swap_eq_linear's default swap (the fused kernels on the naive parameters)
BENCH_VARIANTS = (*VARIANTS, "swapped")


def build(kind: str, scale: str, variant: str, args, device) -> nn.Module:
    factory = MODELS[kind]
    base = "naive" if variant == "swapped" else variant
    G = args.group_size
    if args.dry_run:  # tiny config, whatever the scale label
        model = factory(
            None, base, num_classes=args.num_classes, device=device, group_size=G, **DRY_CONFIGS[kind]
        )
    else:
        model = factory(
            scale, base, num_classes=args.num_classes, img_size=args.img, device=device, group_size=G
        )
    if variant == "swapped":
        fe.swap_eq_linear(model)
    return model


def img_size(kind: str, args) -> int:
    return DRY_CONFIGS[kind]["img_size"] if args.dry_run else args.img


def free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_inference(kind, scale, variant, args, device) -> dict:
    rec = {"model": kind, "scale": scale, "variant": variant, "batch": args.batch, "dry_run": args.dry_run}
    rec["group_size"] = 1 if variant == "plain" else args.group_size
    rec["img"] = img_size(kind, args)
    torch.manual_seed(0)
    model = build(kind, scale, variant, args, device).eval()
    rec["params"] = sum(p.numel() for p in model.parameters())
    S = rec["img"]
    rec.update(count_flops(model, torch.randn(1, 3, S, S, device=device)))
    for dname in args.dtypes:
        dt = DTYPES[dname]
        model.to(dt)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dname == "tf32"
        try:
            x = torch.randn(args.batch, 3, S, S, device=device, dtype=dt)
            amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=dname == "amp")
            with torch.inference_mode(), amp:
                ms = time_calls(lambda: model(x), device, args.warmup, args.iters)  # noqa: B023
                lin = time_linear_layers(model, x, device, min(args.warmup, 3), args.linear_iters)
            lat = statistics.median(ms)
            rec[dname] = {
                "latency_ms": lat,
                "latency_ms_min": min(ms),
                "throughput_img_s": args.batch / lat * 1e3,
                "tflops": rec["flops"] * args.batch / lat / 1e9,
                **lin,
            }
        except torch.OutOfMemoryError as e:
            rec[dname] = {"error": f"out of memory: {str(e).splitlines()[0]}"}
        finally:
            x = None
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            free(device)
    model = None
    free(device)
    return rec


def bench_training(kind, scale, variant, mode, args, device) -> dict:
    S = img_size(kind, args)
    rec = {
        "model": kind,
        "scale": scale,
        "variant": variant,
        "group_size": 1 if variant == "plain" else args.group_size,
        "mode": mode,
        "batch": args.train_batch,
        "img": S,
        "autocast": "bf16",
        "optimizer": "AdamW",
        "dry_run": args.dry_run,
    }
    torch.manual_seed(0)
    model = build(kind, scale, variant, args, device)
    cuda = device.type == "cuda"
    x = torch.randn(args.train_batch, 3, S, S, device=device)
    y = torch.randint(0, args.num_classes, (args.train_batch,), device=device)
    if mode == "compiled":
        torch._dynamo.reset()  # each job compiles afresh (no recompile limit reached, no graphs kept)
        model = torch.compile(model)
    step = training_step(model, x, y, device)
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        ms = time_calls(step, device, args.train_warmup, args.train_iters)
        lat = statistics.median(ms)
        # The host's time to issue a step (from an idle device, up to the last call's return): where it
        # exceeds the device's step time, the step is bound by the host.
        host = []
        for _ in range(args.train_iters):
            _sync(device)
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e3)
        _sync(device)
        rec.update(
            host_ms=statistics.median(host),
            host_ms_min=min(host),
            step_ms=lat,
            step_ms_min=min(ms),
            throughput_img_s=args.train_batch / lat * 1e3,
            peak_memory_gb=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        )
    except torch.OutOfMemoryError as e:
        rec["error"] = f"out of memory: {str(e).splitlines()[0]}"
    finally:
        model = step = x = y = None
        free(device)
    return rec


def training_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device):
    """A callable running one training step of ``model`` on (x, y): forward and cross-entropy under
    bf16 autocast, backward, AdamW (fused on CUDA). ``model`` may be a ``torch.compile`` wrapper (its
    parameters are the model's)."""
    model.train()
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, **fused)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


# ---------------------------------------------------------------------------------------- report


def _f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def _speedup(records, rec, key_path, base_variant):
    base = next(
        (
            r
            for r in records
            if r["model"] == rec["model"]
            and r["scale"] == rec["scale"]
            and r["variant"] == base_variant
            and r.get("mode") == rec.get("mode")  # training: eager against eager, compiled against compiled
        ),
        None,
    )

    def get(r):
        for k in key_path:
            r = (r or {}).get(k)
        return r

    a, b = get(rec), get(base)
    return None if a is None or b is None else b / a


def progress_inference(rec) -> str:
    parts = [
        f"{rec['model']}-{rec['scale']} {rec['variant']:5s} params {rec['params'] / 1e6:7.2f}M "
        f"{rec['flops'] / 1e9:7.2f} GFLOP/img"
    ]
    for d in DTYPES:
        r = rec.get(d)
        if r is None:
            continue
        if "error" in r:
            parts.append(f"{d}: {r['error']}")
        else:
            parts.append(
                f"{d} {r['latency_ms']:8.2f} ms {r['throughput_img_s']:8.1f} img/s "
                f"linear {r['linear_ms']:7.2f} ms ({100 * r['linear_share']:4.1f}%)"
            )
    return " | ".join(parts)


def markdown(payload: dict) -> str:
    env = payload["env"]
    lines = [f"# Network benchmark: {env.get('gpu')}, torch {env['torch']}, commit {env['commit']}", ""]
    if payload["args"].get("dry_run"):
        lines += ["**Dry run**: tiny configs on CPU (scale labels only name the selection).", ""]
    inf = payload["inference"]
    if inf:
        dts = [d for d in DTYPES if any(d in r for r in inf)]
        head = "| model | variant | params (M) | GFLOP/img (dense) |"
        sep = "|---|---|---:|---:|"
        for d in dts:
            head += f" {d} ms | {d} img/s | {d} linear ms (share) | {d} vs naive | {d} vs plain |"
            sep += "---:|---:|---:|---:|---:|"
        S = inf[0]["img"]
        lines += [
            f"Inference, batch {inf[0]['batch']}, {S}x{S}; median of CUDA-event timed forwards; "
            "linear time from hook-recorded events (second pass).",
            "",
            head,
            sep,
        ]
        for r in inf:
            row = (
                f"| {r['model']}-{r['scale']} | {r['variant']} | {r['params'] / 1e6:.2f} | "
                f"{r['flops'] / 1e9:.2f} ({r['flops_dense'] / 1e9:.2f}) |"
            )
            for d in dts:
                m = r.get(d, {})
                if "error" in m or not m:
                    row += f" {m.get('error', '-')} | | | | |"
                    continue
                row += (
                    f" {m['latency_ms']:.2f} | {m['throughput_img_s']:.1f} | {m['linear_ms']:.2f} "
                    f"({100 * m['linear_share']:.1f}%) | "
                    f"{_f(_speedup(inf, r, (d, 'latency_ms'), 'naive'), '{:.2f}x')} | "
                    f"{_f(_speedup(inf, r, (d, 'latency_ms'), 'plain'), '{:.2f}x')} |"
                )
            lines.append(row)
        lines.append("")
    tr = payload["training"]
    if tr:
        lines += [
            f"Training step (forward + backward + AdamW), bf16 autocast, batch {tr[0]['batch']}.",
            "",
            "| model | variant | mode | step ms | host ms | img/s | peak mem (GB) | vs naive | vs plain |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in tr:
            head = f"| {r['model']}-{r['scale']} | {r['variant']} | {r.get('mode', 'eager')} |"
            if "error" in r:
                lines.append(f"{head} {r['error']} | | | | | |")
                continue
            lines.append(
                f"{head} {r['step_ms']:.2f} | {_f(r.get('host_ms'))} | "
                f"{r['throughput_img_s']:.1f} | {_f(r['peak_memory_gb'])} | "
                f"{_f(_speedup(tr, r, ('step_ms',), 'naive'), '{:.2f}x')} | "
                f"{_f(_speedup(tr, r, ('step_ms',), 'plain'), '{:.2f}x')} |"
            )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------- main


def _csv(s: str) -> list[str]:
    return [t.strip() for t in s.split(",") if t.strip()]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="vit,swin", help="comma list of: vit, swin")
    ap.add_argument("--scales", default=",".join(SCALES), help="comma list of: T, S, B, L, H")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma list of: " + ", ".join(BENCH_VARIANTS)
    )
    ap.add_argument(
        "--dtypes", default="fp32,fp16", help="inference dtypes: fp32, tf32, fp16, amp (FP32, bf16 autocast)"
    )
    ap.add_argument(
        "--group-size",
        type=int,
        default=4,
        help="group size of the equivariant models: 4 (p4) or 8 (C8; off the fused kernels, which are p4's)",
    )
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20, help="timed forwards per measurement")
    ap.add_argument("--linear-iters", type=int, default=10, help="timed forwards of the hooked pass")
    ap.add_argument("--no-inference", action="store_true")
    ap.add_argument("--train", default="vit-B,vit-L", help="model-scale list for training steps ('' = none)")
    ap.add_argument("--train-batch", type=int, default=128)
    ap.add_argument("--train-warmup", type=int, default=3)
    ap.add_argument("--train-iters", type=int, default=10)
    ap.add_argument(
        "--train-modes",
        default="eager",
        help="comma list of: eager, compiled (each model wrapped in torch.compile; warm-up compiles)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="JSON file name under benchmarks/results/, the .md and .png beside it (default: default_name)",
    )
    ap.add_argument("--tag", default="", help="appended to the default name (e.g. cast0 -> ..._cast0.json)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny models on CPU, batch 2, 1 warm-up, 2 iterations; writes to a temp dir",
    )
    args = ap.parse_args(argv)
    args.models, args.scales, args.variants = _csv(args.models), _csv(args.scales), _csv(args.variants)
    args.dtypes, args.train, args.train_modes = _csv(args.dtypes), _csv(args.train), _csv(args.train_modes)
    for name, vals, allowed in (
        ("models", args.models, MODELS),
        ("scales", args.scales, SCALES),
        ("variants", args.variants, BENCH_VARIANTS),
        ("dtypes", args.dtypes, DTYPES),
        ("train-modes", args.train_modes, TRAIN_MODES),
    ):
        bad = [v for v in vals if v not in allowed]
        if bad:
            ap.error(f"--{name}: unknown {bad}; choose from {list(allowed)}")
    for t in args.train:
        kind, _, scale = t.partition("-")
        if kind not in MODELS or scale not in SCALES:
            ap.error(f"--train: {t!r} is not MODEL-SCALE (e.g. vit-B)")
    if args.dry_run:
        args.scales = args.scales[:1]
        args.train = args.train[:1]
        args.batch = args.train_batch = 2
        args.warmup = args.train_warmup = 1
        args.iters = args.linear_iters = args.train_iters = 2
    return args


def default_name(args) -> str:
    """The result file's name without --out: net, _infer_<dtypes joined by '-'> where inference ran,
    _<models of --train>_train where training ran (_eager / _compiled added where only that mode ran),
    _c<G> for a group size other than 4, _<tag> where --tag is set: net_infer_fp32.json,
    net_infer_fp16.json, net_vit_train.json (eager and compiled), net_vit_train_eager.json,
    net_swin_train_eager.json, net_vit_train_eager_c8.json, ..."""
    parts = ["net"]
    if not args.no_inference and args.models and args.scales and args.variants:
        parts += ["infer", "-".join(args.dtypes)]
    if args.train:
        parts += ["-".join(dict.fromkeys(t.partition("-")[0] for t in args.train)), "train"]
        modes = list(dict.fromkeys(args.train_modes))
        if len(modes) == 1:
            parts.append(modes[0])
    if args.group_size != 4:
        parts.append(f"c{args.group_size}")
    if args.tag:
        parts.append(args.tag)
    return "_".join(parts) + ".json"


def plot(payload: dict, path: Path) -> Path | None:
    """PNG: inference throughput of naive and flash over plain, per model and scale, per dtype."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG written", flush=True)
        return None
    recs = [r for r in payload["inference"] if "error" not in r]
    names = list(dict.fromkeys(f"{r['model']}-{r['scale']}" for r in recs))
    dtypes = [dt for dt in DTYPES if any(dt in r for r in recs)]
    if not names or not dtypes:
        return None
    fig, axes = plt.subplots(1, len(dtypes), figsize=(1.2 * len(names) + 3, 4), squeeze=False)
    for ax, dt in zip(axes[0], dtypes, strict=True):
        for k, variant in enumerate(("naive", "flash")):
            vals = []
            for name in names:
                by = {r["variant"]: r for r in recs if f"{r['model']}-{r['scale']}" == name and dt in r}
                ok = "plain" in by and variant in by
                vals.append(
                    by[variant][dt]["throughput_img_s"] / by["plain"][dt]["throughput_img_s"] if ok else 0
                )
            ax.bar([i + 0.4 * k for i in range(len(names))], vals, width=0.4, label=variant)
        ax.axhline(1.0, color="gray", lw=1, ls="--", label="plain (nn.Linear)")
        ax.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=30)
        ax.set_ylabel("inference throughput / plain")
        ax.set_title(f"{dt}, {payload['env'].get('gpu', '')}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=120)
    return out


def pick_device(dry_run: bool) -> torch.device | None:
    """CPU for a dry run, else the CUDA device; None (after saying why) when there is none."""
    if dry_run:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print("error: no CUDA device (use --dry-run to check the script on CPU)", file=sys.stderr)
        return None
    return torch.device("cuda")


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.dry_run)
    if device is None:
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # FP32 means FP32
    torch.backends.cudnn.allow_tf32 = False
    env = environment(device)
    print(json.dumps(env), flush=True)
    if device.type == "cuda" and not fe.kernels_available():
        print(
            f"warning: fused kernels unavailable ({fe.ops.kernel_import_error()}); flash uses the "
            "reference path",
            flush=True,
        )

    payload = {"env": env, "args": vars(args), "inference": [], "training": []}
    jobs = [(k, s, v) for k in args.models for s in args.scales for v in args.variants]
    jobs = [] if args.no_inference else jobs
    train_jobs = [
        (*t.split("-", 1), v, m) for m in args.train_modes for t in args.train for v in args.variants
    ]
    n, t0 = len(jobs) + len(train_jobs), time.time()
    for i, (kind, scale, variant) in enumerate(jobs, 1):
        rec = bench_inference(kind, scale, variant, args, device)
        payload["inference"].append(rec)
        print(f"[{i}/{n} {time.time() - t0:6.0f}s] {progress_inference(rec)}", flush=True)
    for i, (kind, scale, variant, mode) in enumerate(train_jobs, len(jobs) + 1):
        rec = bench_training(kind, scale, variant, mode, args, device)
        payload["training"].append(rec)
        msg = rec.get("error") or (
            f"step {rec['step_ms']:8.2f} ms {rec['throughput_img_s']:8.1f} img/s "
            f"peak {_f(rec['peak_memory_gb'])} GB"
        )
        what = f"train {kind}-{scale} {variant:5s} {mode:8s}"
        print(f"[{i}/{n} {time.time() - t0:6.0f}s] {what} {msg}", flush=True)

    if args.out:
        path = RESULTS / args.out
    elif args.dry_run:
        path = Path(tempfile.gettempdir()) / f"dryrun_{default_name(args)}"
    else:
        path = RESULTS / default_name(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    table = markdown(payload)
    path.with_suffix(".md").write_text(table)
    print(table)
    png = plot(payload, path)
    print(f"wrote {path}, {path.with_suffix('.md')}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
