"""``FlashEQLinear`` (frequency-plane parameters, fused kernels) and ``NaiveEQLinear`` (baseline).

Both map ``(..., C) -> (..., D)`` with ``C = c*T``, ``D = d*T``, group index fastest, and compute
the same function for the same group-domain weight ``w (d, c, T)`` and shared bias ``(d,)``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import reference
from .fourier import check_group_size, naive_to_planes, planes_to_naive
from .ops import (
    _CHUNKS_OP,
    _LAYER_OP,
    _autocast_and_check,
    _autocast_dtype,
    _cast_to,
    _fused_eager,
    autocast_inputs,
    backend_for,
    check_chunks,
    chunks_of,
    flash_eq_linear,
    flash_eq_linear_chunks,
    gemm_form_t,
    reference_form,
    rounded_group_weight,
)

__all__ = ["FlashEQLinear", "NaiveEQLinear", "LAYOUT_KEY", "SOURCE_KEY"]

# Recorded in each layer's state-dict metadata so that loading can tell the weight layouts apart
# even where the shapes (T, d, c) and (d, c, T) coincide.
LAYOUT_KEY = "eq_layout"
# Recorded for a FlashEQLinear swapped in for a naive layer (swap_eq_linear(params="planes")): the naive
# layout it came from (FlashEQLinear.naive_source), so that its checkpoints convert back.
SOURCE_KEY = "eq_naive_source"


def _split_features(in_features: int, out_features: int, group_size: int) -> tuple[int, int, int]:
    T = check_group_size(group_size)
    for name, n in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
        if n % T:
            raise ValueError(f"{name}={n} is not divisible by group_size={T}")
    return T, in_features // T, out_features // T


def _init_group_weight(d, c, T, device, dtype):
    """Group-domain weight and bias distributed exactly like nn.Linear(c*T, d*T)'s entries."""
    bound = 1.0 / math.sqrt(c * T)  # kaiming_uniform(a=sqrt(5)) on fan_in = C, as nn.Linear
    w = torch.empty(d, c, T, device=device, dtype=torch.float32).uniform_(-bound, bound)
    b = torch.empty(d, device=device, dtype=torch.float32).uniform_(-bound, bound)
    return w.to(dtype), b.to(dtype)


class ParamCache:
    """For modules with parameters ``weight`` and ``bias`` (or None; others override :meth:`_cache_params`):
    tensors derived from them (a cast, an expansion) kept for inference calls (:meth:`_caches`,
    :meth:`_cached`). Set ``self._cache = None`` in ``__init__``."""

    def _cache_params(self) -> tuple:
        """(weight, bias or None): the parameters the kept tensors derive from."""
        return self.weight, self.bias

    def _caches(self) -> bool:
        """Whether this call may reuse tensors derived from the parameters (:meth:`_cached`): eval mode,
        not under torch.compile, and no gradient of the parameters being recorded (inference). A call that
        may not (training mode, gradients recorded) drops them: an optimizer step may follow, and fused
        optimizers (``fused=True``) update parameters without bumping their version."""
        if torch.compiler.is_compiling():
            return False
        w, b = self._cache_params()
        grads = torch.is_grad_enabled() and (w.requires_grad or (b is not None and b.requires_grad))
        if self.training or grads:
            if getattr(self, "_cache", None) is not None:  # (a module's setattr costs host time)
                self._cache = None
            return False
        return True

    def _cached(self, tag, make):
        """``make()``, a tensor (or tuple) derived from the parameters, reused while their storage and
        versions, ``tag`` and the inference-mode state are unchanged, as equivariant convolution libraries
        do with their expanded filters: an in-place update through torch (optimizer step, ``copy_``,
        ``load_state_dict``) or a new tensor invalidates it, and :meth:`_caches` drops it in calls that
        record gradients; writes through ``.data`` are not seen (call ``.eval()`` again after them). One
        entry per layer, never saved or pickled. Callers check :meth:`_caches` first."""
        w, b = self._cache_params()
        key = (tag, w.data_ptr(), w._version, torch.is_inference_mode_enabled())
        if b is not None:
            key += (b.data_ptr(), b._version)
        cache = getattr(self, "_cache", None)  # absent in modules pickled before it existed
        if cache is not None and cache[1] == key:
            return cache[2]
        value = make()
        # The aliases keep the parameters' storage alive, so their addresses cannot be reused by others.
        self._cache = ((w.detach(), None if b is None else b.detach()), key, value)
        return value

    def train(self, mode: bool = True):
        self._cache = None
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        self._cache = None
        return super()._apply(fn, recurse)

    def __getstate__(self):
        state = dict(super().__getstate__())  # a copy: the live module keeps its cache
        state["_cache"] = None
        return state


