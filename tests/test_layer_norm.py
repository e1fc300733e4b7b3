"""Group LayerNorm off the fused kernels (any device): the functional form and GroupLayerNorm's
``autocast_output`` against ``F.layer_norm`` with the expanded parameters."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from flash_eqlinear.layer_norm import fused_layer_norm_applies, group_layer_norm
from flash_eqlinear.models.layers import GroupLayerNorm, Variant


def expanded(t: torch.Tensor, G: int) -> torch.Tensor:
    return t.repeat_interleave(G)


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16])
def test_functional_is_layer_norm_with_shared_parameters(G, out_dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 6 * G, requires_grad=True)
    w, b = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    y = group_layer_norm(x, w, b, 1e-6, G, out_dtype)
    want = F.layer_norm(x, (6 * G,), expanded(w, G), expanded(b, G), 1e-6)
    want = want if out_dtype is None else want.to(out_dtype)
    assert y.dtype == want.dtype and torch.equal(y, want)
    assert not fused_layer_norm_applies(x, w, G, out_dtype)  # no CUDA tensor
    g = torch.randn_like(y)
    got, expect = (torch.autograd.grad(t, (x, w, b), g) for t in (y, want))
    assert all(torch.equal(a, e) for a, e in zip(got, expect, strict=True))


def test_functional_rejects_bad_parameters():
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match=r"weight and bias must have shape \(c,\)"):
        group_layer_norm(x, torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="bias"):
        group_layer_norm(x, torch.ones(4), torch.zeros(5))


def test_autocast_output():
    """Under autocast the norm's output comes in autocast's dtype: F.layer_norm's (float32) output rounded
    once; outside autocast, and without the flag, as F.layer_norm."""
    torch.manual_seed(0)
    norm = GroupLayerNorm(32, autocast_output=True)
    with torch.no_grad():
        norm.weight.normal_(), norm.bias.normal_()
    x = torch.randn(4, 32)
    want = F.layer_norm(x, (32,), expanded(norm.weight, 4), expanded(norm.bias, 4), norm.eps)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
        assert y.dtype == torch.bfloat16 and torch.equal(y, want.to(torch.bfloat16))
        norm.autocast_output = False
        assert torch.equal(norm(x), want)
    norm.autocast_output = True
    assert torch.equal(norm(x), want)
    assert "autocast_output=True" in repr(GroupLayerNorm(8, autocast_output=True))


def test_variant_norms():
    assert Variant("flash").norm(8, 1e-5, feeds_linear=True).autocast_output
    assert not Variant("naive").norm(8, 1e-5).autocast_output
    assert isinstance(Variant("plain").norm(8, 1e-5, feeds_linear=True), torch.nn.LayerNorm)
