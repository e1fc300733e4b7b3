"""Host (CPU) time per call of FlashEQLinear against nn.Linear of the same shapes, in the same process.

A training step of a network whose layers are small enough is bound by the host: the Python and
dispatcher work per call, not the GPU. Each row times one call of FlashEQLinear and the same call of an
nn.Linear with identical in / out features: wall time per call over a few hundred calls after a warm-up,
without synchronising in between (``host_us``), both modules eager (no CUDA graphs). The rows are timed
in turn over several rounds (the two modules of a row alternating which goes first), so that a slow spell
of the host hits them all alike; the table gives medians over the rounds (mins in brackets) and the ratio
flash / nn.Linear. Rows:

1. inference (eval, ``torch.no_grad``), fp16 parameters and input;
2. inference, FP32;
3. training forward under bf16 autocast, FP32 parameters, an FP32 input that requires its gradient;
4. the same, forward + backward (``y.backward(gy)``, a fixed gy);
5. the chunks call under bf16 autocast in training: ``flash.forward_chunks(x, 3)`` against
   ``lin(x).chunk(3, -1)`` (separate modules with ``--chunks-out-features``, divisible by 12).

Only the public API of flash_eqlinear is used, so that the script also runs against an older checkout
of the package (copied into that checkout's benchmarks/, next to its common.py: it imports the package
of the tree it sits in).

Usage:
  python benchmarks/bench_host.py [--rows 4096 --in-features 256 --out-features 256 --calls 200 --rounds 5]
                                  [--device-rows 32768] [--json PATH]
Writes benchmarks/results/host_cost.json (the commit and GPU inside its "environment"), or PATH.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
from common import git_commit, host_us  # noqa: E402

import flash_eqlinear as fe  # noqa: E402


def inference():
    """The context of the inference rows: no gradients recorded, no autocast."""
    return torch.no_grad()


def training(dtype: torch.dtype, cache: bool):
    """A factory of the training rows' context: autocast to ``dtype`` on CUDA (gradients recorded), with
    autocast's cache of cast weights on or off. With it on (autocast's default) nn.Linear casts its weight
    once per timing, not once per call as a training step does (one call per layer per autocast region)."""
    return lambda: torch.autocast("cuda", dtype=dtype, cache_enabled=cache)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4096, help="M, rows of the input")
    ap.add_argument("--in-features", type=int, default=256, help="C = 4c")
    ap.add_argument("--out-features", type=int, default=256, help="D = 4d")
    ap.add_argument(
        "--chunks-out-features", type=int, default=768, help="D of the chunks row (divisible by 12)"
    )
    ap.add_argument("--calls", type=int, default=200, help="calls per timing")
    ap.add_argument("--rounds", type=int, default=5, help="timings per row, taken in turn with the others")
    ap.add_argument(
        "--no-autocast-cache",
        action="store_true",
        help="training rows with autocast's weight-cast cache off (each call casts, as in a training step)",
    )
    ap.add_argument(
        "--json",
        type=Path,
        default=ROOT / "results" / "host_cost.json",
        metavar="PATH",
        help="where the JSON record goes (default: benchmarks/results/host_cost.json)",
    )
    ap.add_argument(
        "--device-rows",
        type=int,
        default=0,
        metavar="M",
        help="also time single module forwards on the device (CUDA events, no graphs) at M rows, against "
        "F.linear, for fp16 / bf16 / FP32 at c = 64 and 128 (e.g. 32768)",
    )
    args = ap.parse_args(argv)
    M, C, D, D3 = args.rows, args.in_features, args.out_features, args.chunks_out_features
    if C % 4 or D % 4 or D3 % 12:
        ap.error("--in-features and --out-features must be multiples of 4, --chunks-out-features of 12")
    if not torch.cuda.is_available() or not fe.kernels_available():
        print("bench_host.py needs a CUDA device and the built flash_eqlinear kernels", file=sys.stderr)
        return 2
    dev, f16, bf16 = "cuda", torch.float16, torch.bfloat16
    amp = training(bf16, cache=not args.no_autocast_cache)
    torch.manual_seed(0)

    def pair(out_features: int, dtype: torch.dtype, train: bool) -> tuple[nn.Module, nn.Module]:
        """(FlashEQLinear, nn.Linear) with C -> out_features, parameters in dtype, in train or eval mode."""
        flash = fe.FlashEQLinear(C, out_features, device=dev, dtype=dtype)
        lin = nn.Linear(C, out_features, device=dev, dtype=dtype)
        return flash.train(train), lin.train(train)

    flash16, lin16 = pair(D, f16, train=False)
    flash32, lin32 = pair(D, torch.float32, train=False)
    flash_t, lin_t = pair(D, torch.float32, train=True)
    flash3, lin3 = pair(D3, torch.float32, train=True)
    x16 = torch.randn(M, C, device=dev, dtype=f16)
    x32 = torch.randn(M, C, device=dev)
    x32g = x32.clone().requires_grad_()
    gy = torch.randn(M, D, device=dev, dtype=bf16)

    def step(layer):
        def fn():
            layer(x32g).backward(gy)

        return fn

    # (name, context factory, flash call, nn.Linear call)
    rows = [
        ("inference (eval, no_grad), fp16", inference, lambda: flash16(x16), lambda: lin16(x16)),
        ("inference (eval, no_grad), FP32", inference, lambda: flash32(x32), lambda: lin32(x32)),
        ("training forward, bf16 autocast, FP32 x", amp, lambda: flash_t(x32g), lambda: lin_t(x32g)),
        ("training forward + backward, bf16 autocast, FP32 x", amp, step(flash_t), step(lin_t)),
    ]
    if hasattr(flash3, "forward_chunks"):
        rows.append(
            (
                f"forward_chunks(x, 3) vs lin(x).chunk(3, -1), D = {D3}, bf16 autocast training",
                amp,
                lambda: flash3.forward_chunks(x32g, 3),
                lambda: lin3(x32g).chunk(3, -1),
            )
        )
    else:
        print("FlashEQLinear.forward_chunks is missing in this checkout: the chunks row is left out")

    gpu = torch.cuda.get_device_name()
    print(f"M = {M}, C = {C}, D = {D}, {gpu}, torch {torch.__version__}, flash_eqlinear at {git_commit()}")
    flash_us: list[list[float]] = [[] for _ in rows]
    lin_us: list[list[float]] = [[] for _ in rows]
    for r in range(args.rounds):  # rows in turn, so that a slow spell of the host hits them all alike
        for tf, tl, (_, ctx, flash_fn, lin_fn) in zip(flash_us, lin_us, rows, strict=True):
            order = [(tf, flash_fn), (tl, lin_fn)]
            for times, fn in order if r % 2 == 0 else order[::-1]:
                with ctx():
                    torch.cuda.synchronize()
                    times.append(host_us(fn, args.calls))

    out = []
    print(f"\nhost us per call, median (min) over {args.rounds} rounds of {args.calls} calls")
    print("| call | flash us | nn.Linear us | ratio |\n|---|---:|---:|---:|")
    for tf, tl, (name, *_) in zip(flash_us, lin_us, rows, strict=True):
        mf, ml = statistics.median(tf), statistics.median(tl)
        ratio, ratio_min = mf / ml, min(tf) / min(tl)
        cells = f"{mf:.1f} ({min(tf):.1f}) | {ml:.1f} ({min(tl):.1f}) | {ratio:.2f} ({ratio_min:.2f})"
        print(f"| {name} | {cells} |")
        out.append(
            {
                "call": name,
                "flash_us": tf,
                "linear_us": tl,
                "flash_median_us": mf,
                "linear_median_us": ml,
                "flash_min_us": min(tf),
                "linear_min_us": min(tl),
                "ratio_median": ratio,
                "ratio_min": ratio_min,
            }
        )
    if args.device_rows:
        out += device_rows(args.device_rows)
    meta = {"gpu": gpu, "torch": torch.__version__, "commit": git_commit()}
    payload = {"environment": meta, "args": {k: str(v) for k, v in vars(args).items()}, "rows": out}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=1))
    print(f"\nwrote {args.json}")
    return 0


def device_rows(M: int, calls: int = 50) -> list[dict]:
    """Device time of single eager module forwards (eval, no_grad), each call between two CUDA events with
    no CUDA graph, so that host gaps between launches count: FlashEQLinear(4c, 4c) against F.linear with a
    dense weight of the same shape, inputs rotated over four buffers (past L2). Prints a table and returns
    its rows."""
    rows = []
    print(f"\ndevice us per single forward call (eval, no_grad), M = {M}, median of {calls}")
    print("| dtype | c | flash us | F.linear us | speedup |\n|---|---:|---:|---:|---:|")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for c in (64, 128):
            flash = fe.FlashEQLinear(4 * c, 4 * c, device="cuda", dtype=dtype).eval()
            w = torch.randn(4 * c, 4 * c, device="cuda", dtype=dtype) / (4 * c) ** 0.5
            b = torch.randn(4 * c, device="cuda", dtype=dtype)
            xs = [torch.randn(M, 4 * c, device="cuda", dtype=dtype) for _ in range(4)]
            times = {}
            linear = functools.partial(torch.nn.functional.linear, weight=w, bias=b)
            for name, fn in (("flash", flash), ("linear", linear)):
                t = []
                with torch.no_grad():
                    for i in range(calls + 5):
                        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                        start.record()
                        fn(xs[i % 4])
                        end.record()
                        end.synchronize()
                        if i >= 5:
                            t.append(start.elapsed_time(end) * 1e3)
                times[name] = statistics.median(t)
            speedup = times["linear"] / times["flash"]
            cells = f"{times['flash']:.1f} | {times['linear']:.1f} | {speedup:.2f}x"
            print(f"| {str(dtype)[6:]} | {c} | {cells} |")
            rows.append({"call": f"device forward {dtype} c={c} M={M}", **times, "speedup": speedup})
    return rows


if __name__ == "__main__":
    sys.exit(main())
