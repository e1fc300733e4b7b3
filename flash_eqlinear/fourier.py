"""Orthonormal real DFT along the group axis, and the weight conversions built on it.

For a cyclic group of size T the real DFT basis ``Q`` is a (T, T) orthogonal matrix whose rows are,
in this order (the *plane order*):

* ``k = 0``:                      ``1 / sqrt(T)``
* ``k = 1 .. ceil(T/2) - 1``:     ``sqrt(2/T) cos(2 pi k s / T)`` then ``sqrt(2/T) sin(2 pi k s / T)``
* ``k = T/2`` (T even only):      ``(-1)^s / sqrt(T)``

The frequency planes of a group-domain weight ``w`` of shape ``(d, c, T)`` are
``planes[j] = sum_s Q[j, s] w[..., s]``, shape ``(T, d, c)``. For T = 4 that is
``P0 = (w0+w1+w2+w3)/2, PR = (w0-w2)/sqrt2, PI = (w1-w3)/sqrt2, P2 = (w0-w1+w2-w3)/2``.
Because ``Q`` is orthogonal the conversion is an isometry: gradients, weight decay and momentum
map one to one between the two parametrisations.
"""

from __future__ import annotations

import math

import torch

__all__ = ["dft_basis", "plane_kinds", "naive_to_planes", "planes_to_naive"]


def check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    return group_size


def dft_basis(group_size: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The orthogonal real DFT matrix ``Q`` of shape (T, T), rows in plane order.

    Built with device-side ops only (no host-to-device copy), so it works under CUDA graph
    capture, fake tensors and torch.compile. Computed in float64 (float32 on MPS), then cast to
    ``dtype``; ``dtype=None`` returns that working precision.
    """
    T = check_group_size(group_size)
    work = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
    j = torch.arange(T, dtype=work, device=device)
    k = torch.floor((j + 1) / 2)  # row j holds frequency (j+1)//2: cos for odd j, sin for even j > 0
    angle = (2 * math.pi / T) * k[:, None] * j[None, :]
    is_sin = (torch.remainder(j, 2) == 0) & (j > 0)
    rows = torch.where(is_sin[:, None], torch.sin(angle), torch.cos(angle))
    is_real = (j == 0) | ((T % 2 == 0) & (j == T - 1))  # k = 0 and k = T/2 are not paired
    scale = torch.full_like(j, math.sqrt(2.0 / T)).masked_fill(is_real, 1.0 / math.sqrt(T))
    return (rows * scale[:, None]).to(dtype or work)


def plane_kinds(group_size: int) -> list[tuple[str, int]]:
    """The frequency coordinate each plane holds: ``("real", k)``, ``("re", k)`` or ``("im", k)``."""
    T = check_group_size(group_size)
    kinds = [("real", 0)]
    for k in range(1, (T + 1) // 2):
        kinds += [("re", k), ("im", k)]
    if T % 2 == 0 and T > 1:
        kinds.append(("real", T // 2))
    return kinds


def _check_float(t: torch.Tensor, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def naive_to_planes(w: torch.Tensor) -> torch.Tensor:
    """Group-domain weight ``w`` (d, c, T) -> frequency planes (T, d, c). Differentiable."""
    _check_float(w, "w")
    if w.dim() != 3:
        raise ValueError(f"w must have shape (d, c, T), got {tuple(w.shape)}")
    Q = dft_basis(w.shape[-1], dtype=w.dtype, device=w.device)
    return torch.einsum("js,dcs->jdc", Q, w)


def planes_to_naive(planes: torch.Tensor) -> torch.Tensor:
    """Frequency planes (T, d, c) -> group-domain weight ``w`` (d, c, T). Inverse of naive_to_planes."""
    _check_float(planes, "planes")
    if planes.dim() != 3:
        raise ValueError(f"planes must have shape (T, d, c), got {tuple(planes.shape)}")
    Q = dft_basis(planes.shape[0], dtype=planes.dtype, device=planes.device)
    return torch.einsum("js,jdc->dcs", Q, planes)
