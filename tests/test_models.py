"""EQ-ViT / EQ-Swin (flash_eqlinear.models): rotation invariance, naive == flash, parameter counts,
and the migration path of a model written with reference-style EQ-Linear layers.

Tiny configs on CPU. Invariance is checked on the logits, ``model(rot90(img)) == model(img)``, and
equivariance on the features, ``features(rot90(img)) == roll_group(rot90(features(img)))``.
"""

from __future__ import annotations

import copy
import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import RefEQLinear, rel_l2

from flash_eqlinear import FlashEQLinear, NaiveEQLinear, swap_eq_linear
from flash_eqlinear.models import (
    SCALES,
    VARIANTS,
    PatchMerging,
    RelativePositionBias,
    Variant,
    eq_swin,
    eq_vit,
    roll_group,
    rotate_feature_map,
)
from flash_eqlinear.models.layers import LiftingPatchEmbed, _rotation_grid
from flash_eqlinear.models.swin import MERGE_ORDER

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-5  # float32 rounding of a whole (tiny) network

TINY_VIT = dict(num_classes=10, img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
# grids 16 -> 8, window 4 with shift 2 in both stages: every exactness condition holds.
TINY_SWIN = dict(
    num_classes=10, img_size=32, patch_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=4
)
# The standard window 7 / shift 3 on grids 14 -> 7: the shifted blocks of stage 1 are not exact.
ODD_SWIN = dict(
    num_classes=10, img_size=28, patch_size=2, embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=7
)


def tiny(kind: str, variant: str, seed: int = 0, **kw) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "vit":
        return eq_vit(None, variant, **{**TINY_VIT, **kw}).eval()
    return eq_swin(None, variant, **{**TINY_SWIN, **kw}).eval()


def image(size: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def invariance_errors(model: nn.Module, img: torch.Tensor) -> list[float]:
    with torch.no_grad():
        ref = model(img)
        return [rel_l2(model(torch.rot90(img, k, (-2, -1))), ref) for k in (1, 2, 3)]


def assert_invariant(model: nn.Module, img: torch.Tensor) -> None:
    errs = invariance_errors(model, img)
    assert max(errs) < TOL, f"logits not rot90-invariant: rel L2 {errs}"


# ------------------------------------------------------------------------------------- invariance


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("kind", ["vit", "swin"])
@pytest.mark.parametrize("variant", ["naive", "flash"])
def test_invariant_logits(kind, variant, group_size):
    model = tiny(kind, variant, group_size=group_size)
    assert model.group_size == group_size
    assert_invariant(model, image(32))


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_plain_baseline_is_not_invariant(kind):
    """The same check fails for the plain baseline: the test can fail."""
    model = tiny(kind, "plain")
    with pytest.raises(AssertionError, match="not rot90-invariant"):
        assert_invariant(model, image(32))
    assert min(invariance_errors(model, image(32))) > 1e-2


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("variant", ["naive", "flash"])
def test_vit_token_equivariance(variant, group_size):
    """Patch tokens rotate and roll (by G / 4: a quarter turn); the class token rolls (its pooled value is
    invariant)."""
    G = group_size
    model, img = tiny("vit", variant, group_size=G), image(32)
    n = model.grid_size
    with torch.no_grad():
        a = model.forward_features(img)
        b = model.forward_features(torch.rot90(img, 1, (-2, -1)))
    grid = lambda t: t[:, 1:].unflatten(1, (n, n))  # noqa: E731
    assert rel_l2(grid(b), rotate_feature_map(grid(a), 1, G)) < TOL
    assert rel_l2(b[:, 0], roll_group(a[:, 0], G, G // 4)) < TOL
    if G > 4:  # (a roll by one is 45 degrees for C8: not what a quarter turn does)
        assert rel_l2(b[:, 0], roll_group(a[:, 0], G, 1)) > 1e-2


@pytest.mark.parametrize("group_size", [4, 8])
@pytest.mark.parametrize("variant", ["naive", "flash"])
def test_swin_feature_equivariance(variant, group_size):
    model, img = tiny("swin", variant, group_size=group_size), image(32)
    with torch.no_grad():
        a = model.forward_features(img)
        for k in (1, 2, 3):
            b = model.forward_features(torch.rot90(img, k, (-2, -1)))
            assert rel_l2(b, rotate_feature_map(a, k, group_size)) < TOL


def test_swin_odd_window_shift_is_not_exact_as_documented():
    """Window 7 / shift 3 (the standard config): shifted blocks break exactness; shift 0 is exact."""
    img = image(28)
    errs = invariance_errors(tiny("swin", "naive", **ODD_SWIN), img)
    assert min(errs) > 1e-4, errs  # approximately, not exactly, invariant
    assert max(errs) < 0.2, errs
    assert_invariant(tiny("swin", "naive", **ODD_SWIN, shift_size=0), img)
    assert_invariant(tiny("swin", "flash", **ODD_SWIN, shift_size=0), img)


def test_swin_even_window_at_standard_patch():
    """Window 8 / shift 4 with patch 4 (grids 16 -> 8): exact, as documented (img 256 analogue)."""
    model = tiny("swin", "flash", img_size=64, patch_size=4, window_size=8)
    assert_invariant(model, image(64, batch=1))


def test_swin_padded_sizes_run():
    """Grids not divisible by the window (padding) and odd grids before merging run."""
    model = tiny("swin", "flash", img_size=36)  # grid 18: windows pad to 20, merging 18 -> 9
    with torch.no_grad():
        out = model(image(36))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


# ------------------------------------------------------------------------------- building blocks


@pytest.mark.parametrize("G", [4, 8])
def test_patch_merging_equivariance(G):
    torch.manual_seed(0)
    merge = PatchMerging(Variant("naive", group_size=G), 16, 1e-5)
    x = torch.randn(2, 6, 6, 16)
    for k in (1, 2, 3):
        want = rotate_feature_map(merge.merge(x), k, G)
        assert torch.equal(merge.merge(rotate_feature_map(x, k, G)), want)
        assert rel_l2(merge(rotate_feature_map(x, k, G)), rotate_feature_map(merge(x), k, G)) < TOL
    # The documented arrangement v[(j, ci), g] = u[(g // m + j) mod 4, ci, g] over the MERGE_ORDER cycle.
    m, c = G // 4, 16 // G
    u = torch.stack([x[:, a::2, b::2] for a, b in MERGE_ORDER], dim=3).unflatten(-1, (c, G))  # (.., k, ci, g)
    v = merge.merge(x).unflatten(-1, (4, c, G))  # (.., j, ci, g)
    for j, g in itertools.product(range(4), range(G)):
        assert torch.equal(v[..., j, :, g], u[..., (g // m + j) % 4, :, g])
    plain = PatchMerging(Variant("plain"), 16, 1e-5)
    assert torch.equal(plain.merge(x), u.flatten(3))  # Swin's concatenation, in cycle order


def test_relative_position_bias_is_rotation_symmetric():
    torch.manual_seed(0)
    M = 5
    rb = RelativePositionBias(M, 3, 4)
    b = rb()  # (heads, L, L) over row-major window positions
    perm = torch.rot90(torch.arange(M * M).view(M, M), 1, (0, 1)).flatten()  # new index -> old index
    assert rel_l2(b[:, perm][:, :, perm], b) < 1e-6  # equal up to the rounding of the mean
    plain = RelativePositionBias(M, 3, 1)()  # G = 1: a free table, not symmetric
    assert rel_l2(plain[:, perm][:, :, perm], plain) > 1e-2


@pytest.mark.parametrize("G", [4, 8])
def test_pos_embed_and_lifting_are_equivariant(G):
    model = tiny("vit", "naive", group_size=G)
    n = model.grid_size
    pos = model.pos_embed().view(1, n, n, -1)
    assert torch.equal(rotate_feature_map(pos, 1, G), pos)
    assert model.pos_embed.weight.numel() == n * n * model.embed_dim // 4  # every symmetric embedding
    img = image(32)
    with torch.no_grad():
        a, b = model.patch_embed(img), model.patch_embed(torch.rot90(img, 1, (-2, -1)))
    assert rel_l2(b, rotate_feature_map(a, 1, G)) < TOL


def test_c8_lifting_filters_rotate_by_45_degrees():
    """Copy g of a C8 filter is the filter rotated by 45 g degrees: the odd copies by interpolation (the
    sampling grid of a quarter turn is exactly rot90, so it turns the same way), the rest by rot90."""
    torch.manual_seed(0)
    embed = LiftingPatchEmbed(3, 16, 5, group_size=8).double()
    w = embed.filters()[0].unflatten(0, (2, 8))  # (c, g, in, p, p)
    quarter = _rotation_grid(5, math.pi / 2).double().expand(2, 5, 5, 2)
    assert torch.allclose(
        F.grid_sample(embed.weight, quarter, align_corners=False), torch.rot90(embed.weight, 1, (-2, -1))
    )
    eighth = _rotation_grid(5, math.pi / 4).double().expand(2, 5, 5, 2)
    assert torch.equal(w[:, 0], embed.weight)
    assert torch.allclose(w[:, 1], F.grid_sample(embed.weight, eighth, align_corners=False))
    for g in range(2, 8):
        assert torch.equal(w[:, g], torch.rot90(w[:, g - 2], 1, (-2, -1)))
    # A linear ramp turned by 45 degrees (bilinear interpolation is exact for it inside the grid): at the
    # inner cells cos 45 ramp + sin 45 rot90(ramp), the rotation halfway to the quarter turn.
    ramp = torch.arange(5.0, dtype=torch.float64).sub(2).expand(5, 5)[None, None]
    turned = F.grid_sample(ramp, eighth[:1], align_corners=False)
    half = math.sqrt(0.5) * (ramp + torch.rot90(ramp, 1, (-2, -1)))
    assert torch.allclose(turned[..., 1:4, 1:4], half[..., 1:4, 1:4])


# --------------------------------------------------------------------------------- naive == flash


def _swap_copy(model: nn.Module) -> tuple[nn.Module, list[str]]:
    flash = copy.deepcopy(model)
    return flash, swap_eq_linear(flash, params="planes")


def test_group_layer_norm_inference_keeps_expanded_params():
    """Eval-mode inference reuses the expanded affine parameters until they change; training expands per
    call and trains them. The same outputs either way."""
    from flash_eqlinear.models.layers import GroupLayerNorm

    ln = GroupLayerNorm(24, 4).eval()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5), ln.bias.uniform_(-1, 1)
    x = torch.randn(3, 5, 24)
    w, b = ln.weight.repeat_interleave(4), ln.bias.repeat_interleave(4)
    want = torch.nn.functional.layer_norm(x, (24,), w, b)
    with torch.no_grad():
        y = ln(x)
        kept = ln._cache[2]
        assert torch.equal(y, want) and torch.equal(ln(x), y) and ln._cache[2] is kept
        ln.bias.add_(1.0)  # an in-place update: expanded again
        torch.testing.assert_close(ln(x), want + 1.0)
        assert ln._cache[2] is not kept
    ln.train()
    ln(x).sum().backward()
    assert ln._cache is None and ln.weight.grad is not None and ln.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_flash_layers_keep_dense_weight_off_the_kernels(kind):
    """Eval-mode inference on the CPU: every EQ-Linear of the flash model, the MLPs' and the attentions' qkv
    included, keeps its expanded weight (as the naive model's layers do), and the outputs stay the same."""
    flash = tiny(kind, "flash")
    img = image(32)
    with torch.no_grad():
        y = flash(img)
        layers = [m for m in flash.modules() if isinstance(m, FlashEQLinear)]
        assert layers and all(m._cache is not None and "dense" in m._cache[2] for m in layers)
        assert torch.equal(flash(img), y)
        flash.train()
        assert torch.equal(flash(img), y)  # nothing kept: computed per call, the same values


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_flash_matches_naive_same_weights(kind):
    naive = tiny(kind, "naive")
    n_naive = sum(isinstance(m, NaiveEQLinear) for m in naive.modules())
    flash, names = _swap_copy(naive)
    assert len(names) == n_naive > 0
    assert not any(isinstance(m, NaiveEQLinear) for m in flash.modules())
    assert sum(isinstance(m, FlashEQLinear) for m in flash.modules()) == n_naive
    img = image(32)
    with torch.no_grad():
        assert rel_l2(flash(img), naive(img)) <= TOL
    assert_invariant(flash, img)


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_flash_backward_matches_naive(kind):
    naive = tiny(kind, "naive").train()
    flash, _ = _swap_copy(naive)
    img = image(32)
    grads = []
    for model in (naive, flash):
        x = img.clone().requires_grad_()
        model(x).square().sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        grads.append(x.grad)
    assert rel_l2(grads[1], grads[0]) <= TOL


# -------------------------------------------------------------------------------- factory, counts


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("factory", [eq_vit, eq_swin], ids=["vit", "swin"])
def test_every_scale_builds_and_counts(factory):
    for scale in SCALES:
        counts = {}
        for variant in VARIANTS:
            model = factory(scale, variant, device="meta")
            assert all(p.is_meta for p in model.parameters())
            counts[variant] = _count(model)
        assert counts["naive"] == counts["flash"], (scale, counts)
        # EQ-Linear, norms, embeddings and tokens hold 4x fewer parameters; the (unshared) relative
        # position bias tables and class biases of the head keep the ratio just under 4.
        assert 3.95 < counts["plain"] / counts["naive"] <= 4.0, (scale, counts)


def test_plain_counts_match_the_standard_architectures():
    # timm's vit_base_patch16_224 (86,567,656) has a 768-entry position embedding for the class
    # token, which this ViT folds into the class token itself; swin_tiny_patch4_window7_224 exactly.
    assert _count(eq_vit("B", "plain", device="meta")) == 86_567_656 - 768
    assert _count(eq_swin("T", "plain", device="meta")) == 28_288_354


def test_attention_runs_qkv_hooks():
    # With a hook on qkv the attention calls the module (a hook may change its output), not forward_chunks.
    from flash_eqlinear.models.layers import Attention, Variant

    torch.manual_seed(0)
    attn = Attention(Variant("flash"), 32, 2)
    x = torch.randn(2, 5, 32)
    y = attn(x)
    seen = []
    attn.qkv.register_forward_hook(lambda m, i, o: seen.append(o.shape) or o * 2)
    y2 = attn(x)
    assert seen == [(2, 5, 96)] and not torch.allclose(y, y2)


def test_config_errors():
    with pytest.raises(ValueError, match="variant"):
        eq_vit(None, "dense", **TINY_VIT)
    with pytest.raises(ValueError, match="head_dim"):
        eq_vit(None, "flash", **{**TINY_VIT, "embed_dim": 24, "num_heads": 4})  # head dim 6
    with pytest.raises(ValueError, match="scale"):
        eq_swin("XL", "flash", device="meta")
    eq_vit(None, "plain", **{**TINY_VIT, "embed_dim": 24, "num_heads": 4})  # fine without groups
    for bad in (2, 6, 0, True, 8.0):  # the token grid's quarter turns must be group elements
        with pytest.raises(ValueError, match="group_size must be a multiple of 4"):
            eq_swin(None, "flash", **TINY_SWIN, group_size=bad)
    with pytest.raises(ValueError, match="head_dim"):
        eq_vit(None, "flash", **{**TINY_VIT, "embed_dim": 48, "num_heads": 4}, group_size=8)  # head dim 12


# ------------------------------------------------------------------------------- migration path


def ref_style_layer(in_features: int, out_features: int, bias: bool = True) -> RefEQLinear:
    """The models' linear-layer factory signature, building reference-style p4 layers."""
    return RefEQLinear(in_features, out_features, 4, bias=bias)


@pytest.mark.parametrize("kind", ["vit", "swin"])
def test_migration_reference_checkpoint_end_to_end(kind, tmp_path):
    orig = tiny(kind, "naive", linear_layer=ref_style_layer)
    n_ref = sum(isinstance(m, RefEQLinear) for m in orig.modules())
    img = image(32)
    with torch.no_grad():
        logits = orig(img)
    assert_invariant(orig, img)

    src, dst = tmp_path / "ref.pth", tmp_path / "flash.pth"
    torch.save({"model": orig.state_dict(), "epoch": 7}, src)
    proc = subprocess.run(
        [sys.executable, "-m", "flash_eqlinear.convert", str(src), str(dst)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"converted {n_ref} EQ-Linear layer(s)" in proc.stdout

    # (a) the original model, swapped in place.
    swapped, names = _swap_copy(orig)
    assert len(names) == n_ref
    assert sum(isinstance(m, FlashEQLinear) for m in swapped.modules()) == n_ref
    # (b) a freshly built (differently initialised) model, swapped, loaded from the converted file.
    fresh = tiny(kind, "naive", seed=123, linear_layer=ref_style_layer)
    swap_eq_linear(fresh, params="planes")
    ckpt = torch.load(dst, weights_only=True)
    assert ckpt["epoch"] == 7
    with torch.no_grad():
        assert rel_l2(fresh(img), logits) > 1e-2  # really a different model before loading
        fresh.load_state_dict(ckpt["model"])  # strict
        assert rel_l2(swapped(img), logits) <= TOL
        assert rel_l2(fresh(img), logits) <= TOL
