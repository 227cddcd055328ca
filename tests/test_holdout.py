"""mixer.holdout (adalayers.recipes.holdout): the layer weights learn only on held-out training rows, the
projections and the head only on the others; checked step by step against what each batch holds."""
import json

import pytest
import torch

from adalayers.config import Config
from adalayers.data.encoding import EncodedSplit, SplitFeed
from adalayers.engine.loop import FitSettings, adamw
from adalayers.errors import ConfigError
from adalayers.model.sidetask import SideTask
from adalayers.model.states import Fed
from adalayers.recipes.holdout import HeldOutMix, holdout_rows, interleave
from adalayers.recipes.train import MixSchedule


def test_the_held_out_rows_are_the_share_asked_disjoint_and_fixed_by_the_seed():
    kept, held = holdout_rows(100, 0.2, seed=3)
    assert len(held) == 20 and len(kept) == 80
    assert sorted(kept + held) == list(range(100))
    assert holdout_rows(100, 0.2, seed=3) == (kept, held)
    assert holdout_rows(100, 0.2, seed=4)[1] != held


@pytest.mark.parametrize("n,share", [(10, 0.01), (3, 0.9)])
def test_a_holdout_that_leaves_a_part_empty_is_a_one_line_error(n, share):
    with pytest.raises(ConfigError, match=r"^mixer.holdout: .* both the held-out and the kept part need at least "
                                          r"one row$"):
        holdout_rows(n, share, seed=0)


@pytest.mark.parametrize("train,mixing,expected", [
    (4, 2, "TTMTTM"), (3, 1, "TTTM"), (4, 4, "TMTMTMTM"), (2, 3, "TMTMM"), (3, 0, "TTT"), (0, 2, "MM"),
])
def test_mixing_steps_are_spread_evenly_between_the_training_steps(train, mixing, expected):
    assert "".join("T" if t else "M" for t in interleave(train, mixing)) == expected


def task_with(**mixer) -> SideTask:
    cfg = Config()
    cfg.mixer.k, cfg.mixer.cutoff, cfg.head.num_heads, cfg.train.lr = 8, 0.0, 2, 1e-3
    for key, value in mixer.items():
        setattr(cfg.mixer, key, value)
    return SideTask(cfg, 4, 12, ["a", "b"])


def feeds(task, n=20, share=0.25, batch_size=4, schedule=False, pace="epoch"):
    split = EncodedSplit("train", [{"input_ids": [1, 2, 3], "label": i % 2} for i in range(n)], n)
    kept, held = holdout_rows(n, share, seed=0)
    inner = SplitFeed(split, batch_size, 0, None, rows=kept)
    if schedule:
        inner = MixSchedule(inner, task, task.cfg.mixer)
    return HeldOutMix(inner, SplitFeed(split, batch_size, 0, None, rows=held), task, pace), kept, held


def run_epoch(task, feed, epoch, opt):
    """The engine's step on every batch the feed hands out; per batch (its rows, the parameters that moved)."""
    torch.manual_seed(epoch)
    out = []
    for batch in feed.epoch(epoch, torch.Generator().manual_seed(epoch)):
        rows = batch["index"].tolist()
        states = [torch.randn(len(rows), 3, 12) for _ in range(4)]
        before = {n: q.detach().clone() for n, q in task.named_parameters()}
        opt.zero_grad(set_to_none=True)
        task.loss(task(states, batch["attention_mask"]), batch["labels"]).backward()
        opt.step()
        out.append((rows, {n for n, q in task.named_parameters() if not torch.equal(q.detach(), before[n])}))
    return out


