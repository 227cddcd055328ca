"""The engine knows no run config: a resume is checked against the key its caller passes (with the caller's
`differences`, or the top-level keys by default), FitSettings reads any section's same-named fields, and a
NaN validation metric is never a best epoch."""
import dataclasses
import math

import pytest
import torch

from adalayers import config
from adalayers.engine import FitSettings, fit
from adalayers.engine import checkpoint
from adalayers.errors import TrainingError


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, batch):
        return batch["x"] * self.w

    def loss(self, out, batch):
        return torch.nn.functional.mse_loss(out, 2 * batch["x"])

    def trainable_parameters(self):
        return [self.w]


class Feed:
    steps = 2

    def __init__(self, model, metric=None):
        self.model, self.metric = model, metric

    def epoch(self, epoch, generator):
        for _ in range(self.steps):
            yield {"x": torch.rand(4, generator=generator)}

    def validate(self, epoch):
        if self.metric is not None:
            return self.metric, {}
        return -abs(2 - self.model.w.item()), {}


def test_fit_settings_of_a_train_section_reads_its_same_named_fields():
    tc = config.from_dict({"train": {"lr": 0.02, "max_epochs": 7, "early_stopping": 3, "tensorboard": True}}).train
    s = FitSettings.of(tc, desc="x")
    for f in dataclasses.fields(FitSettings):
        assert getattr(s, f.name) == (getattr(tc, f.name) if hasattr(tc, f.name) else
                                      "x" if f.name == "desc" else f.default)


def test_a_resume_is_checked_against_the_callers_key(tmp_path):
    s = FitSettings(lr=0.1, max_epochs=2)
    fit(Scale(), Feed(Scale()), s, torch.device("cpu"), run_dir=tmp_path, resume_key={"a": 1, "b": [2]})
    assert (tmp_path / checkpoint.NAME).is_file()
    with pytest.raises(TrainingError, match=r"different settings \(a: 1 there, 2 now\)"):
        fit(Scale(), Feed(Scale()), FitSettings(lr=0.1, max_epochs=3), torch.device("cpu"), run_dir=tmp_path,
            resume_key={"a": 2, "b": [2]}, resume=True)
    model = Scale()
    summary = fit(model, Feed(model), FitSettings(lr=0.1, max_epochs=3), torch.device("cpu"), run_dir=tmp_path,
                  resume_key={"a": 1, "b": [2]}, resume=True)
    assert [h["epoch"] for h in summary["history"]] == [3]


def test_without_a_resume_key_no_resume_state_is_written(tmp_path):
    fit(Scale(), Feed(Scale()), FitSettings(lr=0.1, max_epochs=1), torch.device("cpu"), run_dir=tmp_path)
    assert (tmp_path / "log.jsonl").is_file() and not (tmp_path / checkpoint.NAME).exists()


def test_a_nan_metric_is_never_the_best_epoch():
    model = Scale()
    summary = fit(model, Feed(model, math.nan), FitSettings(lr=0.1, max_epochs=5, early_stopping=2),
                  torch.device("cpu"))
    assert summary["best_epoch"] == 0 and summary["epochs"] == 2
