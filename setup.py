"""Build script. Builds ``flash_eqlinear._C`` from ``csrc/`` when torch is a CUDA build and a CUDA
toolkit is present; otherwise installs the pure-Python package (reference path only).

Environment:
  FLASH_EQLINEAR_SKIP_CUDA_BUILD=1   never build the extension
  FLASH_EQLINEAR_FORCE_CUDA_BUILD=1  fail instead of falling back when the build is impossible
  TORCH_CUDA_ARCH_LIST               target architectures (default "8.0;8.9;9.0a")
  MAX_JOBS                           parallel compile jobs (honoured by torch's ninja build)
"""

import glob
import os
import sys

from setuptools import setup


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def _cuda_extension():
    """(ext_modules, cmdclass, None), or ([], {}, reason) when the CUDA build is skipped."""
    if _flag("FLASH_EQLINEAR_SKIP_CUDA_BUILD"):
        return [], {}, "FLASH_EQLINEAR_SKIP_CUDA_BUILD is set"
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError as e:
        return [], {}, f"torch is not importable at build time ({e}; build with --no-build-isolation)"
    if torch.version.cuda is None:
        return [], {}, f"torch {torch.__version__} is a CPU build"
    if CUDA_HOME is None:
        return [], {}, "no CUDA toolkit found (set CUDA_HOME)"
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;8.9;9.0a")
    # The Hopper (wgmma) kernels exist only in sm_90a code: build 9.0 as 9.0a.
    archs = os.environ["TORCH_CUDA_ARCH_LIST"].replace(",", ";").replace(" ", ";").split(";")
    archs = ["9.0a" if a in ("9.0", "9.0+PTX") else a for a in archs if a]
    os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(archs)
    here = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(glob.glob(os.path.join("csrc", "*.cu"))) + sorted(
        glob.glob(os.path.join("csrc", "*.cpp"))
    )
    ext = CUDAExtension(
        name="flash_eqlinear._C",
        sources=sources,
        include_dirs=[os.path.join(here, "csrc")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++17"],
            "nvcc": ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"],
        },
    )
    return [ext], {"build_ext": BuildExtension}, None


ext_modules, cmdclass, skipped = _cuda_extension()
if skipped:
    if _flag("FLASH_EQLINEAR_FORCE_CUDA_BUILD"):
        sys.exit(f"flash-eqlinear: cannot build the CUDA extension: {skipped}")
    print(f"flash-eqlinear: building without CUDA kernels ({skipped}); the reference path will be used")

setup(ext_modules=ext_modules, cmdclass=cmdclass)
