import pytest

from adalayers import config
from adalayers.errors import ConfigError


def test_repo_configs_load():
    from conftest import ROOT
    from adalayers.lab.multitask import config as multitask_config
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        (multitask_config if path.stem.startswith("multitask") else config).load(path)


def test_overrides_are_typed():
    cfg = config.from_dict({}, ["train.lr=3e-4", "mixer.positional=false", "mixer.pin_layer=2", "model.base=x"])
    assert cfg.train.lr == 3e-4 and cfg.mixer.positional is False and cfg.mixer.pin_layer == 2
    assert isinstance(cfg.train.lr, float)


def test_every_problem_is_listed_at_once():
    with pytest.raises(ConfigError) as e:
        config.from_dict({"train": {"lr": "fast", "bogus": 1}, "mixer": {"k": 0}, "nope": {}})
    msg = str(e.value)
    assert "train.lr: expected float" in msg
    assert "train.bogus: unknown field" in msg
    assert "nope: unknown field" in msg
    assert "mixer.k: must be at least 1" in msg  # value checks in the same pass as type errors


def test_value_checks_skip_fields_with_type_errors():
    with pytest.raises(ConfigError) as e:
        config.from_dict({"mixer": {"k": "big"}, "head": {"num_heads": 5}, "model": {"max_length": 2}})
    msg = str(e.value)
    assert "mixer.k: expected int" in msg and "model.max_length: must be at least 8" in msg
    assert "must divide mixer.k" not in msg  # mixer.k holds its default, so no check speaks of it


def test_values_are_checked():
    with pytest.raises(ConfigError, match="mixer.k: must be at least 1"):
        config.from_dict({"mixer": {"k": 0}})
    with pytest.raises(ConfigError, match="head.num_heads: must divide mixer.k"):
        config.from_dict({"mixer": {"k": 10}, "head": {"num_heads": 3}})
    with pytest.raises(ConfigError, match="head.kind"):
        config.from_dict({"head": {"kind": "tokens"}})


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match="train: expected a mapping"):
        config.from_dict({"train": 5})


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected section.field=value"):
        config.from_dict({}, ["lr=3"])


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)


def test_differences_read_a_stored_config_with_this_versions_defaults():
    """What resume, tune and sweep compare: a field added since an old config was stored is no difference."""
    from adalayers import config

    new = config.from_dict({"train": {"lr": 0.01}}).to_dict()
    old = config.from_dict({"train": {"lr": 0.01}}).to_dict()
    del old["head"]["pooling"], old["cache"]
    assert config.differences(old, new) == []
    old["train"]["lr"] = 0.02
    old["tune"]["seed"] = 5
    assert config.differences(old, new, {"tune": None}) == ["train.lr: 0.02 there, 0.01 now"]
    assert config.differences(old, new) == ["train.lr: 0.02 there, 0.01 now", "tune.seed: 5 there, 0 now"]


def test_differences_compare_data_paths_as_places(tmp_path, monkeypatch):
    """A run trained with --set task.data_dir=/abs/data is the same as one with the config's ../data."""
    from adalayers import config

    (tmp_path / "data").mkdir()
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    here = config.from_dict({"task": {"data_dir": "../data", "train": "../data/a.csv"}}).to_dict()
    there = config.from_dict({"task": {"data_dir": str(tmp_path / "data"),
                                       "train": str(tmp_path / "data" / "a.csv")}}).to_dict()
    assert config.differences(there, here) == []
    elsewhere = config.from_dict({"task": {"data_dir": str(tmp_path / "other"),
                                           "train": str(tmp_path / "data" / "b.csv")}}).to_dict()
    assert config.differences(elsewhere, here) == [
        f"task.data_dir: {str(tmp_path / 'other')!r} there, '../data' now",
        f"task.files.train: {str(tmp_path / 'data' / 'b.csv')!r} there, '../data/a.csv' now"]


@pytest.mark.parametrize("values, message", [
    ({"max_batch": 0}, "--max-batch: must be at least 1, got 0"),
    ({"read_timeout_s": 0}, "--read-timeout: must be more than 0, got 0"),
    ({"max_wait_ms": -1}, "--max-wait-ms: must be at least 0, got -1"),
    ({"num_threads": 0}, "--threads: must be at least 1, got 0"),
    ({"device": "tpu"}, "--device: Input should be 'auto', 'cpu' or 'cuda', got 'tpu'"),
])
def test_serve_config_is_validated_by_its_declaration(values, message):
    from adalayers.serve.config import ServeConfig

    with pytest.raises(ConfigError) as e:
        ServeConfig(**values)
    assert str(e.value) == message
    cfg = ServeConfig(max_batch=4)
    with pytest.raises(ConfigError, match="--max-queue: must be at least 1"):
        cfg.max_queue = 0
    assert ServeConfig(**cfg.model_dump()) == cfg  # what a Ray Serve replica is built from


def test_serve_flag_errors_are_one_line(capsys):
    from adalayers import cli

    assert cli.main(["serve", "--heads", "nowhere", "--max-batch-tokens", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-batch-tokens: must be at least 1, got 0"


def test_the_old_name_epochs_is_refused_with_its_new_name():
    """max_epochs is declared once (config.OptimSettings) for run and multi-task configs alike."""
    from adalayers.lab.multitask.config import from_dict as multitask_config
    from adalayers.lab.multitask.config import stored

    with pytest.raises(ConfigError, match=r"train\.epochs: renamed to train\.max_epochs; rename it in your config"):
        config.from_dict({"train": {"epochs": 3}})
    with pytest.raises(ConfigError, match=r"- epochs: renamed to max_epochs; rename it in your config"):
        multitask_config({"tasks": [{"name": "sst5"}], "epochs": 3})
    assert multitask_config({"tasks": [{"name": "sst5"}], "max_epochs": 3}).max_epochs == 3
    assert stored({"epochs": 3, "lr": 1e-3}) == {"max_epochs": 3, "lr": 1e-3}  # results stored before the rename


def test_a_set_typo_names_the_flag_and_the_closest_field(tmp_path):
    from conftest import ROOT

    with pytest.raises(ConfigError) as e:
        config.load(ROOT / "configs" / "cola.yaml", ["train.lrr=1e-3"])
    assert str(e.value) == "--set train.lrr=1e-3: no field train.lrr; did you mean train.lr?"  # not cola.yaml's
    with pytest.raises(ConfigError, match=r"--set trian.lr=1: no field trian.lr; did you mean train.lr\?"):
        config.from_dict({}, ["trian.lr=1"])
    with pytest.raises(ConfigError, match="--set train.epochs=3: train.epochs is renamed to train.max_epochs"):
        config.load(None, ["train.epochs=3"])
    with pytest.raises(ConfigError) as e:
        config.load(None, ["mixer.kk=3", "head.num_head=2", "train.zzzzzz=1"])
    assert "did you mean mixer.k?" in str(e.value) and "did you mean head.num_heads?" in str(e.value)
    assert "--set train.zzzzzz=1: no field train.zzzzzz" in str(e.value)
    cfg = config.load(None, ["task.options.lowercase=true", "tune.space.train.lr=[0.001]"])  # inside mappings
    assert cfg.task.options == {"lowercase": True} and cfg.tune.space == {"train": {"lr": [0.001]}}
    with pytest.raises(ConfigError, match=r"train.lrr: unknown field; did you mean train.lr\?"):  # in a file
        config.from_dict({"train": {"lrr": 1}})
