"""How this process was started, without importing torch: under torchrun, and its process group.

adalayers.core and adalayers.engine.distributed re-export these; the CLI reads them before it knows whether the
command needs torch at all (the torch-free llama.cpp serving path never imports it).
"""
from __future__ import annotations

import os
import sys


def launched() -> bool:
    """Started by torchrun (or anything else that sets WORLD_SIZE > 1)?"""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def local_rank() -> int:
    """This process's GPU number on its machine under torchrun (0 otherwise)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank() -> int:
    """This process's rank under torchrun, as torchrun sets it (0 otherwise)."""
    return int(os.environ.get("RANK", "0"))


def stop_process_group() -> None:
    """Leave the torchrun process group, if this process joined one (only engine.distributed starts one)."""
    distributed = sys.modules.get("adalayers.engine.distributed")
    if distributed is not None:
        distributed.stop()
