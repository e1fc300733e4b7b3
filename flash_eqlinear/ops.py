"""The public functional API and its dispatch: the fused kernels (through the registered ops) for T = 4 on
CUDA in fp32 / fp16 / bf16, the pure-PyTorch path (the Fourier reference or the dense expansion, by size:
``reference_form``) everywhere else; ``FLASH_EQLINEAR_BACKEND=reference`` forces the reference Fourier path.

Where each fused call runs is the C++ plan's decision (:func:`plan`, :func:`explain`); the ops' Python
registrations are in ``_registry``, the extension and the switches in ``_extension``.
"""

from __future__ import annotations

import math
import os

import torch

from . import reference
from ._extension import BACKEND, debug_switch, kernel_import_error, kernels_available
from ._extension import KERNEL_DTYPES as _KERNEL_DTYPES
from .fourier import planes_to_naive
from .reference import autocast_dtype as _autocast_dtype

__all__ = [
    "flash_eq_linear",
    "flash_eq_linear_chunks",
    "flash_eq_mlp",
    "kernels_available",
    "kernel_import_error",
    "backend_for",
    "reference_form",
    "plan",
    "explain",
]

if kernels_available():
    from ._registry import call

    _LAYER_OP = torch.ops.flash_eqlinear.eq_linear.default
    _CHUNKS_OP = torch.ops.flash_eqlinear.eq_linear_chunks.default
    _PLANES_OP = torch.ops.flash_eqlinear.group_planes.default
    _GROUP_OP = torch.ops.flash_eqlinear.eq_linear_group.default
    _FWD_T_OP = torch.ops.flash_eqlinear.eq_linear_fwd_t.default
else:
    _LAYER_OP = _CHUNKS_OP = _PLANES_OP = _GROUP_OP = _FWD_T_OP = None


def backend_for(x: torch.Tensor, group_size: int) -> str:
    """The backend a call with this input would use: ``"cuda"`` (fused kernels) or ``"reference"``."""
    if (
        BACKEND == "auto"
        and kernels_available()
        and group_size == 4
        and x.is_cuda
        and x.dtype in _KERNEL_DTYPES
    ):
        return "cuda"
    return "reference"


# The smallest c * d (one plane's weights) at which eq_linear_fwd_t's GEMM form beats the dense F.linear, per
# group size, for FP32 without TF32 and for fp16 / bf16 / TF32 (docs/performance.md).
_GEMM_FORM_T_MIN_CD = {(8, "fp32"): 128**2, (8, "fast"): 512**2, (2, "fp32"): 1024**2, (2, "fast"): 4096**2}


def gemm_form_t(x: torch.Tensor, weight, bias, group_size: int, c: int, d: int) -> bool:
    """Whether a layer call of group size 2 or 8 runs the CUDA GEMM form ``flash_eqlinear::eq_linear_fwd_t``
    (x's group DFT, cuBLAS products per frequency, the synthesis: 14/64 of the dense multiply-adds for T = 8):
    on CUDA in FP32 / fp16 / bf16 with the kernels built, no gradient recorded (its inference form; training
    runs the dense form, or with ``FLASH_EQLINEAR_DEBUG=gemm_t_train=1`` this one too, its backward
    ``eq_linear_bwd_t``, not yet measured), and c * d at least where the forward measured faster than the
    dense form's ``F.linear``. Elsewhere :func:`reference_form` decides."""
    if _FWD_T_OP is None or BACKEND != "auto" or group_size not in (2, 8):
        return False
    if not (x.is_cuda and x.dtype in _KERNEL_DTYPES):
        return False
    params = (x, weight, bias)
    grads = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in params)
    if grads and debug_switch("gemm_t_train") != "1":
        return False
    dtype = _autocast_dtype(x) or x.dtype  # (the dtype it runs in)
    fast = dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32
    return c * d >= _GEMM_FORM_T_MIN_CD[(group_size, "fast" if fast else "fp32")]


