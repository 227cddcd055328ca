"""Task 'files': your own CSV / TSV / JSON Lines / CoNLL / Hugging Face data, read by config alone.

Training runs use a tiny random BERT (built here, with MiniLM's tokenizer) on a few hundred synthetic
rows whose labels depend on words, so a head that reads the right columns must learn them.
"""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import torch

from adalayers import cli, config
from adalayers.recipes import service
from adalayers.errors import ConfigError, DataError
from adalayers.data.tasks import load_task
from adalayers.data.tasks.files import iob1_to_iob2

DATA = Path("../shared/data")
FILLER = "the a movie film plot actor scene story music ending script it was is quite rather".split()
POSITIVE, NEGATIVE = ["great", "wonderful", "superb"], ["awful", "boring", "terrible"]
NAMES = ["alice", "bob", "carol", "dave"]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> str:
    from transformers import AutoTokenizer, BertConfig, BertModel

    from adalayers.model.model_packages import path_for

    folder = tmp_path_factory.mktemp("tiny_bert")
    tok = AutoTokenizer.from_pretrained(str(path_for("minilm-l6")))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def tiny(base: str, task: dict, epochs: int = 8, **train) -> config.Config:
    return config.from_dict({
        "task": task, "model": {"base": base, "max_length": 32},
        "mixer": {"k": 16}, "head": {"num_heads": 2, "dim_feedforward": 32},
        "train": {"lr": 1e-2, "batch_size": 16, "max_epochs": epochs, "early_stopping": 10, "num_threads": 1,
                  "device": "cpu", **train},
        "cache": {"enabled": False}})


def sentence(rng, word: str) -> str:
    words = rng.sample(FILLER, 4) + [word]
    rng.shuffle(words)
    return " ".join(words)


def write_csv(path: Path, rows: list[list], header: list[str] | None = None, delimiter=",") -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if delimiter == "," else csv.QUOTE_NONE)
        if header:
            w.writerow(header)
        w.writerows(rows)
    return path


def sentiment_rows(n: int, seed: int) -> list[list]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        pos = i % 2 == 0
        rows.append([sentence(rng, rng.choice(POSITIVE if pos else NEGATIVE)), "pos" if pos else "neg"])
    return rows


# --- training from files ---------------------------------------------------------------------------

def test_classification_from_csv_trains_and_reports_validation_only(tiny_base, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="adalayers")
    train = write_csv(tmp_path / "train.csv", sentiment_rows(300, 1), ["text", "label"])
    metrics = service.train(tiny(tiny_base, {"train": str(train)}), tmp_path / "run")
    assert metrics["validation"]["n"] == 30                      # stratified 10% of train
    assert metrics["validation"]["accuracy"] >= 0.9                # 27 of 30 or better (chance: ~15)
    assert "test" not in metrics
    assert any("no test file" in n for n in metrics["notes"])
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["labels"] == ["neg", "pos"] and saved["kind"] == "sequence"
    assert saved["config"]["head"]["kind"] == "sequence"          # the head followed the data
    assert "no test file" in caplog.text  # the data's notes are logged
    pred = service.predict(tmp_path / "run", ["the film was superb", "the film was terrible"])
    assert [p["label"] for p in pred] == ["pos", "neg"]


def test_sentence_pair_reads_the_second_column(tiny_base, tmp_path):
    rng = random.Random(2)
    rows = []
    for i in range(300):  # the label is in the pair's second text only
        same = i % 2 == 0
        rows.append({"question": sentence(rng, "plot"), "answer": sentence(rng, "yes" if same else "no"),
                     "label": "match" if same else "mismatch"})
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = tiny(tiny_base, {"train": str(path), "text": "question", "text_pair": "answer", "metric": "accuracy"})
    data = load_task(cfg)
    assert data.splits["train"][0].text_pair and data.main_metric == "accuracy"
    metrics = service.train(cfg, tmp_path / "run")
    assert metrics["validation"]["accuracy"] > 0.9


