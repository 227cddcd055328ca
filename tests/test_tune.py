"""`adalayers tune` on a random 2-layer BERT: a study that persists, resumes and reproduces its best trial."""
import json

import pytest
from tinymodels import imdb_tarball, tiny_bert, tiny_config

from adalayers import cli, config
from adalayers.recipes import service
from adalayers.errors import AdaLayersError, ConfigError
from adalayers.lab.tune import search, space


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    model = tiny_bert(root / "model")
    imdb_tarball(root / "data", per_class=12, test_per_class=6)
    return model, root / "data"


def _cfg(world, **tune):
    model, data = world
    return tiny_config(model, data, "imdb", model={"max_length": 12}, cache={"enabled": True},
                       tune={"max_epochs": 2, **tune})


def test_tune_resumes_without_redoing_trials_and_the_best_config_reproduces(world, tmp_path, monkeypatch):
    out = tmp_path / "study"
    cfg = _cfg(world)
    calls = []
    real_train = service.train

    def interrupted_third(cfg, run_dir, **kw):
        calls.append(run_dir.name)
        if len(calls) == 3:  # Ctrl-C in the third trial's first epoch
            def stop(epoch, metric):
                raise KeyboardInterrupt
            kw["on_epoch"] = stop
        return real_train(cfg, run_dir, **kw)

    monkeypatch.setattr(service, "train", interrupted_third)
    with pytest.raises(KeyboardInterrupt):
        search.tune(cfg, out, trials=3)
    assert (out / "study.db").is_file() and calls == ["trial_000", "trial_001", "trial_002"]
    assert not (out / "best").exists()  # nothing is scored on test before the search ends
    kept = {n: (out / "trials" / n / "head.safetensors").stat().st_mtime_ns for n in calls[:2]
            if (out / "trials" / n / "head.safetensors").is_file()}

    calls.clear()
    summary = search.tune(cfg, out, trials=3)
    # only the interrupted trial ran again, with its settings; the two finished ones were not touched
    assert calls == ["trial_003"]
    assert {n: (out / "trials" / n / "head.safetensors").stat().st_mtime_ns for n in kept} == kept
    rows = json.loads((out / "trials.json").read_text())
    assert [r["state"] for r in rows] == ["complete", "complete", "fail", "complete"]
    assert rows[3]["retry_of"] == 2 and rows[3]["params"] == rows[2]["params"]
    assert summary["trials"] == {"complete": 3, "fail": 1}
    assert all(r["epochs"] == 2 for r in rows if r["state"] == "complete")  # the pruner heard every epoch

    # the test split was scored once, by the best trial only
    best = summary["best"]["trial"]
    assert best == max((r for r in rows if r["value"] is not None), key=lambda r: (r["value"], -r["number"]))["number"]
    for r in rows:
        m = out / r["run"] / "metrics.json"
        assert not m.is_file() or "test" not in json.loads(m.read_text())
    best_metrics = json.loads((out / "best" / "metrics.json").read_text())
    assert best_metrics["trial"] == best and best_metrics["test"]["n"] == 12
    for name in ("trials.md", "tune.json", "best_config.yaml", "optimization_history.png", "param_importances.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 100, name

    # a third call finds the study complete: nothing trains, nothing is scored again
    calls.clear()
    before = (out / "best" / "metrics.json").stat().st_mtime_ns
    search.tune(cfg, out, trials=3)
    assert calls == [] and (out / "best" / "metrics.json").stat().st_mtime_ns == before

    # the best config, trained from scratch, gives its trial's validation metric
    monkeypatch.setattr(service, "train", real_train)
    best_cfg = config.load(out / "best_config.yaml")
    for name, value in rows[best]["params"].items():
        section, field = name.split(".")
        assert getattr(getattr(best_cfg, section), field) == value
    again = service.train(best_cfg, tmp_path / "again")
    assert again["validation"]["accuracy"] == pytest.approx(summary["best"]["validation"], abs=1e-9)


def test_tune_cli_and_another_config_in_the_same_folder(world, tmp_path, capsys):
    model, data = world
    out = tmp_path / "s"
    args = ["tune", "--trials", "2", "--out", str(out), "--set", f"model.base={model}",
            "--set", f"task.data_dir={data}", "--set", "task.name=imdb", "--set", "model.max_length=12",
            "--set", "train.device=cpu", "--set", "train.batch_size=8", "--set", "tune.max_epochs=1",
            "--set", "tune.space={mixer.k: [16], head.num_heads: [2], mixer.entropy_lambda: null}"]
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("head: {kind: sequence}\n")
    assert cli.main([args[0], str(cfg_file), *args[1:]]) == 0
    printed = capsys.readouterr().out
    assert "| trial | state | validation accuracy |" in printed and "best config:" in printed
    rows = json.loads((out / "trials.json").read_text())
    assert len(rows) == 2 and all(r["params"]["mixer.k"] == 16 for r in rows)
    assert all("mixer.entropy_lambda" not in r["params"] for r in rows)
    # the same folder with another config is refused in one line
    assert cli.main([args[0], str(cfg_file), *args[1:], "--set", "model.max_length=10"]) == 2
    assert "holds a study of another config" in capsys.readouterr().err


def test_workers_share_one_study_and_stop_at_the_count(world, tmp_path):
    """Three processes on one study: five trials in all (not three each), each with its own settings and
    run folder, and a second call with more trials continues the same study."""
    out = tmp_path / "w"
    cfg = _cfg(world, max_epochs=1, startup_trials=10)  # every trial a random start-up one
    summary = search.tune(cfg, out, trials=5, workers=3)
    rows = json.loads((out / "trials.json").read_text())
    assert [r["number"] for r in rows] == [0, 1, 2, 3, 4] and summary["trials"] == {"complete": 5}
    assert len({json.dumps(r["params"], sort_keys=True) for r in rows}) == 5  # the workers' samplers differ
    assert all((out / r["run"] / "head.safetensors").is_file() for r in rows)
    assert (out / "best" / "metrics.json").is_file()
    search.tune(cfg, out, trials=6, workers=2)  # one more trial is wanted: one worker runs it, none overshoots
    assert len(json.loads((out / "trials.json").read_text())) == 6
    with pytest.raises(ConfigError, match="--workers: must be at least 1"):
        search.tune(cfg, out, trials=6, workers=0)


def test_settings_the_model_refuses_fail_their_trials_and_end_the_call(world, tmp_path, monkeypatch):
    """A trial whose settings the model refuses (ConfigError) fails and counts as an attempt: the call ends
    after `trials` attempts instead of asking forever, and says that no trial finished."""
    calls = []

    def refuse(cfg, run_dir, **kw):
        calls.append(run_dir.name)
        raise ConfigError("head.num_heads: must divide mixer.k")

    monkeypatch.setattr(service, "train", refuse)
    with pytest.raises(AdaLayersError, match="no trial finished yet"):
        search.tune(_cfg(world), tmp_path / "r", trials=2)
    assert calls == ["trial_000", "trial_001"]


@pytest.mark.parametrize("spec, message", [
    ({"model.max_length": [8, 16]}, "only mixer.*, head.* and train.*"),
    ({"mixer.nope": [1]}, "mixer has no field 'nope'"),
    ({"train.lr": {"low": 1e-3, "high": 1e-4}}, "low must be a number below high"),
    ({"train.lr": {"low": 0, "high": 1e-3, "log": True}}, "a log range needs low > 0"),
    ({"train.lr": {"lo": 0, "hi": 1}}, "a range is {low: L, high: H}"),
    ({"head.num_heads": []}, "an empty list of choices"),
])
def test_a_bad_search_space_is_one_line(world, tmp_path, spec, message):
    cfg = _cfg(world, space=spec)
    with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("{", r"\{")):
        search.tune(cfg, tmp_path / "bad", trials=1)
    assert not (tmp_path / "bad" / "study.db").exists()


def test_space_defaults_follow_the_head():
    seq = config.from_dict({"head": {"kind": "sequence"}})
    tok = config.from_dict({"head": {"kind": "token"}})
    seq_names = {p.name for p in space.build(seq)[0]}
    tok_names = {p.name for p in space.build(tok)[0]}
    assert "head.pooling" in seq_names and "head.dim_feedforward" not in seq_names
    assert {"head.encoder_layers", "head.dim_feedforward"} <= tok_names and "head.pooling" not in tok_names
    ints = space.parse("head.encoder_layers", {"low": 1, "high": 3})
    assert ints.integer and not space.parse("train.lr", {"low": 1e-4, "high": 1e-2, "log": True}).integer
