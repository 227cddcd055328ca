"""The AdaLayers training recipe, run by the one engine (adalayers.engine.fit).

AdamW; the learning rate halves after `lr_patience` epochs without validation improvement;
training stops after `early_stopping` such epochs, after `max_epochs`, or before an epoch that
would overrun `max_minutes`; the run folder keeps the best epoch on the task's main validation
metric. One JSON line per epoch; resume.pt after every epoch. An optional `on_epoch(epoch,
validation_metric)` callback runs after each epoch's checkpoint (the tuner's pruner listens there); an
exception it raises ends training.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from adalayers import config as config_mod
from adalayers.core import pick_device, seed_everything  # noqa: F401  (imported from here by older code)
from adalayers.data.encoding import SplitFeed
from adalayers.engine import FitSettings
from adalayers.engine import fit as engine_fit
from adalayers.engine.loop import STOPPING
from adalayers.engine.precision import autocast_for
from adalayers.errors import TrainingError  # noqa: F401
from adalayers.model.states import Fed
from adalayers.recipes.evaluate import evaluate_split
from adalayers.store import run as runlib


EpochCallback = Callable[[int, float], None]
# what a resumed run may change: when to stop, how many threads, TensorBoard, and the tuner's section
RESUME_FREE = {"train": {*STOPPING, "num_threads", "tensorboard"}, "tune": None}


def resume_differences(stored: dict, config: dict) -> list[str]:
    """The settings a resumed run would change that decide what it learns (adalayers.config.differences:
    the stored config is read by this version first, so a field added since is no difference), and, when
    there are any, what may change."""
    diffs = config_mod.differences(stored, config, RESUME_FREE)
    return diffs and diffs + ["only train.max_epochs, early_stopping, max_minutes, num_threads, tensorboard and "
                              "the tune section may change on resume"]


def fit(task, source, data, encoded: dict, cfg, run_dir: Path, backbone, pad_id: int, resume: bool = False,
        on_epoch: EpochCallback | None = None) -> dict:
    """Train `task` on encoded["train"], selecting the best epoch on encoded["validation"].

    After each epoch the full training state goes to resume.pt; with `resume`, training continues
    from the last completed epoch exactly as if it had never stopped.
    """
    run_dir, tc = Path(run_dir), cfg.train
    autocast = autocast_for(tc.precision, backbone.device)

    def validate(epoch: int) -> tuple[float, dict]:
        val, _ = evaluate_split(task, source, encoded["validation"], data.splits["validation"],
                                tc.eval_batch_size, pad_id, autocast)
        return val[data.main_metric], {"validation": _flat(val)}

    def save_best(epoch: int) -> None:
        sha = runlib.save_head(run_dir, task)
        runlib.save_config(run_dir, cfg, data.labels, backbone, sha, task=data.name, kind=str(data.kind),
                           main_metric=data.main_metric)

    feed = SplitFeed(encoded["train"], tc.batch_size, pad_id, validate)
    if cfg.mixer.freeze_after is not None:
        feed = FreezeMix(feed, task.mixer, cfg.mixer.freeze_after)
    return engine_fit(Fed(task, source), feed, FitSettings.of(tc), backbone.device, run_dir=run_dir,
                      resume_key=cfg.to_dict(), differences=resume_differences, resume=resume, on_best=save_best, on_epoch=on_epoch)


class FreezeMix:
    """A training feed whose epochs after `after` run with the mixing logits frozen (mixer.freeze_after). The
    switch is made as each epoch starts, so a resumed run freezes them too."""

    def __init__(self, feed, mixer, after: int):
        self.feed, self.mixer, self.after = feed, mixer, after
        self.steps, self.validate = feed.steps, feed.validate

    def epoch(self, epoch: int, generator):
        self.mixer.learn_weights(epoch <= self.after)
        return self.feed.epoch(epoch, generator)


def _flat(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, dict)}
