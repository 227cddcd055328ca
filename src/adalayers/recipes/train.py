"""The AdaLayers training recipe, run by the one engine (adalayers.engine.fit).

AdamW; the learning rate halves after `lr_patience` epochs without validation improvement;
training stops after `early_stopping` such epochs, after `max_epochs`, or before an epoch that
would overrun `max_minutes`; the run folder keeps the best epoch on the task's main validation
metric. One JSON line per epoch; resume.pt after every epoch. An optional `on_epoch(epoch,
validation_metric)` callback runs after each epoch's checkpoint (the tuner's pruner listens there); an
exception it raises ends training.
"""
from __future__ import annotations

import logging
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
from adalayers.recipes.holdout import HeldOutMix, holdout_rows
from adalayers.recipes.evaluate import evaluate_split
from adalayers.store import run as runlib


log = logging.getLogger(__name__)
EpochCallback = Callable[[int, float], None]
# what a resumed run may change: when to stop, how many threads, TensorBoard, and the tuner's section
RESUME_FREE = {"train": {*STOPPING, "num_threads", "tensorboard", "keep", "time_budget"}, "tune": None}


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

    train, kept, held = encoded["train"], None, None
    if HeldOutMix.wanted(cfg.mixer):
        kept, held = holdout_rows(len(train.rows), cfg.mixer.holdout, tc.seed)
    feed = SplitFeed(train, tc.batch_size, pad_id, validate, rows=kept)
    if MixSchedule.wanted(cfg.mixer, tc.max_epochs):
        feed = MixSchedule(feed, task, cfg.mixer, tc.max_epochs)
    if held is not None:
        feed = HeldOutMix(feed, SplitFeed(train, tc.batch_size, pad_id, validate, rows=held), task,
                          cfg.mixer.holdout_pace)
    return engine_fit(Fed(task, source), feed, FitSettings.of(tc), backbone.device, run_dir=run_dir,
                      resume_key=cfg.to_dict(), differences=resume_differences, resume=resume, on_best=save_best, on_epoch=on_epoch)


class MixSchedule:
    """A training feed that switches what learns as each epoch starts (so a resumed run does the same):

        epochs 1..warmup_epochs                 only the mixing logits p learn (mixer.warmup_epochs)
        up to epoch held_epochs                 p stays as initialised; the rest learns (mixer.learn_after,
                                                at most a third of train.max_epochs)
        after epoch freeze_after                p stops learning; the rest goes on (mixer.freeze_after)
        otherwise                               everything learns

    A pinned mixer (mixer.pin_layer) has no mix to schedule: it trains as usual. A parameter that does not
    learn in an epoch gets no gradient, so AdamW leaves it (and its weight decay) alone."""

    def __init__(self, feed, task, mixer_cfg, max_epochs: int | None = None):
        self.feed, self.task, self.cfg = feed, task, mixer_cfg
        self.steps, self.validate = feed.steps, feed.validate
        self.rest = [q for q in task.trainable_parameters() if q is not task.mixer.p]
        self.held = self.held_epochs(mixer_cfg, max_epochs)
        if self.held < mixer_cfg.learn_after:
            log.info("mixer.learn_after=%d is held to %d epochs, a third of train.max_epochs=%d, so that the "
                     "layer weights learn for the rest of the run", mixer_cfg.learn_after, self.held, max_epochs)

    @staticmethod
    def held_epochs(m, max_epochs: int | None) -> int:
        """Epochs the mix stays as initialised: mixer.learn_after, at most a third of `max_epochs` (rounded
        down), so that a short run still learns its layer weights."""
        return m.learn_after if max_epochs is None else min(m.learn_after, max_epochs // 3)

    @classmethod
    def wanted(cls, m, max_epochs: int | None = None) -> bool:
        return m.pin_layer is None and (m.freeze_after is not None or cls.held_epochs(m, max_epochs) > 0
                                        or m.warmup_epochs > 0)

    def learning(self, epoch: int) -> tuple[bool, bool]:
        """(the mixing logits learn, the projections and the head learn) in `epoch` (from 1)."""
        m = self.cfg
        if epoch <= m.warmup_epochs:
            return True, False
        logits = epoch > self.held and (m.freeze_after is None or epoch <= m.freeze_after)
        return logits, True

    def epoch(self, epoch: int, generator):
        logits, rest = self.learning(epoch)
        self.task.mixer.learn_weights(logits)
        for q in self.rest:
            q.requires_grad_(rest)
        return self.feed.epoch(epoch, generator)


def _flat(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, dict)}
