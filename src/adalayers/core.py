"""Small helpers every command needs: the device, the seeds, a digest of a module's weights, and the
launch environment torchrun sets (adalayers.engine.distributed joins its process group)."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import torch
from torch import nn

from adalayers.errors import TrainingError
from adalayers.launch import launched, local_rank  # noqa: F401  (core.launched / local_rank: callers use them)


def pick_device(name: str) -> torch.device:
    """auto -> CUDA when present, else CPU; cuda without a CUDA device is an error.

    Under torchrun each process takes the GPU of its LOCAL_RANK (see adalayers.engine.distributed).
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("train.device=cuda but no CUDA device is available")
    if name == "cuda" and launched():
        return torch.device("cuda", local_rank())
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def weights_digest(module: nn.Module) -> str:
    """sha256 over every tensor of the state dict (not cached): equal digests = bit-identical weights."""
    h = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