class _EQLinearBase(ParamCache, nn.Module):
    _layout = ""

    def __init__(self, in_features, out_features, bias, group_size, device, dtype):
        super().__init__()
        T, c, d = _split_features(in_features, out_features, group_size)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a real floating-point torch.dtype, got {dtype!r}")
        self.group_size, self.c, self.d = T, c, d
        self.in_features, self.out_features = in_features, out_features
        shape = (T, d, c) if self._layout == "planes" else (d, c, T)
        self.weight = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(d, device=device, dtype=dtype)) if bias else None
        self.reset_parameters()
        self.register_state_dict_post_hook(_record_layout)
        self._cache = None
        self.naive_source = None  # swapped in for a naive layer: that layer's layout (SOURCE_KEY)

    def _from_group(self, w: torch.Tensor) -> torch.Tensor:
        """Group-domain weight (d, c, T) -> this layer's parameter layout."""
        return _to_layout(w, "planes") if self._layout == "planes" else w

    def reset_parameters(self) -> None:
        w, b = _init_group_weight(self.d, self.c, self.group_size, self.weight.device, self.weight.dtype)
        with torch.no_grad():
            self.weight.copy_(self._from_group(w))
            if self.bias is not None:
                self.bias.copy_(b)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, group_size={self.group_size}"
        )

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        # Accept the other layout (by metadata) and reference-style entries. A copy of the
        # metadata: it is the caller's state_dict._metadata entry (loading twice must work).
        meta = dict(local_metadata or {})
        converted = convert_layer_entries(state_dict, prefix, meta, self._layout, self.weight.dtype)
        from .layouts import naive_layouts  # (layouts imports this module)

        for name in {n for lay in naive_layouts() for n in lay.buffers}:  # a naive layer's index buffers
            if prefix + name in state_dict and name not in self._buffers:
                del state_dict[prefix + name]  # accepted, not kept (a layer swapped in keeps them itself)
        if not converted:
            # No layout metadata (e.g. a hand-built dict): convert the other layout's weight only
            # where its shape cannot be mistaken for this layer's.
            w = state_dict.get(prefix + "weight")
            T, c, d = self.group_size, self.c, self.d
            other = (d, c, T) if self._layout == "planes" else (T, d, c)
            if LAYOUT_KEY not in meta and isinstance(w, torch.Tensor) and tuple(w.shape) == other:
                if other != tuple(self.weight.shape):
                    state_dict[prefix + "weight"] = _to_layout(w, self._layout, self.weight.dtype)
                else:  # d = c = T: either layout; taken as this layer's own
                    theirs, fix = (
                        ("a NaiveEQLinear weight (d, c, T)", "flash_eqlinear.naive_to_planes")
                        if self._layout == "planes"
                        else ("FlashEQLinear planes (T, d, c)", "flash_eqlinear.planes_to_naive")
                    )
                    warnings.warn(
                        f"{prefix}weight {tuple(w.shape)}: the state_dict has no layout metadata and this "
                        f"shape (d = c = T = {T}) fits both layouts; loaded as {type(self).__name__}'s own. "
                        f"If it holds {theirs}, pass it through {fix} first (state_dicts keep the metadata "
                        "that tells them apart in state_dict._metadata, which copying the dict drops)",
                        stacklevel=4,
                    )
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def dense_weight(self) -> torch.Tensor:
        """The (D, C) block-circulant matrix that F.linear would use."""
        return reference.dense_weight(self.naive_weight())

    def to_linear(self) -> nn.Linear:
        """An equivalent dense nn.Linear (for export); same device and dtype, no shared storage."""
        p = self.weight
        lin = nn.Linear(self.in_features, self.out_features, self.bias is not None, p.device, p.dtype)
        with torch.no_grad():
            lin.weight.copy_(self.dense_weight())
            if self.bias is not None:
                lin.bias.copy_(reference.dense_bias(self.bias, self.group_size))
        return lin


