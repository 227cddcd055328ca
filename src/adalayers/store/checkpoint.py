"""A run folder's resume state (resume.pt, written by the engine: adalayers.engine.checkpoint) as the run
folder sees it: whether a run is unfinished, and which epoch its head comes from."""
from __future__ import annotations

from pathlib import Path

from adalayers.engine.checkpoint import NAME, load, restore, rng_state, save  # noqa: F401  (re-exported)


def unfinished_note(run_dir: Path) -> str | None:
    """A run folder whose training has not finished (resume.pt, no metrics.json: still training, or
    stopped) -> one line saying so and which epoch its head comes from; a finished run -> None."""
    import json

    run_dir = Path(run_dir)
    if not (run_dir / NAME).is_file() or (run_dir / "metrics.json").is_file():
        return None
    epochs, best = 0, None
    log_path = run_dir / "log.jsonl"
    if log_path.is_file():
        for line in log_path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            epochs += 1
            best = entry.get("epoch", epochs) if entry.get("best") else best
    where = f"the best epoch so far (epoch {best} of {epochs} done)" if best else "the best epoch so far"
    return (f"{run_dir} is unfinished (still training, or stopped: continue it with 'adalayers train ... --resume'): "
            f"its head is {where}")
