"""Op registration on the Python side: the fakes of every op, the autograd formulas of the 2-D ops (the
paths torch.compile traces), the composite of ``eq_linear_grads_differentiable`` (the layer op's
create_graph=True backward) and the eager shortcut of the 2-D ops (:func:`call`).

The layer op ``eq_linear`` has its autograd and autocast kernels in C++ (``csrc/eq_linear_autograd.cpp``);
the schemas of all ops are in ``csrc/eq_ops.cpp``. Imported by the package when the extension is built.
"""

from __future__ import annotations

import torch

from . import reference
from ._extension import KERNEL_DTYPES as _KERNEL_DTYPES
from ._extension import kernels_available

if not kernels_available():  # pragma: no cover - the package imports this module only with the extension
    raise ImportError("flash_eqlinear._registry needs the compiled extension")


@torch.library.register_fake("flash_eqlinear::eq_linear_fwd")
def _eq_linear_fwd_fake(x, planes, bias):
    # Mirrors the checks of the CUDA implementation (csrc/eq_linear_fwd_api.cpp).
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


@torch.library.register_fake("flash_eqlinear::eq_linear_fwd_t")
def _eq_linear_fwd_t_fake(x, planes, bias):
    # Mirrors the checks of the CUDA implementation (csrc/eq_linear_t_api.cpp).
    torch._check(
        planes.dim() == 3 and planes.shape[0] in (2, 8),
        lambda: f"eq_linear_fwd_t: planes must be (T, d, c) with T = 2 or 8, got {tuple(planes.shape)}",
    )
    T, d, c = planes.shape
    torch._check(
        x.dim() == 2 and x.shape[1] == T * c,
        lambda: f"eq_linear_fwd_t: x must be 2-D (M, T*c) = (M, {T * c}), got {tuple(x.shape)}",
    )
    torch._check(x.dtype in _KERNEL_DTYPES, lambda: f"eq_linear_fwd_t: unsupported dtype {x.dtype}")
    torch._check(planes.dtype == x.dtype, lambda: "eq_linear_fwd_t: planes dtype does not match x dtype")
    if bias is not None:
        torch._check(
            bias.dim() == 1 and bias.shape[0] == d and bias.dtype == x.dtype,
            lambda: f"eq_linear_fwd_t: bias must have shape ({d},) and dtype {x.dtype}",
        )
    return x.new_empty((x.shape[0], T * d))


@torch.library.register_fake("flash_eqlinear::eq_linear_bwd_t")
def _eq_linear_bwd_t_fake(grad_y, x, planes, needs_x, needs_p, needs_b):
    T, d, _ = planes.shape
    torch._check(
        grad_y.dim() == 2 and grad_y.shape[1] == T * d,
        lambda: f"eq_linear_bwd_t: grad_y must be (M, T*d), got {tuple(grad_y.shape)}",
    )
    return (
        grad_y.new_empty(x.shape if needs_x else (0,)),
        grad_y.new_empty(planes.shape if needs_p else (0,)),
        grad_y.new_empty((d,) if needs_b else (0,)),
    )


def _setup_context_t(ctx, inputs, output):
    x, planes, bias = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, planes)


def _backward_t(ctx, grad_y):
    """eq_linear_fwd_t's gradients: eq_linear_bwd_t; with create_graph=True, differentiable ones (grad_x by
    the forward op on the adjoint planes, the weight gradients by stock ops)."""
    x, planes = ctx.saved_tensors
    needs_x, needs_p = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    needs_b = ctx.has_bias and ctx.needs_input_grad[2]
    if torch.is_grad_enabled():
        fwd = torch.ops.flash_eqlinear.eq_linear_fwd_t
        return _differentiable_grads(grad_y, x, planes, needs_x, needs_p, needs_b, fwd)
    gx, gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd_t(grad_y, x, planes, needs_x, needs_p, needs_b)
    return gx if needs_x else None, gp if needs_p else None, gb if needs_b else None


torch.library.register_autograd(
    "flash_eqlinear::eq_linear_fwd_t", _backward_t, setup_context=_setup_context_t
)


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


@torch.library.register_fake("flash_eqlinear::eq_linear_bwd")
def _eq_linear_bwd_fake(grad_y, x, planes, needs_x, needs_p, needs_b, grad_x_fp32=False):
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
        lambda: f"eq_linear_bwd: grad_y, x and planes must share one dtype, got {grad_y.dtype}, {x.dtype}",
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


