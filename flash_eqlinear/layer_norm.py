"""Group LayerNorm: LayerNorm over all ``C = c*G`` channels with affine parameters shared by the G group
copies of each field, as a fused CUDA op for G = 4 and as stock torch ops elsewhere.

``flash_eqlinear::group_layer_norm_fwd(x (M, 4c), weight (c,), bias (c,), eps, out_dtype) -> (y, mean, rstd)``
and ``group_layer_norm_bwd`` (csrc/eq_group_layer_norm.h) compute it in one pass over x forward and one over
(grad_y, x) backward, grad_x and the parameters' gradients together, where stock ops take LayerNorm, the
expanded parameters, two backward kernels and the reductions over the group copies. With ``out_dtype`` the
forward also writes its output in that dtype: under autocast a LayerNorm whose output only feeds linear layers
can hand them the autocast dtype they would cast it to (the same values, rounded once), one pass over the
activations less than LayerNorm + cast (``GroupLayerNorm(autocast_output=True)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._extension import debug_switch
from .ops import _autocast_dtype, backend_for, kernels_available

__all__ = ["group_layer_norm", "fused_layer_norm_applies", "expand_over_group"]

_MAX_FIELDS = 512  # the kernels' limit: c <= 512 (C <= 2048 channels per row)
_HALF = (torch.float16, torch.bfloat16)


def expand_over_group(t: torch.Tensor, group_size: int) -> torch.Tensor:
    """A field's parameter once per group copy: ``(c,) -> (c * G,)``, index ``o * G + g`` (one copy kernel;
    ``repeat_interleave`` launches several and costs more host time per call)."""
    return t.unsqueeze(-1).expand(-1, group_size).reshape(-1)


def fused_layer_norm_applies(x: torch.Tensor, weight: torch.Tensor, group_size: int, out_dtype) -> bool:
    """Whether :func:`group_layer_norm` runs the fused CUDA op for these arguments: the kernels built, G = 4,
    a CUDA x of float32 / float16 / bfloat16 with ``c <= 512`` fields, eager (not under torch.compile, where
    Inductor fuses LayerNorm with its neighbours, nor under functorch transforms), a result dtype the
    kernels write: x's, or any for a float32 x (the result dtype is ``out_dtype`` if given, else float32
    under autocast, else x's), and a pass saved: a gradient to compute, or a cast on either side (the result's
    dtype differs from x's, or autocast would upcast a 16-bit x). ``FLASH_EQLINEAR_DEBUG=fused_norm=0`` turns
    it off (read per call)."""
    return fused_dtype(x, weight, group_size, out_dtype) is not None


def fused_dtype(x, weight, group_size, out_dtype) -> torch.dtype | None:
    """The dtype the fused op writes for these arguments (:func:`fused_group_layer_norm`'s ``dtype``), None
    where it does not run (:func:`fused_layer_norm_applies`)."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return None
    if backend_for(x, group_size) != "cuda" or debug_switch("fused_norm") == "0":
        return None
    if weight.dim() != 1 or weight.shape[0] > _MAX_FIELDS or not weight.is_floating_point():
        return None
    # Under autocast F.layer_norm computes in float32 (as the op does for any x) and returns float32.
    autocast = _autocast_dtype(x) is not None
    dtype = out_dtype or (torch.float32 if autocast else x.dtype)
    kernel_writes = dtype == x.dtype or (x.dtype == torch.float32 and dtype in _HALF)
    # Where the op saves nothing (no gradient, no cast on either side: one LayerNorm kernel either way, e.g.
    # inference in the model's dtype), F.layer_norm runs as it is.
    saves = (
        dtype != x.dtype
        or (autocast and x.dtype != torch.float32)
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )
    return dtype if kernel_writes and saves else None


def group_layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    group_size: int = 4,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """LayerNorm over x's last dimension (``C = c * group_size`` channels, index ``o * G + g``) with
    ``weight`` and ``bias`` of shape ``(c,)`` shared by the G copies of each field:
    ``F.layer_norm(x, (C,), weight_e, bias_e, eps)`` with ``weight_e[o * G + g] = weight[o]``, then cast to
    ``out_dtype`` if given. Same function on every path, up to rounding; under autocast (as ``F.layer_norm``)
    computed in float32, the output float32 unless ``out_dtype`` says otherwise. The fused CUDA op runs where
    :func:`fused_layer_norm_applies`; stock torch ops elsewhere."""
    C = x.shape[-1]
    if weight.dim() != 1 or bias.shape != weight.shape or C != weight.shape[0] * group_size:
        raise ValueError(
            f"group_layer_norm: weight and bias must have shape (c,) with c * group_size = {C} channels "
            f"(group_size {group_size}), got weight {tuple(weight.shape)} and bias {tuple(bias.shape)}"
        )
    dtype = fused_dtype(x, weight, group_size, out_dtype)
    if dtype is not None:
        return fused_group_layer_norm(x, weight, bias, eps, dtype)
    return stock_group_layer_norm(
        x, expand_over_group(weight, group_size), expand_over_group(bias, group_size), eps, out_dtype
    )


def stock_group_layer_norm(x, weight_e, bias_e, eps: float, out_dtype: torch.dtype | None) -> torch.Tensor:
    """:func:`group_layer_norm` by stock ops, with the parameters expanded (:func:`expand_over_group`)."""
    y = F.layer_norm(x, weight_e.shape, weight_e, bias_e, eps)
    return y if out_dtype is None else y.to(out_dtype)


def fused_group_layer_norm(x, weight, bias, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """The fused op on x (..., 4c) with output dtype ``dtype``, where :func:`fused_dtype` gave it (checked
    there; GroupLayerNorm calls both, one decision per call). The op's autograd node and backward are C++
    (csrc/eq_group_layer_norm_api.cpp)."""
    return _FWD(x.reshape(-1, x.shape[-1]), weight, bias, eps, dtype)[0].view(x.shape)


def _differentiable_grads(grad_y, x, weight, eps, needs_x, needs_wb):
    """(grad_x, grad_weight, grad_bias) of the norm by stock ops, differentiable themselves
    (create_graph=True: gradient penalties, double backward); None for those not needed."""
    G = x.shape[-1] // weight.shape[0]
    xf, g = x.float(), grad_y.float()
    mean = xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xf - mean).square().mean(-1, keepdim=True) + eps)
    xhat = (xf - mean) * rstd
    gx = gw = gb = None
    if needs_x:
        gwe = g * expand_over_group(weight.float(), G)
        gx = rstd * (gwe - gwe.mean(-1, keepdim=True) - xhat * (gwe * xhat).mean(-1, keepdim=True))
        gx = gx.to(x.dtype)
    if needs_wb:
        gw = (g * xhat).sum(0).view(-1, G).sum(-1).to(weight.dtype)
        gb = g.sum(0).view(-1, G).sum(-1).to(weight.dtype)
    return gx, gw, gb


