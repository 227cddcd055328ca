"""The run config as one pydantic tree: task-file options in task.files (flat spellings still read), one
declaration of the learning rate, and every bad value one line naming its field."""
import json
import typing

import pytest

from adalayers import config
from adalayers.errors import ConfigError

# config.json's "config" as adalayers wrote it before task.files existed (the options of your own files flat in task)
OLD_FLAT = json.loads("""{"task": {"name": "files", "data_dir": "../shared/data", "train": "data/train.csv",
 "validation": null, "test": null, "format": null, "kind": null, "text": "review", "text_pair": null,
 "label": "sentiment", "header": null, "label_names": {"0": "neg", "1": "pos"}, "tag_scheme": "iob2",
 "metric": null, "positive_label": null, "validation_fraction": 0.1, "split_seed": 42, "max_train_examples": null,
 "skip_bad_rows": false, "max_eval_examples": null, "options": {}, "template": null, "add_generation_prompt": true},
 "model": {"base": "minilm-l6", "max_length": null, "states": "encoder"},
 "mixer": {"k": 64, "alpha": 64.0, "entropy_lambda": 0.0, "cutoff": 0.01, "dropout": 0.03,
 "projection_dropout": false, "gelu_after_sum": false, "positional": true, "pin_layer": null},
 "head": {"kind": null, "num_heads": 8, "encoder_layers": 1, "dim_feedforward": 2048, "dropout": 0.03,
 "pooling": "mean", "skip_bos": null, "attention_dropout": null, "target_mean": null, "target_std": null},
 "train": {"lr": 0.0001, "weight_decay": 0.0, "batch_size": 32, "eval_batch_size": 128, "max_epochs": 30,
 "grad_clip": 1.0, "seed": 0, "precision": "auto", "lr_patience": 3, "early_stopping": 8, "max_minutes": null,
 "device": "auto", "num_threads": null, "head_precision": null, "tensorboard": false},
 "cache": {"enabled": true, "max_gb": 20.0, "dir": null, "shard_mb": 256.0},
 "tune": {"space": {}, "max_epochs": null, "seed": 0, "startup_trials": 5, "warmup_epochs": 2}}""")


def test_a_run_config_written_before_task_files_loads(tmp_path):
    from adalayers.store import run as runlib

    meta = {"config": OLD_FLAT, "data": {"data_dir": str(tmp_path), "train": str(tmp_path / "train.csv")}}
    cfg = runlib.run_config(tmp_path, meta)
    assert cfg.task.files.train == str(tmp_path / "train.csv") and cfg.task.data_dir == str(tmp_path)
    assert cfg.task.files.label_names == {"0": "neg", "1": "pos"} and cfg.task.files.text == "review"
    new = config.from_dict(OLD_FLAT).to_dict()
    assert "train" not in new["task"] and new["task"]["files"]["label"] == "sentiment"
    assert config.differences(OLD_FLAT, new) == []  # resume, sweep and tune see the same settings
    assert config.from_dict(new) == config.from_dict(OLD_FLAT)


def test_flat_and_nested_file_options_are_one_setting():
    nested = config.from_dict({"task": {"files": {"train": "a.csv", "text": "review"}}})
    flat = config.from_dict({"task": {"train": "a.csv", "text": "review"}})
    by_set = config.load(None, ["task.train=a.csv", "task.files.text=review"])
    assert nested == flat == by_set and nested.task.name == "files"  # giving a training file picks task files
    changed = config.from_dict(nested.to_dict(), ["task.text=sentence"])  # --set over a stored (nested) config
    assert changed.task.files.text == "sentence" and changed.task.files.train == "a.csv"


