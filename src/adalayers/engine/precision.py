"""Which floating-point precision a run computes in.

`auto` is bf16 autocast on CUDA and plain fp32 on a CPU, so CPU results stay bit-reproducible. bf16
also works on a CPU, where it is worth it only with bf16 instructions (AVX512-BF16 or AMX).
"""
from __future__ import annotations

import torch

from adalayers.errors import ConfigError


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
