"""Replace naive EQ-Linear layers of a model by fused ones (keeping their parameters, or as FlashEQLinear's
planes), and convert checkpoints' entries between the naive layouts and FlashEQLinear's."""

from __future__ import annotations

import fnmatch
import logging
import warnings
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn as nn

from .layouts import SwappedEQLinear, escnn_candidate, escnn_eq_linear, find_layout, naive_layouts
from .modules import (
    LAYOUT_KEY,
    SOURCE_KEY,
    FlashEQLinear,
    _source,
    convert_layer_entries,
    layer_entries_convertible,
    planes_to_naive_entries,
)

__all__ = ["swap_eq_linear", "convert_state_dict", "naive_state_dict", "is_naive_eq_linear"]

PARAMS = ("keep", "planes")
_log = logging.getLogger("flash_eqlinear")
# NaiveEQLinear's layout, where a FlashEQLinear records none (FlashEQLinear.naive_source's form)
_NAIVE_SOURCE = {"layout": "naive", "weight": "weight", "weight_dim": 3, "bias": "bias", "bias_dim": 1}


def is_naive_eq_linear(module: nn.Module) -> bool:
    """Whether ``module`` is a naive EQ-Linear of a known layout (:func:`flash_eqlinear.layouts.find_layout`:
    ``NaiveEQLinear``, reference-style layers, ``weight`` (d, 1, c, T) with an index buffer, and the layouts
    registered with :func:`flash_eqlinear.layouts.register_naive_layout`)."""
    return find_layout(module) is not None


def _flash_from(module: nn.Module) -> FlashEQLinear:
    """FlashEQLinear (planes) equal to ``module``, remembering the naive layout it came from (for export back)
    and keeping the naive layer's buffers (e.g. an index buffer: its checkpoint entries stay)."""
    layout = find_layout(module)
    w, b, _ = layout.parameters_of(module)
    layer = FlashEQLinear.from_naive(w.detach(), None if b is None else b.detach().reshape(-1))
    layer.weight.requires_grad_(w.requires_grad)
    if layer.bias is not None:
        layer.bias.requires_grad_(b.requires_grad)
    for name, buf in module.named_buffers(recurse=False):
        if not hasattr(layer, name):
            layer.register_buffer(name, buf, persistent=name not in module._non_persistent_buffers_set)
    layer.naive_source = _source(layout.name, layout.weight, w.dim(), layout.bias, b)
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


