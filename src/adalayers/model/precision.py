"""Which floating-point precision the base and the heads run in (precision_of and autocast_for live in
adalayers.engine.precision, which the training loop uses), and whether this CPU has bf16 instructions.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from adalayers.engine.precision import autocast_for, precision_of  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)


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
