"""Bad input gets the project's own errors with a clear message, never a deep traceback."""
import string

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from adalayers import config
from adalayers.recipes import service
from adalayers.errors import AdaLayersError, ConfigError, DataError
from adalayers.data.tasks import load_task


def cola_dir(tmp_path, train: bytes, dev: bytes = b"s\t1\t\tA fine sentence.\n"):
    folder = tmp_path / "glue" / "CoLA"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_bytes(train)
    (folder / "dev.tsv").write_bytes(dev)
    return config.from_dict({"task": {"name": "cola", "data_dir": str(tmp_path)}})


GOOD = b"".join(b"s\t%d\t\tSentence number %d.\n" % (i % 2, i) for i in range(40))


def test_wrong_column_count_names_file_and_line(tmp_path):
    cfg = cola_dir(tmp_path, GOOD + b"s\t1\tonly three\n")
    with pytest.raises(DataError, match=r"train.tsv:41: expected 4 tab-separated columns"):
        load_task(cfg)


def test_label_outside_the_label_set(tmp_path):
    cfg = cola_dir(tmp_path, GOOD + b"s\t7\t\tA sentence.\n")
    with pytest.raises(DataError, match=r"train.tsv:41: label must be 0 or 1, got '7'"):
        load_task(cfg)


def test_bytes_that_are_not_utf8(tmp_path):
    cfg = cola_dir(tmp_path, GOOD + b"s\t1\t\tCaf\xe9 au lait.\n")
    with pytest.raises(DataError, match=r"train.tsv:41: not valid UTF-8"):
        load_task(cfg)


def test_missing_data_folder(tmp_path):
    cfg = config.from_dict({"task": {"name": "cola", "data_dir": str(tmp_path / "nowhere")}})
    with pytest.raises(DataError, match="data file not found"):
        load_task(cfg)


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(ConfigError, match="unknown task 'colaa'.*cola"):
        load_task(config.from_dict({"task": {"name": "colaa"}}))


@pytest.mark.parametrize("texts,match", [([""], "text 1 is empty"), (["ok", "   \n"], "text 2 is empty"),
                                         (["x" * 1_000_000], "text 1 has 1000000 characters")])
def test_bad_texts_for_prediction(texts, match):
    with pytest.raises(DataError, match=match):
        service.check_texts(texts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400))
def test_fuzz_cola_reader_raises_only_project_errors(tmp_path, blob):
    cfg = cola_dir(tmp_path, blob)
    try:
        load_task(cfg)
    except AdaLayersError:
        pass


yaml_text = st.text(alphabet=string.printable, max_size=200)
values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=8),
                   st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
sections = st.sampled_from(["task", "model", "mixer", "head", "train", "cache", "bogus"])
fields = st.sampled_from(["name", "k", "alpha", "cutoff", "lr", "batch_size", "kind", "pin_layer", "base",
                          "max_length", "dropout", "enabled", "max_gb", "nope"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(sections, st.one_of(values, st.dictionaries(fields, values, max_size=4)), max_size=4))
def test_fuzz_config_dicts_raise_only_config_errors(data):
    try:
        config.from_dict(data)
    except ConfigError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(yaml_text)
def test_fuzz_config_files_raise_only_config_errors(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    try:
        config.load(path)
    except ConfigError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), max_size=3))
def test_fuzz_overrides_raise_only_config_errors(items):
    try:
        config.from_dict({}, items)
    except ConfigError:
        pass


def test_skip_bad_rows_counts_and_reports_them(tmp_path):
    cfg = cola_dir(tmp_path, GOOD + b"s\t1\tonly three\n" + b"s\t7\t\tA sentence.\n" + GOOD)
    cfg.task.skip_bad_rows = True
    data = load_task(cfg)
    assert len(data.splits["train"]) + len(data.splits["validation"]) == 80
    assert any("skipped 2 bad rows" in n and "train.tsv:41" in n for n in data.notes)


def test_skip_bad_rows_drops_a_broken_conll_sentence(tmp_path):
    folder = tmp_path / "conll2003"
    folder.mkdir()
    good = "EU NNP B-NP I-ORG\nrejects VBZ B-VP O\n\n"
    (folder / "eng.train").write_text(good + "Peter NNP B-NP\nBlackburn NNP I-NP I-PER\n\n" + good)
    for name in ("eng.testa", "eng.testb"):
        (folder / name).write_text(good)
    cfg = config.from_dict({"task": {"name": "conll2003", "data_dir": str(tmp_path)}, "head": {"kind": "token"}})
    with pytest.raises(DataError, match=r"eng.train:4: expected 4 space-separated columns"):
        load_task(cfg)
    cfg.task.skip_bad_rows = True
    data = load_task(cfg)
    assert [e.words for e in data.splits["train"]] == [["EU", "rejects"], ["EU", "rejects"]]
    assert any("skipped 1 bad rows" in n for n in data.notes)


def test_fp16_on_a_cpu_is_refused_before_any_loading():
    cfg = config.from_dict({"train": {"precision": "fp16", "device": "cpu"}})
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device; on a CPU use bf16"):
        service.prepare(cfg)
