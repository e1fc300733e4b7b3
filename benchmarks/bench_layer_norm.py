"""The group LayerNorm of the equivariant models against the stock forms, as an eager training step runs it.

Under bf16 autocast, for an activation x (M, C) feeding a linear layer (FP32, or bf16 as the residual stream
of EQ-ViT / ViT under autocast, which F.layer_norm casts to FP32 first), forward + backward of:
  * ``nn.LayerNorm`` + the cast the linear layer's autocast makes (the plain ViT's norm);
  * ``GroupLayerNorm`` on stock ops (``F.layer_norm`` with the expanded shared parameters, then the cast;
    ``FLASH_EQLINEAR_DEBUG=fused_norm=0``);
  * ``GroupLayerNorm(autocast_output=True)`` on the fused op (one pass forward, one backward).
The backward starts from a bf16 gradient of the norm's bf16 output (what the linear layer returns). Medians of
CUDA-event samples over rotated inputs; also the bytes each form must move at least, over the measured copy
bandwidth. Writes ``results/layer_norm.{json,md}`` (``--out NAME.json``: ``NAME.{json,md}``; the commit and
GPU inside the JSON's "env").

Usage:  python benchmarks/bench_layer_norm.py [--shapes 25216x768,25216x1024,32768x2048] [--out NAME.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
from common import bench, debug_switch, environment, n_buffers, save_json  # noqa: E402

from flash_eqlinear.models.layers import GroupLayerNorm  # noqa: E402


def forward(norm, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return norm(x)


def step(norm, x, gy):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = norm(x)
    (y if y.dtype == torch.bfloat16 else y.to(torch.bfloat16)).backward(gy)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="25216x768,25216x1024,32768x2048", help="comma list of MxC")
    ap.add_argument("--x-dtypes", default="float32,bfloat16", help="comma list: x's dtype")
    ap.add_argument(
        "--out", default="layer_norm.json", help="JSON file name under benchmarks/results/ (.md beside it)"
    )
    args = ap.parse_args(argv)
    env = environment()
    src = torch.empty(2**28, device="cuda").normal_()
    dst = torch.empty_like(src)
    copy_tbps = 2 * src.numel() * 4 / bench(lambda: dst.copy_(src), [()], min_time_s=0.3) / 1e9
    src = dst = None
    rows = []
    for shape, xdt in ((s, d) for d in args.x_dtypes.split(",") for s in args.shapes.split(",")):
        M, C = (int(v) for v in shape.split("x"))
        xdtype = getattr(torch, xdt)
        forms = {
            "nn.LayerNorm + cast": torch.nn.LayerNorm(C),
            "GroupLayerNorm, stock ops": GroupLayerNorm(C, autocast_output=True),
            "GroupLayerNorm, fused": GroupLayerNorm(C, autocast_output=True),
        }
        n = n_buffers(M * C * 6)
        xs = [torch.randn(M, C, device="cuda", dtype=xdtype, requires_grad=True) for _ in range(n)]
        gys = [torch.randn(M, C, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
        # bytes at least per element: forward x + y (2), backward grad_y (2) + x + grad_x
        floor_ms = M * C * (4 + 3 * xs[0].element_size()) / (copy_tbps * 1e12) * 1e3
        for name, norm in forms.items():
            norm = norm.cuda()
            with debug_switch("fused_norm", "0" if "stock" in name else "1"):
                fwd = bench(lambda x, _n=norm: forward(_n, x), [(x.detach(),) for x in xs], min_calls=4)
                train = bench(
                    lambda x, g, _n=norm: step(_n, x, g), list(zip(xs, gys, strict=True)), min_calls=4
                )
            rows.append(dict(M=M, C=C, x=xdt, form=name, fwd_ms=fwd, train_ms=train, floor_ms=floor_ms))
            print(
                f"{M}x{C} {xdt} {name:28s} forward {fwd:.4f} ms  forward + backward {train:.4f} ms",
                flush=True,
            )
    lines = [
        f"Group LayerNorm, eager, bf16 autocast; {env['gpu']}, torch {env['torch']}, {env['commit']}",
        "",
        "| M x C | x | form | forward ms | forward + backward ms | floor ms (both)",
        "|---|---|---|---|---|---",
    ]
    lines += [
        f"| {r['M']} x {r['C']} | {r['x']} | {r['form']} | "
        f"{r['fwd_ms']:.4f} | {r['train_ms']:.4f} | {r['floor_ms']:.4f}"
        for r in rows
    ]
    md = "\n".join(lines)
    print(md)
    path = save_json(args.out, {"env": env, "copy_tb_s": copy_tbps, "rows": rows})
    path.with_suffix(".md").write_text(md + "\n")
    print(f"wrote {path} and {path.with_suffix('.md').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
