"""EQ-ViT: a p4-equivariant (rotation-invariant classifier) Vision Transformer, three variants.

One definition, three variants chosen by ``variant``:

* ``"plain"``: ``nn.Linear`` / ``nn.LayerNorm``, a standard ViT of the same total width C (the
  baseline; not equivariant);
* ``"naive"``: :class:`~flash_eqlinear.NaiveEQLinear` (dense block-circulant expansion + F.linear);
* ``"flash"``: :class:`~flash_eqlinear.FlashEQLinear` (same function, frequency-domain kernels).

The equivariant variants are *exactly* invariant (up to float rounding) to ``rot90`` of a square
input whose side is a multiple of the patch size: the lifting patch embedding and the symmetric
position embedding turn the rotation into (token permutation) x (group roll); LayerNorm with
shared affine parameters, EQ-Linear, GELU and attention with whole-field heads commute with both;
the class token is group-invariant (one value per field, shared by the 4 copies) so it is fixed by
the action; the head pools the class token over the group axis before its ``nn.Linear``.
A ``naive`` and a ``flash`` model with the same weights compute the same function, and
:func:`flash_eqlinear.swap_eq_linear` turns the former into the latter.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .layers import (
    GROUP_SIZE,
    Attention,
    GroupPosEmbed,
    LiftingPatchEmbed,
    Mlp,
    Variant,
    build_model,
    group_pool,
)

__all__ = ["EQViT", "VIT_CONFIGS", "eq_vit"]

# Total channel counts C (c = C/4 fields for the equivariant variants); patch 16.
VIT_CONFIGS: dict[str, dict] = {
    "T": dict(embed_dim=384, depth=12, num_heads=3),
    "S": dict(embed_dim=480, depth=12, num_heads=6),
    "B": dict(embed_dim=768, depth=12, num_heads=12),
    "L": dict(embed_dim=1024, depth=24, num_heads=16),
    "H": dict(embed_dim=1280, depth=32, num_heads=16),
}


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, variant: Variant, dim: int, num_heads: int, mlp_ratio: float, eps: float):
        super().__init__()
        self.norm1 = variant.norm(dim, eps, feeds_linear=True)
        self.attn = Attention(variant, dim, num_heads)
        self.norm2 = variant.norm(dim, eps, feeds_linear=True)
        self.mlp = Mlp(variant, dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class EQViT(nn.Module):
    """p4 EQ-ViT (``variant`` "naive"/"flash") or the plain ViT baseline (``variant="plain"``).

    ``embed_dim`` is the total channel count C (multiple of 4 for the equivariant variants; the
    head dimension ``embed_dim // num_heads`` too). Input ``(B, in_chans, img_size, img_size)``,
    output logits ``(B, num_classes)``. Structure: lifting patch embedding -> + symmetric position
    embedding -> [class token] + tokens -> ``depth`` blocks -> LayerNorm -> class token ->
    group mean -> ``nn.Linear(C / G, num_classes)``. The class token has no position embedding
    of its own (it would only add a constant to it). MLP hidden width ``mlp_ratio * C``.
    ``linear_layer`` overrides the linear class (see :class:`~flash_eqlinear.models.layers.Variant`).
    """

    def __init__(
        self,
        variant: str = "flash",
        img_size: int = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 768,
        depth: int = 12,
        num_heads: int = 12,
        mlp_ratio: float = 4.0,
        norm_eps: float = 1e-6,
        linear_layer=None,
        group_size: int = GROUP_SIZE,
    ):
        super().__init__()
        v = Variant(variant, linear_layer, group_size)
        if img_size % patch_size:
            raise ValueError(f"img_size={img_size} is not a multiple of patch_size={patch_size}")
        self.variant, self.group_size = v.name, v.group_size
        self.img_size, self.patch_size = img_size, patch_size
        self.embed_dim, self.num_classes = embed_dim, num_classes
        G = v.group_size
        self.grid_size = img_size // patch_size
        self.patch_embed = LiftingPatchEmbed(in_chans, embed_dim, patch_size, G)
        self.pos_embed = GroupPosEmbed(self.grid_size, embed_dim, G)
        self.cls_token = nn.Parameter(torch.empty(embed_dim // G))  # one value per field: invariant
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.blocks = nn.ModuleList(Block(v, embed_dim, num_heads, mlp_ratio, norm_eps) for _ in range(depth))
        self.norm = v.norm(embed_dim, norm_eps)
        self.head = nn.Linear(embed_dim // G, num_classes)

    def forward_features(self, img: torch.Tensor) -> torch.Tensor:
        """Tokens after the final norm, ``(B, 1 + N, C)`` (class token first)."""
        x = self.patch_embed(img)  # (B, n, n, C)
        if x.shape[1:3] != (self.grid_size, self.grid_size):
            raise ValueError(
                f"expected a {self.img_size}x{self.img_size} image ({self.grid_size}x{self.grid_size} "
                f"patches), got {tuple(img.shape[-2:])}"
            )
        x = (x + self.pos_embed().to(x.dtype)).flatten(1, 2)
        cls = self.cls_token.repeat_interleave(self.group_size).to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.forward_features(img)[:, 0]
        return self.head(group_pool(x, self.group_size))


def eq_vit(
    scale: str | None = "B",
    variant: str = "flash",
    num_classes: int = 1000,
    img_size: int = 224,
    *,
    device=None,
    dtype: torch.dtype | None = None,
    linear_layer=None,
    **overrides,
) -> EQViT:
    """Build an EQ-ViT at ``scale`` in ``{"T", "S", "B", "L", "H"}`` (patch 16, MLP 4x).

    ``overrides`` replace any :class:`EQViT` argument (``embed_dim``, ``depth``, ``num_heads``,
    ``patch_size``, ...); with ``scale=None`` they define the whole config (tiny test models).
    ``device="meta"`` builds without allocating (parameter counts of the large scales).
    """
    return build_model(
        EQViT,
        "EQ-ViT",
        VIT_CONFIGS,
        dict(patch_size=16),
        scale,
        device,
        dtype,
        variant=variant,
        num_classes=num_classes,
        img_size=img_size,
        linear_layer=linear_layer,
        **overrides,
    )
