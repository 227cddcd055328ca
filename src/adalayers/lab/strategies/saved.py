"""A run folder written by a harness-trained strategy (`adalayers compare`) -> the strategy and its trained model."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from adalayers import config as config_mod
from adalayers.core import pick_device
from adalayers.data.tasks import TaskData
from adalayers.errors import ModelError, RunError
from adalayers.lab.strategies import make
from adalayers.lab.strategies.base import META, TRAINED
from adalayers.model.backbone import Backbone
from adalayers.store import run as runlib


def load_run(run_dir: Path, backbone=None):
    """A harness-trained run folder -> (strategy, model with its trained tensors, run config, meta)."""
    run_dir = Path(run_dir)
    path = run_dir / META
    if not path.is_file():
        raise RunError(f"{run_dir}: no {META} (is this a strategy folder written by 'adalayers compare'?)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        cfg = config_mod.from_dict(meta["run_config"])
        strategy = make(meta["spec"], [f"{k}={json.dumps(v)}" for k, v in meta["config"].items()])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise RunError(f"{path}: not a valid strategy file ({e})") from None
    if backbone is None:
        backbone = Backbone.load(cfg.model.base, cfg.model.states, pick_device(cfg.train.device))
    if backbone.fingerprint() != meta["base"]["fingerprint"]:
        raise ModelError(f"{run_dir} was trained on base {meta['base']['name']!r}, not on {backbone.name!r}")
    if runlib.sha256(run_dir / TRAINED) != meta["checksums"][TRAINED]:
        raise RunError(f"{run_dir / TRAINED}: checksum does not match {META}")
    data = TaskData(meta["task"], meta["kind"], meta["labels"], {}, meta["main_metric"])
    model = strategy.build(cfg, backbone, data)
    missing, unexpected = model.load_state_dict(load_file(str(run_dir / TRAINED)), strict=False)
    wanted = {k for k, v in model.named_parameters() if v.requires_grad}
    if unexpected or wanted & set(missing):
        raise RunError(f"{run_dir / TRAINED}: does not fit the strategy (missing {sorted(wanted & set(missing))[:3]}, "
                       f"unexpected {unexpected[:3]})")
    model.to(backbone.device).eval()
    return strategy, model, cfg, backbone, meta
