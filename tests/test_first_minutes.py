"""What a new user meets in the first minutes: a head that learned nothing or was judged on a handful of
rows says so, a small file gets defaults that fit it, a failed train leaves no empty folder, an unfinished
run says so when asked, serve finds the base in the run folders, loading a base prints no bars, and
training shows the epoch count and the time left."""
from __future__ import annotations

import json
import logging
import random

import pytest

from adalayers import cli
from adalayers import config
from adalayers.recipes import health
from adalayers.data.tasks import shortcut
from adalayers.errors import DataError, ModelError

from conftest import tiny_backbone
from runs_util import make_run


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from tinymodels import tiny_bert

    return tiny_bert(tmp_path_factory.mktemp("tiny") / "tiny-bert")


def _csv(path, rows: list[tuple[str, str]]):
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows), encoding="utf-8")
    return path


def _cfg(base, train_file, **train):
    return config.from_dict({"task": {"train": str(train_file)}, "model": {"base": str(base), "max_length": 16},
                             "mixer": {"k": 8}, "head": {"num_heads": 2},
                             "train": {"max_epochs": 2, "batch_size": 16, "num_threads": 1, "device": "cpu",
                                       **train},
                             "cache": {"enabled": False}})


def _varied(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = "the a movie film plot actor scene story it was is quite".split()
    return [(" ".join(rng.sample(words, 4) + ["great" if i % 2 else "awful"]), "pos" if i % 2 else "neg")
            for i in range(n)]


def test_a_head_that_answers_one_class_says_so_with_what_to_try(base, tmp_path, caplog):
    from adalayers.recipes import service

    rows = [("the same sentence every time", "pos" if i % 3 else "neg") for i in range(320)]  # no signal at all
    with caplog.at_level(logging.WARNING, logger="adalayers"):
        metrics = service.train(_cfg(base, _csv(tmp_path / "same.csv", rows), lr=1e-4), tmp_path / "run")
    assert metrics["validation"]["n"] == 32
    warned = [r.getMessage() for r in caplog.records if "learned no more than a constant" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert "for all 32 validation rows" in warned[0] and "--set train.lr=0.001; it was 0.0001" in warned[0]
    assert "--set train.max_epochs=20; it ran 2" in warned[0]
    assert not [r for r in caplog.records if "only" in r.getMessage()]  # 32 rows: no tiny-validation warning


def test_a_head_that_learned_gives_no_warning(base, tmp_path, caplog):
    from adalayers.recipes import service

    with caplog.at_level(logging.WARNING, logger="adalayers"):
        metrics = service.train(_cfg(base, _csv(tmp_path / "v.csv", _varied(400)), lr=1e-2, max_epochs=3),
                                tmp_path / "run")
    assert metrics["validation"]["accuracy"] > 0.6
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_tiny_file_gets_small_data_defaults_and_a_tiny_validation_warning(base, tmp_path, capsys):
    data = _csv(tmp_path / "tiny.csv", _varied(40))
    args = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--set", f"model.base={base}",
            "--set", "mixer.k=8", "--set", "head.num_heads=2", "--set", "cache.enabled=false",
            "--set", "train.num_threads=1", "--set", "train.device=cpu"]
    assert cli.main(args + ["--set", "train.max_minutes=1e-6"]) == 0  # one epoch: the defaults are what counts
    err = capsys.readouterr().err
    small = [line for line in err.splitlines() if line.startswith("small data set")]
    assert small == ["small data set: 36 training rows of about 8 tokens give 306 tokens an epoch (the defaults are "
                     "made for 768,000 in all), so train.lr 0.001 (not 0.0001), train.max_epochs 200 (not 40), "
                     "train.early_stopping 50 (not 10); --set them to choose"]
    assert "the validation set has only 4 rows" in err and "--set task.validation_fraction" in err
    used = json.loads((tmp_path / "run" / "config.json").read_text())["config"]["train"]
    assert used["lr"] == 1e-3 and used["max_epochs"] == 200 and used["early_stopping"] == 50
    # --set train.lr chooses: no small-data defaults then
    assert cli.main(args[:4] + [str(tmp_path / "run2"), *args[5:], "--set", "train.lr=5e-4",
                                "--set", "train.max_epochs=2"]) == 0
    assert "small data set" not in capsys.readouterr().err


def test_few_step_defaults_leave_enough_steps_alone():
    train = {"lr": 1e-4, "max_epochs": 40, "early_stopping": 10, "batch_size": 32}
    assert shortcut.few_step_defaults(dict(train), 7_695) is None  # CoLA: 241 steps an epoch
    small = dict(train)
    assert "train.max_epochs 119" in shortcut.few_step_defaults(small, 540)  # 540 rows of CoLA's 12 tokens
    assert small == {"lr": 1e-3, "max_epochs": 119, "early_stopping": 29, "batch_size": 32}
    # the work is counted in tokens: 1,000 texts of 80 tokens need 10 epochs, not 2,000 steps' 63
    long = dict(train)
    assert "train.max_epochs 40" not in (shortcut.few_step_defaults(long, 1_000, 80.0) or "")
    assert long["max_epochs"] == 40  # 80,000 tokens an epoch x 40 epochs: enough already
    short = {**train, "max_epochs": 5}
    shortcut.few_step_defaults(short, 1_000, 80.0)
    assert short["max_epochs"] == 10


def test_one_answer_for_every_kind():
    assert health.one_answer("sequence", ["a", "b"], [(1, [0.4, 0.6])] * 3) == "'b'"
    assert health.one_answer("sequence", ["a", "b"], [(1, [0.4, 0.6]), (0, [0.6, 0.4])]) is None
    assert health.one_answer("regression", [], [2.5, 2.5]) == "2.5"
    assert health.one_answer("regression", [], [2.5, 2.6]) is None
    assert health.one_answer("token", [], [["O", "O"], ["O"]]) == "the tag 'O'"
    assert health.one_answer("token", [], [["O", "B-PER"]]) is None


def test_a_failed_train_leaves_no_empty_run_folder(base, tmp_path, capsys):
    from adalayers.recipes import service

    cfg = _cfg(base, tmp_path / "missing.csv")
    with pytest.raises(DataError, match="missing.csv"):
        service.train(cfg, tmp_path / "runs" / "new")
    assert not (tmp_path / "runs" / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder the user made is theirs: kept
    with pytest.raises(DataError):
        service.train(cfg, tmp_path / "mine")
    assert (tmp_path / "mine").is_dir()
    bad = tmp_path / "cfg.yaml"
    bad.write_text(f"task: {{name: cola, data_dir: {tmp_path / 'nodata'}}}\nmodel: {{base: '{base}'}}\n")
    assert cli.main(["train", str(bad), "--out", str(tmp_path / "cli_run")]) == 2
    assert "data file not found" in capsys.readouterr().err and not (tmp_path / "cli_run").exists()


def test_predict_on_an_unfinished_run_says_so(base, tmp_path, capsys):
    from adalayers.model.backbone import Backbone

    run = make_run(tmp_path / "acc", Backbone.load(str(base)), "sequence", ["bad", "good"], seed=3)
    assert cli.main(["predict", str(run), "a good movie"]) == 0
    assert "unfinished" not in capsys.readouterr().err  # no resume.pt: as a finished run
    (run / "resume.pt").write_bytes(b"training goes on")
    (run / "log.jsonl").write_text("".join(json.dumps({"epoch": e, "best": e == 2}) + "\n" for e in (1, 2, 3)))
    assert cli.main(["predict", str(run), "a good movie"]) == 0
    out = capsys.readouterr()
    assert out.out.count("\n") == 1  # the prediction is still given
    assert out.err.strip() == (f"{run} is unfinished (still training, or stopped: continue it with 'adalayers "
                               f"train ... --resume'): its head is the best epoch so far (epoch 2 of 3 done)")
    (run / "metrics.json").write_text("{}")
    assert cli.main(["predict", str(run), "a good movie"]) == 0
    assert "unfinished" not in capsys.readouterr().err


def test_serve_takes_the_base_from_the_run_folders(tmp_path, tokenizer):
    from adalayers.infer.sidetasks import SideTasks, heads_base
    from adalayers.store.head_spec import parse_heads

    one, two = tiny_backbone("bert", tokenizer), tiny_backbone("roberta", tokenizer)
    a = make_run(tmp_path / "a", one, "sequence", ["bad", "good"], seed=1)
    b = make_run(tmp_path / "b", one, "sequence", ["x", "y"], seed=2)
    c = make_run(tmp_path / "c", two, "sequence", ["bad", "good"], seed=3)
    # heads_base takes heads parsed at the edge (HeadSpec); SideTasks.load parses them
    assert heads_base(parse_heads([a, f"named={b}"])) == "tiny-bert"
    with pytest.raises(ModelError) as e:
        heads_base(parse_heads([a, c]))
    assert str(e.value) == (f"the heads were trained on different bases ({a}: tiny-bert, {c}: tiny-roberta); serve "
                            f"the heads of one base together, or choose the base with --base")
    with pytest.raises(ModelError, match="--base"):
        SideTasks.load(None, [a, c])


def test_serve_without_base_loads_the_heads_base(base, tmp_path):
    from adalayers.model.backbone import Backbone
    from adalayers.infer.sidetasks import SideTasks

    run = make_run(tmp_path / "acc", Backbone.load(str(base)), "sequence", ["bad", "good"], seed=3)
    side = SideTasks.load(None, [run])
    assert side.backbone.name == str(base) and side.names == ["acc"]


def test_loading_a_base_from_python_prints_no_bars(base, capfd):
    from transformers.utils import logging as hf_logging

    from adalayers.model.backbone import Backbone

    hf_logging.enable_progress_bar()  # as in a fresh Python session
    Backbone.load(str(base))
    assert "Loading" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # switched back on afterwards


def test_training_shows_the_epoch_count_and_the_time_left(base, tmp_path, caplog):
    from adalayers.recipes import service
    from adalayers.engine.loop import time_left

    assert time_left([20.0, 4.0, 5.0, 100.0, 5.0], 36) == "  ~3m00s left at most"  # the median: one slow epoch is no trend
    assert time_left([10.0], 10, cap=30.0) == "  ~0m30s left at most"  # train.max_minutes leaves 30 s
    assert time_left([500.0, 10.0], 8) == "  ~1m20s left at most"  # the first epoch also built the cache
    assert time_left([500.0], 9) == "  ~1h15m left at most"  # until a second epoch says otherwise
    assert time_left([30.0], 200) == "  ~1h40m left at most" and time_left([3.0], 0) == ""
    with caplog.at_level(logging.INFO, logger="adalayers"):
        service.train(_cfg(base, _csv(tmp_path / "v.csv", _varied(100)), lr=1e-2, max_epochs=3, early_stopping=9),
                      tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all("left at most" in line for line in lines[:2]) and "left" not in lines[2]


def test_gguf_conversion_draws_adalayers_bar_not_transformers(capfd):
    pytest.importorskip("gguf")
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    from adalayers.model.gguf_models import _own_bar

    original = gguf_utils.tqdm
    with _own_bar():  # what the conversion loop of transformers calls, with its own description
        items = list(gguf_utils.tqdm([1, 2, 3], desc="Converting and de-quantizing GGUF tensors..."))
    assert items == [1, 2, 3] and gguf_utils.tqdm is original
    err = capfd.readouterr().err
    assert "de-quantizing" not in err and (err == "" or "converting the GGUF tensors (once)" in err)


def test_predict_files_without_base_takes_the_heads_base(base, tmp_path, capsys):
    from adalayers.model.backbone import Backbone

    run = make_run(tmp_path / "acc", Backbone.load(str(base)), "sequence", ["bad", "good"], seed=3)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                               for i, t in enumerate(["a good movie", "a bad one"])))
    assert cli.main(["predict-files", "--heads", str(run), "--input", str(tmp_path / "in.jsonl"),
                     "--output", str(tmp_path / "out"), "--format", "jsonl"]) == 0
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["job"]["base"] == str(base)


def test_many_classes_get_epochs_enough_for_early_stopping_to_end_training(tmp_path, caplog):
    """--data with 12 classes of 200 rows: not small data (2,160 rows of ~15 tokens x 40 epochs >= 768,000
    tokens), but many classes,
    so max_epochs 100 and a log line saying so; with 2 classes the closest config's settings stay; both say
    which settings they took."""
    import csv
    import logging

    train = {"lr": 1e-4, "max_epochs": 40, "early_stopping": 10, "batch_size": 32}
    assert shortcut.many_class_defaults(dict(train), 2) is None and shortcut.many_class_defaults(dict(train), None) is None
    for classes, epochs in ((12, 100), (2, 40)):
        path = tmp_path / f"c{classes}.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for i in range(2_400):
                w.writerow([f"text number {i} of a row with a few more words", f"class_{i % classes}"])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="adalayers.data.tasks.shortcut"):
            cfg = shortcut.shortcut_config(None, {"train": str(path)}, [])
        assert cfg.train.max_epochs == epochs and cfg.train.lr == 1e-4
        lines = [r.getMessage() for r in caplog.records]
        assert any(line.startswith(f"training settings: lr 0.0001, batch 32 (68 steps an epoch over 2,160 training "
                                   f"rows, {classes} classes), max_epochs {epochs}, early_stopping 10")
                   for line in lines), lines
        assert any("12 classes: train.max_epochs 100 (not 40)" in line for line in lines) == (classes == 12)
    # --set chooses: nothing raised, and the line says what training will use (--set's values, not the file's)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="adalayers.data.tasks.shortcut"):
        cfg = shortcut.shortcut_config(None, {"train": str(tmp_path / "c12.csv")},
                                       ["train.max_epochs=30", "train.lr=1e-3", "task.max_train_examples=500"])
    assert (cfg.train.max_epochs, cfg.train.lr, cfg.task.max_train_examples) == (30, 1e-3, 500)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["training settings: lr 0.001, batch 32 (16 steps an epoch over 500 training rows, 12 classes), "
                     "max_epochs 30, early_stopping 10"], lines
