"""CoNLL-2003: IOB1 -> IOB2, the 4-column reader, and its errors."""
import pytest

from adalayers.errors import DataError
from adalayers.data.tasks.conll import iob1_to_iob2, read_conll

from conftest import DATA
from tinymodels import conll_files


@pytest.mark.parametrize("iob1, iob2", [
    (["I-PER", "I-PER", "O", "I-LOC"], ["B-PER", "I-PER", "O", "B-LOC"]),
    # IOB1 uses B- only where a chunk directly follows one of the same type
    (["I-ORG", "B-ORG", "I-ORG"], ["B-ORG", "B-ORG", "I-ORG"]),
    (["I-PER", "I-LOC", "I-LOC"], ["B-PER", "B-LOC", "I-LOC"]),
    (["O", "I-MISC", "I-MISC", "O", "I-MISC"], ["O", "B-MISC", "I-MISC", "O", "B-MISC"]),
    (["B-MISC", "I-MISC"], ["B-MISC", "I-MISC"]),
    (["O", "O"], ["O", "O"]),
    ([], []),
])
def test_iob1_to_iob2(iob1, iob2):
    assert iob1_to_iob2(iob1) == iob2


def test_reader_drops_docstart_and_converts(tmp_path):
    folder = conll_files(tmp_path, copies=2)
    sents = read_conll(folder / "eng.train")
    assert len(sents) == 12  # 6 sentences per document, two documents
    assert all("-DOCSTART-" not in s.words for s in sents)
    assert sents[0].words[:3] == ["EU", "rejects", "German"]
    assert sents[0].tags[:3] == ["B-ORG", "O", "B-MISC"]
    assert sents[4].tags == ["B-LOC", "O", "O", "O", "O", "B-ORG", "I-ORG", "B-PER", "I-PER", "O"]


def test_wrong_column_count_names_file_and_line(tmp_path):
    path = tmp_path / "eng.train"
    path.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ O\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"eng\.train:4: expected 4 .* got 3"):
        read_conll(path)


def test_unknown_tag_and_missing_file(tmp_path):
    path = tmp_path / "eng.testa"
    path.write_text("EU NNP I-NP I-ORG\nBerlin NNP I-NP I-CITY\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"eng\.testa:2: unknown NER tag 'I-CITY'"):
        read_conll(path)
    with pytest.raises(DataError, match="not found"):
        read_conll(tmp_path / "eng.testb")


@pytest.mark.skipif(not (DATA / "conll2003" / "eng.train").is_file(), reason=f"real data not found at {DATA}")
def test_real_files_match_the_published_counts():
    from collections import Counter

    from adalayers import config
    from adalayers.data.tasks import load_task

    data = load_task(config.from_dict({"task": {"name": "conll2003", "data_dir": str(DATA)}}))
    assert {k: len(v) for k, v in data.splits.items()} == {"train": 14041, "validation": 3250, "test": 3453}
    assert sum(len(e.words) for e in data.splits["test"]) == 46435
    # entity counts of the CoNLL-2003 paper (Tjong Kim Sang & De Meulder 2003, table 2): IOB2 B- tags = entities
    starts = Counter(t[2:] for e in data.splits["train"] for t in e.tags if t.startswith("B-"))
    assert starts == {"LOC": 7140, "MISC": 3438, "ORG": 6321, "PER": 6600}
    test = Counter(t[2:] for e in data.splits["test"] for t in e.tags if t.startswith("B-"))
    assert test == {"LOC": 1668, "MISC": 702, "ORG": 1661, "PER": 1617}