def _differentiable_grads(grad_y, x, planes, needs_x, needs_p, needs_b, fwd=None):
    """create_graph=True (double backward, gradient penalties, Hessian-vector products): gradients
    that are themselves differentiable. grad_x through the forward op ``fwd`` (default eq_linear_fwd;
    eq_linear_fwd_t for group sizes 2 and 8) on the adjoint planes (its own backward is registered), the
    weight gradients by stock ops in x's dtype, returned in the planes' dtype."""
    gx = None
    if needs_x:
        adj = reference.adjoint_planes(planes).contiguous()
        gx = (fwd or torch.ops.flash_eqlinear.eq_linear_fwd)(grad_y.contiguous(), adj, None)
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
    its three column blocks (eq_linear_fwd_split3's outputs), which eq_linear_bwd_split3 reads where they
    are (joining them where its plan needs them whole). The backward ops follow the C++ plan."""
    needs_x, needs_p = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    needs_b = ctx.has_bias and ctx.needs_input_grad[2]
    if isinstance(grad_y, list):  # eq_linear_fwd_split3's three column blocks
        if not torch.is_grad_enabled():
            op = torch.ops.flash_eqlinear.eq_linear_bwd_split3
            gx, gp, gb = op(*grad_y, x, planes, needs_x, needs_p, needs_b, gx_fp32)
            return gx if needs_x else None, gp if needs_p else None, gb if needs_b else None
        grad_y = torch.cat(grad_y, 1)
    if torch.is_grad_enabled():
        gx, gp, gb = _differentiable_grads(grad_y, x, planes, needs_x, needs_p, needs_b)
        return gx.float() if gx_fp32 and gx is not None else gx, gp, gb
    # One op for the rest: the host cost of a backward is one call, not a dozen.
    gx, gp, gb = torch.ops.flash_eqlinear.eq_linear_bwd(grad_y, x, planes, needs_x, needs_p, needs_b, gx_fp32)
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
    return _eq_linear_bwd_fake(grad_y, xf, planes, needs_x, needs_p, needs_b)


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
        gy0.new_empty((gy0.shape[0], 4 * d)), x, planes, needs_x, needs_p, needs_b, grad_x_fp32
    )


def eager_function(op, setup_context, backward):
    """``op`` as an ``autograd.Function`` with the setup_context and backward registered for it above:
    the same graph node, without the registered kernel's per-call Python (argument normalisation, a
    redispatch, functorch bookkeeping), which costs about as much host time as the CUDA op itself.
    Eager calls of the 2-D ops take it (:func:`call`)."""

    def forward(ctx, *args):  # ctx here: a separate setup_context costs an inspect.signature per call
        with torch._C._AutoDispatchBelowAutograd():
            out = op(*args)
        setup_context(ctx, args, out)
        return out

    name = f"{op.name().split('::')[-1]}_eager"
    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (torch.autograd.Function,), methods).apply


EAGER = {
    kind: (op.default, eager_function(op.default, setup_context, backward))
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


def call(kind: str, x, weight, bias):
    """One forward op of :func:`flash_eq_linear`, :func:`flash_eq_linear_chunks` or :func:`flash_eq_mlp`
    (``kind``: "fwd", "cast", "xf", "gelu" or "split3"). Eager calls skip the registered autograd kernel's
    Python: below the autograd key where nothing needs a gradient, else the equivalent
    ``autograd.Function`` (:func:`eager_function`). Under torch.compile and functorch transforms the
    registered op runs as it is (the same backward)."""
    op, fn = EAGER[kind]
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


# ---- The layer op (x (..., 4c); autograd and autocast in C++) ----
@torch.library.register_fake("flash_eqlinear::eq_linear")
def _eq_linear_fake(x, planes, bias, x_rounded=False):
    torch._check(
        planes.dim() == 3 and planes.shape[0] == 4,
        lambda: f"weight must have shape (T, d, c) with T = 4, got {tuple(planes.shape)}",
    )
    d, c = planes.shape[1], planes.shape[2]
    torch._check(
        x.dim() >= 1 and x.shape[-1] == 4 * c,
        lambda: f"input's last dimension must be in_features = c*T = {c}*4 = {4 * c}, got {tuple(x.shape)}",
    )
    rounded = x_rounded and x.dtype == torch.float32 and planes.dtype in (torch.float16, torch.bfloat16)
    torch._check(
        x.dtype == planes.dtype or rounded,
        lambda: f"input dtype {x.dtype} does not match weight dtype {planes.dtype}",
    )
    torch._check(planes.dtype in _KERNEL_DTYPES, lambda: f"eq_linear: unsupported dtype {planes.dtype}")
    if bias is not None:
        torch._check(
            bias.dim() == 1 and bias.shape[0] == d and bias.dtype == planes.dtype,
            lambda: f"bias must have shape (d,) = ({d},) and dtype {planes.dtype}",
        )
    return x.new_empty((*x.shape[:-1], 4 * d), dtype=planes.dtype)


@torch.library.register_fake("flash_eqlinear::eq_linear_chunks")
def _eq_linear_chunks_fake(x, planes, bias, chunks, x_rounded=False):
    # Without gradients recorded (where this runs) the op returns the whole output; the caller chunks it.
    d = planes.shape[1] if planes.dim() == 3 else 0
    torch._check(
        chunks >= 1 and d % chunks == 0,
        lambda: f"chunks must be a positive divisor of d = {d} (whole fields each), got {chunks}",
    )
    return [_eq_linear_fake(x, planes, bias, x_rounded)]


@torch.library.impl("flash_eqlinear::eq_linear_grads_differentiable", "CompositeImplicitAutograd")
def _eq_linear_grads_differentiable(grad_y, saved, planes, form, needs_x, needs_p, needs_b):
    """The layer op's gradients under create_graph=True, by differentiable ops. saved: what its node kept,
    2-D: x (form 0), x rounded to the planes' dtype (form 1; grad_x in FP32), or x's planes as
    eq_linear_fwd_xf returns them (form 2). Gradients not needed come back as empty (0,) tensors."""
    x = x_from_halved_planes(saved) if form == 2 else saved
    gx, gp, gb = _differentiable_grads(grad_y, x, planes, needs_x, needs_p, needs_b)
    if form == 1 and gx is not None:
        gx = gx.float()
    empty = grad_y.new_empty((0,))
    return tuple(empty if t is None else t for t in (gx, gp, gb))
