"""CoNLL-2003 English NER from the original 4-column files.

Each line is `token POS chunk NER`; blank lines end sentences and `-DOCSTART-` lines (document
breaks) are dropped. The files use IOB1 (a chunk starts with I- unless it directly follows a chunk
of the same type); tags are converted to IOB2 (every chunk starts with B-), scored as seqeval scores them.
Splits: eng.train = train, eng.testa = validation, eng.testb = test.
"""
from __future__ import annotations

from pathlib import Path

from adalayers.errors import DataError
from adalayers.data.tasks.base import Example, TaskData, bad_row, read_lines, register
from adalayers.data.tasks.tables import conll_sentences
from adalayers.kinds import TaskKind

TYPES = ["LOC", "MISC", "ORG", "PER"]
LABELS = ["O"] + [f"{p}-{t}" for t in TYPES for p in ("B", "I")]
FILES = {"train": "eng.train", "validation": "eng.testa", "test": "eng.testb"}


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """I-X that does not continue a chunk of type X becomes B-X; everything else is kept."""
    out = []
    for i, tag in enumerate(tags):
        if tag.startswith("I-"):
            prev = out[i - 1] if i else "O"
            if prev == "O" or prev[2:] != tag[2:]:
                tag = "B-" + tag[2:]
        out.append(tag)
    return out


def read_conll(path: Path) -> list[Example]:
    """Sentences of one CoNLL-2003 file as Examples with words and IOB2 tags."""
    sentences = []
    for sentence in conll_sentences(read_lines(path)):
        words, tags, broken = [], [], False
        for n, cols in sentence:
            if len(cols) != 4:
                bad_row(f"{path}:{n}: expected 4 space-separated columns (token POS chunk NER), "
                        f"got {len(cols)}: {' '.join(cols)[:80]!r}")
                broken = True  # skipping: the whole sentence goes
                continue
            tag = cols[3]
            if tag != "O" and not (tag[:2] in ("B-", "I-") and tag[2:] in TYPES):
                bad_row(f"{path}:{n}: unknown NER tag {tag!r} (expected O or B-/I- with {', '.join(TYPES)})")
                broken = True
                continue
            words.append(cols[0])
            tags.append(tag)
        if words and not broken:
            sentences.append(Example(words=words, tags=iob1_to_iob2(tags)))
    if not sentences:
        raise DataError(f"{path}: no sentences found")
    return sentences


@register("conll2003")
def conll2003(cfg) -> TaskData:
    folder = cfg.data_dir() / "conll2003"
    paths = {split: folder / name for split, name in FILES.items()}
    splits = {split: read_conll(path) for split, path in paths.items()}
    counts = ", ".join(f"{s} {len(ex):,} sentences / {sum(len(e.words) for e in ex):,} words"
                       for s, ex in splits.items())
    return TaskData("conll2003", TaskKind.TOKENS, LABELS, splits, main_metric="f1", files=list(paths.values()),
                    notes=["train = eng.train, validation = eng.testa, test = eng.testb; "
                           "-DOCSTART- lines dropped; IOB1 tags converted to IOB2",
                           counts,
                           "scored at entity level (CoNLL-eval rules, as seqeval) on every word; the first "
                           "sub-token of a word carries its tag; sentences longer than max_length are "
                           "split into windows"])
