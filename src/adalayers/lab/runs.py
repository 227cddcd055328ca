"""Reading finished run folders for the lab's commands: metrics (the epoch log is adalayers.store.run.read_log), and whether a run made with the
same settings can be reused (an interrupted sweep or seed series resumes)."""
from __future__ import annotations

import json
from pathlib import Path

from adalayers import config as config_mod
from adalayers.errors import RunError
from adalayers.store import run as runlib

# settings that do not change what a run learns: a finished run is reused even if they differ
# train.keep: what a run keeps, not what its head learns (the lab trains and compares heads: train.keep=head;
# a given run that kept its probe is refused where its head is wanted)
IGNORED = {"cache": None, "tune": None, "train": {"device", "num_threads", "eval_batch_size", "keep"},
           "mixer": {"pin_layer"}}


def read_metrics(run_dir: Path) -> dict:
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e.msg})") from None


def parameters_used(metrics: dict, meta: dict) -> int | None:
    """Trainable parameters the run really uses: the projections of layers with weight 0 never run."""
    weights, total = metrics.get("layer_weights"), metrics.get("trainable_params")
    if weights is None or total is None:
        return None
    k, d = meta["config"]["mixer"]["k"], meta["base"]["hidden_size"]
    return total - sum(1 for w in weights if w == 0) * k * d


def duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def differences(old: dict, new: dict) -> list[str]:
    """The settings (config dicts) that differ in what a run learns; IGNORED ones do not count."""
    return config_mod.differences(old, new, IGNORED)


def finished(run_dir: Path, cfg) -> dict | None:
    """{"metrics", "meta"} of a finished run made with the same settings; None when there is none yet."""
    metrics = read_metrics(run_dir)
    if not metrics:
        return None
    meta = runlib.read_config(run_dir)
    diffs = differences(meta["config"], cfg.to_dict())
    if diffs:
        raise RunError(f"{run_dir} was trained with other settings ({'; '.join(diffs)}); "
                       f"give the sweep a new --out folder or remove that run")
    return {"metrics": metrics, "meta": meta}
