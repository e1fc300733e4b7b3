"""Convert a checkpoint's naive EQ-Linear entries to FlashEQLinear's, or back (``--to naive``).

Usage: ``python -m flash_eqlinear.convert IN.pth OUT.pth [--to planes|naive] [--key KEY] [--only PATTERN ...]
[--trust]``

``--to naive`` turns FlashEQLinear entries back into the naive layout their layer was swapped in for
(recorded by ``swap_eq_linear(params="planes")``; else ``NaiveEQLinear``'s), for the original code.

IN may be a bare state_dict or a dict holding one under a key such as ``model`` or
``state_dict`` (the other entries, e.g. an epoch counter, are kept). Optimizer states are kept
as they are: momentum buffers of converted layers are in the old layout, so restart optimizers.

OUT may be IN (in-place conversion). It is written to a temporary file next to it, flushed to disk and
only then renamed onto OUT: on any failure OUT (and IN) are left as they were.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fnmatch
import os
import re
import stat
import sys
import tempfile
import warnings

import torch

from .modules import _naive_entries
from .swap import convert_state_dict_with_names, convertible_layers, naive_state_dict_with_names

CONTAINER_KEYS = ("state_dict", "model", "model_state_dict", "model_state", "net", "module", "ema")

# How torch.load(weights_only=True) refuses a pickled object it does not allowlist (torch >= 2.4).
_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")
_BLOCKED_MODULE = re.compile(r"GLOBAL (\S+) whose module \S+ is blocked")
_ZIP_MAGIC = b"PK\x03\x04"
_TRUST_HINT = "(use --trust to load it anyway, only for a file you trust: unpickling can run arbitrary code)"


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


def split_patterns(values) -> list[str]:
    """Glob patterns from a string or strings, each a pattern or a comma-separated list of them."""
    values = [values] if isinstance(values, str) else list(values)
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def match_names(names, patterns) -> tuple[list[str], list[str]]:
    """Match qualified names against glob patterns, as ``swap_eq_linear(include=...)`` does
    (``fnmatch.fnmatchcase``: ``*`` also crosses dots; a name also matches itself literally).
    Returns (the names some pattern matches, in their order; the patterns that match no name)."""
    names, patterns = list(names), list(patterns)
    hits = {p: [n for n in names if n == p or fnmatch.fnmatchcase(n, p)] for p in patterns}
    chosen = {n for found in hits.values() for n in found}
    return [n for n in names if n in chosen], [p for p in patterns if not hits[p]]


def _weight_key(state_dict, name: str) -> str:
    """The key of the naive weight of converted layer ``name``, found as convert_layer_entries finds it (any
    naive layout's weight; else NaiveEQLinear's ``weight``, known by its metadata)."""
    prefix = name + "." if name else ""
    found = _naive_entries(state_dict, prefix, getattr(state_dict, "_metadata", {}).get(name))
    return found[1] if found is not None else prefix + "weight"


def _check_dtypes(state_dict, names) -> None:
    """TypeError unless the naive weights of ``names`` are real floating point: the conversion, an
    orthogonal map computed in float64, would truncate integers and drop imaginary parts."""
    bad = []
    for name in names:
        key = _weight_key(state_dict, name)
        w = state_dict.get(key)
        if isinstance(w, torch.Tensor) and (not w.is_floating_point() or w.is_complex()):
            bad.append(f"{key} ({w.dtype})")
    if bad:
        raise TypeError(
            f"naive EQ-Linear weights must be real floating point, got {', '.join(bad)}; "
            "not converted (the conversion would round integers and drop imaginary parts; --only selects "
            "the layers to convert where such an entry is not an EQ-Linear weight)"
        )


def convert_checkpoint(ckpt, key: str | None = None, only=None):
    """Return (converted checkpoint, names of the converted layers).

    ``only``: glob patterns on qualified layer names (as ``swap_eq_linear(include=...)``; a string
    may be a comma-separated list), e.g. ``"blocks.*.mlp.*"`` or the names swap_eq_linear returned;
    default: every naive EQ-Linear entry; an empty list: none. ValueError if no state_dict is found or
    a pattern matches no layer; TypeError if a weight to convert is not real floating point. ``ckpt``
    is not modified.
    """
    where = find_state_dict_key(ckpt, key)
    sd = ckpt if where is None else ckpt[where]
    chosen = None
    if only is not None:  # (matched against the names first: each layer converted once)
        names = convertible_layers(sd)
        chosen, unmatched = match_names(names, split_patterns(only))  # no pattern: nothing chosen
        if unmatched:
            layers = names[:10] + (["..."] if len(names) > 10 else [])
            raise ValueError(
                f"only: no naive EQ-Linear layer matches {', '.join(map(repr, unmatched))} "
                f"(the checkpoint's layers: {layers}; a wrapper's prefix such as 'module.' must be part "
                "of the patterns)"
            )
    new, names = convert_state_dict_with_names(sd, chosen)
    _check_dtypes(sd, names)
    if where is None:
        return new, names
    out = dict(ckpt)
    out[where] = new
    return out, names


def to_naive(ckpt, key: str | None = None):
    """(checkpoint with FlashEQLinear entries in their naive layouts, names of the converted layers)."""
    where = find_state_dict_key(ckpt, key)
    new, names = naive_state_dict_with_names(ckpt if where is None else ckpt[where])
    if where is None:
        return new, names
    return {**ckpt, where: new}, names


def save_atomic(obj, path) -> None:
    """``torch.save(obj, path)`` that never leaves a partial file: writes a temporary file in
    ``path``'s directory, flushes it to disk (fsync), then renames it onto ``path`` (os.replace).
    On any failure the temporary file is removed and ``path`` is left as it was. Through a symlink,
    the file it points to is replaced. A new file gets the usual permissions (0o666 less the umask),
    a replaced one keeps its permission bits."""
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        umask = os.umask(0o022)  # read it (no other way in the standard library), then restore it
        os.umask(umask)
        mode = 0o666 & ~umask
    directory, base = os.path.split(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
    try:
        with open(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":  # make the rename itself durable; best effort
        with contextlib.suppress(OSError):
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def _detail(e: BaseException) -> str:
    """The informative part of a load error, without torch's advice paragraphs."""
    msg = str(e)
    if "WeightsUnpickler error:" in msg:
        msg = msg.split("WeightsUnpickler error:", 1)[1]
    msg = msg.strip().split("\n")[0].split(". This is an internal miniz error")[0].strip()
    msg = msg if len(msg) <= 200 else msg[:197] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _load_error(path, head: bytes, e: Exception, trust: bool) -> str:
    """A clear message for a failed torch.load; the --trust hint only where trust is the problem."""
    msg = str(e)
    unsafe = _UNSAFE_GLOBAL.search(msg) or _BLOCKED_MODULE.search(msg)
    if not trust and unsafe:
        blocked = " (a module blocked as dangerous: be sure of the file's origin)" if "blocked" in msg else ""
        return (
            f"cannot load {path}: it holds a pickled Python object ({unsafe.group(1)}){blocked}, which the "
            f"safe loader (torch.load(weights_only=True)) refuses\n{_TRUST_HINT}"
        )
    if not trust and "Cannot use ``weights_only=True``" in msg:  # legacy .tar format, TorchScript
        kind = "a TorchScript archive" if "TorchScript" in msg else "in the legacy .tar format"
        return (
            f"cannot load {path}: it is {kind}, which the safe loader (torch.load(weights_only=True)) "
            f"refuses\n{_TRUST_HINT}"
        )
    if trust and isinstance(e, (ImportError, AttributeError)):
        return f"cannot load {path}: a class it pickled cannot be imported here ({_detail(e)})"
    if head.startswith(_ZIP_MAGIC) or isinstance(e, EOFError) or "unexpected EOF" in msg:
        return f"cannot load {path}: the file is truncated or corrupt, not a whole checkpoint ({_detail(e)})"
    return f"cannot load {path}: not a PyTorch checkpoint, or a corrupt one ({_detail(e)})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flash_eqlinear.convert", description=__doc__.split("\n")[0])
    ap.add_argument("input", help="checkpoint with naive EQ-Linear entries (.pth)")
    ap.add_argument("output", help="where to write the converted checkpoint (may be the input)")
    ap.add_argument("--key", default=None, help="key holding the state_dict (default: auto-detect)")
    ap.add_argument(
        "--to",
        choices=("planes", "naive"),
        default="planes",
        help="planes (default): naive entries to FlashEQLinear's; naive: FlashEQLinear's back to the naive "
        "layout each layer came from",
    )
    ap.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="PATTERN",
        help="convert only the layers whose qualified names match these glob patterns (e.g. "
        "'blocks.*.mlp.*'; comma-separated, or repeat the option); a pattern that matches no layer is an "
        "error. Default: every naive EQ-Linear entry",
    )
    ap.add_argument(
        "--trust",
        action="store_true",
        help="load with weights_only=False (arbitrary pickled objects; only for files you trust)",
    )
    args = ap.parse_args(argv)
    if args.only is not None and not split_patterns(args.only):
        print("error: --only got no pattern", file=sys.stderr)
        return 2
    if args.only is not None and args.to == "naive":
        print(
            "error: --only selects layers to convert to planes; --to naive converts every one",
            file=sys.stderr,
        )
        return 2
    try:
        with open(args.input, "rb") as f:  # missing, unreadable, a directory: said before torch is asked
            head = f.read(len(_ZIP_MAGIC))
    except OSError as e:
        print(f"error: cannot read {args.input}: {e.strerror or e}", file=sys.stderr)
        return 2
    if not head:
        print(f"error: cannot load {args.input}: the file is empty", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as load_warnings:  # noise when the load fails
            warnings.simplefilter("always")
            ckpt = torch.load(args.input, map_location="cpu", weights_only=not args.trust)
    except Exception as e:  # corrupt files raise many types (pickle errors, RuntimeError, EOFError, ...)
        print(f"error: {_load_error(args.input, head, e, args.trust)}", file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, names = (
                convert_checkpoint(ckpt, args.key, args.only)
                if args.to == "planes"
                else to_naive(ckpt, args.key)
            )
    except (ValueError, TypeError) as e:
        print(f"error: {e}; nothing written", file=sys.stderr)
        return 2
    for w in load_warnings + caught:
        print(f"warning: {w.message}", file=sys.stderr)
    try:
        save_atomic(out, args.output)
    except Exception as e:  # OSError (disk full, missing directory, permissions), pickling errors
        detail = e.strerror if isinstance(e, OSError) and e.strerror else e
        print(
            f"error: cannot write {args.output}: {detail}; nothing written (no file was changed)",
            file=sys.stderr,
        )
        return 2
    kind = "naive EQ-Linear" if args.to == "planes" else "FlashEQLinear"
    none = f" (no {kind} entries found; the output is a copy)" if not names else ""
    print(f"converted {len(names)} EQ-Linear layer(s): {args.input} -> {args.output}{none}")
    for name in names:
        print(f"  {name or '<root>'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