def swap_eq_linear(model: nn.Module, include=None, params: str = "keep") -> list[str]:
    """Replace, in place, every naive EQ-Linear in ``model`` (:func:`is_naive_eq_linear`) by a fused one.

    ``params="keep"`` (default): a :class:`~flash_eqlinear.layouts.SwappedEQLinear` holding the naive layer's
    own parameters and buffers: ``state_dict`` keys and shapes, optimizers built before the swap (their
    state too) and checkpoints in both directions stay as they were, and any optimizer follows the naive
    model's trajectory to rounding; each training forward transforms the weight (small). ``params="planes"``:
    a :class:`FlashEQLinear` whose parameters are the frequency planes (new Parameter objects: build
    optimizers after the swap; Adam-type optimizers then take a different trajectory than on the naive
    parameters, SGD the same; checkpoints convert on load, and back with
    :func:`naive_state_dict`); no transform per step.

    escnn's pointwise layers between regular fields of C_N (a 1x1 ``R2Conv``, ``escnn.nn.Linear``) become an
    escnn module of this library's (:func:`flash_eqlinear.layouts.escnn_eq_linear`) that keeps escnn's
    parameters whatever ``params`` says; the escnn layers it leaves (other kernels, fields, groups) are logged
    at INFO level on the ``flash_eqlinear`` logger with the reason.

    ``include``: None (all), a predicate ``(qualified_name, module) -> bool``, or glob patterns
    on qualified names (``"blocks.*.mlp.*"``). Keeps device, dtype, requires_grad and train/eval
    mode, and weight tying: a layer registered under several names is replaced under all of them when
    any is selected. Returns the qualified names replaced. The model itself cannot be a layer to replace:
    a naive layer passed as the model, where ``include`` selects it (qualified name ``""``), raises
    ValueError (build its replacement with ``FlashEQLinear.from_naive``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if params not in PARAMS:
        raise ValueError(f"params must be one of {PARAMS}, got {params!r}")
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
    layers, escnn = [], set()
    for name, m in model.named_modules(remove_duplicate=False):
        ok, why = escnn_candidate(m)
        if ok:
            escnn.add(id(m))
        elif why:  # an escnn layer that is no EQ-Linear between regular fields of C_N
            _log.info("swap_eq_linear: %s (%s) not swapped: %s", name, type(m).__name__, why)
        if name and (ok or is_naive_eq_linear(m)):
            layers.append((name, m))
    chosen = {id(m) for name, m in layers if keep(name, m)}
    targets = [(name, m) for name, m in layers if id(m) in chosen]
    new: dict[int, FlashEQLinear] = {}
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if id(module) not in new:
            if id(module) in escnn:  # escnn's own parameters, GeometricTensors in and out
                new[id(module)] = escnn_eq_linear(module)
            else:
                new[id(module)] = SwappedEQLinear(module) if params == "keep" else _flash_from(module)
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
    prefixes = _candidate_prefixes(state_dict, meta)
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


def _candidate_prefixes(state_dict, meta) -> set[str]:
    """The prefixes of entries named as a naive layout's weight (exactly: ``weights``, not ``class_weights``)
    and of layers whose metadata records the group layout; convert_layer_entries checks their shapes."""
    names = {lay.weight for lay in naive_layouts()}
    prefixes = {
        k.rpartition(".")[0] + "." if "." in k else "" for k in state_dict if k.rpartition(".")[2] in names
    }
    return prefixes | {k + "." if k else "" for k, v in meta.items() if v.get(LAYOUT_KEY) == "group"}


def convertible_layers(state_dict) -> list[str]:
    """The layer names :func:`convert_state_dict_with_names` would convert, without converting anything."""
    meta = getattr(state_dict, "_metadata", {})
    return [
        p[:-1]
        for p in sorted(_candidate_prefixes(state_dict, meta))
        if layer_entries_convertible(state_dict, p, meta.get(p[:-1]))
    ]


def naive_state_dict(source) -> OrderedDict[str, torch.Tensor]:
    """A state_dict (or a model's) with FlashEQLinear's planes entries converted back to the naive layout they
    came from: the layout recorded by :func:`swap_eq_linear` (``params="planes"``), e.g. reference-style
    ``weights`` (d, 1, c, T) and ``c`` (d, 1), so that the checkpoint loads into the original code; a
    FlashEQLinear made otherwise comes back as ``NaiveEQLinear``'s ``weight`` (d, c, T) and ``bias`` (d,).
    The conversion is orthogonal, in float64, rounded once to each entry's dtype. Other entries (those of
    :class:`~flash_eqlinear.layouts.SwappedEQLinear`, already naive, included) are copied unchanged."""
    return naive_state_dict_with_names(source.state_dict() if isinstance(source, nn.Module) else source)[0]


def naive_state_dict_with_names(sd):
    """:func:`naive_state_dict` of a state_dict, also returning the converted layers' names."""
    if not isinstance(sd, dict):
        raise TypeError(f"expected a state_dict or an nn.Module, got {type(sd).__name__}")
    out = OrderedDict(sd)
    names = []
    meta = OrderedDict((k, dict(v)) for k, v in getattr(sd, "_metadata", {}).items())
    for name, local in meta.items():
        prefix = name + "." if name else ""
        planes = out.get(prefix + "weight")
        if local.get(LAYOUT_KEY) != "planes" or not isinstance(planes, torch.Tensor) or planes.dim() != 3:
            continue
        planes_to_naive_entries(out, prefix, local.pop(SOURCE_KEY, None) or _NAIVE_SOURCE)
        local[LAYOUT_KEY] = "group"
        names.append(name)
    out._metadata = meta
    return out, names