def test_regression_guessed_from_decimal_labels(tiny_base, tmp_path):
    rng = random.Random(3)
    rows = []
    for _ in range(300):
        k = rng.randint(0, 3)
        words = rng.sample(FILLER, 5 - k) + ["great"] * k
        rng.shuffle(words)
        rows.append([" ".join(words), f"{k + rng.uniform(-0.3, 0.3):.2f}"])
    train = write_csv(tmp_path / "scores.tsv", rows[:240], ["sentence", "score"], delimiter="\t")
    test = write_csv(tmp_path / "scores_test.tsv", rows[240:], ["sentence", "score"], delimiter="\t")
    cfg = tiny(tiny_base, {"train": str(train), "test": str(test), "text": "sentence", "label": "score"})
    metrics = service.train(cfg, tmp_path / "run")
    assert set(metrics["test"]) >= {"pearson", "spearman"}
    assert metrics["test"]["pearson"] > 0.7
    assert json.loads((tmp_path / "run" / "config.json").read_text())["main_metric"] == "pearson"


def token_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.sample(FILLER, 5)
        tags = ["O"] * 5
        i = rng.randrange(4)
        words[i: i + 2] = [rng.choice(NAMES), "smith"]
        tags[i: i + 2] = ["B-PER", "I-PER"]
        out.append((words, tags))
    return out


def test_tokens_from_jsonl(tiny_base, tmp_path):
    path = tmp_path / "ner.jsonl"
    path.write_text("".join(json.dumps({"tokens": w, "tags": t}) + "\n" for w, t in token_sentences(200, 4)))
    cfg = tiny(tiny_base, {"train": str(path)})
    metrics = service.train(cfg, tmp_path / "run")
    assert metrics["validation"]["f1"] > 0.8


def test_conll_file_with_docstart_and_iob1(tiny_base, tmp_path):
    lines = ["-DOCSTART- -X- O O", ""]
    for words, tags in token_sentences(200, 5):
        iob1 = ["I-PER" if t != "O" else "O" for t in tags]  # IOB1: an entity starts with I-
        lines += [f"{w} NN O {t}" for w, t in zip(words, iob1)] + [""]
    path = tmp_path / "ner.conll"
    path.write_text("\n".join(lines), encoding="utf-8")
    plain = load_task(tiny(tiny_base, {"train": str(path)}))
    assert "B-PER" not in plain.labels and any("tag_scheme: iob1" in n for n in plain.notes)
    cfg = tiny(tiny_base, {"train": str(path), "tag_scheme": "iob1"})
    data = load_task(cfg)
    assert data.kind == "token" and data.labels == ["O", "B-PER", "I-PER"]
    assert len(data.splits["train"]) + len(data.splits["validation"]) == 200  # -DOCSTART- is no sentence
    metrics = service.train(cfg, tmp_path / "run")
    assert metrics["validation"]["f1"] > 0.8


def test_iob1_to_iob2():
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == \
        ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG"]
    assert iob1_to_iob2(["B-PER", "I-PER", "O"]) == ["B-PER", "I-PER", "O"]  # IOB2 stays as it is


def test_hugging_face_dataset_from_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = sentiment_rows(40, 6)
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["pos", "neg"])})
    ds = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": [r[0] for r in rows[:30]],
                                             "label": [0 if r[1] == "pos" else 1 for r in rows[:30]]}, features),
        "test": datasets.Dataset.from_dict({"text": [r[0] for r in rows[30:]],
                                            "label": [0 if r[1] == "pos" else 1 for r in rows[30:]]}, features)})
    ds.save_to_disk(str(tmp_path / "ds"))
    data = load_task(config.from_dict({"task": {"train": str(tmp_path / "ds"), "validation_fraction": 0.2}}))
    assert data.labels == ["pos", "neg"]  # the dataset's own label order
    assert data.splits["test"][0].label == rows[30][1]
    assert len(data.splits["validation"]) == 6 and data.kind == "sequence"


