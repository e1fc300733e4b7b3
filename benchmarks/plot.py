"""Plot a bench_op JSON (either direction): speedup over F.linear vs c, one panel per dtype.

Usage: python benchmarks/plot.py benchmarks/results/NAME.json [-o OTHER.png]
Writes NAME.png beside the JSON (benchmarks/results/op_fwd.json -> op_fwd.png) unless -o names another file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = {
    "flash": "FlashEQLinear (fused)",
    "fourier_ref": "Fourier path, stock torch ops",
    "naive": "NaiveEQLinear (dense expansion)",
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("-o", "--output", default=None, help="the PNG (default: the JSON's name with .png)")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    rows = data["rows"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(5 * len(dtypes), 4), squeeze=False)
    for ax, dt in zip(axes[0], dtypes, strict=True):
        sel = [r for r in rows if r["dtype"] == dt]
        cs = [r["c"] for r in sel]
        for key, label in SERIES.items():
            ax.plot(cs, [r[key]["speedup_vs_linear"] for r in sel], marker="o", label=label)
        ax.axhline(1.0, color="gray", lw=1, ls="--", label="F.linear (cuBLAS)")
        ax.axhline(16 / 6, color="green", lw=1, ls=":", label="theory 16/6")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("c = C/4 (C = D)")
        ax.set_ylabel("speedup over F.linear")
        ax.set_title(f"{dt}, M = {data['M']}, {data['env']['gpu']}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{data['benchmark']} (torch {data['env']['torch']}, commit {data['env']['commit']})")
    fig.tight_layout()
    out = Path(args.output) if args.output else Path(args.json).with_suffix(".png")
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