if kernels_available():

    @torch.library.register_fake("flash_eqlinear::group_layer_norm_fwd")
    def _group_layer_norm_fwd_fake(x, weight, bias, eps, out_dtype):
        torch._check(
            x.dim() == 2 and weight.dim() == 1 and x.shape[1] == 4 * weight.shape[0],
            lambda: f"group_layer_norm_fwd: want x (M, 4c), weight (c,), got {x.shape}, {weight.shape}",
        )
        torch._check(
            out_dtype == x.dtype or x.dtype == torch.float32,
            lambda: f"group_layer_norm_fwd: out_dtype {out_dtype} for x of {x.dtype}",
        )
        M = x.shape[0]
        return (
            x.new_empty(x.shape, dtype=out_dtype),
            x.new_empty((M,), dtype=torch.float32),
            x.new_empty((M,), dtype=torch.float32),
        )

    @torch.library.register_fake("flash_eqlinear::group_layer_norm_bwd")
    def _group_layer_norm_bwd_fake(grad_y, x, weight, mean, rstd, needs_x, needs_wb):
        torch._check(
            grad_y.shape == x.shape and x.dim() == 2 and x.shape[1] == 4 * weight.shape[0],
            lambda: f"group_layer_norm_bwd: want grad_y and x (M, 4c), got {grad_y.shape}, {x.shape}",
        )
        c = weight.shape[0]
        return (
            x.new_empty(x.shape if needs_x else (0,)),
            weight.new_empty((c,) if needs_wb else (0,)),
            weight.new_empty((c,) if needs_wb else (0,)),
        )

    @torch.library.impl("flash_eqlinear::group_layer_norm_grads_differentiable", "CompositeImplicitAutograd")
    def _group_layer_norm_grads_differentiable(grad_y, x, weight, eps, needs_x, needs_wb):
        """The C++ node's backward under create_graph=True; gradients not needed come back as empty (0,)."""
        grads = _differentiable_grads(grad_y, x, weight, eps, needs_x, needs_wb)
        return tuple(grad_y.new_empty((0,)) if t is None else t for t in grads)

    _FWD = torch.ops.flash_eqlinear.group_layer_norm_fwd.default