def reference_form(x: torch.Tensor, group_size: int, c: int, d: int, dense_kept: bool = False) -> str:
    """How the pure-PyTorch path computes a layer (group size T, planes (T, d, c)) off the fused kernels.

    ``"fourier"``: the reference Fourier path (6/16 of the dense MACs for T = 4, but several passes
    over the activations in small-K products); ``"dense"``: the expanded block-circulant weight and one
    ``F.linear`` (NaiveEQLinear's computation, so the layer is never slower than the one it replaces).
    ``FLASH_EQLINEAR_BACKEND=reference`` always takes the Fourier path. Otherwise Fourier only where it
    measured faster: on the CPU for T >= 3 and T * sqrt(c * d) >= 1024. GPUs take the dense form.
    ``dense_kept``: inference with the expanded weight kept (``FlashEQLinear`` in eval mode, as
    ``NaiveEQLinear`` keeps it), so that the dense form costs only its ``F.linear``: then Fourier also needs
    at least 256 rows. (The measurements: docs/performance.md.)
    """
    if BACKEND == "reference":
        return "fourier"
    if x.device.type == "cpu" and group_size >= 3 and group_size * math.sqrt(c * d) >= 1024:
        if not dense_kept or (x.dim() >= 1 and x.numel() >= 256 * x.shape[-1]):
            return "fourier"
    return "dense"


def autocast_inputs(x, weight, bias, cast_x: bool = True):
    """Cast (x, weight, bias) as autocast would for nn.Linear: floating-point tensors other than
    float64 go to the autocast dtype; anything else is left for the input checks to reject.
    ``cast_x=False`` leaves x as it is."""
    cast = _autocast_dtype(x) if isinstance(x, torch.Tensor) else None
    return (x, weight, bias) if cast is None else _cast_to(cast, x, weight, bias, cast_x)


def _cast_to(cast: torch.dtype, x, weight, bias, cast_x: bool = True):
    """:func:`autocast_inputs` with autocast's dtype given."""

    def to(t):
        if not isinstance(t, torch.Tensor) or t.dtype in (cast, torch.float64) or not t.is_floating_point():
            return t
        return t.to(cast)

    return to(x) if cast_x else x, to(weight), to(bias)


def _keeps_fp32_input(x, weight, group_size, cast: torch.dtype | None = None) -> bool:
    """Whether an FP32 x that autocast would cast to fp16 / bf16 goes to the fused kernels as it is:
    in training (x needs its gradient) on the CUDA path, eq_linear_fwd_cast rounds it in the op and its
    backward writes grad_x in FP32 from the kernel, which saves the cast's backward (a 16-bit -> FP32 pass
    over grad_x) after every layer fed by an FP32 op such as LayerNorm. Same values as casting first, but
    grad_x is not rounded to 16 bits. ``FLASH_EQLINEAR_DEBUG=fused_cast=0`` casts first (read when called).
    Under torch.compile x is cast first: Inductor fuses the cast into the kernel that makes x (LayerNorm,
    pointwise ops) and the backward's widening into the one that takes grad_x, and the 16-bit grad_x
    kernels are faster (docs/performance.md). ``cast``: autocast's dtype for x, where the caller has it."""
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if torch.compiler.is_compiling():
        return False
    if x.dtype != torch.float32 or not (x.requires_grad and torch.is_grad_enabled()):
        return False
    if not weight.is_floating_point() or weight.dtype == torch.float64:
        return False
    if debug_switch("fused_cast") == "0":
        return False
    cast = _autocast_dtype(x) if cast is None else cast
    return cast in (torch.float16, torch.bfloat16) and backend_for(x, group_size) == "cuda"


