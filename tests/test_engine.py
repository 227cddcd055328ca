"""The one engine: every strategy and the multi-task model train through the same fit loop, here for
one step under bf16 autocast; TaskKind parsing; the loss and the window of a resume."""
import pytest
import torch

from adalayers.recipes import service
from adalayers.lab import strategies
from adalayers.engine import loop as fit_module
from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind

from conftest import tiny_tokenizer
from test_multitask import mt_config, tiny_backbone as mt_backbone
from test_strategies import ALL, tiny_bert, tiny_config


@pytest.fixture
def steps(monkeypatch):
    """Every training step the engine takes: (the trained module's class, the autocast dtype or None)."""
    seen = []
    real = fit_module._Step.forward

    def spy(self, batch):
        on = torch.is_autocast_enabled("cpu")
        seen.append((type(self.model).__name__, torch.get_autocast_dtype("cpu") if on else None))
        return real(self, batch)

    monkeypatch.setattr(fit_module._Step, "forward", spy)
    return seen


@pytest.mark.parametrize("spec", ALL)
def test_every_strategy_takes_one_bf16_step_through_the_engine(spec, steps, tmp_path):
    torch.set_num_threads(1)
    backbone = tiny_bert(tiny_tokenizer())
    cfg = tiny_config("tiny-seq")
    cfg.train.precision, cfg.train.batch_size = "bf16", 48  # 48 training rows: one step
    strategy = strategies.make(spec, ["size=8"] if spec.startswith("adapters") else [])
    _, data, encoded = service.prepare(cfg, backbone)
    trained = strategy.train(cfg, backbone, data, encoded, tmp_path / "run")
    assert len(steps) == 1 and steps[0][1] == torch.bfloat16, steps
    assert trained.epochs == 1 and "mcc" in trained.results["test"]


def test_multitask_takes_bf16_steps_through_the_same_engine(steps):
    from adalayers.lab.multitask.config import from_dict
    from adalayers.lab.multitask.trainer import train

    torch.set_num_threads(1)
    cfg = from_dict(mt_config(precision="bf16", pcgrad=True))
    result = train(cfg, mt_backbone(), log=lambda *a: None)
    assert steps and {s for _, s in steps} == {torch.bfloat16} and {m for m, _ in steps} == {"Steps"}
    assert set(result["results"]) == {"t-sent", "t-para", "t-sim"}
    assert set(result["history"][0]["train_loss"]) == {"t-sent", "t-para", "t-sim"}


def test_task_kind_takes_every_name_and_equals_the_stored_strings():
    assert TaskKind.parse("classification") is TaskKind.CLASSIFICATION == "sequence"
    assert TaskKind.parse("tokens") is TaskKind.parse("token") is TaskKind.TOKENS
    assert {"regression": 1}[TaskKind.REGRESSION] == 1 and f"{TaskKind.TOKENS}" == "token"
    with pytest.raises(ConfigError, match="classification, regression or tokens"):
        TaskKind.parse("ranking")


def test_unknown_schedule_is_a_config_error():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ConfigError, match="schedule"):
        fit_module.schedule(opt, fit_module.FitSettings(lr=1.0, max_epochs=1, schedule="cosine"), 10)


