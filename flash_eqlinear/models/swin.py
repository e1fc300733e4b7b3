"""EQ-Swin: a p4-equivariant Swin Transformer (window attention, shifted windows, patch merging).

One definition, three variants (``variant``): ``"plain"`` (``nn.Linear``/``nn.LayerNorm``, the
standard Swin of the same widths), ``"naive"`` (:class:`~flash_eqlinear.NaiveEQLinear`) and
``"flash"`` (:class:`~flash_eqlinear.FlashEQLinear`).

Equivariant pieces (see :mod:`flash_eqlinear.models.layers` for the action on feature maps):

* lifting patch embedding, LayerNorm with shared affine parameters, EQ-Linear, whole-field heads;
* **relative position bias** symmetrised over the 4 rotations of its ``(2M-1, 2M-1)`` table, so the
  bias of a displacement equals that of the rotated displacement (one scalar per head: the heads
  are whole fields, so the bias must be invariant, not merely equivariant);
* **patch merging**: a 90-degree rotation maps each aligned 2x2 neighbourhood to an aligned 2x2
  neighbourhood and cycles its four positions ``(0,0) -> (1,0) -> (1,1) -> (0,1)`` (row, column
  offsets) while rolling the group axis. Writing ``p_0..p_3`` for that cycle and ``u[k, ci, g]`` for
  copy ``g`` of field ``ci`` at ``p_k``, the merged feature has ``4c`` fields ``(j, ci)`` with
  ``v[(j, ci), g] = u[(g + j) mod 4, ci, g]``; then ``v`` transforms by a plain group roll, and an
  EQ-LayerNorm + EQ-Linear ``4C -> 2C`` (no bias) follow;
* head: LayerNorm, mean over tokens, mean over the group axis, ``nn.Linear``.

**Where EQ-Swin is exactly equivariant and where not.** The logits of the ``naive``/``flash``
variants are exactly invariant (up to float rounding) to ``torch.rot90(img, k, (-2, -1))`` when

1. the image is square and its side is a multiple of the patch size;
2. no padding happens: at every stage the token grid side is a multiple of that stage's window
   size (and even before each patch merging). Padding (bottom/right, as Swin does for other sizes)
   is not rotation-symmetric, so such inputs run but are only approximately invariant;
3. every shifted block uses ``shift_size == window_size / 2`` (or ``shift_size = 0``). The cyclic
   shift by ``s`` with its attention mask makes each axis' attention pieces
   ``[0, s), [s, s+M), ..., [n-M+s, n)`` of sizes ``s, M, ..., M, M-s``; a 90-degree rotation
   reverses one axis, giving sizes ``M-s, M, ..., M, s`` -- the same partition only if ``s = M-s``.
   **The standard configuration (window 7, shift 3) is therefore not exactly equivariant**: its
   shifted blocks on the 56/28/14 grids of a 224 image break the symmetry (the non-shifted blocks
   and the last stage, whose 7x7 grid is a single window with no shift, are exact). An even window
   with half-window shift (e.g. ``window_size=8`` with ``img_size=256``: grids 64/32/16/8) or
   ``shift_size=0`` gives an exactly invariant model.

With windows that tile the grid, the window partition itself is rotation-symmetric (a rotation maps
windows to windows), and attention inside a window is permutation-equivariant.
"""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import (
    GROUP_SIZE,
    Attention,
    LiftingPatchEmbed,
    Mlp,
    Variant,
    build_model,
    group_pool,
    quarter_turn,
)

__all__ = ["EQSwin", "SWIN_CONFIGS", "eq_swin", "PatchMerging", "RelativePositionBias"]

# Total channel counts C of the first stage (doubling per stage); patch 4, window 7.
SWIN_CONFIGS: dict[str, dict] = {
    "T": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24)),
    "S": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24)),
    "B": dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32)),
    "L": dict(embed_dim=192, depths=(2, 2, 18, 2), num_heads=(6, 12, 24, 48)),
    "H": dict(embed_dim=352, depths=(2, 2, 18, 2), num_heads=(11, 22, 44, 88)),
}