def _autocast_and_check(x, weight, bias, group_size):
    """One layer's inputs as autocast casts them (x kept FP32 where :func:`_keeps_fp32_input` says) and
    checked: (x, weight, bias, whether x stayed FP32, (T, c, d))."""
    cast = _autocast_dtype(x) if isinstance(x, torch.Tensor) else None
    keep32 = cast is not None and _keeps_fp32_input(x, weight, group_size, cast)
    if cast is not None:
        x, weight, bias = _cast_to(cast, x, weight, bias, cast_x=not keep32)
    x_dtype = weight.dtype if keep32 else None
    dims = reference.check_inputs(x, weight, bias, group_size, "planes", input_dtype=x_dtype)
    return x, weight, bias, keep32, dims


def flash_eq_mlp(x, weight1, bias1, weight2, bias2, group_size: int = 4) -> torch.Tensor:
    """An equivariant MLP, ``flash_eq_linear(GELU(flash_eq_linear(x, weight1, bias1)), weight2, bias2)``.

    x (..., c*T); weight1: planes (T, h, c), bias1 (h,) or None; weight2: planes (T, d, h), bias2 (d,) or
    None -> (..., d*T). GELU is the exact (erf) form, ``nn.GELU()``. Same function as the three calls. Where
    no gradient is needed (inference), for T = 4 on CUDA the first layer's kernel applies GELU in its
    epilogue (the fp16 / bf16 fused kernels, and the TF32 one on Hopper GPUs; elsewhere, e.g. exact FP32,
    GELU runs as its own pass): no pass over the hidden activation remains. In training it runs the three
    calls (fusing GELU there measured slower). ``FLASH_EQLINEAR_DEBUG=fused_mlp=0`` runs the three calls
    always.
    Under ``torch.autocast`` it casts like ``nn.Linear`` (an FP32 x in training as
    :func:`flash_eq_linear` takes it).
    """
    params = (x, weight1, bias1, weight2, bias2)
    if _LAYER_OP is not None and group_size == 4 and _fused_eager(x) and torch.is_grad_enabled():
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in params):  # training: two layer ops
            try:
                hidden = torch.nn.functional.gelu(_LAYER_OP(x, weight1, bias1))
            except (TypeError, ValueError, RuntimeError) as e:
                raise _naming(e, "flash_eq_mlp, first layer (x, weight1, bias1)") from None
            try:
                return _LAYER_OP(hidden, weight2, bias2)
            except (TypeError, ValueError, RuntimeError) as e:
                raise _naming(e, _SECOND_LAYER) from None
    try:
        x, weight1, bias1, _, (T, c, h) = _autocast_and_check(x, weight1, bias1, group_size)
    except (TypeError, ValueError, RuntimeError) as e:
        raise _naming(e, "flash_eq_mlp, first layer (x, weight1, bias1)") from None
    _, weight2, bias2 = autocast_inputs(x, weight2, bias2, cast_x=False)
    if not isinstance(weight2, torch.Tensor) or weight2.dim() != 3 or weight2.shape[::2] != (T, h):
        got = tuple(weight2.shape) if isinstance(weight2, torch.Tensor) else type(weight2).__name__
        raise ValueError(
            f"weight2 must have shape (T, d, h) = ({T}, d, {h}) (weight1 is (T, h, c)), got {got}"
        )
    second = _SECOND_LAYER
    params = (x, weight1, bias1, weight2, bias2)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in params)
    fused = debug_switch("fused_mlp") != "0"
    if needs_grad or not fused or backend_for(x, T) != "cuda":
        hidden = torch.nn.functional.gelu(flash_eq_linear(x, weight1, bias1, T))
        try:
            return flash_eq_linear(hidden, weight2, bias2, T)
        except (TypeError, ValueError, RuntimeError) as e:
            raise _naming(e, second) from None
    try:  # the hidden activation: weight1's dtype, x's device
        reference.check_inputs(x.new_empty((0, h * T), dtype=weight1.dtype), weight2, bias2, T, "planes")
    except (TypeError, ValueError, RuntimeError) as e:
        raise _naming(e, second) from None
    hidden = call("gelu", x.reshape(-1, c * T).contiguous(), weight1.contiguous(), bias1)
    y = call("fwd", hidden, weight2.contiguous(), bias2)
    return y.reshape(*x.shape[:-1], y.shape[-1])


