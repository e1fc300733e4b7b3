"""flash-eqlinear: fast rotation-equivariant (cyclic-group) linear layers for PyTorch."""

from . import reference
from .fourier import naive_to_planes, planes_to_naive
from .layouts import NaiveLayout, SwappedEQLinear, register_naive_layout
from .modules import FlashEQLinear, NaiveEQLinear
from .ops import explain, flash_eq_linear, flash_eq_linear_chunks, flash_eq_mlp, kernels_available
from .swap import convert_state_dict, naive_state_dict, swap_eq_linear

__version__ = "0.1.0"

__all__ = [
    "FlashEQLinear",
    "NaiveEQLinear",
    "flash_eq_linear",
    "flash_eq_linear_chunks",
    "flash_eq_mlp",
    "naive_to_planes",
    "planes_to_naive",
    "swap_eq_linear",
    "SwappedEQLinear",
    "NaiveLayout",
    "register_naive_layout",
    "naive_state_dict",
    "convert_state_dict",
    "kernels_available",
    "explain",
    "reference",
]
