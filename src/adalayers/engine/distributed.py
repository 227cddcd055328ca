"""Training across processes with torch.distributed, as launched by torchrun.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous; `start()` joins the process group
(gloo on a CPU, NCCL on CUDA, one GPU per LOCAL_RANK). Without torchrun the world is one process
and every function here is a no-op, so the engine runs one code path.

How work is split (the same global batches as one process, so results are comparable):
    training    the global batch (train.batch_size rows, drawn in the same shuffled order on every
                rank) is dealt out: rank r takes rows r, r + N, r + 2N, ... DDP averages the
                ranks' gradients; each rank's loss is weighted by N * n_r / n, so the update is the
                gradient of the global batch's mean loss (exactly so for per-example losses).
    evaluation  the evaluation batches are dealt out; the outputs are gathered on every rank, so
                every rank computes the same metric and makes the same early-stopping decision.
    writing     rank 0 alone writes the run folder, logs and checkpoints; the others wait at a barrier.
"""
from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

from adalayers.core import launched, local_rank  # noqa: F401  (distributed.launched / local_rank: callers use them)

log = logging.getLogger(__name__)


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if active() else int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return dist.get_rank() if active() else int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def start(device: torch.device) -> None:
    """Join the process group torchrun prepared (once per process); nothing when not launched."""
    if not launched() or active():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    log.info("process %d of %d joined (%s)", dist.get_rank(), dist.get_world_size(), backend)


def stop() -> None:
    if active():
        dist.destroy_process_group()


def barrier() -> None:
    if active():
        dist.barrier()


def gather(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank ([obj] in one process)."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's `obj` on every rank."""
    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def deal(items: list) -> list:
    """This rank's share of `items`: items[rank::world]."""
    return items[rank()::world_size()] if active() else items


def wrap(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DistributedDataParallel over the module's trainable parameters (the module itself in one process).

    find_unused_parameters: a layer whose weight fell under mixer.cutoff gets no gradient in a step.
    """
    if not active():
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids, find_unused_parameters=True)