_SECOND_LAYER = "flash_eq_mlp, second layer (weight2, bias2; its input has weight1's dtype)"


def _naming(e: Exception, what: str) -> Exception:
    """``e`` with ``what`` (the layer it concerns) before its message: for the plain exception types a
    check raises; others (subclasses with constructors of their own, e.g. out of memory) as they are."""
    return type(e)(f"{what}: {e}") if type(e) in (TypeError, ValueError, RuntimeError) else e


def flash_eq_linear(x, weight, bias=None, group_size: int = 4) -> torch.Tensor:
    """Equivariant linear map with frequency-plane weights.

    x (..., c*T); weight: planes (T, d, c); bias (d,) or None -> (..., d*T). Uses the fused CUDA
    kernels for T = 4 on CUDA in fp32/fp16/bf16, the pure-PyTorch path otherwise (the Fourier
    reference or the dense expansion, whichever is faster there: :func:`reference_form`). Under
    ``torch.autocast`` it casts like ``nn.Linear`` (inputs, weight and bias to the autocast dtype).
    On the fused kernels, eager calls are one call of the layer op ``flash_eqlinear::eq_linear``, whose
    autocast, checks and autograd run in C++; its training forward follows the plan (:func:`explain`): it
    may keep x's Fourier planes for the backward instead of x (the same memory) where the weight gradient's
    GEMM form uses them, and an FP32 x that needs its gradient under fp16 / bf16 autocast is rounded
    inside the op, with grad_x coming back in FP32 from the kernel. Traced calls (torch.compile, functorch)
    run the 2-D ops with the same plan.
    """
    if _LAYER_OP is not None and group_size == 4 and _fused_eager(x):
        return _LAYER_OP(x, weight, bias)  # casts, checks, autograd: one dispatcher call (C++)
    return _eq_linear(*_autocast_and_check(x, weight, bias, group_size))


def flash_eq_linear_chunks(
    x, weight, bias=None, chunks: int = 3, group_size: int = 4
) -> tuple[torch.Tensor, ...]:
    """``flash_eq_linear(x, weight, bias, group_size).chunk(chunks, -1)``: the output's ``chunks`` column
    blocks of ``d / chunks`` whole fields each (d % chunks == 0), e.g. an attention's q, k, v.

    In training with ``chunks == 3`` where the Hopper kernels run (sm_90, fp16 / bf16 planes, d a multiple
    of 192, c of 8, the fused weight gradient), the chunks are tensors of their own (each (..., d*T/3),
    contiguous) that the forward kernel writes in place, and the backward reads their three gradients where
    they are: consumers such as ``F.scaled_dot_product_attention`` return dq, dk, dv as three dense tensors,
    which autograd would otherwise first assemble into one (..., 3 C) gradient (a pass over it). Elsewhere
    (inference, other ``chunks``, other paths) the chunks are views of the whole output.
    """
    if _CHUNKS_OP is not None and group_size == 4 and _fused_eager(x):
        return chunks_of(_CHUNKS_OP(x, weight, bias, _int_chunks(chunks)), chunks)
    x, weight, bias, keep32, (T, c, d) = _autocast_and_check(x, weight, bias, group_size)
    check_chunks(chunks, d)
    return _eq_linear(x, weight, bias, keep32, (T, c, d), chunks)


def chunks_of(outs: list, chunks: int) -> tuple:
    """The chunks op's result as chunks: its parts, or views of its whole output."""
    return tuple(outs) if len(outs) > 1 else outs[0].chunk(chunks, -1)


def _int_chunks(chunks):
    """chunks where it is an int (the op checks that it divides d), else ValueError."""
    if isinstance(chunks, bool) or not isinstance(chunks, int):
        check_chunks(chunks, 1)
    return chunks


