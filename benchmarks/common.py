"""Shared benchmark utilities: timing with CUDA events over rotated inputs, ceilings, metadata."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def env_switch(name: str, value: str):
    """The environment variable ``name`` set to ``value`` inside the block, restored after (the
    kernels read their FLASH_EQLINEAR_* switches at each call)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def with_debug_switch(raw: str, name: str, value: str) -> str:
    """``FLASH_EQLINEAR_DEBUG``'s value ``raw`` ("name=value,...", may be empty) with ``name`` set to
    ``value`` (added, or replacing the item of that name; the others kept in their order)."""
    items = {}
    for item in raw.split(","):
        key, sep, val = item.partition("=")
        if sep and key.strip():
            items[key.strip()] = val.strip()
    items[name] = str(value)
    return ",".join(f"{k}={v}" for k, v in items.items())


@contextmanager
def debug_switch(name: str, value: str):
    """The debug switch ``name`` (one of FLASH_EQLINEAR_DEBUG's names: narrow, products, weight_grad,
    keep_planes, fused_cast, fused_mlp, fused_norm, workspace_mb, fp32_tile, sm90_cluster, wgrad_swap,
    wgrad_half_r, pdl) set to ``value`` inside the block, merged with what FLASH_EQLINEAR_DEBUG holds;
    the variable is restored after (the kernels read it at each call)."""
    raw = with_debug_switch(os.environ.get("FLASH_EQLINEAR_DEBUG", ""), name, value)
    with env_switch("FLASH_EQLINEAR_DEBUG", raw):
        yield


# The switches with variables of their own (the others are names of FLASH_EQLINEAR_DEBUG).
OWN_VARIABLES = (
    "FLASH_EQLINEAR_SM90",
    "FLASH_EQLINEAR_FP32",
    "FLASH_EQLINEAR_BACKEND",
    "FLASH_EQLINEAR_DEBUG",
)


def switch(name: str, value: str):
    """A context with one switch set: a variable of its own where ``name`` is one
    (``FLASH_EQLINEAR_SM90``, ``FLASH_EQLINEAR_FP32``: :func:`env_switch`), else a name of
    FLASH_EQLINEAR_DEBUG (``pdl``, ``narrow``, ...: :func:`debug_switch`). A retired variable
    (``FLASH_EQLINEAR_PDL`` and the like, now ``pdl``) raises instead of being set to no effect."""
    if name in OWN_VARIABLES:
        return env_switch(name, value)
    if name.startswith("FLASH_EQLINEAR_"):
        short = name.removeprefix("FLASH_EQLINEAR_").lower()
        raise ValueError(
            f"{name} is gone: set {short}={value} in FLASH_EQLINEAR_DEBUG (the switch name {short!r})"
        )
    return debug_switch(name, value)


def git_commit() -> str:
    """HEAD's short hash (``-dirty`` with local changes); FLASH_EQLINEAR_COMMIT overrides it where
    the tree is a copy without .git."""
    if os.environ.get("FLASH_EQLINEAR_COMMIT"):
        return os.environ["FLASH_EQLINEAR_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict:
    dev = torch.cuda.get_device_properties(0)
    return {
        "gpu": dev.name,
        "sm_count": dev.multi_processor_count,
        "capability": f"{dev.major}.{dev.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": git_commit(),
    }


def n_buffers(bytes_per_call: int) -> int:
    """How many input sets to rotate through so that they do not all sit in L2."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    return max(1, min(16, -(-3 * l2 // max(bytes_per_call, 1))))


def bench(fn, args_list, min_time_s: float = 0.25, max_samples: int = 200, min_calls: int = 1) -> float:
    """Median ms per call. Each sample times passes over ``args_list`` (rotated inputs), at least
    ``min_calls`` calls, with CUDA events; samples repeat until ``min_time_s`` of samples or
    ``max_samples``. With min_calls > 1 an eagerly launched call's host latency (Python, autograd,
    dispatch before its first kernel) overlaps the previous call's GPU work, as in a training step,
    instead of being timed in full as the latency of one isolated call."""
    passes = max(1, -(-min_calls // len(args_list)))
    for args in args_list:  # warm-up: module load, autotuning, workspace allocation
        fn(*args)
    torch.cuda.synchronize()
    samples: list[float] = []
    total = 0.0
    while len(samples) < 5 or (total < min_time_s * 1e3 and len(samples) < max_samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(passes):
            for args in args_list:
                fn(*args)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        total += ms
        samples.append(ms / (passes * len(args_list)))
    return statistics.median(samples)


def host_us(fn, n: int = 300) -> float:
    """Host time per call (microseconds) of fn, on tensors small enough that the GPU never holds the host
    back: what the Python / dispatch side costs. No synchronisation between the calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def measure_ceilings() -> dict:
    """Measured ceilings on this GPU: cuBLAS matmul TFLOP/s per dtype and copy bandwidth."""
    out = {}
    n = 8192
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    for name, dt, tf32 in (
        ("fp32", torch.float32, False),
        ("tf32", torch.float32, True),
        ("fp16", torch.float16, False),
        ("bf16", torch.bfloat16, False),
    ):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        a = torch.randn(n, n, device="cuda", dtype=dt)
        b = torch.randn(n, n, device="cuda", dtype=dt)
        ms = bench(torch.mm, [(a, b)], min_time_s=0.3, max_samples=30)
        out[f"{name}_tflops"] = 2 * n**3 / ms / 1e9
    torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    src = torch.empty(2**30 // 4, device="cuda", dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), [()], min_time_s=0.3, max_samples=50)
    out["copy_tbps"] = 2 * src.numel() * 4 / ms / 1e9
    return out


def save_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=1))
    return path
