"""Pure-PyTorch EQ-Linear for any cyclic group size T, dtype and device (the reference path).

Layout (both paths): input ``(..., C)`` with ``C = c*T`` viewed as ``(..., c, T)``, group index
fastest; output ``(..., D)`` with ``D = d*T``; bias ``(d,)`` shared by the T group copies.

* :func:`naive_eq_linear` expands the group-domain weight ``w (d, c, T)`` into the dense
  block-circulant ``(D, C)`` matrix ``W[(o,t),(ci,s)] = w[o, ci, (s-t) mod T]`` and calls F.linear.
* :func:`fourier_eq_linear` takes the frequency planes ``(T, d, c)`` (see :mod:`.fourier`),
  transforms ``x`` along the group axis, does one small real (k = 0, T/2) or complex product per
  frequency, and transforms back: (2T-2)/T^2 of the dense MACs for even T, (2T-1)/T^2 for odd
  T (6/16 for T = 4).
* :func:`fourier_eq_linear_backward` gives the three gradients of the Fourier path in closed form
  (the same structure as the forward), used as the backward of the fused kernels.

Range: in fp16 / bf16 the Fourier path computes the group transforms and the bias in FP32 (autocast kept
off inside) and rounds its result once. A transform can reach sqrt(T) times its input's largest entry
(``|xf| <= ||x_group||_2``), e.g. 2 x 33000 for T = 4, past fp16's 65504, so that 16-bit transforms would
overflow where nn.Linear (F.linear with the dense weight) is finite. The per-frequency products run in
FP32 for fp16 and in bf16 (FP32 accumulation) for bf16, whose range is FP32's. The per-frequency scales
are folded into the weights, not applied to the activations or their gradients: each transform and
product, forward and autograd backward, is bounded by the per-group L2 norm of an input, output or
gradient. So fp16 keeps nn.Linear's range; bf16 (and FP32) do up to the top factor sqrt(T) of the range
(e.g. bf16 inputs all 2e38, T = 4: the transform's 4e38 exceeds FP32's 3.4e38).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from .fourier import check_group_size, dft_basis, plane_kinds

__all__ = [
    "naive_eq_linear",
    "fourier_eq_linear",
    "fourier_eq_linear_backward",
    "dense_weight",
    "circulant_index",
    "as_group_weight",
    "check_inputs",
]


def as_group_weight(w: torch.Tensor) -> torch.Tensor:
    """Accept ``(d, c, T)`` or the reference-style ``(d, 1, c, T)`` and return ``(d, c, T)``."""
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() == 4 and w.shape[1] == 1:
        return w.squeeze(1)
    if w.dim() != 3:
        raise ValueError(
            f"group-domain weight must have shape (d, c, T) or (d, 1, c, T), got {tuple(w.shape)}"
        )
    return w


def check_inputs(x, weight, bias, group_size, layout: str, input_dtype=None) -> tuple[int, int, int]:
    """Validate an EQ-Linear call and return ``(T, c, d)``.

    ``layout`` is ``"planes"`` for weights ``(T, d, c)`` and ``"group"`` for ``(d, c, T)``.
    ``input_dtype``: the dtype the layer takes x in where that is not x's own (an FP32 x that the op
    rounds to the weight's dtype); default x's.
    Raises TypeError for non-tensors and non-float dtypes, ValueError for shapes and group size,
    RuntimeError for dtype or device mismatches.
    """
    T = check_group_size(group_size)
    for name, t in (("input", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if weight.dim() != 3:
        want = "(T, d, c)" if layout == "planes" else "(d, c, T)"
        raise ValueError(f"weight must have shape {want}, got {tuple(weight.shape)}")
    if layout == "planes":
        wT, d, c = weight.shape
    else:
        d, c, wT = weight.shape
    if wT != T:
        ours, theirs, fix = ("planes", "group-domain", "naive_to_planes")
        if layout != "planes":
            ours, theirs, fix = ("group-domain", "planes", "planes_to_naive")
        shapes = {"planes": "(T, d, c)", "group-domain": "(d, c, T)"}
        hint = f"{ours} weights are {shapes[ours]}; {theirs} ones {shapes[theirs]} convert by "
        hint += f"flash_eqlinear.{fix}"
        raise ValueError(f"weight {tuple(weight.shape)} holds group size {wT} but group_size={T} ({hint})")
    if x.dim() < 1 or x.shape[-1] != c * T:
        raise ValueError(
            f"input's last dimension must be in_features = c*T = {c}*{T} = {c * T}, "
            f"got input of shape {tuple(x.shape)}"
        )
    if (input_dtype or x.dtype) != weight.dtype:
        raise RuntimeError(f"input dtype {input_dtype or x.dtype} does not match weight dtype {weight.dtype}")
    if x.device != weight.device:
        raise RuntimeError(f"input is on {x.device} but weight is on {weight.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if tuple(bias.shape) != (d,):
            raise ValueError(f"bias must have shape (d,) = ({d},), got {tuple(bias.shape)}")
        if bias.dtype != weight.dtype:
            raise RuntimeError(f"bias dtype {bias.dtype} does not match weight dtype {weight.dtype}")
        if bias.device != weight.device:
            raise RuntimeError(f"bias is on {bias.device} but weight is on {weight.device}")
    return T, c, d


def circulant_index(T: int, device=None) -> torch.Tensor:
    """``(T, T)`` int64 ``idx[t, s] = (s - t) mod T``: the group-domain tap of dense block (t, s)."""
    t = torch.arange(T, device=device)
    return (t[None, :] - t[:, None]) % T


def dense_weight(w: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """Block-circulant ``(D, C)`` matrix of a group-domain weight ``w (d, c, T)``.

    One gather straight into the ``(d, T, c, T)`` order (its backward is one scatter-add and a
    sum); ``index`` is :func:`circulant_index` on ``w``'s device, built here when not given.
    """
    d, c, T = w.shape
    idx = circulant_index(T, w.device) if index is None else index
    full = (d, T, c, T)
    dense = torch.gather(w.unsqueeze(1).expand(full), 3, idx[None, :, None, :].expand(full))
    return dense.reshape(d * T, c * T)


def dense_bias(bias: torch.Tensor | None, group_size: int) -> torch.Tensor | None:
    """The ``(D,)`` bias of the dense layer: ``b[o]`` for each of the T copies (index ``o*T + t``)."""
    return None if bias is None else bias[:, None].expand(-1, group_size).reshape(-1)


def naive_eq_linear(x, w, bias=None, group_size: int = 4, index: torch.Tensor | None = None) -> torch.Tensor:
    """EQ-Linear by dense expansion: ``F.linear(x, dense_weight(w), dense_bias(bias))``.

    x (..., c*T); w (d, c, T) or (d, 1, c, T); bias (d,) or (d, 1) or None -> (..., d*T);
    ``index``: an optional cached :func:`circulant_index` (saves its small kernels per call).
    """
    w = as_group_weight(w)
    if isinstance(bias, torch.Tensor) and bias.dim() == 2 and bias.shape[1] == 1:
        bias = bias.reshape(-1)
    T, _, _ = check_inputs(x, w, bias, group_size, "group")
    return F.linear(x, dense_weight(w, index), dense_bias(bias, T))


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision of the Fourier path's transforms and bias: FP32 for the 16-bit (and narrower) floats,
    whose range the transforms could leave (module docstring); the dtype itself otherwise."""
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def _product_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision of the per-frequency products: bf16 keeps its own (its range is FP32's, so rounding
    the FP32 transform to it loses none; CPUs and GPUs with bf16 units run them at their speed), fp16
    (range 65504, less than a transform can reach) takes FP32, the rest their working precision."""
    return dtype if dtype == torch.bfloat16 else _work_dtype(dtype)


AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast casts x's device type to, or None where autocast is off there."""
    dev = x.device.type
    # Only state queries that torch.compile constant-folds (torch.amp.is_autocast_available is not).
    if not torch._C._is_any_autocast_enabled() or dev not in AUTOCAST_DEVICES:
        return None
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


