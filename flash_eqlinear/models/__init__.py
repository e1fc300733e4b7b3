"""p4-equivariant vision models built from EQ-Linear layers: EQ-ViT and EQ-Swin.

Each model comes in three variants from one definition, chosen by ``variant``: ``"plain"``
(``nn.Linear``/``nn.LayerNorm``, non-equivariant baseline of the same total width), ``"naive"``
(:class:`~flash_eqlinear.NaiveEQLinear`) and ``"flash"`` (:class:`~flash_eqlinear.FlashEQLinear`)::

    from flash_eqlinear.models import eq_vit, eq_swin
    model = eq_vit("B", variant="flash", num_classes=1000, img_size=224)
    tiny = eq_swin(None, variant="naive", img_size=32, patch_size=2, embed_dim=16,
                   depths=(2, 2), num_heads=(2, 4), window_size=4)

Widths are total channel counts C = 4c (c fields of 4 group copies, group index fastest).
"""

from .layers import (
    GROUP_SIZE,
    VARIANTS,
    GroupLayerNorm,
    GroupPosEmbed,
    LiftingPatchEmbed,
    Variant,
    group_pool,
    is_linear_layer,
    roll_group,
    rotate_feature_map,
)
from .swin import SWIN_CONFIGS, EQSwin, PatchMerging, RelativePositionBias, eq_swin
from .vit import VIT_CONFIGS, EQViT, eq_vit

MODELS = {"vit": eq_vit, "swin": eq_swin}
SCALES = ("T", "S", "B", "L", "H")

__all__ = [
    "GROUP_SIZE",
    "VARIANTS",
    "MODELS",
    "SCALES",
    "VIT_CONFIGS",
    "SWIN_CONFIGS",
    "EQViT",
    "EQSwin",
    "eq_vit",
    "eq_swin",
    "Variant",
    "GroupLayerNorm",
    "GroupPosEmbed",
    "LiftingPatchEmbed",
    "PatchMerging",
    "RelativePositionBias",
    "group_pool",
    "roll_group",
    "rotate_feature_map",
    "is_linear_layer",
]
