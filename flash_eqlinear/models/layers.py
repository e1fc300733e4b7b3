"""Building blocks shared by EQ-ViT and EQ-Swin, for the cyclic rotation groups C_G with G a multiple of 4
(p4: G = 4, the default; C8: G = 8, rotations by 45 degrees) and the plain baseline (G = 1).

Every block is written once for a *group size* ``G``: ``G = 4`` (or 8, ...) for the equivariant variants
(``naive``: :class:`~flash_eqlinear.NaiveEQLinear`, ``flash``: :class:`~flash_eqlinear.FlashEQLinear`)
and ``G = 1`` for ``plain`` (``nn.Linear``, ``nn.LayerNorm``), where every group construction below
collapses to the ordinary one (one filter orientation, no symmetrisation, a trivial group pool).

Conventions (README, 'Layout convention'): a feature of ``C = c*G`` channels is
``x.view(..., c, G)``, group index fastest; copy ``g`` belongs to the rotation by ``g * 360 / G`` degrees. A
spatial feature map ``F`` of shape ``(B, H, W, C)`` transforms under the rotation of the input image by
``torch.rot90(img, 1, (-2, -1))`` as

    F  ->  roll_group(rot90(F, 1, (1, 2)), G, G / 4)   (tokens move, then the group axis rolls by a quarter)

which is the action that every block below commutes with (``rot90`` of an ``(n, n)`` grid sends
the position ``(a, b)`` to ``(n - 1 - b, a)``). Only quarter turns act on a square grid of tokens, so for
G = 8 the models are exactly invariant to 90-degree rotations (a roll by 2); the 45-degree copies come from
the lifting embedding's filters rotated by interpolation.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..layer_norm import expand_over_group, fused_dtype, fused_group_layer_norm, stock_group_layer_norm
from ..layouts import SwappedEQLinear
from ..modules import FlashEQLinear, NaiveEQLinear, ParamCache
from ..ops import _autocast_dtype, backend_for, flash_eq_mlp
from ..swap import is_naive_eq_linear

__all__ = [
    "GROUP_SIZE",
    "VARIANTS",
    "Variant",
    "GroupLayerNorm",
    "LiftingPatchEmbed",
    "GroupPosEmbed",
    "Attention",
    "Mlp",
    "group_pool",
    "roll_group",
    "rotate_feature_map",
    "quarter_turn",
    "is_linear_layer",
]

GROUP_SIZE = 4  # the default: p4, rotations by multiples of 90 degrees
VARIANTS = ("plain", "naive", "flash")

_LINEARS: dict[str, Callable[..., nn.Module]] = {
    "plain": nn.Linear,
    "naive": NaiveEQLinear,
    "flash": FlashEQLinear,
}


class Variant:
    """Which layers a model is built from.

    ``plain``: ``nn.Linear`` / ``nn.LayerNorm``, group size 1 (the non-equivariant baseline of the
    same total width; ``group_size`` is ignored). ``naive`` / ``flash``: EQ-Linear layers with group size
    ``group_size`` (a multiple of 4: 4 for p4, 8 for C8) and the C_G versions of every other block.
    ``linear_layer`` overrides the linear class (any callable ``(in_features, out_features, bias) ->
    module`` computing an EQ-Linear of that group size in the layout above), e.g. reference-style modules
    of an existing code base; the rest follows ``name``.
    """

    def __init__(
        self, name: str, linear_layer: Callable[..., nn.Module] | None = None, group_size: int = GROUP_SIZE
    ):
        if name not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {name!r}")
        if (
            isinstance(group_size, bool)
            or not isinstance(group_size, int)
            or group_size < 4
            or group_size % 4
        ):
            raise ValueError(
                f"group_size must be a multiple of 4 (rotations by 360/G degrees that include the quarter "
                f"turns of the token grid; 4: p4, 8: C8), got {group_size!r}"
            )
        self.name = name
        self.equivariant = name != "plain"
        self.group_size = group_size if self.equivariant else 1
        if linear_layer is None:
            linear_layer = (
                _LINEARS[name]
                if name == "plain"
                else functools.partial(_LINEARS[name], group_size=group_size)
            )
        self._linear = linear_layer

    def linear(self, in_features: int, out_features: int, bias: bool = True) -> nn.Module:
        return self._linear(in_features, out_features, bias)

    def norm(self, dim: int, eps: float, feeds_linear: bool = False) -> nn.Module:
        """LayerNorm of ``dim`` channels; ``feeds_linear``: its output goes to linear layers only (through
        exact ops such as padding, rolls and reshapes), so the equivariant norm may hand them the autocast
        dtype they cast it to (``GroupLayerNorm(autocast_output=True)``)."""
        if not self.equivariant:
            return nn.LayerNorm(dim, eps=eps)
        return GroupLayerNorm(dim, self.group_size, eps=eps, autocast_output=feeds_linear)

    def __repr__(self) -> str:
        return f"Variant({self.name!r}, group_size={self.group_size})"


def build_model(cls, name: str, configs: dict, base: dict, scale, device, dtype, **kwargs) -> nn.Module:
    """Shared body of the model factories: ``base`` config, then ``configs[scale]`` (unless scale
    is None), then the caller's overrides (in ``kwargs``); built under ``device`` (``"meta"``
    allocates nothing), cast to ``dtype`` if given."""
    cfg = dict(base)
    if scale is not None:
        if scale not in configs:
            raise ValueError(f"unknown {name} scale {scale!r}; choose from {sorted(configs)}")
        cfg.update(configs[scale])
    cfg.update(kwargs)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = cls(**cfg)
    return model if dtype is None else model.to(dtype)


def is_linear_layer(module: nn.Module) -> bool:
    """nn.Linear, NaiveEQLinear/FlashEQLinear, or a reference-style EQ-Linear (``weights``, ``tranNum``)."""
    return isinstance(
        module, (nn.Linear, NaiveEQLinear, FlashEQLinear, SwappedEQLinear)
    ) or is_naive_eq_linear(module)


def _check_fields(name: str, n: int, G: int) -> int:
    if n % G:
        raise ValueError(f"{name}={n} must be a multiple of the group size {G} (whole fields)")
    return n // G


def roll_group(x: torch.Tensor, group_size: int = GROUP_SIZE, shifts: int = 1) -> torch.Tensor:
    """The group generator on a ``(..., c*G)`` feature: cyclic shift of the group axis."""
    shape = x.shape
    return torch.roll(x.reshape(*shape[:-1], shape[-1] // group_size, group_size), shifts, -1).reshape(shape)


def quarter_turn(group_size: int) -> int:
    """How far the group axis rolls when the image turns by 90 degrees: G / 4 (1 for p4, 2 for C8; for the
    plain G = 1, where any roll is the identity, 1)."""
    return max(group_size // 4, 1)


def rotate_feature_map(x: torch.Tensor, k: int = 1, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """How a ``(B, H, W, C)`` feature map transforms when the image is ``rot90``-ed ``k`` times."""
    return roll_group(torch.rot90(x, k, (1, 2)), group_size, k * quarter_turn(group_size))


def _rotation_grid(p: int, angle: float) -> torch.Tensor:
    """``(p, p, 2)`` sampling grid (``F.grid_sample``'s, ``align_corners=False``) that rotates a p x p filter
    by ``angle`` radians about its centre, in the sense of ``torch.rot90(w, 1, (-2, -1))`` (a quarter turn
    gives exactly that)."""
    cos, sin = math.cos(angle), math.sin(angle)
    theta = torch.tensor([[[cos, -sin, 0.0], [sin, cos, 0.0]]], dtype=torch.float64)
    return F.affine_grid(theta, [1, 1, p, p], align_corners=False)[0].float()


def group_pool(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(..., c*G) -> (..., c)``: mean over the group copies of each field (invariant)."""
    return x.unflatten(-1, (x.shape[-1] // group_size, group_size)).mean(-1)


class GroupLayerNorm(ParamCache, nn.Module):
    """LayerNorm over all ``C = c*G`` channels with affine parameters shared by the G copies.

    Mean and variance over all channels are invariant under any permutation of the group axis;
    ``weight`` and ``bias`` have shape ``(c,)`` and are expanded over the group axis. With G = 1
    this is ``nn.LayerNorm``. For G = 4 on CUDA it runs the fused op of
    :func:`~flash_eqlinear.layer_norm.group_layer_norm` in eager mode where that saves a pass (training,
    casts under autocast: one pass forward, one backward); elsewhere ``F.layer_norm`` with the expanded
    parameters, which in eval-mode inference are kept until the parameters change (the rules of
    ``NaiveEQLinear``'s expanded weight).

    ``autocast_output=True``: under autocast the output comes in the autocast dtype (float32 otherwise, as
    ``F.layer_norm``'s): for a norm whose output only feeds linear layers, which cast it to that dtype
    anyway: the same values, without a float32 output written and read back by a cast.
    """

    def __init__(
        self,
        num_features: int,
        group_size: int = GROUP_SIZE,
        eps: float = 1e-5,
        autocast_output: bool = False,
    ):
        super().__init__()
        self.num_features, self.group_size, self.eps = num_features, group_size, eps
        self.autocast_output = autocast_output
        c = _check_fields("num_features", num_features, group_size)
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self._cache = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _autocast_dtype(x) if self.autocast_output else None
        dtype = fused_dtype(x, self.weight, self.group_size, out)
        if dtype is not None:
            return fused_group_layer_norm(x, self.weight, self.bias, self.eps, dtype)
        w, b = self._cached(None, self._expanded) if self._caches() else self._expanded()
        return stock_group_layer_norm(x, w, b, self.eps, out)

    def _expanded(self) -> tuple[torch.Tensor, torch.Tensor]:
        return expand_over_group(self.weight, self.group_size), expand_over_group(self.bias, self.group_size)

    def extra_repr(self) -> str:
        extra = ", autocast_output=True" if self.autocast_output else ""
        return f"{self.num_features}, group_size={self.group_size}, eps={self.eps}{extra}"


class LiftingPatchEmbed(nn.Module):
    """Rotation-lifting patch embedding: ``(B, in_chans, H, W) -> (B, H/p, W/p, C)``.

    One filter bank ``weight (c, in_chans, p, p)`` with bias ``(c,)``; group copy ``g`` of output
    field ``o`` is the convolution (kernel = stride = p) with ``weight[o]`` rotated by ``g * 360 / G``
    degrees. For p4 that is ``rot90(weight[o], g)``. Because
    ``conv(rot90(img), rot90(K)) = rot90(conv(img, K))`` for non-overlapping patches tiling a
    square image, rotating the image rotates the token grid and rolls the group axis by one
    (exact). For G = 4m (C8: m = 2) the filters at the m angles below a quarter turn are ``weight``
    and its rotations by ``j * 90 / m`` degrees (bilinear interpolation on the p x p grid, zero outside),
    and copy ``j + m r`` is ``rot90`` of the j-th of them r times: the 90-degree rotation of the image
    still rolls the group axis exactly, by m. With G = 1 this is the usual ``Conv2d`` patch embedding.
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int, group_size: int = GROUP_SIZE):
        super().__init__()
        self.in_chans, self.embed_dim = in_chans, embed_dim
        self.patch_size, self.group_size = patch_size, group_size
        c = _check_fields("embed_dim", embed_dim, group_size)
        self.weight = nn.Parameter(torch.empty(c, in_chans, patch_size, patch_size))
        self.bias = nn.Parameter(torch.empty(c))
        self.reset_parameters()
        m = quarter_turn(group_size)
        if m > 1:  # sampling grids of the rotations by j * 90 / m degrees, j = 1 .. m-1
            grids = [_rotation_grid(patch_size, j * math.pi / (2 * m)) for j in range(1, m)]
            self.register_buffer("rotation_grids", torch.stack(grids), persistent=False)  # derived

    def reset_parameters(self) -> None:
        # As nn.Conv2d: kaiming_uniform(a=sqrt(5)) and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1.0 / math.sqrt(self.in_chans * self.patch_size**2)
        nn.init.uniform_(self.bias, -bound, bound)

    def filters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The expanded ``(C, in_chans, p, p)`` filter bank and ``(C,)`` bias, index ``o*G + g``."""
        G = self.group_size
        m = quarter_turn(G)
        base = [self.weight]  # the filters at the angles below a quarter turn
        if m > 1:
            c, p = self.weight.shape[0], self.patch_size
            for grid in self.rotation_grids.to(self.weight.dtype):
                base.append(F.grid_sample(self.weight, grid.expand(c, p, p, 2), align_corners=False))
        w = torch.stack([torch.rot90(base[g % m], g // m, (-2, -1)) for g in range(G)], dim=1)
        return w.flatten(0, 1), self.bias.repeat_interleave(G)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch_size
        if x.shape[-2] % p or x.shape[-1] % p:
            raise ValueError(f"image size {tuple(x.shape[-2:])} is not divisible by the patch size {p}")
        w, b = self.filters()
        return F.conv2d(x, w.to(x.dtype), b.to(x.dtype), stride=p).permute(0, 2, 3, 1)

    def extra_repr(self) -> str:
        return (
            f"{self.in_chans}, {self.embed_dim}, patch_size={self.patch_size}, group_size={self.group_size}"
        )


class GroupPosEmbed(nn.Module):
    """Rotation-symmetric absolute position embedding of an ``(n, n)`` token grid, shape ``(n, n, C)``.

    p4: free parameter ``q (n, n, c)``; copy ``g`` of field ``o`` is ``rot90(q[..., o], g)``. Hence
    ``pos[..., g] = rot90(pos[..., g - 1])``: the embedding is invariant under the action
    ``roll_group o rot90`` of the feature map, i.e. ``pos[R p] = roll_group(pos[p])``. It has
    ``n*n*c`` free entries (the action is free on (position, group copy) pairs, so this is every
    symmetric embedding). For G = 4m: ``q (n, n, c*m)`` viewed as ``(n, n, c, m)``, copy ``j + m r`` of field
    ``o`` is ``rot90(q[..., o, j], r)``, invariant under rot90 with a roll by m; ``n*n*C/4`` free entries,
    again every symmetric embedding. With G = 1 it is a free ``(n, n, C)`` parameter.
    """

    def __init__(self, grid_size: int, embed_dim: int, group_size: int = GROUP_SIZE, std: float = 0.02):
        super().__init__()
        self.grid_size, self.embed_dim, self.group_size = grid_size, embed_dim, group_size
        c = _check_fields("embed_dim", embed_dim, group_size)
        self.weight = nn.Parameter(torch.empty(grid_size, grid_size, c * quarter_turn(group_size)))
        nn.init.trunc_normal_(self.weight, std=std)

    def forward(self) -> torch.Tensor:
        G = self.group_size
        if G == 1:
            return self.weight
        m = quarter_turn(G)
        q = self.weight.unflatten(-1, (-1, m))  # (n, n, c, m)
        return torch.stack([torch.rot90(q[..., g % m], g // m, (0, 1)) for g in range(G)], dim=-1).flatten(-2)

    def extra_repr(self) -> str:
        return f"grid_size={self.grid_size}, embed_dim={self.embed_dim}, group_size={self.group_size}"


# The fused layers whose parameters the models' MLP and attention take for one fused call (_params_for).
_FUSED = (FlashEQLinear, SwappedEQLinear)


class Mlp(nn.Module):
    """Linear -> GELU -> Linear (GELU is pointwise, so it commutes with the group action).

    With two fused layers (:class:`~flash_eqlinear.FlashEQLinear` or :class:`~flash_eqlinear.SwappedEQLinear`,
    without forward hooks, which a fused call would skip) and the exact GELU, on the fused kernels one
    :func:`~flash_eqlinear.flash_eq_mlp` call (in inference, GELU in the first layer's kernel where it can
    be); the same function either way. Off them the layers run one by one (in inference, each with what it
    keeps).
    """

    def __init__(self, variant: Variant, dim: int, hidden: int):
        super().__init__()
        self.fc1 = variant.linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = variant.linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1, fc2 = self.fc1, self.fc2
        if (
            type(fc1) in _FUSED
            and type(fc2) in _FUSED
            and fc1.group_size == fc2.group_size
            and type(self.act) is nn.GELU
            and self.act.approximate == "none"
            and not any(m._forward_hooks or m._forward_pre_hooks for m in (fc1, self.act, fc2))
            and backend_for(x, fc1.group_size) == "cuda"
        ):
            return flash_eq_mlp(x, *fc1._params_for(x), *fc2._params_for(x), fc1.group_size)
        return fc2(self.act(fc1(x)))


class Attention(nn.Module):
    """Multi-head self-attention with heads made of whole fields.

    ``qkv`` maps ``C -> 3C``; output field ``o`` of the first ``c`` fields is a query field, etc.
    Head ``h`` holds channels ``[h*hd, (h+1)*hd)`` with ``hd`` a multiple of G, i.e. whole fields,
    so the group action permutes the channels inside each head identically for q and k: the
    scores ``q.k`` are invariant, the values (hence the outputs) roll. Computed by
    ``F.scaled_dot_product_attention``.

    ``forward(x, attn_mask)`` takes ``x (B, N, C)``, or ``x (B, W, N, C)`` for ``W`` windows of ``N``
    tokens each (Swin), in which case ``attn_mask`` is an additive ``(1, W * heads, N, N)`` tensor
    broadcast over the batch (window and head are merged into one SDPA "head" dimension).
    """

    def __init__(self, variant: Variant, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        _check_fields("head_dim", self.head_dim, variant.group_size)
        self.qkv = variant.linear(dim, 3 * dim)
        self.proj = variant.linear(dim, dim)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        H, hd = self.num_heads, self.head_dim
        # A FlashEQLinear qkv without hooks (a direct call would skip them): q, k, v as tensors of their own
        # (in training on the Hopper kernels), whose gradients its backward reads where they are (no pass
        # assembling one gradient of its whole output).
        qkv = self.qkv
        chunks = None
        if type(qkv) in _FUSED and not (qkv._forward_hooks or qkv._forward_pre_hooks):
            chunks = getattr(qkv, "forward_chunks", None)
        if x.dim() == 3:
            B, N, C = x.shape
            if chunks is not None:  # SDPA gives dq, dk, dv back in q, k, v's layout: free views
                q, k, v = (t.view(B, N, H, hd).transpose(1, 2) for t in chunks(x, 3))
            else:
                # Unbound along the 3 first, then each transposed: the same (B, H, N, hd) views as a
                # permute then unbind(0), but the backward stacks dq, dk, dv straight into qkv's (B, N, 3,
                # H, hd) layout (one contiguous stack) instead of a (3, B, H, N, hd) one copied back by the
                # permute's backward (less copying per training step: docs/kernels.md, Attention's qkv split).
                q, k, v = (t.transpose(1, 2) for t in self.qkv(x).view(B, N, 3, H, hd).unbind(2))
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=_mask_as(attn_mask, q))
            return self.proj(o.transpose(1, 2).reshape(B, N, C))
        B, W, N, C = x.shape
        if chunks is not None:  # a (B, W * H, N, hd) copy of each part, its gradient copied back: one pass
            q, k, v = (t.view(B, W, N, H, hd).transpose(2, 3).reshape(B, W * H, N, hd) for t in chunks(x, 3))
        else:
            qkv = self.qkv(x).view(B, W, N, 3, H, hd).permute(3, 0, 1, 4, 2, 5).reshape(3, B, W * H, N, hd)
            q, k, v = qkv.unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=_mask_as(attn_mask, q))
        return self.proj(o.view(B, W, H, N, hd).transpose(2, 3).reshape(B, W, N, C))


def _mask_as(mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """An additive mask in the query's dtype (SDPA requires it; under autocast q may be bf16)."""
    if mask is None or mask.dtype == torch.bool or mask.dtype == q.dtype:
        return mask
    return mask.to(q.dtype)