def _autocast_off(t: torch.Tensor):
    """A context with autocast off on t's device where it is on (it would narrow the FP32 work back to
    16 bits); a null context otherwise."""
    if autocast_dtype(t) is not None:
        return torch.autocast(t.device.type, enabled=False)
    return contextlib.nullcontext()


def _mix_scales(T: int) -> list[float]:
    """The per-plane factor of the products in orthonormal coordinates: sqrt(T) for the real frequencies,
    sqrt(T/2) for the cos / sin pairs."""
    return [math.sqrt(T) if kind == "real" else math.sqrt(T / 2) for kind, _ in plane_kinds(T)]


def _analysis(v: torch.Tensor, T: int) -> torch.Tensor:
    """(M, n, T) group values -> (T, M, n) orthonormal frequency coordinates, plane order."""
    Q = dft_basis(T, dtype=v.dtype, device=v.device)
    return torch.matmul(v, Q.t()).permute(2, 0, 1)


def _synthesis(vf: torch.Tensor, T: int) -> torch.Tensor:
    """(T, M, n) frequency coordinates -> (M, n, T) group values (inverse of _analysis)."""
    Q = dft_basis(T, dtype=vf.dtype, device=vf.device)
    return torch.matmul(vf.permute(1, 2, 0), Q)


def _mix(xf: torch.Tensor, planes: torch.Tensor, T: int) -> list[torch.Tensor]:
    """Per-frequency products in orthonormal coordinates, in xf's dtype.

    Real frequencies: ``yf_j = sqrt(T) xf_j P_j^T``. Complex pair (r, i) with ``s = sqrt(T/2)``:
    ``yf_r = s (xf_r P_r^T + xf_i P_i^T)``, ``yf_i = s (xf_i P_r^T - xf_r P_i^T)``. The factors go into
    the (small) weights, scaled in at least FP32 and rounded once to xf's dtype: the activations and, in
    the backward, their gradients are not scaled up.
    """
    kinds = plane_kinds(T)
    scales = _mix_scales(T)
    wide = torch.promote_types(_work_dtype(planes.dtype), xf.dtype)
    out: list[torch.Tensor] = [None] * T  # type: ignore[list-item]
    j = 0
    while j < T:
        if kinds[j][0] == "real":
            out[j] = xf[j] @ (planes[j].to(wide) * scales[j]).to(xf.dtype).t()
            j += 1
        else:
            pr, pi = planes[j].to(wide), planes[j + 1].to(wide)
            # One (M, 2c) x (2c, 2d) product per pair: [yr | yi] = [xr | xi] [[Pr, -Pi], [Pi, Pr]]^T-ish.
            w2 = torch.cat([torch.cat([pr, pi], 1), torch.cat([-pi, pr], 1)], 0) * scales[j]
            y2 = torch.cat([xf[j], xf[j + 1]], -1) @ w2.to(xf.dtype).t()
            out[j], out[j + 1] = y2.split(pr.shape[0], dim=-1)
            j += 2
    return out


