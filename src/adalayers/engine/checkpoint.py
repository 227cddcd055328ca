"""The resumable training state, saved after every completed epoch.

resume.pt holds the trainable model's and the optimiser's weights, the scheduler, the early-stopping
counters, the best metric and every RNG state that decides what happens next (under torchrun: every
rank's), so a resumed run continues exactly as an uninterrupted one would. It is written atomically
and read with torch.load(weights_only=True): only tensors and plain Python values, never pickled code.
"""
from __future__ import annotations

import io
from pathlib import Path

import torch

from adalayers.errors import RunError
from adalayers.files import atomic_write

NAME = "resume.pt"


def rng_state() -> dict:
    """This process's RNG states that training draws from (the batch order has its own generator)."""
    return {"torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def save(run_dir: Path, *, epoch: int, model, opt, sched, scaler, gen: torch.Generator, progress: dict,
         elapsed: float, config: dict, rngs: list[dict]) -> None:
    """rngs: rng_state() of every rank, in rank order."""
    state = {"epoch": epoch, "progress": progress, "elapsed": elapsed, "config": config,
             "task": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
             "scaler": scaler.state_dict(), "gen": gen.get_state(), "rngs": rngs}
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write(Path(run_dir) / NAME, buf.getvalue())


def load(run_dir: Path) -> dict | None:
    path = Path(run_dir) / NAME
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unreadable file is reported the same way
        raise RunError(f"{path}: cannot read the resume state ({e}); delete it to start over") from None


def restore(state: dict, model, opt, sched, scaler, gen: torch.Generator, rank: int = 0) -> None:
    model.load_state_dict(state["task"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    scaler.load_state_dict(state["scaler"])
    gen.set_state(state["gen"])
    rngs = state["rngs"]
    rng = rngs[rank] if rank < len(rngs) else rngs[0]  # resumed on more processes: the new ones copy rank 0
    torch.set_rng_state(rng["torch_rng"])
    if rng["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda_rng"])