# Cyclic order of the 2x2 neighbourhood under rot90(., 1, (H, W)): (row, column) offsets.
MERGE_ORDER = ((0, 0), (1, 0), (1, 1), (0, 1))


def window_partition(x: torch.Tensor, M: int) -> torch.Tensor:
    """``(B, H, W, C) -> (B, (H/M)*(W/M), M*M, C)``, windows and their tokens in row-major order."""
    B, H, W, C = x.shape
    x = x.view(B, H // M, M, W // M, M, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, (H // M) * (W // M), M * M, C)


def window_reverse(x: torch.Tensor, M: int, H: int, W: int) -> torch.Tensor:
    """Inverse of :func:`window_partition`."""
    B, C = x.shape[0], x.shape[-1]
    x = x.view(B, H // M, W // M, M, M, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(B, H, W, C)


@lru_cache(maxsize=64)
def _shift_blocked(H: int, W: int, M: int, s: int, device: torch.device) -> torch.Tensor:
    """``(nW, M*M, M*M)`` bool: token pairs of a shifted window that come from different regions."""
    region = torch.zeros(H, W, dtype=torch.long, device=device)  # built on the device: no host copy
    n = 0
    for hs in (slice(0, -M), slice(-M, -s), slice(-s, None)):
        for ws in (slice(0, -M), slice(-M, -s), slice(-s, None)):
            region[hs, ws] = n
            n += 1
    win = window_partition(region[None, :, :, None], M)[0, :, :, 0]  # (nW, L)
    return win[:, :, None] != win[:, None, :]


class RelativePositionBias(nn.Module):
    """Swin's learned bias per head and relative displacement inside an ``M x M`` window.

    ``table`` has shape ``(2M-1, 2M-1, heads)`` (index ``(di + M-1, dj + M-1)``). With group size
    4 the table is averaged over its 4 rotations before use, so that ``bias(R delta) = bias(delta)``
    for the 90-degree rotation R: the attention scores then commute with rotating the window. The
    average is taken over 4 gathered copies (one index per rotation), not over 4 rotated tables.
    """

    def __init__(self, window_size: int, num_heads: int, group_size: int):
        super().__init__()
        M = self.window_size = window_size
        self.num_heads, self.group_size = num_heads, group_size
        self.table = nn.Parameter(torch.empty(2 * M - 1, 2 * M - 1, num_heads))
        nn.init.trunc_normal_(self.table, std=0.02)
        ii, jj = torch.meshgrid(torch.arange(M), torch.arange(M), indexing="ij")
        ii, jj = ii.flatten(), jj.flatten()
        index = (
            (ii[:, None] - ii[None, :] + M - 1) * (2 * M - 1) + (jj[:, None] - jj[None, :] + M - 1)
        ).flatten()
        if group_size > 1:  # row k: where rot90(table, k) reads each entry, at the window's pairs
            cells = torch.arange((2 * M - 1) ** 2).view(2 * M - 1, 2 * M - 1)
            index = torch.stack([torch.rot90(cells, k, (0, 1)).flatten()[index] for k in range(4)])
        self.register_buffer("index", index, persistent=False)  # derived: not in the state_dict

    def forward(self) -> torch.Tensor:
        """``(heads, M*M, M*M)``."""
        L = self.window_size**2
        t = self.table.flatten(0, 1)
        b = t[self.index] if self.group_size == 1 else t[self.index].mean(0)  # (L*L, heads)
        return b.view(L, L, -1).permute(2, 0, 1)


class SwinBlock(nn.Module):
    """(Shifted-)window attention block on a ``(B, H, W, C)`` map, then an MLP, both pre-norm."""

    def __init__(self, variant: Variant, dim, num_heads, window_size, shift_size, mlp_ratio, eps):
        super().__init__()
        if not 0 <= shift_size < window_size:
            raise ValueError(f"shift_size={shift_size} must be in [0, window_size={window_size})")
        self.window_size, self.shift_size = window_size, shift_size
        self.norm1 = variant.norm(dim, eps, feeds_linear=True)
        self.attn = Attention(variant, dim, num_heads)
        self.rel_bias = RelativePositionBias(window_size, num_heads, variant.group_size)
        self.norm2 = variant.norm(dim, eps, feeds_linear=True)
        self.mlp = Mlp(variant, dim, int(dim * mlp_ratio))

    def attn_mask(self, H: int, W: int, device, dtype) -> torch.Tensor:
        """Additive ``(1, nW * heads, L, L)`` mask: relative position bias (+ -inf across regions)."""
        M, s = self.window_size, self.shift_size
        nW = (H // M) * (W // M)
        bias = self.rel_bias().unsqueeze(0)  # (1, heads, L, L)
        if s:
            blocked = _shift_blocked(H, W, M, s, torch.device(device))
            mask = bias.masked_fill(blocked.unsqueeze(1), float("-inf"))  # (nW, heads, L, L)
        else:
            mask = bias.expand(nW, -1, -1, -1)
        return mask.reshape(1, -1, M * M, M * M).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        M, s = self.window_size, self.shift_size
        y = self.norm1(x)
        ph, pw = (-H) % M, (-W) % M
        if ph or pw:  # not rotation-symmetric: see the module docstring
            y = F.pad(y, (0, 0, 0, pw, 0, ph))
        Hp, Wp = H + ph, W + pw
        if s:
            y = torch.roll(y, (-s, -s), (1, 2))
        y = self.attn(window_partition(y, M), self.attn_mask(Hp, Wp, y.device, y.dtype))
        y = window_reverse(y, M, Hp, Wp)
        if s:
            y = torch.roll(y, (s, s), (1, 2))
        if ph or pw:
            y = y[:, :H, :W]
        x = x + y
        return x + self.mlp(self.norm2(x))

    def extra_repr(self) -> str:
        return f"window_size={self.window_size}, shift_size={self.shift_size}"


class PatchMerging(nn.Module):
    """2x2 neighbourhood -> one token, ``(B, H, W, C) -> (B, H/2, W/2, 2C)``, rotation-equivariant.

    See the module docstring for the field arrangement ``v[(j, ci), g] = u[(g + j) mod 4, ci, g]``
    over the neighbourhood cycle ``MERGE_ORDER`` (for G = 4m, ``u[(g // m + j) mod 4, ci, g]``: a quarter
    turn moves the neighbourhood by one and rolls the group axis by m). With G = 1 it is Swin's
    concatenation (in the cycle order) followed by LayerNorm and a bias-free Linear. Odd sizes are padded
    bottom/right (not rotation-symmetric).
    """

    def __init__(self, variant: Variant, dim: int, eps: float):
        super().__init__()
        self.dim, self.group_size = dim, variant.group_size
        self.norm = variant.norm(4 * dim, eps, feeds_linear=True)
        self.reduction = variant.linear(4 * dim, 2 * dim, False)
        G = self.group_size
        if G > 1:
            # v[(j, ci), g] = u[(g // m + j) mod 4, ci, g] as one gather over the concatenated channels
            # (position k, field ci, copy g) -> k * dim + ci * G + g.
            j, ci, g = torch.meshgrid(torch.arange(4), torch.arange(dim // G), torch.arange(G), indexing="ij")
            index = ((g // quarter_turn(G) + j) % 4 * dim + ci * G + g).flatten()
            self.register_buffer("merge_index", index, persistent=False)  # derived: not in the state_dict

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        if H % 2 or W % 2:
            x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))
        u = torch.cat([x[:, a::2, b::2] for a, b in MERGE_ORDER], dim=-1)  # (B, H/2, W/2, 4C)
        return u.index_select(-1, self.merge_index) if self.group_size > 1 else u

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reduction(self.norm(self.merge(x)))


class SwinStage(nn.Module):
    def __init__(
        self, variant, dim, depth, num_heads, resolution, window_size, shift_size, mlp_ratio, eps, downsample
    ):
        super().__init__()
        if resolution <= window_size:  # as Swin: one window covering the grid, no shift
            window_size, shift_size = resolution, 0
        self.window_size = window_size
        self.blocks = nn.ModuleList(
            SwinBlock(variant, dim, num_heads, window_size, 0 if i % 2 == 0 else shift_size, mlp_ratio, eps)
            for i in range(depth)
        )
        self.downsample = PatchMerging(variant, dim, eps) if downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x if self.downsample is None else self.downsample(x)


class EQSwin(nn.Module):
    """p4 EQ-Swin (``variant`` "naive"/"flash") or the plain Swin baseline (``variant="plain"``).

    ``embed_dim`` is the total channel count C of the first stage (stage i has ``C * 2**i``);
    every head dimension must be a multiple of 4 for the equivariant variants. ``shift_size``
    defaults to ``window_size // 2``. Input ``(B, in_chans, H, W)`` with H, W multiples of
    ``patch_size``; ``img_size`` fixes the per-stage window sizes (a stage whose grid is not
    larger than the window uses one window and no shift). See the module docstring for when the
    model is exactly rotation-invariant.
    """

    def __init__(
        self,
        variant: str = "flash",
        img_size: int = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 96,
        depths=(2, 2, 6, 2),
        num_heads=(3, 6, 12, 24),
        window_size: int = 7,
        shift_size: int | None = None,
        mlp_ratio: float = 4.0,
        norm_eps: float = 1e-5,
        linear_layer=None,
        group_size: int = GROUP_SIZE,
    ):
        super().__init__()
        v = Variant(variant, linear_layer, group_size)
        if len(depths) != len(num_heads):
            raise ValueError(f"depths {tuple(depths)} and num_heads {tuple(num_heads)} differ in length")
        self.variant, self.group_size = v.name, v.group_size
        self.img_size, self.patch_size, self.num_classes = img_size, patch_size, num_classes
        shift_size = window_size // 2 if shift_size is None else shift_size
        G = v.group_size
        self.patch_embed = LiftingPatchEmbed(in_chans, embed_dim, patch_size, G)
        self.patch_norm = v.norm(embed_dim, norm_eps)
        res = img_size // patch_size
        stages = []
        for i, (depth, heads) in enumerate(zip(depths, num_heads, strict=True)):
            stages.append(
                SwinStage(
                    v,
                    embed_dim * 2**i,
                    depth,
                    heads,
                    res,
                    window_size,
                    shift_size,
                    mlp_ratio,
                    norm_eps,
                    downsample=i < len(depths) - 1,
                )
            )
            res = (res + 1) // 2
        self.stages = nn.ModuleList(stages)
        self.num_features = embed_dim * 2 ** (len(depths) - 1)
        self.norm = v.norm(self.num_features, norm_eps)
        self.head = nn.Linear(self.num_features // G, num_classes)

    def forward_features(self, img: torch.Tensor) -> torch.Tensor:
        """Final feature map after the last norm, ``(B, h, w, C_last)``."""
        x = self.patch_norm(self.patch_embed(img))
        for stage in self.stages:
            x = stage(x)
        return self.norm(x)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(img).mean((1, 2))
        return self.head(group_pool(x, self.group_size))


def eq_swin(
    scale: str | None = "T",
    variant: str = "flash",
    num_classes: int = 1000,
    img_size: int = 224,
    *,
    device=None,
    dtype: torch.dtype | None = None,
    linear_layer=None,
    **overrides,
) -> EQSwin:
    """Build an EQ-Swin at ``scale`` in ``{"T", "S", "B", "L", "H"}`` (patch 4, window 7, MLP 4x).

    ``overrides`` replace any :class:`EQSwin` argument (``embed_dim``, ``depths``, ``num_heads``,
    ``window_size``, ``shift_size``, ``patch_size``, ...); with ``scale=None`` they define the
    whole config. ``device="meta"`` builds without allocating.
    """
    return build_model(
        EQSwin,
        "EQ-Swin",
        SWIN_CONFIGS,
        dict(patch_size=4, window_size=7),
        scale,
        device,
        dtype,
        variant=variant,
        num_classes=num_classes,
        img_size=img_size,
        linear_layer=linear_layer,
        **overrides,
    )
