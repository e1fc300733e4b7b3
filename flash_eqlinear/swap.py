"""Replace naive EQ-Linear layers of a model, or the entries of a checkpoint, by FlashEQLinear."""

from __future__ import annotations

import fnmatch
import warnings
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn as nn

from .modules import LAYOUT_KEY, FlashEQLinear, NaiveEQLinear, convert_layer_entries

__all__ = ["swap_eq_linear", "convert_state_dict", "is_naive_eq_linear"]


def is_naive_eq_linear(module: nn.Module) -> bool:
    """NaiveEQLinear, or a reference-style layer: Parameter ``weights`` (d, 1, c, T), int
    attribute ``tranNum`` equal to T, optional Parameter ``c`` (d, 1)."""
    if isinstance(module, NaiveEQLinear):
        return True
    w = getattr(module, "weights", None)
    T = getattr(module, "tranNum", None)
    if not isinstance(w, torch.Tensor) or isinstance(T, bool) or not isinstance(T, int):
        return False
    if w.dim() != 4 or w.shape[1] != 1 or w.shape[-1] != T:
        return False
    b = getattr(module, "c", None)
    return b is None or (isinstance(b, torch.Tensor) and tuple(b.shape) == (w.shape[0], 1))


def _flash_from(module: nn.Module) -> FlashEQLinear:
    if isinstance(module, NaiveEQLinear):
        w, b = module.weight, module.bias
    else:
        w, b = module.weights, getattr(module, "c", None)
    layer = FlashEQLinear.from_naive(w.detach(), None if b is None else b.detach())
    layer.weight.requires_grad_(w.requires_grad)
    if layer.bias is not None:
        layer.bias.requires_grad_(b.requires_grad)
    return layer.train(module.training)


def _selector(include) -> Callable[[str, nn.Module], bool]:
    if include is None:
        return lambda name, module: True
    if callable(include):
        return include
    if isinstance(include, str):
        include = [include]
    patterns = list(include)
    return lambda name, module: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def swap_eq_linear(model: nn.Module, include=None) -> list[str]:
    """Replace, in place, every naive EQ-Linear in ``model`` by an equivalent FlashEQLinear.

    ``include``: None (all), a predicate ``(qualified_name, module) -> bool``, or glob patterns
    on qualified names (``"blocks.*.mlp.*"``). Keeps device, dtype, requires_grad and train/eval
    mode, and weight tying: a layer registered under several names is replaced under all of them when
    any is selected. Returns the qualified names replaced. The model itself cannot be a layer to replace:
    a naive layer passed as the model, where ``include`` selects it (qualified name ``""``), raises
    ValueError (build its replacement with ``FlashEQLinear.from_naive``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    keep = _selector(include)
    if is_naive_eq_linear(model) and keep("", model):
        raise ValueError(
            f"model is itself a naive EQ-Linear ({type(model).__name__}), which cannot be replaced in place: "
            "use FlashEQLinear.from_naive(model.weight, model.bias) (reference-style layers: model.weights, "
            "model.c), or wrap it in a container"
        )
    # remove_duplicate=False: a layer registered under several names is replaced under each of
    # them, by one shared FlashEQLinear (the model keeps its weight tying), also where ``include``
    # selects only some of its names.
    layers = [
        (name, m) for name, m in model.named_modules(remove_duplicate=False) if name and is_naive_eq_linear(m)
    ]
    chosen = {id(m) for name, m in layers if keep(name, m)}
    targets = [(name, m) for name, m in layers if id(m) in chosen]
    new: dict[int, FlashEQLinear] = {}
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if id(module) not in new:
            new[id(module)] = _flash_from(module)
        setattr(parent, attr, new[id(module)])
    return [name for name, _ in targets]


def convert_state_dict(state_dict, only=None) -> OrderedDict[str, torch.Tensor]:
    """Return a copy of ``state_dict`` with naive EQ-Linear entries converted to FlashEQLinear's.

    Converted: reference-style ``<prefix>weights (d, 1, c, T)`` (+ ``<prefix>c (d, 1)``) and
    NaiveEQLinear ``<prefix>weight (d, c, T)`` whose state-dict metadata records its layout.
    Everything else is copied unchanged. The result loads into a model whose naive layers were
    replaced with :func:`swap_eq_linear`. ``only``: layer names to convert (e.g. the list
    :func:`swap_eq_linear` returns); by default every entry of those forms, which can also match
    an unrelated parameter named ``weights`` of shape (n, 1, a, b): pass ``only`` where a model
    holds such parameters. A name of ``only`` with no entries under it gives a warning.
    """
    return convert_state_dict_with_names(state_dict, only)[0]


def convert_state_dict_with_names(state_dict, only=None):
    """:func:`convert_state_dict`, also returning the converted layers' prefixes."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    out = OrderedDict(state_dict)
    meta = OrderedDict((k, dict(v)) for k, v in getattr(state_dict, "_metadata", {}).items())
    # Only a key named exactly ``weights`` (not e.g. ``class_weights``) is a reference-style weight.
    prefixes = {k[: -len("weights")] for k in state_dict if k == "weights" or k.endswith(".weights")}
    prefixes |= {k + "." if k else "" for k, v in meta.items() if v.get(LAYOUT_KEY) == "group"}
    if only is not None:
        only = {name + "." if name else "" for name in ([only] if isinstance(only, str) else only)}
        absent = sorted(p[:-1] for p in only if p and not any(k.startswith(p) for k in state_dict))
        if absent:  # e.g. a layer the model has and the checkpoint not, or a name without a wrapper's prefix
            warnings.warn(
                f"only: no entries under {absent} in the state_dict (its keys start e.g. "
                f"{sorted({k.split('.')[0] for k in state_dict})[:5]}; a wrapper's prefix such as 'module.' "
                "must be part of the names)",
                stacklevel=3,
            )
        prefixes &= only
    converted = []
    for prefix in sorted(prefixes):
        local = meta.setdefault(prefix[:-1], {})
        if convert_layer_entries(out, prefix, local):
            converted.append(prefix[:-1])
    out._metadata = meta
    return out, converted
