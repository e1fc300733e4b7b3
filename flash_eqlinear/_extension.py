"""The compiled extension and the switches.

``flash_eqlinear._C`` registers the ``torch.ops.flash_eqlinear.*`` ops on import (``csrc/eq_ops.cpp``). When
it is missing (a CPU-only install) everything runs on the pure-PyTorch path.

Switches (README, "Switches"): for users, ``FLASH_EQLINEAR_BACKEND`` (``auto`` or ``reference``, read here at
import), ``FLASH_EQLINEAR_SM90`` and ``FLASH_EQLINEAR_FP32`` (read by the C++ plan); the knobs that exist to
A/B paths share ``FLASH_EQLINEAR_DEBUG="name=value,..."`` (names in ``csrc/eq_switches.h``; the C++ side
validates them). Python reads some of them itself (:func:`debug_switch`).
"""

from __future__ import annotations

import importlib.util
import os

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

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

_BACKENDS = ("auto", "reference")
BACKEND = os.environ.get("FLASH_EQLINEAR_BACKEND", "auto").strip().lower() or "auto"
if BACKEND not in _BACKENDS:
    raise ValueError(f"FLASH_EQLINEAR_BACKEND must be one of {_BACKENDS}, got {BACKEND!r}")


def kernels_available() -> bool:
    """Whether the fused CUDA kernels were built and import here."""
    return _KERNEL_IMPORT_ERROR is None


def kernel_import_error() -> str | None:
    """Why the fused kernels are unavailable (None when they are available)."""
    return _KERNEL_IMPORT_ERROR


def debug_switch(name: str) -> str | None:
    """The value of ``name`` in ``FLASH_EQLINEAR_DEBUG`` (read when called), or None where it is not set."""
    raw = os.environ.get("FLASH_EQLINEAR_DEBUG", "")
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return None