def test_the_logits_learn_only_on_held_out_rows_and_the_rest_only_on_the_kept_rows():
    task = task_with(holdout=0.25)
    feed, kept, held = feeds(task)
    assert feed.steps == 4 + 2
    opt = adamw(Fed(task, None).param_groups(), FitSettings(lr=1e-3, max_epochs=2), torch.device("cpu"))
    steps = run_epoch(task, feed, 1, opt)
    mixing = [(rows, moved) for rows, moved in steps if set(rows) <= set(held)]
    training = [(rows, moved) for rows, moved in steps if set(rows) <= set(kept)]
    assert len(mixing) == 2 and len(training) == 4 and len(steps) == 6
    assert sorted(r for rows, _ in mixing for r in rows) == held  # each held-out row once an epoch
    assert sorted(r for rows, _ in training for r in rows) == kept
    assert all(moved == {"mixer.p"} for _, moved in mixing)
    for _, moved in training:
        assert "mixer.p" not in moved and any(n.startswith("head.") for n in moved) \
            and any(n.startswith("mixer.proj.") for n in moved)
    assert task.mixer.p.requires_grad and all(q.requires_grad for q in task.trainable_parameters())  # restored


def test_an_epoch_whose_logits_are_frozen_has_no_mixing_steps_and_a_warm_up_epoch_no_training_steps():
    task = task_with(holdout=0.25, warmup_epochs=1, freeze_after=1)
    feed, kept, held = feeds(task, schedule=True)
    opt = adamw(Fed(task, None).param_groups(), FitSettings(lr=1e-3, max_epochs=2), torch.device("cpu"))
    first = run_epoch(task, feed, 1, opt)  # only p learns: held-out rows only
    assert len(first) == 2 and all(set(rows) <= set(held) and moved == {"mixer.p"} for rows, moved in first)
    second = run_epoch(task, feed, 2, opt)  # p frozen: kept rows only
    assert len(second) == 4 and all(set(rows) <= set(kept) and "mixer.p" not in moved for rows, moved in second)


def test_pace_step_follows_every_training_step_with_a_mixing_step_cycling_the_held_out_rows():
    task = task_with(holdout=0.25)
    feed, kept, held = feeds(task, pace="step")  # 15 kept rows: 4 batches; 5 held-out rows: 2 batches
    assert feed.steps == 8
    opt = adamw(Fed(task, None).param_groups(), FitSettings(lr=1e-3, max_epochs=2), torch.device("cpu"))
    steps = run_epoch(task, feed, 1, opt)
    kinds = ["M" if moved == {"mixer.p"} else "T" for _, moved in steps]
    assert kinds == list("TMTMTMTM")
    mixing_rows = [r for (rows, _), k in zip(steps, kinds) if k == "M" for r in rows]
    assert set(mixing_rows) == set(held) and len(mixing_rows) == 2 * len(held)  # the held-out rows twice over
    assert sorted(r for (rows, _), k in zip(steps, kinds) if k == "T" for r in rows) == kept


def test_an_unknown_pace_is_a_one_line_error():
    task = task_with(holdout=0.25)
    with pytest.raises(ConfigError, match="^mixer.holdout_pace: must be one of epoch, step, got 'often'$"):
        feeds(task, pace="often")
    from adalayers import config as config_mod
    with pytest.raises(ConfigError, match="mixer.holdout_pace"):
        config_mod.from_dict(Config().to_dict(), ["mixer.holdout_pace=often"])


def test_a_run_with_holdout_trains_and_its_layer_weights_move(tmp_path, monkeypatch):
    from adalayers.recipes import service
    from tinymodels import imdb_tarball, tiny_bert, tiny_config

    monkeypatch.delenv("ADALAYERS_DATA", raising=False)
    model = tiny_bert(tmp_path / "model")
    imdb_tarball(tmp_path / "data", per_class=12, test_per_class=6)
    cfg = tiny_config(model, tmp_path / "data", "imdb", mixer={"holdout": 0.25}, train={"max_epochs": 2})
    service.train(cfg, tmp_path / "run", resume=None)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and log[1]["layer_weights"] != log[0]["layer_weights"]
    start = [1 / len(log[0]["layer_weights"])] * len(log[0]["layer_weights"])
    assert log[0]["layer_weights"] != pytest.approx(start)
    assert (tmp_path / "run" / "metrics.json").is_file()
