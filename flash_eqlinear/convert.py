"""Convert a checkpoint's naive EQ-Linear entries to FlashEQLinear's.

Usage: ``python -m flash_eqlinear.convert IN.pth OUT.pth [--key KEY] [--only LAYER ...] [--trust]``

IN may be a bare state_dict or a dict holding one under a key such as ``model`` or
``state_dict`` (the other entries, e.g. an epoch counter, are kept). Optimizer states are kept
as they are: momentum buffers of converted layers are in the old layout, so restart optimizers.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch

from .swap import convert_state_dict_with_names

CONTAINER_KEYS = ("state_dict", "model", "model_state_dict", "model_state", "net", "module", "ema")


def _is_state_dict(obj) -> bool:
    return (
        isinstance(obj, dict)
        and len(obj) > 0
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def find_state_dict_key(ckpt, key: str | None = None):
    """Where the state_dict is: None for a bare one, else the key holding it. ValueError if none."""
    if key is not None:
        if not isinstance(ckpt, dict) or key not in ckpt:
            raise ValueError(f"checkpoint has no key {key!r}")
        if not _is_state_dict(ckpt[key]):
            raise ValueError(f"checkpoint[{key!r}] is not a state_dict (a dict of tensors)")
        return key
    if _is_state_dict(ckpt):
        return None
    if isinstance(ckpt, dict):
        for k in CONTAINER_KEYS:
            if _is_state_dict(ckpt.get(k)):
                return k
        keys = list(ckpt)[:10]
        raise ValueError(f"no state_dict found in the checkpoint (top-level keys: {keys}); pass --key")
    raise ValueError(f"checkpoint is a {type(ckpt).__name__}, not a dict")


def convert_checkpoint(ckpt, key: str | None = None, only=None):
    """Return (converted checkpoint, names of the converted layers); ``only`` as in convert_state_dict."""
    where = find_state_dict_key(ckpt, key)
    new, names = convert_state_dict_with_names(ckpt if where is None else ckpt[where], only)
    if where is None:
        return new, names
    out = dict(ckpt)
    out[where] = new
    return out, names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flash_eqlinear.convert", description=__doc__.split("\n")[0])
    ap.add_argument("input", help="checkpoint with naive EQ-Linear entries (.pth)")
    ap.add_argument("output", help="where to write the converted checkpoint")
    ap.add_argument("--key", default=None, help="key holding the state_dict (default: auto-detect)")
    ap.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="LAYER",
        help="convert only this layer (qualified name; repeat for several); default: every match",
    )
    ap.add_argument(
        "--trust",
        action="store_true",
        help="load with weights_only=False (arbitrary pickled objects; only for files you trust)",
    )
    args = ap.parse_args(argv)
    try:
        ckpt = torch.load(args.input, map_location="cpu", weights_only=not args.trust)
    except OSError as e:  # missing, unreadable
        print(f"error: cannot read {args.input}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # pickle errors come in many types
        hint = "" if args.trust else "\n(use --trust for checkpoints holding arbitrary objects)"
        print(f"error: cannot load {args.input}: {e}{hint}", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, names = convert_checkpoint(ckpt, args.key, args.only)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    try:
        torch.save(out, args.output)
    except (OSError, RuntimeError) as e:  # torch reports a missing directory as a RuntimeError
        print(f"error: cannot write {args.output}: {e}", file=sys.stderr)
        return 2
    none = " (no naive EQ-Linear entries found; the output is a copy)" if not names else ""
    print(f"converted {len(names)} EQ-Linear layer(s): {args.input} -> {args.output}{none}")
    for name in names:
        print(f"  {name or '<root>'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