def check_chunks(chunks, d: int) -> None:
    """ValueError unless ``chunks`` splits d fields into whole fields each."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or d % chunks:
        raise ValueError(f"chunks must be a positive divisor of d = {d} (whole fields each), got {chunks!r}")


def rounded_group_weight(planes: torch.Tensor) -> torch.Tensor:
    """The group-domain weight (d, c, T) of ``planes`` (T, d, c) for the dense form: computed in at least
    float32 and rounded once to the planes' dtype (as a naive layer stores it); differentiable, so gradients
    reach the planes."""
    w = planes_to_naive(planes if planes.dtype in (torch.float32, torch.float64) else planes.float())
    return w.to(planes.dtype)


def _eq_linear(x, weight, bias, keep32: bool, dims: tuple, chunks: int = 0):
    """:func:`flash_eq_linear` after autocast and the checks (:func:`_autocast_and_check`); with chunks >= 1,
    :func:`flash_eq_linear_chunks`."""
    T, c, d = dims
    if backend_for(x, T) == "reference":
        if gemm_form_t(x, weight, bias, T, c, d):  # (x has the weight's dtype: keep32 is the p4 path's)
            y = _FWD_T_OP(x.reshape(-1, c * T), weight, bias).reshape(*x.shape[:-1], d * T)
        elif reference_form(x, T, c, d) == "fourier":
            y = reference.fourier_eq_linear(x, weight, bias, T)
        else:
            y = reference.naive_eq_linear(x, rounded_group_weight(weight), bias, T)
        return y.chunk(chunks, -1) if chunks else y
    lead = x.shape[:-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, c * T)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    grad = torch.is_grad_enabled()
    needs = tuple(grad and isinstance(t, torch.Tensor) and t.requires_grad for t in (x2, weight, bias))
    train = _train_form(weight.dtype, keep32, c, d, x2.device.index, *needs, 3 if chunks == 3 else 0)
    if train == "parts":
        parts = call("split3", x2, weight.contiguous(), bias)[:3]
        return tuple(p if x.dim() == 2 else p.reshape(*lead, d * T // 3) for p in parts)
    if train == "round_x":
        y, _ = call("cast", x2, weight.contiguous(), bias)
    elif train == "keep_planes":
        y, _ = call("xf", x2.to(weight.dtype), weight.contiguous(), bias)
    else:
        y = call("fwd", x2.to(weight.dtype) if keep32 else x2, weight.contiguous(), bias)
    y = y if x.dim() == 2 else y.reshape(*lead, d * T)
    return y.chunk(chunks, -1) if chunks else y


def _train_form(dtype, x_fp32, c, d, device_index, needs_x, needs_p, needs_b, chunks) -> str:
    """The plan's training form (:func:`plan`'s "train") of a traced, chunked or MLP call (under
    torch.compile, read when traced), kept per arguments and the settings the plan reads."""
    if device_index is None:
        device_index = torch.cuda.current_device()
    env = os.environ.get
    key = (
        dtype,
        x_fp32,
        c,
        d,
        device_index,
        needs_x,
        needs_p,
        needs_b,
        chunks,
        env("FLASH_EQLINEAR_DEBUG"),
        env("FLASH_EQLINEAR_SM90"),
        env("FLASH_EQLINEAR_FP32"),
        torch.backends.cuda.matmul.allow_tf32,
    )
    form = _TRAIN_FORMS.get(key)
    if form is None:
        op = torch.ops.flash_eqlinear.eq_linear_plan
        device = torch.device("cuda", device_index)
        text = op(0, c, d, dtype, x_fp32, device, needs_x, needs_p, needs_b, chunks)
        form = _TRAIN_FORMS[key] = text.split("train=", 1)[1].split("\n", 1)[0]
    return form


# Dynamo runs it when tracing and keeps its result as a constant: the mark that
# torch.compiler.assume_constant_result sets, set here directly, since that decorator imports torch._dynamo.
_train_form._dynamo_marked_constant = True
_TRAIN_FORMS: dict = {}


def plan(
    M, c, d, dtype, device, *, needs_x=False, needs_p=False, needs_b=False, x_fp32=False, chunks=0
) -> dict:
    """How the fused kernels run a p4 layer call (C++, ``csrc/eq_linear_plan.h``): x (M, 4c) -> (M, 4d) in
    ``dtype`` (the planes'; ``x_fp32``: an FP32 x under 16-bit autocast) on CUDA ``device``, with the
    gradients of x, the planes and the bias recorded as given, ``chunks`` = 3 for
    :func:`flash_eq_linear_chunks`' parts. Returns a dict: "forward" (the forward's kernel: narrow,
    exact_fp32, split_tf32, tf32_hopper, tf32_gemm, hopper, gemm, mma), "fallback" (the kernel where a
    Hopper launcher declines the tensors), "train" (inference, plain, round_x, keep_planes, parts),
    "weight_grad" (none, fused, gemm), "weight_grad_kernel" (where fused: hopper, mma, fp32), "grad_x" (none,
    kernel, hopper_planes, gemm), "grad_x_kernel" (where grad_x is the forward's kernel on the adjoint planes)
    and "why" (the reasons, a list of str).
    Depends on the switches (README, "Switches") and PyTorch's TF32 setting as they are when called."""
    if not kernels_available():
        raise RuntimeError(f"flash_eqlinear.ops.plan needs the fused kernels: {kernel_import_error()}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    op = torch.ops.flash_eqlinear.eq_linear_plan
    text = op(M, c, d, dtype, x_fp32, device, needs_x, needs_p, needs_b, chunks)
    out: dict = {"why": []}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and " " not in key:
            out[key] = value
        elif line:
            out["why"].append(line)
    return out


def explain(layer, x: torch.Tensor, chunks: int = 0) -> dict:
    """The plan (:func:`plan`) of ``layer(x)`` (a ``FlashEQLinear`` or ``SwappedEQLinear``) as called now:
    train or eval, grad mode, autocast and the switches as they are; ``chunks`` = 3: of
    ``layer.forward_chunks(x, 3)``. Where the call runs off the fused p4 kernels, {"backend": "reference",
    "form": "fourier" or "dense"}, or "gemm_t" for T = 2, 8 on CUDA (:func:`gemm_form_t`), instead."""
    T = layer.group_size
    c, d = layer.in_features // T, layer.out_features // T
    weight, bias = layer._params_for(x)  # (SwappedEQLinear: the planes of its group weight)
    cast = _autocast_dtype(x)
    if backend_for(x, T) != "cuda":
        if gemm_form_t(x, weight, bias, T, c, d):
            return {"backend": "reference", "form": "gemm_t"}
        return {"backend": "reference", "form": reference_form(x, T, c, d, dense_kept=not layer.training)}
    keep32 = cast is not None and _keeps_fp32_input(x, weight, T, cast)
    dtype = cast if cast is not None and weight.dtype != torch.float64 else weight.dtype
    grad = torch.is_grad_enabled()
    needs = [grad and t is not None and t.requires_grad for t in (x, weight, bias)]
    out = plan(
        x.numel() // max(x.shape[-1], 1),
        c,
        d,
        dtype,
        x.device,
        needs_x=needs[0],
        needs_p=needs[1],
        needs_b=needs[2],
        x_fp32=keep32,
        chunks=chunks,
    )
    return {"backend": "cuda", **out}


def _eager() -> bool:
    """Whether a call may go to the C++ autograd ops: eager, nothing tracing or transforming it."""
    tracing = torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
    return BACKEND == "auto" and not tracing


def _fused_eager(x) -> bool:
    """Whether an eager call with input x goes to the layer op (the fused kernels, not traced)."""
    return isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in _KERNEL_DTYPES and _eager()
