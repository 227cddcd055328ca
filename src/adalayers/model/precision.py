"""Which floating-point precision the base and the heads run in.

`auto` is bf16 autocast on CUDA and plain fp32 on a CPU, so CPU results stay bit-reproducible. bf16
also works on a CPU, where it is worth it only with bf16 instructions (AVX512-BF16 or AMX).
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from adalayers.errors import ConfigError

log = logging.getLogger(__name__)


def precision_of(precision: str, device: torch.device) -> str:
    """The precision a run really uses on `device`: fp32, bf16 or fp16."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a CUDA device; on a CPU use bf16 (fast where the CPU has "
                          "AVX512-BF16 or AMX instructions) or fp32")
    return precision


def autocast_for(precision: str, device: torch.device):
    """A context factory for mixed precision on `device`, or None when the run is fp32."""
    name = precision_of(precision, device)
    if name == "fp32":
        return None
    dtype = torch.float16 if name == "fp16" else torch.bfloat16
    return lambda: torch.autocast(device.type, dtype=dtype)


def cpu_bf16_flags() -> list[str]:
    """The CPU's bf16 instructions as /proc/cpuinfo names them (avx512_bf16, amx_bf16); [] where none or unknown."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()]


def warn_if_slow(tc, device: torch.device) -> None:
    """Log a warning when bf16 is asked for on a CPU without bf16 instructions: its products are then
    emulated and slower than fp32 ones. `tc`: the train section (precision, head_precision)."""
    asked = [name for name, value in (("train.precision", tc.precision), ("train.head_precision", tc.head_precision))
             if value == "bf16"]
    if asked and device.type == "cpu" and not cpu_bf16_flags():
        log.warning("%s=bf16 on a CPU without bf16 instructions (AVX512-BF16 or AMX): bf16 products are emulated "
                    "there, slower than fp32", " and ".join(asked))
