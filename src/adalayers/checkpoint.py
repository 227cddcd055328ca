"""The resumable training state, saved after every completed epoch.

resume.pt holds the head and optimizer weights, the scheduler, the early-stopping counters, the best
metric and every RNG state that decides what happens next, so a resumed run continues exactly as an
uninterrupted one would. It is written atomically and read with torch.load(weights_only=True): only
tensors and plain Python values, never pickled code.
"""
from __future__ import annotations

import io
from pathlib import Path

import torch

from adalayers.errors import RunError
from adalayers.run import atomic_write

NAME = "resume.pt"


def save(run_dir: Path, *, epoch: int, task, loop, progress: dict, elapsed: float, config: dict) -> None:
    state = {"epoch": epoch, "progress": progress, "elapsed": elapsed, "config": config,
             "task": task.state_dict(), "opt": loop.opt.state_dict(), "sched": loop.sched.state_dict(),
             "scaler": loop.scaler.state_dict(), "gen": loop.gen.get_state(), "torch_rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
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


def restore(state: dict, task, opt, sched, scaler, gen: torch.Generator) -> None:
    task.load_state_dict(state["task"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    scaler.load_state_dict(state["scaler"])
    gen.set_state(state["gen"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