def _record_layout(module, state_dict, prefix, local_metadata):
    local_metadata[LAYOUT_KEY] = module._layout
    source = getattr(module, "naive_source", None)
    if source:
        local_metadata[SOURCE_KEY] = dict(source)


def _to_layout(w: torch.Tensor, layout: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Convert a weight into ``layout`` ("planes" from group-domain, "group" from planes) in float64
    (orthogonal map), rounding once to ``dtype`` (default: ``w``'s)."""
    convert = naive_to_planes if layout == "planes" else planes_to_naive
    return convert(w.detach().to(torch.float64)).to(dtype or w.dtype)


class NaiveEQLinear(_EQLinearBase):
    """Baseline EQ-Linear: expands the block-circulant (D, C) weight and calls F.linear.

    Parameters: ``weight`` (d, c, T) group-domain weight, ``bias`` (d,) shared by the T copies.

    In eval mode, when no gradient of the parameters is being recorded (inference), the expanded weight
    is kept and reused until the weight changes, as equivariant convolution libraries do with their
    expanded filters: an in-place update through torch (optimizer step, ``copy_``, ``load_state_dict``)
    or a new tensor invalidates it, and so does any call that records gradients (after which a fused
    optimizer may update the weight without bumping its version); writes through ``weight.data`` are not
    seen (call ``.eval()`` again after them). It costs one (D, C) tensor per layer and is never saved or
    pickled.
    """

    _layout = "group"

    def __init__(self, in_features, out_features, bias=True, group_size=4, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, group_size, device, dtype)
        # The (T, T) tap index of the expansion, kept on the weight's device (not in state_dict).
        idx = reference.circulant_index(self.group_size, device)
        self.register_buffer("circulant_index", idx, persistent=False)

    def naive_weight(self) -> torch.Tensor:
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return naive_forward(self, x, self.weight, self.bias, self.group_size, self.circulant_index)


def naive_forward(layer: ParamCache, x, w, b, group_size: int, index=None) -> torch.Tensor:
    """The naive computation of ``layer`` (group weight ``w`` (d, c, T), bias ``b`` (d,) or None, derived from
    its parameters): autocast's casts as ``nn.Linear``'s, the dense expansion, ``F.linear``; in inference
    (``layer._caches()``) the expansion kept by ``layer``'s rules. ``index``: the expansion's tap index."""
    x, w, b = autocast_inputs(x, w, b)
    if not layer._caches():
        return reference.naive_eq_linear(x, w, b, group_size, index)
    T = reference.check_inputs(x, w, b, group_size, "group")[0]  # the same errors as uncached
    # w: the weight, possibly cast by autocast
    wd = w.detach()
    dense = layer._cached((w.dtype, w.device), lambda: reference.dense_weight(wd, index))
    return F.linear(x, dense, reference.dense_bias(b, T))


class FlashEQLinear(_EQLinearBase):
    """Drop-in EQ-Linear computed in the group-frequency domain (fused CUDA kernels for T = 4).

    Parameters: ``weight`` (T, d, c), the orthonormal real-DFT planes of the group-domain weight
    (order: k = 0; Re, Im of k = 1 .. ceil(T/2)-1; k = T/2 for even T); ``bias`` (d,).
    Initialised so the group-domain weight has nn.Linear(C, D)'s distribution. ``load_state_dict``
    also accepts naive checkpoints (reference-style ``weights (d,1,c,T)``/``c (d,1)`` and
    ``NaiveEQLinear``'s own).

    Under ``torch.autocast`` in eval mode, when no gradient of the parameters is being recorded
    (inference), the weight and bias cast to autocast's dtype are kept and reused until they change
    (the rules of ``NaiveEQLinear``'s expanded weight), as autocast keeps ``nn.Linear``'s casts within
    a region: one 16-bit copy of the parameters per layer, and no cast per call. Off the fused kernels,
    where the dense form runs (:func:`flash_eqlinear.ops.reference_form`), inference keeps the expanded
    (D, C) weight by the same rules, as ``NaiveEQLinear`` does.
    """

    _layout = "planes"

    def __init__(self, in_features, out_features, bias=True, group_size=4, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, group_size, device, dtype)

    def naive_weight(self) -> torch.Tensor:
        """Group-domain weight (d, c, T); differentiable function of the planes."""
        return planes_to_naive(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused kernels, eager: one call of the layer op (autocast, checks and autograd in C++), except
        # for inference under autocast, which reuses the kept casts of the parameters (_params_for).
        if _LAYER_OP is not None and self.group_size == 4 and _fused_eager(x):
            if not torch._C._is_any_autocast_enabled() or not self._caches():
                return _LAYER_OP(x, self.weight, self.bias)
        caches = self._caches()
        if caches and isinstance(x, torch.Tensor) and backend_for(x, self.group_size) == "reference":
            y = self._kept_dense_forward(x)
            if y is not None:
                return y
        return flash_eq_linear(x, *self._params_for(x, caches), self.group_size)

    def _kept_dense_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """Inference off the fused kernels in the dense form (``reference_form`` with the dense weight kept):
        the expanded (D, C) weight, made as the dense form makes it per call, kept and reused under
        ``NaiveEQLinear``'s rules, so a swapped layer is no slower than the naive one it replaced. None
        where the Fourier form or, for T = 2 and 8 on CUDA, the GEMM form (``gemm_form_t``) runs instead."""
        T, c, d = self.group_size, self.c, self.d
        if reference_form(x, T, c, d, dense_kept=True) != "dense" or gemm_form_t(
            x, self.weight, self.bias, T, c, d
        ):
            return None
        kept = self._kept(_autocast_dtype(x))
        wc, bc = kept["params"]
        x = _autocast_and_check(x, wc, bc, T)[0]  # the uncached path's casts and errors, before expanding
        if "dense" not in kept:  # as the dense form makes it per call
            kept["dense"] = reference.dense_weight(rounded_group_weight(wc)), reference.dense_bias(bc, T)
        return F.linear(x, *kept["dense"])

    def forward_chunks(self, x: torch.Tensor, chunks: int) -> tuple[torch.Tensor, ...]:
        """``self(x).chunk(chunks, -1)`` (whole fields per chunk), as :func:`flash_eq_linear_chunks` makes
        it: for ``chunks == 3`` on the fused kernels, three tensors of their own whose gradients the
        backward reads where they are (an attention's q, k, v); off them, views of :meth:`forward`'s
        output."""
        if _CHUNKS_OP is not None and self.group_size == 4 and _fused_eager(x) and type(chunks) is int:
            if not torch._C._is_any_autocast_enabled() or not self._caches():  # (as forward)
                return chunks_of(_CHUNKS_OP(x, self.weight, self.bias, chunks), chunks)
        if isinstance(x, torch.Tensor) and backend_for(x, self.group_size) == "reference":
            check_chunks(chunks, self.d)
            return self(x).chunk(chunks, -1)
        return flash_eq_linear_chunks(x, *self._params_for(x), chunks, self.group_size)

    def _kept(self, cast: torch.dtype | None) -> dict:
        """What inference keeps of the parameters for autocast dtype ``cast`` (None: autocast off), one
        entry shared by its uses (:meth:`ParamCache._cached`): ``"params"``, the weight and bias cast (or
        themselves), and where the dense form ran, ``"dense"``, its expanded weight and bias."""
        w, b = self.weight.detach(), None if self.bias is None else self.bias.detach()
        return self._cached(
            cast, lambda: {"params": (w, b) if cast is None else _cast_to(cast, None, w, b, False)[1:]}
        )

    def _params_for(self, x, caches: bool | None = None) -> tuple:
        """(weight, bias) for a call on ``x``: in inference under autocast their kept casts (above), else
        the parameters themselves. ``caches``: :meth:`_caches`, where the caller has it."""
        weight, bias = self.weight, self.bias
        cast = _autocast_dtype(x) if isinstance(x, torch.Tensor) else None
        if caches is None:
            caches = self._caches()  # first: it may drop what was kept
        if caches and cast is not None and weight.dtype != cast:
            weight, bias = self._kept(cast)["params"]
        return weight, bias

    @classmethod
    def from_naive(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> FlashEQLinear:
        """Build from a group-domain weight (d, c, T) or (d, 1, c, T) and bias (d,) or (d, 1)."""
        w = reference.as_group_weight(weight)
        if not w.is_floating_point():
            raise TypeError(f"weight must be floating point, got {w.dtype}")
        d, c, T = w.shape
        if bias is not None:
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
            if bias.dim() == 2 and bias.shape[1] == 1:
                bias = bias.reshape(-1)
            if tuple(bias.shape) != (d,):
                raise ValueError(f"bias must have shape ({d},) or ({d}, 1), got {tuple(bias.shape)}")
            if bias.dtype != w.dtype or bias.device != w.device:
                raise RuntimeError(
                    f"bias ({bias.dtype}, {bias.device}) must match weight ({w.dtype}, {w.device})"
                )
        layer = cls(c * T, d * T, bias is not None, T, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            layer.weight.copy_(layer._from_group(w))
            if bias is not None:
                layer.bias.copy_(bias)
        return layer

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group_size: int = 4, atol: float | None = None, rtol: float = 1e-6
    ):
        """Build from a dense nn.Linear whose weight is block-circulant; ValueError otherwise, naming the
        block (output field, input field) that breaks the structure most.

        Allowed deviation from block-circulant structure: ``atol`` if given, else ``rtol`` times the weight's
        largest entry, at least a few units of rounding of its dtype. The default ``rtol`` accepts weights
        built in float32 (e.g. escnn's exported C8 layers) also in float64.
        """
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_linear expects an nn.Linear, got {type(linear).__name__}")
        T, c, d = _split_features(linear.in_features, linear.out_features, group_size)
        W = linear.weight.detach()
        w = W.reshape(d, T, c, T)[:, 0]  # row copy t = 0 holds w[o, ci, s] unrolled
        scale = W.abs().max().item() if W.numel() else 0.0
        rel = max(rtol, 8 * torch.finfo(W.dtype).eps)
        tol = atol if atol is not None else rel * max(scale, 1e-30)
        off = (reference.dense_weight(w) - W).abs().reshape(d, T, c, T).amax((1, 3))  # per block (o, ci)
        dev = off.max().item() if off.numel() else 0.0
        if dev > tol:
            o, ci = divmod(int(off.argmax()), c)
            raise ValueError(
                f"nn.Linear weight is not block-circulant for group_size={T}: block (output field {o}, "
                f"input field {ci}) = rows {o * T}..{o * T + T - 1}, columns {ci * T}..{ci * T + T - 1} "
                f"deviates by {dev:.3g} > tolerance {tol:.3g}"
            )
        b = None
        if linear.bias is not None:
            B = linear.bias.detach().reshape(d, T)
            bdev = (B - B[:, :1]).abs().max().item()
            btol = atol if atol is not None else rel * max(B.abs().max().item(), 1e-30)
            if bdev > btol:
                raise ValueError(
                    f"nn.Linear bias is not shared across the {T} group copies "
                    f"(max deviation {bdev:.3g} > tolerance {btol:.3g})"
                )
            b = B[:, 0]
        layer = cls.from_naive(w, b)
        layer.weight.requires_grad_(linear.weight.requires_grad)
        return layer


def _source(layout: str, weight: str, weight_dim: int, bias: str, b) -> dict:
    """A naive layout as FlashEQLinear.naive_source records it (SOURCE_KEY); b: the bias entry, if any."""
    has_bias = isinstance(b, torch.Tensor)
    return {
        "layout": layout,
        "weight": weight,
        "weight_dim": weight_dim,
        "bias": bias if has_bias else None,
        "bias_dim": b.dim() if has_bias else None,
    }


def planes_to_naive_entries(state_dict, prefix: str, source: dict, dtype=None) -> None:
    """Rewrite FlashEQLinear's entries under ``prefix`` (``weight`` planes (T, d, c), ``bias`` (d,)) into the
    naive layout ``source`` (SOURCE_KEY's form: names and dims of weight and bias), in place; the weight
    converted in float64 and rounded once to ``dtype`` (default: the entry's); a bias ``source`` has none
    of is dropped."""
    w = _to_layout(state_dict.pop(prefix + "weight"), "group", dtype)  # (d, c, T)
    b = state_dict.pop(prefix + "bias", None)
    state_dict[prefix + source["weight"]] = w.unsqueeze(1) if source["weight_dim"] == 4 else w
    if b is not None and source["bias"]:
        state_dict[prefix + source["bias"]] = b.reshape(-1, 1) if source["bias_dim"] == 2 else b


def _naive_entries(state_dict, prefix: str, local_metadata):
    """(layout, weight key, bias key or None) of naive entries under ``prefix`` in a layout of
    :func:`flash_eqlinear.layouts.naive_layouts`, or None. A weight (d, 1, c, T) or, where its name cannot be
    FlashEQLinear's own ``weight``, (d, c, T); a bias (d, 1) or (d,); the layout's required buffers present.
    ``NaiveEQLinear``'s own entries (and our layers' in general) go by their layout metadata instead."""
    from .layouts import naive_layouts  # (layouts imports this module)

    if (local_metadata or {}).get(LAYOUT_KEY) == "planes":
        return None
    for lay in naive_layouts():
        if lay.name == "naive":
            continue
        w = state_dict.get(prefix + lay.weight)
        if not isinstance(w, torch.Tensor) or w.dim() not in (3, 4) or (w.dim() == 4 and w.shape[1] != 1):
            continue
        if w.dim() == 3 and lay.weight == "weight":  # (T, d, c) planes look the same
            continue
        if any(prefix + name not in state_dict for name in lay.requires if name in lay.buffers):
            continue
        b = state_dict.get(prefix + lay.bias) if lay.bias else None
        ok_bias = isinstance(b, torch.Tensor) and b.numel() == w.shape[0] and b.dim() in (1, 2)
        return lay, prefix + lay.weight, prefix + lay.bias if ok_bias else None
    return None


def convert_layer_entries(state_dict, prefix: str, local_metadata, layout="planes", dtype=None) -> bool:
    """Rewrite one layer's entries under ``prefix`` into ``layout`` ("planes": FlashEQLinear,
    "group": NaiveEQLinear), in place, rounding once to ``dtype`` (default: the entry's).

    Recognised: the naive layouts' entries (:func:`_naive_entries`: reference-style ``weights (d, 1, c, T)``
    with optional ``c (d, 1)``, ``weight (d, 1, c, T)`` with an index buffer, registered layouts), and our
    layers' ``weight`` whose metadata records the other layout. Converting to planes records the naive
    layout the entries came from (SOURCE_KEY). Returns whether anything changed.
    """
    found = _naive_entries(state_dict, prefix, local_metadata)
    if found is not None:
        lay, wkey, bkey = found
        w4 = state_dict.pop(wkey)
        b = state_dict.pop(bkey) if bkey else None
        w = w4.reshape(w4.shape[0], w4.shape[-2], w4.shape[-1])
        state_dict[prefix + "weight"] = _to_layout(w, "planes", dtype) if layout == "planes" else w
        if b is not None:
            state_dict[prefix + "bias"] = b.reshape(-1)
        local_metadata[LAYOUT_KEY] = layout
        if layout == "planes":  # where the entries came from (exported back by naive_state_dict)
            local_metadata[SOURCE_KEY] = _source(lay.name, lay.weight, w4.dim(), lay.bias or "bias", b)
        return True
    if not _in_other_layout(state_dict, prefix, local_metadata, layout):
        return False
    state_dict[prefix + "weight"] = _to_layout(state_dict[prefix + "weight"], layout, dtype)
    local_metadata[LAYOUT_KEY] = layout
    return True


def _in_other_layout(state_dict, prefix: str, local_metadata, layout: str) -> bool:
    """Whether our layer's ``weight`` under ``prefix`` is recorded in the layout other than ``layout``."""
    stored = (local_metadata or {}).get(LAYOUT_KEY)
    return stored in ("planes", "group") and stored != layout and prefix + "weight" in state_dict


def layer_entries_convertible(state_dict, prefix: str, local_metadata, layout="planes") -> bool:
    """Whether :func:`convert_layer_entries` would change the entries under ``prefix`` (nothing converted)."""
    found = _naive_entries(state_dict, prefix, local_metadata) is not None
    return found or _in_other_layout(state_dict, prefix, local_metadata, layout)