def test_cli_shortcut_without_config(tiny_base, tmp_path, capsys):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(200, 7), ["review", "sentiment"])
    out = tmp_path / "runs" / "mine"
    rc = cli.main(["train", "--data", str(train), "--text", "review", "--label", "sentiment", "--out", str(out),
                   "--set", f"model.base={tiny_base}", "--set", "mixer.k=16", "--set", "head.num_heads=2",
                   "--set", "train.max_epochs=1", "--set", "cache.enabled=false", "--set", "train.device=cpu"])
    captured = capsys.readouterr()
    printed, logged = captured.out, captured.err
    assert rc == 0
    assert "settings from" in printed and "cola.yaml" in printed
    assert "no test split: the numbers above are validation only" in printed
    saved = json.loads((out / "config.json").read_text())["config"]
    assert saved["task"]["files"]["train"] == str(train.resolve())
    assert "model.max_length not set" in logged  # not cola.yaml's 64: chosen from these short sentences
    assert 8 <= saved["model"]["max_length"] < 20
    assert json.loads((out / "metrics.json").read_text())["validation"]["n"] == 20


def test_cli_shortcut_picks_regression_settings(tmp_path):
    from adalayers.data.tasks.shortcut import shortcut_config

    train = write_csv(tmp_path / "s.csv", [["a b", "0.5"], ["c d", "1.25"]], ["text", "label"])
    cfg = shortcut_config(None, {"train": str(train)}, [])
    assert cfg.task.name == "files" and cfg.head.kind is None and cfg.model.max_length is None  # from the data
    assert cfg.mixer.k == 64 and cfg.head.num_heads == 8  # the rest from stsb.yaml


# --- the same numbers as the built-in readers ------------------------------------------------------

needs_glue = pytest.mark.skipif(not (DATA / "glue").is_dir(), reason="needs ../shared/data/glue")


@needs_glue
@pytest.mark.slow
def test_cola_as_generic_tsv_matches_builtin_reader(tiny_base, tmp_path):
    limits = {"max_train_examples": 200, "max_eval_examples": 100}
    folder = DATA / "glue" / "CoLA"
    builtin = tiny(tiny_base, {"name": "cola", **limits}, epochs=2)
    generic = tiny(tiny_base, {"train": str(folder / "train.tsv"), "test": str(folder / "dev.tsv"), "text": 3,
                               "label": 1, "label_names": {0: "unacceptable", 1: "acceptable"}, "metric": "mcc",
                               **limits}, epochs=2)
    a = service.train(builtin, tmp_path / "builtin")
    b = service.train(generic, tmp_path / "generic")
    assert a["validation"] == b["validation"] and a["test"] == b["test"]


@pytest.mark.skipif(not (DATA / "conll2003").is_dir(), reason="needs ../shared/data/conll2003")
def test_conll2003_as_generic_conll_gives_the_builtin_examples():
    from adalayers.data.tasks import TASKS

    folder = DATA / "conll2003"
    b = load({"train": str(folder / "eng.train"), "validation": str(folder / "eng.testa"),
              "test": str(folder / "eng.testb"), "tag_scheme": "iob1"})
    assert b.labels == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert [len(b.splits[s]) for s in ("train", "validation", "test")] == [14041, 3250, 3453]  # data README
    if "conll2003" not in TASKS:
        pytest.skip("no built-in conll2003 reader on this branch")
    a = load_task(config.from_dict({"task": {"name": "conll2003"}}))
    assert (a.kind, a.labels, a.main_metric) == (b.kind, b.labels, b.main_metric)
    for split in ("train", "validation", "test"):
        assert [(e.words, e.tags) for e in a.splits[split]] == [(e.words, e.tags) for e in b.splits[split]]


@needs_glue
def test_stsb_as_generic_tsv_gives_the_builtin_examples():
    folder = DATA / "glue" / "STS-B"
    a = load_task(config.from_dict({"task": {"name": "stsb"}}))
    b = load_task(config.from_dict({"task": {"train": str(folder / "train.tsv"), "test": str(folder / "dev.tsv"),
                                             "text": "sentence1", "text_pair": "sentence2", "label": "score"}}))
    assert (a.kind, a.main_metric) == (b.kind, b.main_metric) == ("regression", "pearson")
    for split in ("train", "validation", "test"):
        assert a.splits[split] == b.splits[split]


# --- errors a user will hit ------------------------------------------------------------------------

def load(task: dict):
    return load_task(config.from_dict({"task": task}))


def error(task: dict) -> str:
    with pytest.raises(DataError) as e:
        load(task)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_missing_column_names_the_columns(tmp_path):
    train = write_csv(tmp_path / "t.csv", [["good", "pos"]], ["review", "sentiment"])
    assert error({"train": str(train)}) == f"{train}:1: no column 'label' (columns: review, sentiment)"
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"text": "a", "label": "x"}\n{"text": "b", "lab": "y"}\n')
    assert error({"train": str(jl)}) == f"{jl}:2: no column 'label' (columns: text, lab)"


