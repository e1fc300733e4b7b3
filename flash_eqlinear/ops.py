"""Op wrappers: the registered CUDA ops, their fake (meta) and autograd registrations, dispatch.

The fused kernels live in ``flash_eqlinear._C`` and register ``torch.ops.flash_eqlinear.*`` through
``TORCH_LIBRARY``. When that extension is missing (CPU-only install) everything runs on the
pure-PyTorch path (the Fourier reference or the dense expansion, by size: ``reference_form``).
``FLASH_EQLINEAR_BACKEND=reference`` forces the reference Fourier path.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch

from . import reference
from .fourier import planes_to_naive

__all__ = [
    "flash_eq_linear",
    "flash_eq_linear_chunks",
    "flash_eq_mlp",
    "kernels_available",
    "kernel_import_error",
    "backend_for",
    "reference_form",
]

_KERNEL_IMPORT_ERROR: str | None = None
if importlib.util.find_spec(f"{__package__}._C") is None:
    _KERNEL_IMPORT_ERROR = (
        "flash_eqlinear._C was not built (installed without a CUDA build of torch or a CUDA toolkit)"
    )
else:
    try:  # the compiled extension registers its ops on import
        from . import _C  # noqa: F401
    except ImportError as e:
        _KERNEL_IMPORT_ERROR = f"flash_eqlinear._C failed to load: {e}"

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BACKENDS = ("auto", "reference")
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")
BACKEND = os.environ.get("FLASH_EQLINEAR_BACKEND", "auto").strip().lower() or "auto"
if BACKEND not in _BACKENDS:
    raise ValueError(f"FLASH_EQLINEAR_BACKEND must be one of {_BACKENDS}, got {BACKEND!r}")
# How grad_planes / grad_bias are computed on the CUDA path (FLASH_EQLINEAR_WEIGHT_GRAD):
#   "auto"      by size: "fused" for small layers, "gemm" for large ones (H100 timings)
#   "fused"     the fused weight-gradient kernels (no workspace)
#   "gemm"      one group-DFT pass per operand into Fourier planes (a workspace of 1x x and 1x
#               grad_y), then the six plane products as cuBLAS GEMMs (its tensor-core / FFMA peak
#               on large layers); for fp16 / bf16 without the Hopper kernel (and for the largest
#               layers), grad_x from grad_y's planes too (GEMMs into an FP32 (M, 4c) buffer, then
#               the inverse DFT; FLASH_EQLINEAR_PRODUCTS)
#   "reference" the reference reductions (stock torch ops), for comparison
_WEIGHT_GRAD_MODES = ("auto", "fused", "gemm", "reference")
WEIGHT_GRAD = os.environ.get("FLASH_EQLINEAR_WEIGHT_GRAD", "auto").strip().lower() or "auto"
if WEIGHT_GRAD not in _WEIGHT_GRAD_MODES:
    raise ValueError(f"FLASH_EQLINEAR_WEIGHT_GRAD must be one of {_WEIGHT_GRAD_MODES}, got {WEIGHT_GRAD!r}")
# "auto" uses the GEMM form from this many output weights per plane (c * d) on. H100, M = 32768, c = d
# (benchmarks/profile_bwd.py): FP32 fused and GEMM tie at c = 512, GEMM wins from c = 1024 on; fp16 /
# bf16 with the mma.sync kernel: fused wins at c = 256 (0.14 vs 0.23 ms), GEMM at c = 512 (0.42 vs 0.66 ms).
GEMM_WEIGHT_GRAD_MIN_CD = {torch.float32: 768 * 768, torch.float16: 2**17, torch.bfloat16: 2**17}
# fp16 / bf16 where the Hopper weight-gradient kernel runs (1.5-1.7x the mma.sync one). Training forward
# + backward of one layer, H100, bf16, us, fused / GEMM form: M = 25216: 326 / 372 (c, d = 192, 576),
# 402 / 449 (192, 768), 460 / 438 (768, 192), 494 / 501 (256, 768), 615 / 630 (256, 1024); M = 32768:
# 232 / 306 (256, 256), 761 / 746 (512, 512) (benchmarks/results/weight_grad_b5704bb.md). At the threshold
# itself narrow layers (min(c, d) <= 256, e.g. ViT-L's fc layers, 256 x 1024) keep the fused kernel: the
# EQ-ViT-L bf16 training step measured 116.1-116.3 ms against 117.5-117.6 with the GEMM form there
# (H100, two rounds; benchmarks/README.md v17).
GEMM_WEIGHT_GRAD_MIN_CD_SM90 = 2**18


def kernels_available() -> bool:
    """Whether the fused CUDA kernels were built and import here."""
    return _KERNEL_IMPORT_ERROR is None


def kernel_import_error() -> str | None:
    """Why the fused kernels are unavailable (None when they are available)."""
    return _KERNEL_IMPORT_ERROR


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


def reference_form(x: torch.Tensor, group_size: int, c: int, d: int, dense_kept: bool = False) -> str:
    """How the pure-PyTorch path computes a layer (group size T, planes (T, d, c)) off the fused kernels.

    ``"fourier"``: the reference Fourier path (6/16 of the dense MACs for T = 4, but several passes
    over the activations in small-K products); ``"dense"``: the expanded block-circulant weight and one
    ``F.linear`` (NaiveEQLinear's computation, so the layer is never slower than the one it replaces).
    ``FLASH_EQLINEAR_BACKEND=reference`` always takes the Fourier path. Otherwise Fourier only where it
    measured faster: on the CPU for T >= 3 and T * sqrt(c * d) >= 1024. (Fourier / dense time, 2 CPU
    threads, M = 4096, c = d: T = 4: 3.2, 2.1, 1.3, 0.96 at c = 16, 64, 128, 256; T = 8: 3.1, 1.1,
    0.72, 0.61; T = 16: 1.7, 0.44, 0.40 at c = 16, 64, 128; T = 2: 2.1-4.0.) GPUs take the dense form:
    on an H100 the Fourier path ran at 0.08-0.84x F.linear for T = 4, c = 16 .. 2048.

    ``dense_kept``: inference with the expanded weight kept (``FlashEQLinear`` in eval mode, as
    ``NaiveEQLinear`` keeps it), so that the dense form costs only its ``F.linear``: then Fourier also needs
    at least 256 rows. (Fourier / kept dense, 2 CPU threads, T = 4, C -> D = 1024 -> 1024, 768 -> 3072,
    3072 -> 768, 2048 -> 2048: 5.3, 3.2, 3.2, 2.3 at 1 row; 1.8, 1.7, 1.1, 1.05 at 8; 1.14, 0.98, 0.84, 0.79
    at 64; 0.82, 0.73, 0.72, 0.63 at 256; 0.7-1.0 from 1024 rows.)
    """
    if BACKEND == "reference":
        return "fourier"
    if x.device.type == "cpu" and group_size >= 3 and group_size * math.sqrt(c * d) >= 1024:
        if not dense_kept or (x.dim() >= 1 and x.numel() >= 256 * x.shape[-1]):
            return "fourier"
    return "dense"


if kernels_available():

    @torch.library.register_fake("flash_eqlinear::eq_linear_fwd")
    def _eq_linear_fwd_fake(x, planes, bias):
        # Mirrors the checks of the CUDA implementation (csrc/eq_linear_bindings.cpp).
        torch._check(x.dim() == 2, lambda: f"eq_linear_fwd: x must be 2-D (M, 4c), got {tuple(x.shape)}")
        torch._check(
            planes.dim() == 3 and planes.shape[0] == 4,
            lambda: f"eq_linear_fwd: planes must have shape (4, d, c), got {tuple(planes.shape)}",
        )
        torch._check(
            x.shape[1] == 4 * planes.shape[2],
            lambda: f"eq_linear_fwd: x has {x.shape[1]} features but planes {tuple(planes.shape)} expect 4*c",
        )
        torch._check(x.dtype in _KERNEL_DTYPES, lambda: f"eq_linear_fwd: unsupported dtype {x.dtype}")
        torch._check(planes.dtype == x.dtype, lambda: "eq_linear_fwd: planes dtype does not match x dtype")
        if bias is not None:
            torch._check(
                bias.dim() == 1 and bias.shape[0] == planes.shape[1] and bias.dtype == x.dtype,
                lambda: f"eq_linear_fwd: bias must have shape ({planes.shape[1]},) and dtype {x.dtype}",
            )
        return x.new_empty((x.shape[0], 4 * planes.shape[1]))

    @torch.library.register_fake("flash_eqlinear::eq_linear_bwd_weight")
    def _eq_linear_bwd_weight_fake(x, grad_y):
        torch._check(
            x.dim() == 2 and grad_y.dim() == 2 and x.shape[0] == grad_y.shape[0],
            lambda: f"eq_linear_bwd_weight: want x (M, 4c), grad_y (M, 4d), got {x.shape}, {grad_y.shape}",
        )
        torch._check(
            x.dtype == grad_y.dtype and x.dtype in _KERNEL_DTYPES,
            lambda: f"eq_linear_bwd_weight: x and grad_y must share one dtype, got {x.dtype}, {grad_y.dtype}",
        )
        c, d = x.shape[1] // 4, grad_y.shape[1] // 4
        return x.new_empty((4, d, c)), x.new_empty((d,))

    @torch.library.register_fake("flash_eqlinear::eq_group_dft")
    def _eq_group_dft_fake(t, input, sum):
        torch._check(
            t.dim() == 2 and t.shape[1] % 4 == 0 and t.shape[1] > 0,
            lambda: f"eq_group_dft: expected a 2-D (M, 4n) tensor, got {tuple(t.shape)}",
        )
        torch._check(t.dtype in _KERNEL_DTYPES, lambda: f"eq_group_dft: unsupported dtype {t.dtype}")
        n = t.shape[1] // 4
        sums = t.new_empty((n if sum else 0,), dtype=torch.float32)
        return t.new_empty((4, t.shape[0], n)), sums

    def weight_grad_mode(c: int, d: int, dtype: torch.dtype, device_index: int | None = None) -> str:
        """The weight-gradient method the CUDA backward uses for a layer with these sizes and dtype on
        this CUDA device (None: the current one)."""
        if WEIGHT_GRAD != "auto":
            return WEIGHT_GRAD
        tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32  # GEMMs on tensor cores
        min_cd = GEMM_WEIGHT_GRAD_MIN_CD[torch.float16 if tf32 else dtype]
        if dtype != torch.float32 and c % 2 == 0 and d % 2 == 0 and _sm90(device_index):
            min_cd = GEMM_WEIGHT_GRAD_MIN_CD_SM90
            if c * d == min_cd and min(c, d) <= 256:
                return "fused"
        return "gemm" if c * d >= min_cd else "fused"

    @torch.library.register_fake("flash_eqlinear::eq_linear_bwd")
    def _eq_linear_bwd_fake(grad_y, x, planes, needs_x, needs_p, needs_b, gemm, grad_x_fp32=False):
        d, c = planes.shape[1], planes.shape[2]
        torch._check(
            x.dim() == 2
            and grad_y.dim() == 2
            and x.shape == (grad_y.shape[0], 4 * c)
            and grad_y.shape[1] == 4 * d,
            lambda: f"eq_linear_bwd: want grad_y (M, {4 * d}), x (M, {4 * c}), got {grad_y.shape}, {x.shape}",
        )
        torch._check(
            x.dtype == grad_y.dtype == planes.dtype,
            lambda: (
                f"eq_linear_bwd: grad_y, x and planes must share one dtype, got {grad_y.dtype}, {x.dtype}"
            ),
        )
        return (
            grad_y.new_empty(
                x.shape if needs_x else (0,), dtype=torch.float32 if grad_x_fp32 and needs_x else None
            ),
            grad_y.new_empty((4, d, c) if needs_p else (0,)),
            grad_y.new_empty((d,) if needs_b else (0,)),
        )

    def _setup_context(ctx, inputs, output):
        x, planes, bias = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, planes)

    def _differentiable_grads(grad_y, x, planes, needs_x, needs_p, needs_b):
        """create_graph=True (double backward, gradient penalties, Hessian-vector products): gradients
        that are themselves differentiable. grad_x through the forward op on the adjoint planes (its
        own backward is registered), the weight gradients by stock ops in x's dtype, returned in the
        planes' dtype."""
        gx = None
        if needs_x:
            adj = reference.adjoint_planes(planes).contiguous()
            gx = torch.ops.flash_eqlinear.eq_linear_fwd(grad_y.contiguous(), adj, None)
        _, gp, gb = reference.fourier_eq_linear_backward(
            grad_y.to(x.dtype), x, planes.to(x.dtype), (False, needs_p, needs_b)
        )
        return gx, *(None if t is None else t.to(planes.dtype) for t in (gp, gb))

    def _backward(ctx, grad_y):
        x, planes = ctx.saved_tensors[:2]
        return _grads(ctx, grad_y, x, planes, False)

    def _grads(ctx, grad_y, x, planes, gx_fp32: bool):
        """(grad_x, grad_planes, grad_bias) of a layer with input x (as the kernels took it) as the
        context asks for them; gx_fp32: grad_x in FP32 (eq_linear_fwd_cast's x; with create_graph=True
        the 16-bit grad_x of the differentiable path, widened). grad_y: the output's gradient, or a list of
        its three column blocks (eq_linear_fwd_split3's outputs), which the fused form reads where they are
        (eq_linear_bwd_split3) and the other forms join."""
        needs_x, needs_p = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        needs_b = ctx.has_bias and ctx.needs_input_grad[2]
        mode = weight_grad_mode(planes.shape[2], planes.shape[1], x.dtype, x.device.index)
        if isinstance(grad_y, list):  # eq_linear_fwd_split3's three column blocks
            if mode == "fused" and not torch.is_grad_enabled():
                op = torch.ops.flash_eqlinear.eq_linear_bwd_split3
                gx, gp, gb = op(*grad_y, x, planes, needs_x, needs_p, needs_b, gx_fp32)
                return gx if needs_x else None, gp if needs_p else None, gb if needs_b else None
            grad_y = torch.cat(grad_y, 1)  # the other forms take grad_y whole
        if torch.is_grad_enabled():
            gx, gp, gb = _differentiable_grads(grad_y, x, planes, needs_x, needs_p, needs_b)
            return gx.float() if gx_fp32 and gx is not None else gx, gp, gb
        ref = mode == "reference" and (needs_p or needs_b)
        # One op for the rest (grad_x: the forward kernel on the adjoint planes; the weight: the fused
        # kernel or group DFTs + GEMMs): the host cost of a backward is one call, not a dozen.
        gx, gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd(
            grad_y, x, planes, needs_x, needs_p and not ref, needs_b and not ref, mode == "gemm", gx_fp32
        )
        if ref:
            _, gp, gb = reference.fourier_eq_linear_backward(grad_y, x, planes, (False, needs_p, needs_b))
        return gx if needs_x else None, gp if needs_p else None, gb if needs_b else None

    torch.library.register_autograd("flash_eqlinear::eq_linear_fwd", _backward, setup_context=_setup_context)

    # ---- An FP32 input under autocast (eq_linear_fwd_cast): rounded in the op, grad_x in FP32 ----
    @torch.library.register_fake("flash_eqlinear::eq_linear_fwd_cast")
    def _eq_linear_fwd_cast_fake(x, planes, bias):
        torch._check(
            x.dtype == torch.float32 and planes.dtype in (torch.float16, torch.bfloat16),
            lambda: (
                f"eq_linear_fwd_cast: want a float32 x and float16 / bfloat16 planes, got {x.dtype}, "
                f"{planes.dtype}"
            ),
        )
        torch._check(x.dim() == 2, lambda: f"eq_linear_fwd_cast: x must be 2-D (M, 4c), got {tuple(x.shape)}")
        x_low = x.new_empty(x.shape, dtype=planes.dtype)
        return _eq_linear_fwd_fake(x_low, planes, bias), x_low

    def _setup_context_cast(ctx, inputs, output):
        _, planes, bias = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(output[1], planes)  # x as the kernels took it
        ctx.set_materialize_grads(False)  # no zeros for the rounded x's gradient (None unless a double
        # backward reaches it through the saved x)

    def _backward_cast(ctx, grad_y, grad_x_low):
        x_low, planes = ctx.saved_tensors
        gx = gp = gb = None
        if grad_y is not None:
            gx, gp, gb = _grads(ctx, grad_y, x_low, planes, True)
        if grad_x_low is not None and ctx.needs_input_grad[0]:  # rounding passes gradients as they are
            gx = grad_x_low.float() if gx is None else gx + grad_x_low.float()
        return gx, gp, gb

    torch.library.register_autograd(
        "flash_eqlinear::eq_linear_fwd_cast", _backward_cast, setup_context=_setup_context_cast
    )

    # ---- GELU(layer) in one kernel (flash_eq_mlp's inference path) ----
    @torch.library.register_fake("flash_eqlinear::eq_linear_fwd_gelu")
    def _eq_linear_fwd_gelu_fake(x, planes, bias):
        return _eq_linear_fwd_fake(x, planes, bias)

    def _setup_context_gelu(ctx, inputs, output):
        x, planes, bias = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, planes, bias)

    def _backward_gelu(ctx, grad_a):
        # The layer's backward at GELU'(pre) grad_a, pre recomputed (the op keeps only its output;
        # flash_eq_mlp takes it where no gradient is needed).
        x, planes, bias = ctx.saved_tensors
        pre = torch.ops.flash_eqlinear.eq_linear_fwd(x, planes, bias)
        return _backward(ctx, torch.ops.aten.gelu_backward(grad_a, pre))

    torch.library.register_autograd(
        "flash_eqlinear::eq_linear_fwd_gelu", _backward_gelu, setup_context=_setup_context_gelu
    )

    # ---- The training forward that keeps x's Fourier planes (eq_linear_fwd_xf) ----
    @torch.library.register_fake("flash_eqlinear::eq_linear_fwd_xf")
    def _eq_linear_fwd_xf_fake(x, planes, bias):
        return _eq_linear_fwd_fake(x, planes, bias), x.new_empty(x.shape)

    @torch.library.register_fake("flash_eqlinear::eq_linear_bwd_xf")
    def _eq_linear_bwd_xf_fake(grad_y, xf, planes, needs_x, needs_p, needs_b):
        return _eq_linear_bwd_fake(grad_y, xf, planes, needs_x, needs_p, needs_b, True)

    def _setup_context_xf(ctx, inputs, output):
        _, planes, bias = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(output[1], planes)  # x's planes instead of x: same size
        ctx.set_materialize_grads(False)  # xf's gradient stays None unless a double backward reaches it

    def _backward_xf(ctx, grad_y, grad_xf):
        xf, planes = ctx.saved_tensors
        needs_x, needs_p = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        needs_b = ctx.has_bias and ctx.needs_input_grad[2]
        gx = gp = gb = None
        if grad_y is not None and torch.is_grad_enabled():
            # x rebuilt from its saved planes by stock ops: differentiable through xf (this op's output)
            # back to x, by the grad_xf term below. Weight gradients in FP32, rounded once.
            x32 = x_from_halved_planes(xf)
            gx, gp, gb = _differentiable_grads(grad_y, x32, planes, needs_x, needs_p, needs_b)
        elif grad_y is not None:
            op = torch.ops.flash_eqlinear.eq_linear_bwd_xf
            gx, gp, gb = op(grad_y, xf, planes, needs_x, needs_p, needs_b)
        if grad_xf is not None and needs_x:
            gxf = halved_planes_adjoint(grad_xf).to(xf.dtype)
            gx = gxf if gx is None else gx + gxf
        return gx if needs_x else None, gp if needs_p else None, gb if needs_b else None

    torch.library.register_autograd(
        "flash_eqlinear::eq_linear_fwd_xf", _backward_xf, setup_context=_setup_context_xf
    )

    # ---- The output in three parts of their own (an attention's q, k, v; flash_eq_linear_chunks) ----
    @torch.library.register_fake("flash_eqlinear::eq_linear_fwd_split3")
    def _eq_linear_fwd_split3_fake(x, planes, bias):
        cast = x.dtype == torch.float32 and planes.dtype in (torch.float16, torch.bfloat16)
        x_low = x.new_empty(x.shape, dtype=planes.dtype) if cast else x
        y = _eq_linear_fwd_fake(x_low, planes, bias)
        d = planes.shape[1]
        torch._check(
            d % 3 == 0,
            lambda: f"eq_linear_fwd_split3: d = {d} output channels per group copy do not split in three",
        )
        parts = tuple(y.new_empty((x.shape[0], 4 * d // 3)) for _ in range(3))
        return *parts, x_low if cast else x.new_empty((0,))

    def _setup_context_split3(ctx, inputs, output):
        x, planes, bias = inputs
        ctx.has_bias = bias is not None
        ctx.cast = x.dtype != planes.dtype  # an FP32 x rounded in the op: the backward takes that x_low
        ctx.save_for_backward(output[3] if ctx.cast else x, planes)
        ctx.set_materialize_grads(False)  # (x_low's gradient: None unless a double backward reaches it)

    def _backward_split3(ctx, g0, g1, g2, grad_x_low):
        x, planes = ctx.saved_tensors
        gx = gp = gb = None
        if g0 is not None or g1 is not None or g2 is not None:
            shape = (x.shape[0], 4 * planes.shape[1] // 3)
            parts = [planes.new_zeros(shape) if g is None else g for g in (g0, g1, g2)]
            gx, gp, gb = _grads(ctx, parts, x, planes, ctx.cast)
        # (Without the cast, x_low is an empty placeholder; its gradient, if any, is one too.)
        if ctx.cast and grad_x_low is not None and ctx.needs_input_grad[0]:
            gx = grad_x_low.float() if gx is None else gx + grad_x_low.float()  # rounding passes gradients
        return gx, gp, gb

    torch.library.register_autograd(
        "flash_eqlinear::eq_linear_fwd_split3", _backward_split3, setup_context=_setup_context_split3
    )

    @torch.library.register_fake("flash_eqlinear::eq_linear_bwd_split3")
    def _eq_linear_bwd_split3_fake(gy0, gy1, gy2, x, planes, needs_x, needs_p, needs_b, grad_x_fp32=False):
        d = planes.shape[1]
        torch._check(
            all(g.dtype == x.dtype for g in (gy0, gy1, gy2)),
            lambda: f"eq_linear_bwd_split3: grad_y parts, x and planes must share one dtype, got {x.dtype}",
        )
        torch._check(
            d % 3 == 0 and all(g.shape == (x.shape[0], 4 * d // 3) for g in (gy0, gy1, gy2)),
            lambda: f"eq_linear_bwd_split3: want three grad_y parts (M, {4 * d // 3}), planes {planes.shape}",
        )
        return _eq_linear_bwd_fake(
            gy0.new_empty((gy0.shape[0], 4 * d)), x, planes, needs_x, needs_p, needs_b, False, grad_x_fp32
        )

    def _eager_function(op, setup_context, backward):
        """``op`` as an ``autograd.Function`` with the setup_context and backward registered for it above:
        the same graph node, without the registered kernel's per-call Python (argument normalisation, a
        redispatch, functorch bookkeeping), which costs about as much host time as the CUDA op itself.
        Eager calls of the layers take it (:func:`_call`)."""

        def forward(ctx, *args):  # ctx here: a separate setup_context costs an inspect.signature per call
            with torch._C._AutoDispatchBelowAutograd():
                out = op(*args)
            setup_context(ctx, args, out)
            return out

        name = f"{op.name().split('::')[-1]}_eager"
        methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
        return type(name, (torch.autograd.Function,), methods).apply

    _EAGER = {
        kind: (op.default, _eager_function(op.default, setup_context, backward))
        for kind, op, setup_context, backward in (
            ("fwd", torch.ops.flash_eqlinear.eq_linear_fwd, _setup_context, _backward),
            ("cast", torch.ops.flash_eqlinear.eq_linear_fwd_cast, _setup_context_cast, _backward_cast),
            ("xf", torch.ops.flash_eqlinear.eq_linear_fwd_xf, _setup_context_xf, _backward_xf),
            ("gelu", torch.ops.flash_eqlinear.eq_linear_fwd_gelu, _setup_context_gelu, _backward_gelu),
            (
                "split3",
                torch.ops.flash_eqlinear.eq_linear_fwd_split3,
                _setup_context_split3,
                _backward_split3,
            ),
        )
    }


def _call(kind: str, x, weight, bias):
    """One forward op of :func:`flash_eq_linear`, :func:`flash_eq_linear_chunks` or :func:`flash_eq_mlp`
    (``kind``: "fwd", "cast", "xf", "gelu" or "split3"). Eager calls skip the registered autograd kernel's
    Python: below the autograd key where nothing needs a gradient, else the equivalent
    ``autograd.Function`` (:func:`_eager_function`). Under torch.compile and functorch transforms the
    registered op runs as it is (the same backward)."""
    op, fn = _EAGER[kind]
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return op(x, weight, bias)
    if torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        return fn(x, weight, bias)
    with torch._C._AutoDispatchBelowAutograd():
        return op(x, weight, bias)


def x_from_halved_planes(xf: torch.Tensor) -> torch.Tensor:
    """x (M, 4c) interleaved, in FP32, from its Fourier planes as eq_linear_fwd_xf returns them: column
    blocks xf (M, 4c) = [f0 | f2 | fR | fI] / 2 with f0 = x0+x1+x2+x3, f2 = x0-x1+x2-x3, fR = x0-x2,
    fI = x3-x1 (the inverse of that map; exact up to the rounding of xf)."""
    h0, h2, hr, hi = xf.float().unflatten(1, (4, -1)).unbind(1)
    s, t = (h0 + h2) * 0.5, (h0 - h2) * 0.5
    return torch.stack([s + hr, t - hi, s - hr, t + hi], dim=-1).flatten(1)


def halved_planes_adjoint(g: torch.Tensor) -> torch.Tensor:
    """The adjoint (transpose) of x -> [f0 | f2 | fR | fI] / 2 (:func:`x_from_halved_planes`' inverse):
    a gradient (M, 4c) with respect to the planes -> one (M, 4c) with respect to x, in FP32."""
    g0, g2, gr, gi = g.float().unflatten(1, (4, -1)).unbind(1)
    s, t = (g0 + g2) * 0.5, (g0 - g2) * 0.5
    return torch.stack([s + 0.5 * gr, t - 0.5 * gi, s - 0.5 * gr, t + 0.5 * gi], dim=-1).flatten(1)


@torch.compiler.assume_constant_result
def _gemm_training_forward(dtype: torch.dtype, c: int, d: int, device_index: int) -> bool:
    """Whether a training forward of a layer with planes (4, d, c) on this CUDA device takes
    eq_linear_fwd_xf, which keeps x's Fourier planes for the backward: where the weight gradient takes
    the GEMM form (it uses the planes) and the forward makes the planes anyway or nearly so.
    fp16 / bf16: on Hopper GPUs the Hopper kernel writes them as a by-product (idle producer warps), and
    from c * d >= 2^22 the GEMM form runs instead (it ties the Hopper kernel there: H100, c = d = 2048,
    3.46 vs 3.44 ms); elsewhere the GEMM form from c * d >= 2^18 (FLASH_EQLINEAR_PRODUCTS forces either).
    FP32 with TF32 allowed: the DFT + cuBLAS forward, i.e. c * d >= 2^19 on Hopper, else always (here
    from c * d >= 2^17: large layers only). FLASH_EQLINEAR_KEEP_PLANES=0 turns it off. (Read when
    called; under torch.compile, when traced.)"""
    env = os.environ.get
    if env("FLASH_EQLINEAR_KEEP_PLANES", "1").strip() == "0":
        return False
    if weight_grad_mode(c, d, dtype, device_index) != "gemm":
        return False
    sm90 = _sm90(device_index)
    if dtype == torch.float32:
        if not torch.backends.cuda.matmul.allow_tf32 or env("FLASH_EQLINEAR_FP32") == "3xtf32":
            return False
        return c * d >= 2**17 and (not (sm90 and c % 4 == 0 and d % 2 == 0) or c * d >= 2**19)
    if max(c, d) <= 32 and env("FLASH_EQLINEAR_NARROW") != "0":
        return False  # the narrow kernel's layers
    form = env("FLASH_EQLINEAR_PRODUCTS", "auto")
    if form in ("fused", "gemm"):
        return form == "gemm"
    return (sm90 and c % 8 == 0 and d % 2 == 0) or c * d >= 2**18


@torch.compiler.assume_constant_result
def _parts_in_place(dtype: torch.dtype, c: int, d: int, device_index: int) -> bool:
    """Whether a training call of :func:`flash_eq_linear_chunks` (3 chunks) takes eq_linear_fwd_split3:
    where the Hopper kernels write the three parts in place and read their gradients where they are (fp16 /
    bf16 planes, d / 3 a multiple of 64, c % 8 == 0, the fused weight gradient). Elsewhere that op would copy
    the parts out of the whole output and join their gradients, which views of the whole output and
    autograd's one stack of the gradients do in fewer passes. (Read when called; under torch.compile, when
    traced.)"""
    return (
        dtype in (torch.float16, torch.bfloat16)
        and d % 192 == 0
        and c % 8 == 0
        and _sm90(device_index)
        and os.environ.get("FLASH_EQLINEAR_PRODUCTS", "auto") != "gemm"
        and weight_grad_mode(c, d, dtype, device_index) == "fused"
    )


def _sm90(device_index: int | None) -> bool:
    """Whether the Hopper kernels may run on this CUDA device (compute capability 9.x, FLASH_EQLINEAR_SM90
    not "0"; read when called)."""
    return os.environ.get("FLASH_EQLINEAR_SM90", "1") != "0" and _capability_major(device_index) == 9


_CAPABILITY_MAJOR: dict[int, int] = {}


def _capability_major(device_index: int | None) -> int:
    """The compute capability's major number of a CUDA device (None: the current one), looked up once per
    device: ``torch.cuda.get_device_capability`` costs microseconds of host time, and layers ask on every
    call."""
    if device_index is None:
        device_index = torch.cuda.current_device()
    major = _CAPABILITY_MAJOR.get(device_index)
    if major is None:
        major = _CAPABILITY_MAJOR[device_index] = torch.cuda.get_device_capability(device_index)[0]
    return major


def _autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast casts x's device type to, or None where autocast is off there."""
    dev = x.device.type
    # Only state queries that torch.compile constant-folds (torch.amp.is_autocast_available is not).
    if not torch._C._is_any_autocast_enabled() or dev not in _AUTOCAST_DEVICES:
        return None
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None


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
    grad_x is not rounded to 16 bits. ``FLASH_EQLINEAR_FUSED_CAST=0`` casts first (read when called).
    Under torch.compile x is cast first: Inductor fuses the cast into the kernel that makes x (LayerNorm,
    pointwise ops) and the backward's widening into the one that takes grad_x, and the 16-bit grad_x
    kernels are faster (H100, bf16 training step, compiled: EQ-ViT-B 34.30 -> 31.95 ms, EQ-ViT-L 87.77
    -> 81.91 ms; benchmarks/README.md, v21). ``cast``: autocast's dtype for x, where the caller has it."""
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if torch.compiler.is_compiling():
        return False
    if x.dtype != torch.float32 or not (x.requires_grad and torch.is_grad_enabled()):
        return False
    if not weight.is_floating_point() or weight.dtype == torch.float64:
        return False
    if os.environ.get("FLASH_EQLINEAR_FUSED_CAST", "1").strip() == "0":
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
    calls (fusing GELU there measured slower). ``FLASH_EQLINEAR_FUSED_MLP=0`` runs the three calls always.
    Under ``torch.autocast`` it casts like ``nn.Linear`` (an FP32 x in training as
    :func:`flash_eq_linear` takes it).
    """
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
    second = "flash_eq_mlp, second layer (weight2, bias2; its input has weight1's dtype)"
    params = (x, weight1, bias1, weight2, bias2)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in params)
    fused = os.environ.get("FLASH_EQLINEAR_FUSED_MLP", "1").strip() != "0"
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
    hidden = _call("gelu", x.reshape(-1, c * T).contiguous(), weight1.contiguous(), bias1)
    y = _call("fwd", hidden, weight2.contiguous(), bias2)
    return y.reshape(*x.shape[:-1], y.shape[-1])


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
    In training (grad enabled, weight requiring grad), layers whose weight gradient takes the GEMM form
    keep x's Fourier planes for the backward instead of x, the same memory, where the forward makes them
    anyway (the GEMM form) or nearly so (the Hopper kernel's writers) (``_gemm_training_forward``;
    ``FLASH_EQLINEAR_KEEP_PLANES=0``: x). Otherwise an FP32 x that needs its gradient under fp16 / bf16
    autocast is rounded inside the op, and grad_x comes back in FP32 from the kernel
    (``_keeps_fp32_input``).
    """
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
    x, weight, bias, keep32, (T, c, d) = _autocast_and_check(x, weight, bias, group_size)
    check_chunks(chunks, d)
    return _eq_linear(x, weight, bias, keep32, (T, c, d), chunks)


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
        if reference_form(x, T, c, d) == "fourier":
            y = reference.fourier_eq_linear(x, weight, bias, T)
        else:
            y = reference.naive_eq_linear(x, rounded_group_weight(weight), bias, T)
        return y.chunk(chunks, -1) if chunks else y
    lead = x.shape[:-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, c * T)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    keeps_planes = (
        torch.is_grad_enabled()
        and weight.requires_grad
        and _gemm_training_forward(weight.dtype, c, d, x2.device.index)
    )
    needs_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (x2, weight, bias)
    )
    wants_parts = chunks == 3 and needs_grad and not keeps_planes
    if wants_parts and _parts_in_place(weight.dtype, c, d, x2.device.index):
        parts = _call("split3", x2, weight.contiguous(), bias)[:3]
        return tuple(p if x.dim() == 2 else p.reshape(*lead, d * T // 3) for p in parts)
    if keep32 and not keeps_planes:
        y, _ = _call("cast", x2, weight.contiguous(), bias)
    elif keeps_planes:
        y, _ = _call("xf", x2.to(weight.dtype), weight.contiguous(), bias)
    else:
        y = _call("fwd", x2, weight.contiguous(), bias)
    y = y if x.dim() == 2 else y.reshape(*lead, d * T)
    return y.chunk(chunks, -1) if chunks else y