class Line(torch.nn.Module):
    """A Trainable in a few lines: y = w x + b, MSE."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)

    def forward(self, batch):
        return self.lin(batch["x"]).squeeze(-1)

    def loss(self, out, batch):
        return torch.nn.functional.mse_loss(out, batch["y"])

    def trainable_parameters(self):
        return list(self.parameters())


class LineFeed:
    """y = 3x - 1 in batches of 8; validation metric: -MSE on fixed points."""

    def __init__(self, model):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(64, 1, generator=g)
        self.model, self.steps = model, 8

    def epoch(self, epoch, generator):
        order = torch.randperm(64, generator=generator)
        for s in range(0, 64, 8):
            x = self.x[order[s:s + 8]]
            yield {"x": x, "y": 3 * x[:, 0] - 1}

    def validate(self, epoch):
        with torch.no_grad():
            mse = torch.nn.functional.mse_loss(self.model({"x": self.x}), 3 * self.x[:, 0] - 1).item()
        return -mse, {"validation": {"neg_mse": -mse}}


def test_fit_learns_a_line_logs_each_epoch_and_writes_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from adalayers.engine import FitSettings, fit

    torch.manual_seed(0)
    model = Line()
    feed = LineFeed(model)
    start = feed.validate(0)[0]
    s = FitSettings(lr=0.5, max_epochs=6, schedule="linear", warmup_fraction=0.2, tensorboard=True)
    summary = fit(model, feed, s, torch.device("cpu"), run_dir=tmp_path, keep_best=True)
    assert summary["epochs"] == 6 and summary["best_validation"] > start / 4, (start, summary["best_validation"])
    assert feed.validate(0)[0] == summary["best_validation"]  # the best epoch's weights are back
    log = [line for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(log) == 6
    assert summary["history"][-1]["lr"] == pytest.approx(0.0, abs=1e-9)  # linear decay reaches 0 at the end
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert {"train_loss", "lr", "validation/neg_mse"} <= set(events.Tags()["scalars"])
    assert len(events.Scalars("train_loss")) == 6


def test_fit_stops_early_and_keeps_the_best_epoch():
    from adalayers.engine import FitSettings, fit

    torch.manual_seed(0)
    model = Line()

    class Worse(LineFeed):  # the metric only gets worse after epoch 1
        def validate(self, epoch):
            return -float(epoch), {"validation": {}}

    summary = fit(model, Worse(model), FitSettings(lr=0.1, max_epochs=10, early_stopping=2), torch.device("cpu"))
    assert summary["epochs"] == 3 and summary["best_epoch"] == 1


def test_the_time_left_after_the_first_epoch_leaves_its_slow_first_batches_out(caplog):
    """fit's time left counts each epoch's training at the pace of its second half: a first epoch whose first
    batches are slow (8 batches, the first two 0.2 s more) does not inflate the estimate after it."""
    import logging
    import time

    from adalayers.engine import FitSettings, fit

    class SlowStart(LineFeed):
        def epoch(self, epoch, generator):
            for b, batch in enumerate(super().epoch(epoch, generator)):
                time.sleep(0.2 if epoch == 1 and b < 2 else 0.02)
                yield batch

    with caplog.at_level(logging.INFO, logger="adalayers"):
        fit(Line(), SlowStart(Line()), FitSettings(lr=0.1, max_epochs=11), torch.device("cpu"))
    first = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch   1/11"))
    took = float(first.split("  ")[-2].rstrip("s"))  # the epoch's own seconds, about 8 x 0.02 + 0.4
    minutes, seconds = first.split("~")[1].split("s left")[0].split("m")
    left = 60 * int(minutes) + int(seconds)
    assert took >= 0.5 and 1 <= left <= 0.6 * 10 * took, first  # 10 epochs at about 0.17 s, not at took (0.56 s)


def test_resume_reads_the_stored_config_with_this_versions_defaults(tmp_path):
    """A resume state saved before a config field existed (or with another tune section) resumes;
    a setting that changes what is learned is still refused, by name."""
    from adalayers.engine import checkpoint
    from adalayers import config
    from adalayers.engine import FitSettings, fit
    from adalayers.errors import TrainingError
    from adalayers.recipes.train import resume_differences

    torch.manual_seed(0)
    cfg = config.from_dict({"train": {"max_epochs": 2}}).to_dict()
    fit(Line(), LineFeed(Line()), FitSettings(lr=0.1, max_epochs=2), torch.device("cpu"), run_dir=tmp_path,
        resume_key=cfg, differences=resume_differences)
    state = torch.load(tmp_path / checkpoint.NAME, weights_only=True)
    del state["config"]["head"]["pooling"], state["config"]["train"]["tensorboard"]  # as an older version wrote it
    state["config"]["tune"] = {"max_epochs": 3, "seed": 7}
    torch.save(state, tmp_path / checkpoint.NAME)

    changed = config.from_dict(cfg, ["train.lr=0.5"]).to_dict()
    with pytest.raises(TrainingError, match=r"train\.lr: 0\.0001 there, 0\.5 now"):
        fit(Line(), LineFeed(Line()), FitSettings(lr=0.1, max_epochs=3), torch.device("cpu"), run_dir=tmp_path,
            resume_key=changed, differences=resume_differences, resume=True)
    model = Line()
    summary = fit(model, LineFeed(model), FitSettings(lr=0.1, max_epochs=3), torch.device("cpu"), run_dir=tmp_path,
                  resume_key=cfg, differences=resume_differences, resume=True)
    assert [h["epoch"] for h in summary["history"]] == [3]
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 3