def test_label_unseen_in_train(tmp_path):
    train = write_csv(tmp_path / "t.csv", sentiment_rows(10, 0), ["text", "label"])
    val = write_csv(tmp_path / "v.csv", [["fine", "pos"], ["so so", "neutral"]], ["text", "label"])
    msg = error({"train": str(train), "validation": str(val)})
    assert msg == f"{val}:3: label 'neutral' does not occur in train (train labels: neg, pos)"


def test_empty_file_and_header_only(tmp_path):
    (tmp_path / "e.csv").write_text("")
    assert error({"train": str(tmp_path / "e.csv")}) == f"{tmp_path / 'e.csv'}: empty file"
    (tmp_path / "h.csv").write_text("text,label\n")
    assert error({"train": str(tmp_path / "h.csv")}) == f"{tmp_path / 'h.csv'}: no data rows after the header"


def test_mixed_types_in_numeric_label_column(tmp_path):
    train = write_csv(tmp_path / "t.csv", [["a", "0.5"], ["b", "1.5"], ["c", "n/a"]], ["text", "label"])
    msg = error({"train": str(train)})
    assert msg.startswith(f"{train}:4: label 'n/a' is not a number") and "task.kind: classification" in msg
    msg = error({"train": str(train), "kind": "regression"})
    assert msg.startswith(f"{train}:4: label 'n/a' is not a number")


def test_wrong_column_count(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("text\tlabel\nfine\tpos\nbad\tneg\textra\n")
    assert error({"train": str(path)}) == f"{path}:3: expected 2 columns (text, label), got 3"
    conll = tmp_path / "t.conll"
    conll.write_text("EU NNP B-ORG\nrejects VBZ O\n\nGerman O\n")
    assert error({"train": str(conll)}) == f"{conll}:4: expected 3 columns like line 1, got 2"


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes("text,label\ngood,pos\n".encode() + "caf\xe9,neg\n".encode("latin-1"))
    assert error({"train": str(path)}).startswith(f"{path}:3: not valid UTF-8")


def test_token_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"tokens": ["a", "b"], "tags": ["O"]}) + "\n")
    assert error({"train": str(path)}) == f"{path}:1: 2 tokens but 1 tags"
    pos = tmp_path / "pos.conll"
    pos.write_text("the DT\ncat NN\n")
    assert error({"train": str(pos)}) == f"{pos}:1: tag 'DT' is not O, B-TYPE or I-TYPE (token tasks are scored " \
                                         f"by entity F1)"


def test_exponents_without_a_dot_are_numbers():
    cfg = config.from_dict({"train": {"lr": "3e-4"}}, ["train.weight_decay=1e-2"])
    assert cfg.train.lr == 3e-4 and cfg.train.weight_decay == 1e-2


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="task.files.format: must be one of"):
        config.from_dict({"task": {"train": "x.csv", "format": "xlsx"}})
    with pytest.raises(ConfigError, match="only read by task 'files'"):
        config.from_dict({"task": {"name": "cola", "text": "sentence"}})
    with pytest.raises(ConfigError, match="cannot tell the format"):
        load({"train": str(tmp_path / "data.xlsx")})
    train = write_csv(tmp_path / "t.csv", sentiment_rows(40, 0), ["text", "label"])
    with pytest.raises(ConfigError, match="task.metric: a sequence task can select on"):
        load({"train": str(train), "metric": "pearson"})
    with pytest.raises(DataError, match="data file not found"):
        load({"train": str(tmp_path / "missing.csv")})


def test_head_kind_that_contradicts_the_data_is_an_error(tiny_base, tmp_path):
    from adalayers.errors import AdaLayersError

    train = write_csv(tmp_path / "t.csv", sentiment_rows(20, 0), ["text", "label"])
    cfg = tiny(tiny_base, {"train": str(train)})
    cfg.head.kind = "regression"
    with pytest.raises(AdaLayersError, match="set head.kind: sequence"):
        service.prepare(cfg)
