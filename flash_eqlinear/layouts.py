"""Naive EQ-Linear layouts of existing codebases, and the fused layer that keeps a naive layer's parameters.

A *layout* says where a naive layer keeps its group-domain weight (``(d, 1, c, T)`` or ``(d, c, T)``), its
bias (``(d, 1)`` or ``(d,)``, or none) and its group size, and which modules have it. Built in: our
``NaiveEQLinear``; the reference style (``weights`` (d, 1, c, T), ``c`` (d, 1), ``tranNum``); and ``weight``
(d, 1, c, T) / ``bias`` (d,) with an index buffer ``shift_index``, T from the weight. A user adds their own
with :func:`register_naive_layout`; :func:`~flash_eqlinear.swap_eq_linear`, loading and the converter then
know it too. All layouts compute the same function: output copy t of field o is
``sum_{ci, s} x[ci, s] w[o, ci, (s - t) mod T] + b[o]``.

:class:`SwappedEQLinear` is what :func:`~flash_eqlinear.swap_eq_linear` puts in place of a naive layer by
default: it holds that layer's own ``Parameter`` objects and buffers under their names and shapes (so
``state_dict`` keys, optimizers built before the swap and checkpoints are unchanged) and runs the fused
kernels on the planes it computes from them (one small transform per training forward; kept in inference).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from . import reference
from .fourier import dft_basis, planes_to_naive
from .modules import (
    LAYOUT_KEY,
    FlashEQLinear,
    NaiveEQLinear,
    ParamCache,
    _source,
    naive_forward,
    planes_to_naive_entries,
)
from .ops import (
    _GROUP_OP,
    _LAYER_OP,
    _PLANES_OP,
    _autocast_dtype,
    _eager,
    _fused_eager,
    backend_for,
    check_chunks,
    chunks_of,
    flash_eq_linear,
    flash_eq_linear_chunks,
    gemm_form_t,
    reference_form,
)

__all__ = ["NaiveLayout", "register_naive_layout", "naive_layouts", "find_layout", "SwappedEQLinear"]


@dataclass(frozen=True)
class NaiveLayout:
    """Where a naive EQ-Linear keeps its parameters.

    ``weight``: the attribute (a Parameter) holding the group-domain weight, (d, 1, c, T) or (d, c, T);
    ``bias``: the attribute holding the bias, (d, 1) or (d,), absent or None for none (None here: never a
    bias); ``group_size``: the int attribute holding T (None: T is the weight's last dimension);
    ``classes``: the module classes that have this layout (empty: any module with these attributes);
    ``requires``: further attributes (e.g. an index buffer) a module must have to match, which keeps a
    layout such as ``weight`` (d, 1, c, T) from matching unrelated modules (a depthwise convolution's
    weight has that shape too; in a checkpoint, required ``buffers`` entries must be present). Buffers of a
    matched module are kept by both swaps (and in converted checkpoints); a ``FlashEQLinear`` without them
    accepts and drops their entries on load. Swapping, loading and converting all know every layout.
    """

    name: str
    weight: str = "weight"
    bias: str | None = "bias"
    group_size: str | None = None
    classes: tuple[type, ...] = ()
    requires: tuple[str, ...] = ()
    buffers: tuple[str, ...] = field(default=())  # state-dict entries of buffers to drop on conversion

    def parameters_of(self, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
        """(weight, bias or None, T) of ``module`` where it has this layout, else None."""
        if self.classes and not isinstance(module, self.classes):
            return None
        if any(not hasattr(module, a) for a in self.requires):
            return None
        w = getattr(module, self.weight, None)
        if not isinstance(w, nn.Parameter) or not w.is_floating_point() or w.dim() not in (3, 4):
            return None
        if w.dim() == 4 and w.shape[1] != 1:
            return None
        T = w.shape[-1]
        if self.group_size is not None:
            T = getattr(module, self.group_size, None)
            if isinstance(T, bool) or not isinstance(T, int) or T != w.shape[-1]:
                return None
        b = getattr(module, self.bias, None) if self.bias else None
        if b is not None and (not isinstance(b, torch.Tensor) or b.numel() != w.shape[0] or b.dim() > 2):
            return None
        return w, b, T


_BUILT_IN = (
    NaiveLayout("naive", classes=(NaiveEQLinear,), group_size="group_size"),
    NaiveLayout("reference", weight="weights", bias="c", group_size="tranNum"),
    NaiveLayout("weight_index", requires=("shift_index",), buffers=("shift_index",)),
)
_REGISTERED: list[NaiveLayout] = []


def register_naive_layout(layout: NaiveLayout) -> NaiveLayout:
    """Adds ``layout`` to the ones recognised (ahead of the built-in ones; a name registered again replaces
    the earlier entry). Returns it."""
    if not isinstance(layout, NaiveLayout):
        raise TypeError(f"layout must be a NaiveLayout, got {type(layout).__name__}")
    _REGISTERED[:] = [lay for lay in _REGISTERED if lay.name != layout.name]
    _REGISTERED.insert(0, layout)
    return layout


def naive_layouts() -> tuple[NaiveLayout, ...]:
    """The layouts recognised, in the order they are tried (registered ones first)."""
    return (*_REGISTERED, *_BUILT_IN)


def find_layout(module: nn.Module) -> NaiveLayout | None:
    """The first layout that ``module`` has (:meth:`NaiveLayout.parameters_of`), or None (always for this
    library's fused layers, whose buffers may be a naive layer's)."""
    if isinstance(module, (SwappedEQLinear, FlashEQLinear, *_ESCNN_CLASS)):
        return None
    for layout in naive_layouts():
        if layout.parameters_of(module) is not None:
            return layout
    return None


_BASIS: dict = {}  # dft_basis per (T, dtype, device), for SwappedEQLinear.planes


def _kept_constant(store: dict, key, make) -> torch.Tensor:
    """``store[key]``, made by ``make()`` the first time: outside inference mode, so that a constant first
    made in an inference_mode call is a normal tensor that later training can use."""
    t = store.get(key)
    if t is None:
        with torch.inference_mode(False), torch.no_grad():
            t = store[key] = make()
    return t


def _record_group_layout(module, state_dict, prefix, local_metadata):
    local_metadata[LAYOUT_KEY] = "group"  # (the naive layouts' weights are group-domain)


class SwappedEQLinear(ParamCache, nn.Module):
    """The fused layer on a naive layer's own parameters (what :func:`~flash_eqlinear.swap_eq_linear` puts in
    place of a naive layer by default).

    Holds the naive layer's ``Parameter`` objects, buffers and group-size attribute under their names, so
    ``state_dict()`` (keys, shapes, values), ``named_parameters()`` and optimizers built before the swap are
    those of the layer it replaced, and checkpoints load either way without conversion. Each forward computes
    the frequency planes (T, d, c) from the group-domain weight (a small differentiable transform, in FP32 for
    16-bit weights, rounded once; in inference kept until the weight changes, by ``FlashEQLinear``'s rules)
    and runs the fused kernels on them; the weight's gradient is the transform's adjoint of the planes'.
    Same function and, with any optimizer, the same training as the naive layer, to rounding.
    ``FlashEQLinear`` (planes as the parameters) saves that transform per step.
    """

    def __init__(self, module: nn.Module, layout: NaiveLayout | None = None):
        super().__init__()
        layout = layout or find_layout(module)
        found = layout.parameters_of(module) if layout is not None else None
        if found is None:
            raise TypeError(f"{type(module).__name__} is not a naive EQ-Linear of a known layout")
        w, b, T = found
        self.layout = layout
        # (fields per group copy under names of our own: a naive layer's parameter may be called c)
        self.group_size, self._fields = T, (w.shape[-2], w.shape[0])
        self.in_features, self.out_features = w.shape[-2] * T, w.shape[0] * T
        self._weight_name = layout.weight
        self._bias_name = layout.bias if b is not None else None
        for name, p in module.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, buf in module.named_buffers(recurse=False):
            self.register_buffer(name, buf, persistent=name not in module._non_persistent_buffers_set)
        if layout.group_size is not None:
            setattr(self, layout.group_size, T)
        self._cache = None
        self.train(module.training)
        self.register_state_dict_post_hook(_record_group_layout)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        # FlashEQLinear's entries (planes, by their metadata) load too: converted to this layer's layout.
        w = state_dict.get(prefix + "weight")
        if (
            (local_metadata or {}).get(LAYOUT_KEY) == "planes"
            and isinstance(w, torch.Tensor)
            and w.dim() == 3
        ):
            own_w, own_b = self._cache_params()
            source = _source("", self._weight_name, own_w.dim(), self._bias_name, own_b)
            planes_to_naive_entries(state_dict, prefix, source, own_w.dtype)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing, unexpected, errors)

    def _cache_params(self) -> tuple:
        return getattr(self, self._weight_name), getattr(self, self._bias_name) if self._bias_name else None

    def group_weight(self) -> torch.Tensor:
        """The group-domain weight as (d, c, T): a view of the parameter."""
        c, d = self._fields
        return self._cache_params()[0].reshape(d, c, self.group_size)

    def _basis(self, w: torch.Tensor) -> torch.Tensor:
        """The (T, T) DFT basis in the transform's work dtype (FP32 for 16-bit weights) on w's device; kept
        (made per call it costs a dozen small launches)."""
        work = torch.float32 if w.dtype in (torch.float16, torch.bfloat16) else w.dtype
        T = self.group_size
        return _kept_constant(_BASIS, (T, work, w.device), lambda: dft_basis(T, work, w.device))

    def planes(self) -> torch.Tensor:
        """The frequency planes (T, d, c) of the weight (:func:`~flash_eqlinear.naive_to_planes`), in its
        dtype (16-bit: made in FP32, rounded once); differentiable."""
        g = self.group_weight()
        Q = self._basis(g)
        if _PLANES_OP is not None and _eager():  # one dispatcher call and one node, below Python
            return _PLANES_OP(g, Q)
        # (T, T) @ (T, d*c): the planes contiguous, (T, d, c), in one product (its backward: one more), in the
        # work dtype: not autocast's 16-bit product
        T = self.group_size
        with torch.autocast(g.device.type, enabled=False):
            return (Q @ g.to(Q.dtype).reshape(-1, T).t()).view(T, *g.shape[:2]).to(g.dtype)

    def _group_op_call(self, x) -> bool:
        """Whether a call on ``x`` is one ``eq_linear_group`` op: eager on the fused kernels, planes not kept
        (training, or gradients recorded), the planes made inside the op in the dtype the layer runs in."""
        return _GROUP_OP is not None and self.group_size == 4 and _fused_eager(x) and not self._caches()

    def _params_for(self, x) -> tuple:
        """(planes (T, d, c), bias (d,) or None) for a call on ``x``: made per call (differentiable), or in
        inference kept until the weight changes (under autocast, cast: ``FlashEQLinear._params_for``)."""
        w, b = self._cache_params()
        if not self._caches():
            return self.planes(), None if b is None else b.reshape(-1)
        cast = _autocast_dtype(x) if isinstance(x, torch.Tensor) else None
        cast = None if w.dtype == torch.float64 else cast

        def kept():
            p, bd = self.planes().detach(), None if b is None else b.detach().reshape(-1)
            return (p, bd) if cast is None else (p.to(cast), None if bd is None else bd.to(cast))

        return self._cached(cast, kept)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._group_op_call(x):  # (first: the training step's path, the least host work)
            w, b = self._cache_params()
            return _GROUP_OP(x, w, b, self._basis(w))[0]
        T = self.group_size
        if not (isinstance(x, torch.Tensor) and backend_for(x, T) == "cuda"):
            c, d = self._fields
            w, b = self._cache_params()
            if reference_form(x, T, c, d, dense_kept=self._caches()) == "dense" and not gemm_form_t(
                x, w, b, T, c, d
            ):
                # Off the fused kernels, where the dense form runs: the naive layer's own computation.
                return naive_forward(self, x, self.group_weight(), None if b is None else b.reshape(-1), T)
        planes, b = self._params_for(x)
        if _LAYER_OP is not None and T == 4 and _fused_eager(x):
            return _LAYER_OP(x, planes, b)
        return flash_eq_linear(x, planes, b, T)

    def forward_chunks(self, x: torch.Tensor, chunks: int) -> tuple[torch.Tensor, ...]:
        """``self(x).chunk(chunks, -1)`` as :meth:`FlashEQLinear.forward_chunks` makes it (an attention's q,
        k, v as tensors of their own on the fused kernels)."""
        if isinstance(x, torch.Tensor) and backend_for(x, self.group_size) == "reference":
            check_chunks(chunks, self._fields[1])
            return self(x).chunk(chunks, -1)
        if self._group_op_call(x):
            check_chunks(chunks, self._fields[1])
            w, b = self._cache_params()
            return chunks_of(_GROUP_OP(x, w, b, self._basis(w), None, chunks), chunks)
        return flash_eq_linear_chunks(x, *self._params_for(x), chunks, self.group_size)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self._bias_name is not None}, "
            f"group_size={self.group_size}, layout={self.layout.name!r}"
        )


# ---- escnn: pointwise layers between regular fields of C_N ----------------------------------------------
#
# escnn's R2Conv with a 1x1 kernel (stride 1, no padding, dilation 1, groups 1) and escnn.nn.Linear, with
# every input and output field the regular representation of a cyclic group C_N, are EQ-Linear layers: escnn's
# regular fields use this library's layout (element j of a field at channel j, the generator shifting j to
# j + 1). Their learnable `weights` hold, per (output field, input field), N coefficients of escnn's basis;
# the planes are a fixed linear map of them, read off the layer's own basis expansion (so it holds whatever
# escnn's basis, float32-sampled for C8, is).


def escnn_candidate(module: nn.Module) -> tuple[bool, str]:
    """(whether ``module`` is an escnn layer that :class:`EscnnEQLinear` replaces, why not otherwise). Only
    escnn's R2Conv and Linear are looked at (other modules: (False, ""))."""
    import sys

    if "escnn" not in sys.modules:  # a model holding escnn layers has imported it
        return False, ""
    from escnn import group as egroup
    from escnn import nn as enn

    if not isinstance(module, (enn.R2Conv, enn.Linear)):
        return False, ""
    if isinstance(module, enn.R2Conv):
        ks = module.kernel_size if isinstance(module.kernel_size, int) else max(module.kernel_size)
        geometry = (ks, module.stride, module.padding, module.dilation, getattr(module, "groups", 1))
        if geometry != (1, 1, 0, 1, 1):
            return False, "not pointwise (kernel_size 1, stride 1, padding 0, dilation 1, groups 1)"
    G = module.in_type.fibergroup
    if not isinstance(G, egroup.CyclicGroup):
        return False, f"group {G.name} is not cyclic"
    for side, ftype in (("input", module.in_type), ("output", module.out_type)):
        if any(rep.name != "regular" for rep in ftype.representations):
            return False, f"{side} fields are not all regular representations of {G.name}"
    N = G.order()
    if module.weights.numel() != module.in_type.size * module.out_type.size // N:
        return False, f"{module.weights.numel()} basis coefficients, not N = {N} per pair of fields"
    return True, ""


def _escnn_map(module: nn.Module) -> tuple[torch.Tensor, str, float]:
    """For an escnn layer on regular fields of C_N (``escnn_candidate``): M (N, N), float64 on the weights'
    device, with planes[:, o, i] = M @ weights[o, i, :] (``order`` "dcj": weights.view(d, c, N); "cdj":
    weights.view(c, d, N)), and the factor of the bias in each output channel. Read off the layer's own basis
    expansion of one-hot weights (N + 1 expansions; no random numbers drawn, nothing of escnn's changed), so
    it holds whatever escnn's basis is (float32-sampled for C8)."""
    N = module.in_type.fibergroup.order()
    c, d = module.in_type.size // N, module.out_type.size // N
    w0 = module.weights
    with torch.inference_mode(False), torch.no_grad():
        M = torch.zeros(N, N, dtype=torch.float64, device=w0.device)
        order = "dcj"
        for k in range(N + 1 if c * d > 1 else N):
            e = torch.zeros_like(w0)
            e[k] = 1.0
            dense = module._basisexpansion(e).reshape(d, N, c, N).double()
            o, i = divmod(int(dense.abs().sum((1, 3)).argmax()), c)
            if k == N:  # the second field pair tells the index order apart
                order = "dcj" if (o, i) == divmod(1, c) else "cdj"
                break
            block = dense[o, :, i, :]
            w = block[0]  # row t = 0 holds w[s]; a circulant block: row t = w rolled by t
            off = (reference.dense_weight(w.view(1, 1, N)) - block).abs().max()
            if (o, i) != (0, 0) or off > 1e-5 * max(w.abs().max(), 1e-30):
                raise TypeError(f"escnn's C_{N} basis element {k} is not a circulant block of fields (0, 0)")
            M[:, k] = dft_basis(N, device=w0.device) @ w
        bexp = getattr(module, "bias_expansion", None)
        scale = float(bexp[0, 0]) if bexp is not None else 1.0
    return M, order, scale


def escnn_eq_linear(module: nn.Module) -> nn.Module:
    """The replacement of an escnn layer that :func:`escnn_candidate` accepts: an escnn ``EquivariantModule``
    (class ``EscnnEQLinear``) taking and returning ``GeometricTensor``s of the layer's types, holding the
    layer's own ``weights``, ``bias``, buffers and basis submodule under their names (state_dict, optimizers
    and training as escnn's), and running this library's layer on the planes made from ``weights`` (kept in
    inference). escnn's ``export()`` of it gives the plain layer (``nn.Conv2d`` 1x1 or ``nn.Linear``)."""
    ok, why = escnn_candidate(module)
    if not ok:
        raise TypeError(f"{type(module).__name__}: {why or 'not an escnn R2Conv or Linear'}")
    return _escnn_class()(module)


_ESCNN_CLASS = []


def _escnn_class():
    if _ESCNN_CLASS:
        return _ESCNN_CLASS[0]
    from escnn import nn as enn

    class EscnnEQLinear(ParamCache, enn.EquivariantModule):
        def __init__(self, module):
            super().__init__()
            self.in_type, self.out_type = module.in_type, module.out_type
            self.group_size = T = module.in_type.fibergroup.order()
            self.conv = isinstance(module, enn.R2Conv)
            self._fields = (module.in_type.size // T, module.out_type.size // T)
            for name, p in module.named_parameters(recurse=False):
                self.register_parameter(name, p)
            for name, buf in module.named_buffers(recurse=False):
                self.register_buffer(name, buf, persistent=name not in module._non_persistent_buffers_set)
            for name, child in module.named_children():
                self.add_module(name, child)
            self._dense_name = "filter" if self.conv else "matrix"  # escnn's eval-mode buffers
            self._cache = None
            self.training = module.training
            self._map = _escnn_map(module)  # (M in float64, order, bias scale)
            self._maps = {}  # M per (dtype, device) of the weights

        def _cache_params(self) -> tuple:
            return self.weights, getattr(self, "bias", None)

        def _planes(self) -> tuple:
            """(planes (T, d, c), bias (d,) or None) from escnn's parameters; differentiable."""
            w, b = self._cache_params()
            (c, d), T = self._fields, self.group_size
            M64, order, scale = self._map
            M = _kept_constant(
                self._maps, (w.dtype, w.device), lambda: M64.to(device=w.device, dtype=w.dtype)
            )
            g = w.view(d, c, T) if order == "dcj" else w.view(c, d, T).transpose(0, 1)
            return torch.einsum("kj,ocj->koc", M, g), None if b is None else b * scale

        def _params_for(self, x) -> tuple:
            if not self._caches():
                return self._planes()
            return self._cached(
                None, lambda: tuple(None if t is None else t.detach() for t in self._planes())
            )

        def forward(self, x):
            if x.type != self.in_type:
                raise TypeError(f"input field type {x.type} does not match the layer's {self.in_type}")
            t = x.tensor
            planes, b = self._params_for(t)
            if self.conv:  # channels at dim 1: the layer on channels-last views
                y = flash_eq_linear(t.movedim(1, -1), planes, b, self.group_size).movedim(-1, 1)
            else:
                y = flash_eq_linear(t, planes, b, self.group_size)
            return enn.GeometricTensor(y, self.out_type, getattr(x, "coords", None))

        def _dense(self) -> tuple:
            planes, b = (t.detach() if t is not None else None for t in self._planes())
            W = reference.dense_weight(planes_to_naive(planes))
            B = None if b is None else reference.dense_bias(b, self.group_size)
            return (W[:, :, None, None] if self.conv else W), B

        def train(self, mode: bool = True):
            # escnn's eval-mode buffers as escnn keeps them: dropped in training, made from the weights in
            # eval
            if mode:
                for name in (self._dense_name, "expanded_bias"):
                    self._buffers.pop(name, None)
            elif self.training or not self.conv:  # (escnn's Linear rebuilds them at every eval())
                W, B = self._dense()
                self.register_buffer(self._dense_name, W)
                if B is not None:
                    self.register_buffer("expanded_bias", B)
            return super().train(mode)

        def evaluate_output_shape(self, input_shape: tuple) -> tuple:
            return (input_shape[0], self.out_type.size, *input_shape[2:])

        def export(self) -> nn.Module:
            W, B = self._dense()
            C, D = self.in_type.size, self.out_type.size
            plain = (
                nn.Conv2d(C, D, 1, bias=B is not None) if self.conv else nn.Linear(C, D, bias=B is not None)
            )
            plain = plain.to(device=W.device, dtype=W.dtype)
            with torch.no_grad():
                plain.weight.copy_(W)
                if B is not None:
                    plain.bias.copy_(B)
            return plain.train(self.training)

        def extra_repr(self) -> str:
            kind = "1x1 R2Conv" if self.conv else "Linear"
            return f"{kind}, C_{self.group_size}, {self.in_type.size} -> {self.out_type.size} channels"

    _ESCNN_CLASS.append(EscnnEQLinear)
    return EscnnEQLinear