@pytest.mark.parametrize("data, line", [
    ({"train": {"lr": "fast"}}, "train.lr: expected float, got 'fast'"),
    ({"train": {"lr": 0}}, "train.lr: must be positive, got 0"),
    ({"train": {"batch_size": True}}, "train.batch_size: expected int, got True"),
    ({"train": {"precision": "fp8"}}, "train.precision: must be one of auto, fp32, bf16, fp16, got 'fp8'"),
    ({"mixer": {"dropout": 1.5}}, "mixer.dropout: must be in [0, 1), got 1.5"),
    ({"mixer": {"alpha": float("inf")}}, "mixer.alpha: must be a finite number, got inf"),
    ({"head": {"pooling": "sum"}}, "head.pooling: must be one of mean, max, first, last, got 'sum'"),
    ({"model": {"states": "both"}}, "model.states: must be encoder or decoder, got 'both'"),
    ({"task": {"train": "a.csv", "kind": "tags"}}, "task.files.kind: must be classification, regression or tokens, "
                                                   "got 'tags'"),
    ({"task": {"name": "cola", "label": 2}}, "task.files.label: only read by task 'files' (your own data), "
                                             "but task.name is 'cola'"),
    ({"task": {"files": {"trian": "a.csv"}}}, "task.files.trian: unknown field; did you mean task.files.train?"),
    ({"cache": []}, "cache: expected a mapping, got list"),
])
def test_every_bad_value_is_one_line_naming_its_field(data, line):
    with pytest.raises(ConfigError) as e:
        config.from_dict(data)
    lines = str(e.value).splitlines()
    assert lines[0] == "invalid config:" and len(lines) == 2 and lines[1].startswith(f"  - {line}")


def test_one_learning_rate_declaration():
    """train.lr, the multi-task config's lr and head_lr share config.LR: its check and its help."""
    from adalayers.lab.multitask.config import MultitaskConfig, from_dict as multitask

    assert MultitaskConfig.model_fields["lr"].description == config.TrainConfig.model_fields["lr"].description
    assert MultitaskConfig().lr == 3e-5 and config.TrainConfig().lr == 1e-4  # each its own default
    with pytest.raises(ConfigError) as e:
        multitask({"tasks": [{"name": "sst5"}], "lr": -1, "head_lr": 0})
    assert "- lr: must be positive, got -1" in str(e.value) and "- head_lr: must be positive, got 0" in str(e.value)


def test_settings_build_checks_a_dataclass_strictly():
    """A lab strategy's settings (a Section of the same tree) go through the same checks as the run config."""
    from adalayers.lab.strategies import make

    with pytest.raises(ConfigError) as e:
        make("finetune", ["dropout=x", "top=3"])
    msg = str(e.value)
    assert "dropout: expected float, got 'x'" in msg and "top: unknown field" in msg
    assert make("finetune", ["lr=5e-5"]).conf.lr == 5e-5  # YAML 1.1 reads 5e-5 as a string; a float field takes it


def test_a_checked_optional_float_takes_yaml_exponents_and_names_its_type():
    """`Fraction | None` and `LR | None` (checked types in a union) read '1e-1' as a float, as a bare float does,
    and a bad value names the type, not its checks."""
    assert config.load(None, ["head.attention_dropout=1e-1"]).head.attention_dropout == 0.1
    with pytest.raises(ConfigError, match=r"head.attention_dropout: expected float \| None, got 'x'$"):
        config.load(None, ["head.attention_dropout=x"])


def test_the_strategies_share_the_run_configs_lr_declaration():
    """One lr: every strategy's lr is the run config's LR type (its check), or None for train.lr; each strategy
    keeps its own default."""
    from adalayers.lab.strategies import STRATEGIES, make

    for name, cls in STRATEGIES.items():
        field = cls.Config.model_fields.get("lr")
        if field is not None:
            assert typing.get_args(field.annotation) == (config.LR, type(None)), name
    assert [make(s).conf.lr for s in ("scalar-mix", "concat", "finetune", "finetune-top:3", "adapters")] == \
        [None, 1e-3, 3e-5, 5e-5, 3e-4]


def test_a_set_typo_of_a_file_option_names_the_closest_spelling():
    with pytest.raises(ConfigError, match=r"^--set task.formt=csv: no field task.formt; did you mean task.format\?$"):
        config.load(None, ["task.formt=csv"])
    with pytest.raises(ConfigError, match=r"did you mean task.files.format\?$"):
        config.load(None, ["task.files.formt=csv"])