def fourier_eq_linear(x, planes, bias=None, group_size: int = 4) -> torch.Tensor:
    """EQ-Linear through the group DFT. x (..., c*T); planes (T, d, c); bias (d,) -> (..., d*T).

    fp16 / bf16: the transforms and the bias in FP32, the products in FP32 (fp16) or bf16 with FP32
    accumulation, the result rounded once (nn.Linear's range: module docstring).
    """
    T, c, d = check_inputs(x, planes, bias, group_size, "planes")
    lead = x.shape[:-1]
    work, prod = _work_dtype(x.dtype), _product_dtype(x.dtype)
    with _autocast_off(x):
        xf = _analysis(x.reshape(-1, c, T).to(work), T).to(prod)
        y = _synthesis(torch.stack(_mix(xf, planes, T)).to(work), T)
        if bias is not None:
            y = y + bias.to(work)[:, None]
        y = y.to(x.dtype)
    return y.reshape(*lead, d * T)


def adjoint_planes(planes: torch.Tensor) -> torch.Tensor:
    """Planes ``(T, c, d)`` of the adjoint map (used for grad_x): transposed, imaginary parts negated."""
    kinds = plane_kinds(planes.shape[0])  # no sign tensor: keeps graph capture / fake mode happy
    return torch.stack(
        [-p if kind == "im" else p for p, (kind, _) in zip(planes.transpose(1, 2), kinds, strict=True)]
    )


def fourier_eq_linear_backward(grad_y, x, planes, needs=(True, True, True)):
    """Closed-form gradients of :func:`fourier_eq_linear` (group size = ``planes.shape[0]``).

    grad_y (..., d*T), x (..., c*T), planes (T, d, c); ``needs`` flags (x, planes, bias).
    Returns (grad_x (..., c*T), grad_planes (T, d, c), grad_bias (d,)), None where not needed.
    fp16 / bf16: computed in FP32 (grad_x as :func:`fourier_eq_linear`), each gradient rounded once.
    """
    T, d, c = planes.shape
    gx = gp = gb = None
    if needs[0]:
        gx = fourier_eq_linear(grad_y, adjoint_planes(planes), None, T).reshape(x.shape)
    g = grad_y.reshape(-1, d, T)
    work = _work_dtype(torch.promote_types(grad_y.dtype, x.dtype))
    with _autocast_off(x):
        if needs[1]:
            gf = _analysis(g.to(work), T)
            xf = _analysis(x.reshape(-1, c, T).to(work), T)
            # One product over 2M rows per complex pair; the per-frequency scale on the small (d, c)
            # results (not on x's transform: it would leave the range first). In fp16 / bf16 all in FP32.
            kinds, scales = plane_kinds(T), _mix_scales(T)
            grads = [None] * T
            j = 0
            while j < T:
                if kinds[j][0] == "real":
                    grads[j] = (gf[j].t() @ xf[j]) * scales[j]
                    j += 1
                else:
                    gpair = torch.cat([gf[j], gf[j + 1]], 0).t()  # (d, 2M)
                    grads[j] = (gpair @ torch.cat([xf[j], xf[j + 1]], 0)) * scales[j]
                    grads[j + 1] = (gpair @ torch.cat([xf[j + 1], -xf[j]], 0)) * scales[j]
                    j += 2
            gp = torch.stack(grads).to(planes.dtype)
        if needs[2]:
            gb = g.sum(dim=(0, 2), dtype=work).to(grad_y.dtype)
    return gx, gp, gb
