"""The IMDB reader on tiny archives made here, in the official layout."""
import io
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from adalayers import config
from adalayers.errors import DataError
from adalayers.data.tasks import load_task
from adalayers.data.tasks.imdb import read_imdb

from conftest import DATA
from tinymodels import imdb_tarball


def _cfg(data_dir, **task):
    return config.from_dict({"task": {"name": "imdb", "data_dir": str(data_dir), **task}})


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("ADALAYERS_DATA", raising=False)


def test_tarball_splits_and_labels(tmp_path):
    imdb_tarball(tmp_path, per_class=20, test_per_class=7)
    data = load_task(_cfg(tmp_path))
    assert data.kind == "sequence" and data.main_metric == "accuracy"
    assert data.labels == ["negative", "positive"]
    sizes = {k: len(v) for k, v in data.splits.items()}
    assert sizes == {"train": 36, "validation": 4, "test": 14}
    assert Counter(e.label for e in data.splits["validation"]) == {"negative": 2, "positive": 2}  # stratified
    assert Counter(e.label for e in data.splits["test"]) == {"negative": 7, "positive": 7}
    train_texts = {e.text for e in data.splits["train"]}
    assert not train_texts & {e.text for e in data.splits["validation"]}
    assert all("<br" not in e.text for e in data.splits["train"] + data.splits["validation"])
    pos = [e for e in data.splits["train"] + data.splits["validation"] if "loved it" in e.text]
    assert pos and all(e.label == "positive" for e in pos) and "funny see it" in pos[0].text
    # the split is fixed by the seed, and a prefix of train is not one label only
    again = load_task(_cfg(tmp_path))
    assert [e.text for e in again.splits["validation"]] == [e.text for e in data.splits["validation"]]
    head = load_task(_cfg(tmp_path, max_train_examples=8))
    assert len(head.splits["train"]) == 8 and len({e.label for e in head.splits["train"]}) == 2


def test_extracted_folder_reads_the_same(tmp_path):
    imdb_tarball(tmp_path / "a", per_class=10, test_per_class=3)
    imdb_tarball(tmp_path / "b", per_class=10, test_per_class=3, extracted=True)
    a, _ = read_imdb(tmp_path / "a" / "imdb")
    b, source = read_imdb(tmp_path / "b" / "imdb")
    assert source.name == "aclImdb" and source.is_dir()
    assert [(e.text, e.label) for e in a["train"]] == [(e.text, e.label) for e in b["train"]]
    assert [(e.text, e.label) for e in a["test"]] == [(e.text, e.label) for e in b["test"]]


def test_extracted_folder_keys_the_cache(tmp_path):
    """The hidden-state cache keys on the data's sha256: an extracted folder hashes every file's path and bytes."""
    from adalayers.store.cache.source import _FILE_HASHES, files_hash

    imdb_tarball(tmp_path, per_class=10, test_per_class=2, extracted=True)
    data = load_task(_cfg(tmp_path))
    folder = data.files[0]
    assert folder.is_dir()
    before = files_hash([folder])["aclImdb"]
    review = next((folder / "train" / "pos").glob("*.txt"))
    review.write_text(review.read_text() + " edited")
    _FILE_HASHES.clear()  # the per-process memo keys on the folder's own size and mtime
    edited = files_hash([folder])["aclImdb"]
    review.rename(review.with_name("9" + review.name))
    _FILE_HASHES.clear()
    assert len({before, edited, files_hash([folder])["aclImdb"]}) == 3


def _tar(path: Path, files: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, raw in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="IMDB not found"):
        read_imdb(tmp_path / "imdb")
    bad = tmp_path / "bad" / "imdb" / "aclImdb_v1.tar.gz"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"this is not a tar archive at all")
    with pytest.raises(DataError, match="not a readable tar.gz"):
        read_imdb(bad.parent)
    ok = {f"aclImdb/{s}/{p}/0_{r}.txt": b"fine review" for s in ("train", "test") for p, r in (("pos", 8), ("neg", 1))}
    latin = dict(ok, **{"aclImdb/train/pos/1_9.txt": "caf\xe9 cr\xe8me".encode("latin-1")})
    _tar(tmp_path / "latin" / "imdb" / "aclImdb_v1.tar.gz", latin)
    with pytest.raises(DataError, match=r"aclImdb/train/pos/1_9\.txt: not valid UTF-8"):
        read_imdb(tmp_path / "latin" / "imdb")
    no_neg = {k: v for k, v in ok.items() if "test/neg" not in k}
    _tar(tmp_path / "noneg" / "imdb" / "aclImdb_v1.tar.gz", no_neg)
    with pytest.raises(DataError, match=r"no reviews in aclImdb/test/neg/"):
        read_imdb(tmp_path / "noneg" / "imdb")
    empty = dict(ok, **{"aclImdb/test/neg/5_3.txt": b"<br /> "})
    _tar(tmp_path / "empty" / "imdb" / "aclImdb_v1.tar.gz", empty)
    with pytest.raises(DataError, match=r"5_3\.txt: empty review"):
        read_imdb(tmp_path / "empty" / "imdb")


@pytest.mark.skipif(not (DATA / "imdb" / "aclImdb_v1.tar.gz").is_file(), reason=f"real data not found at {DATA}")
def test_real_archive(monkeypatch):
    data = load_task(_cfg(DATA))
    assert {k: len(v) for k, v in data.splits.items()} == {"train": 22500, "validation": 2500, "test": 25000}
    for split, n in (("train", 11250), ("validation", 1250), ("test", 12500)):
        assert Counter(e.label for e in data.splits[split]) == {"negative": n, "positive": n}
