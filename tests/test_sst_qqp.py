"""SST (PTB trees) and the QQP subset: tiny files written here, bad lines, and the real files' counts."""
import pytest

from adalayers.config import Config
from adalayers.errors import DataError
from adalayers.data.tasks import load_task
from adalayers.data.tasks.qqp import read_pairs, split_80_10_10
from adalayers.data.tasks.sst import parse_tree, read_trees

from conftest import DATA


def _cfg(name, data_dir) -> Config:
    cfg = Config()
    cfg.task.name, cfg.task.data_dir = name, str(data_dir)
    return cfg


def test_parse_tree_root_label_and_brackets():
    label, words = parse_tree("(3 (2 -LRB-) (4 (2 very) (4 good)) (2 -RRB-))")
    assert label == 3 and words == ["(", "very", "good", ")"]


@pytest.mark.parametrize("line", ["(3 (2 a) (2 b)", "(3 (2 a)) (2 b))", "(x (2 a))", "3 a", "(3 (2 a)) extra"])
def test_parse_tree_rejects_bad_trees(line):
    with pytest.raises(ValueError):
        parse_tree(line)


def test_sst_files(tmp_path, monkeypatch):
    monkeypatch.delenv("ADALAYERS_DATA", raising=False)
    (tmp_path / "sst").mkdir()
    trees = ["(0 (1 awful) (0 film))", "(2 (2 a) (2 film))", "(4 (4 great) (2 film))", "(3 (3 nice) (2 one))"]
    for name in ("train", "dev", "test"):
        (tmp_path / "sst" / f"{name}.txt").write_text("\n".join(trees) + "\n")
    five = load_task(_cfg("sst5", tmp_path))
    assert [e.label for e in five.splits["train"]] == ["very negative", "neutral", "very positive", "positive"]
    two = load_task(_cfg("sst2", tmp_path))
    assert [(e.text, e.label) for e in two.splits["test"]] == [
        ("awful film", "negative"), ("great film", "positive"), ("nice one", "positive")]
    (tmp_path / "sst" / "dev.txt").write_text(trees[0] + "\n(2 (2 broken)\n")
    with pytest.raises(DataError, match=r"dev\.txt:2"):
        load_task(_cfg("sst5", tmp_path))


def test_qqp_joined_label_and_bad_lines(tmp_path):
    path = tmp_path / "subset.tsv"
    lines = ["1\t2\t3\tHow do I cook?\tHow to cook rice? 1"]  # the first line's label joined by a space
    lines += [f"{i}\t{i}\t{i + 1}\tq{i} one?\tq{i} two?\t{i % 2}" for i in range(2, 40)]
    path.write_text("\n".join(lines) + "\n")
    rows = read_pairs(path)
    assert (rows[0].text, rows[0].text_pair, rows[0].label) == ("How do I cook?", "How to cook rice?", "duplicate")
    assert len(rows) == 39
    splits = split_80_10_10(rows, 42)
    assert sorted(len(v) for v in splits.values()) == [4, 4, 31]
    assert {e.label for e in splits["test"]} == {"duplicate", "not_duplicate"}  # stratified
    path.write_text(lines[1] + "\n1\t2\t3\tq\tq2\tyes\n")
    with pytest.raises(DataError, match=r"subset\.tsv:2: is_duplicate"):
        read_pairs(path)
    path.write_text("1\t2\tonly three\n")
    with pytest.raises(DataError, match=r"subset\.tsv:1: expected 6"):
        read_pairs(path)


@pytest.mark.skipif(not (DATA / "sst" / "train.txt").is_file(), reason="real SST not found")
def test_real_sst_counts():
    counts = {s: len(read_trees(DATA / "sst" / f"{s}.txt")) for s in ("train", "dev", "test")}
    assert counts == {"train": 8544, "dev": 1101, "test": 2210}
    two = load_task(_cfg("sst2", DATA))
    assert [len(two.splits[s]) for s in ("train", "validation", "test")] == [6920, 872, 1821]


@pytest.mark.skipif(not (DATA / "qqp" / "subset.tsv").is_file(), reason="real QQP not found")
def test_real_qqp_counts():
    data = load_task(_cfg("qqp", DATA))
    every = [e for v in data.splits.values() for e in v]
    # data/README.md says 23,496 pairs, but the file holds 23,497 lines, each a pair with a distinct id
    # (the first one, whose label is joined by a space, included); the duplicate count 8,747 agrees
    assert len(every) == 23497 and sum(e.label == "duplicate" for e in every) == 8747
    assert len({(e.text, e.text_pair) for e in every}) > 23000
    assert [len(data.splits[s]) for s in ("train", "validation", "test")] == [18797, 2350, 2350]
