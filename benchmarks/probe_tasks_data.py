"""Issue 55's new tasks as TSV files: BANKING77 (77 intents), SICK entailment (sentence pairs) and short IMDB.

    python benchmarks/probe_tasks_data.py banking77 TRAIN.csv TEST.csv OUT_DIR/banking77
    python benchmarks/probe_tasks_data.py sick SICK_train.txt SICK_trial.txt SICK_test_annotated.txt OUT_DIR/sick
    python benchmarks/probe_tasks_data.py imdb-short aclImdb_v1.tar.gz OUT_DIR/imdb_short

banking77: banking_data/{train,test}.csv of github.com/PolyAI-LDN/task-specific-datasets (CC BY 4.0; docs/data.md
names the commit and the sha256): 10,003 training and 3,080 test customer queries, each one of 77 intents. A
stratified 10% of train (seed 42) becomes dev; train.tsv keeps the rest.
sick: data/sts/sick2014/ of github.com/brmson/dataset-sts (SICK, CC BY-NC-SA 3.0): SemEval 2014 task 1's
4,500 train, 500 trial (dev) and 4,927 test sentence pairs, each labelled ENTAILMENT, NEUTRAL or CONTRADICTION.
imdb-short: the data folder's IMDB archive; 1,000 training and 500 test reviews drawn at random (seed 42) among
those of at most --max-words words (the 1,000 texts of about 60 words the issue's time goal names).

Whitespace runs become one space, so a row is one TSV line. Writes OUT_DIR/{train,dev,test}.tsv (header
`text<TAB>label`, pairs `text<TAB>text_pair<TAB>label`; imdb-short has no dev: --data takes a stratified 10%
of train) and SHA256SUMS (sources first); nothing is written into the project (the data is not committed).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import random
import re
import tarfile
from pathlib import Path

from adalayers.files import atomic_write


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def stratified_split(rows: list[tuple], share: float, seed: int) -> tuple[list[tuple], list[tuple]]:
    """(rest, held): `share` of each label's rows (the label is a row's last field) held out, seeded."""
    rng, rest, held = random.Random(seed), [], []
    for lab in sorted({r[-1] for r in rows}):
        group = [r for r in rows if r[-1] == lab]
        rng.shuffle(group)
        k = round(share * len(group))
        held += group[:k]
        rest += group[k:]
    rng.shuffle(rest)
    rng.shuffle(held)
    return rest, held


def banking77(train: Path, test: Path, seed: int) -> dict[str, list[tuple]]:
    def read(p: Path) -> list[tuple]:
        with p.open(newline="", encoding="utf-8") as f:
            return [(clean(r["text"]), r["category"]) for r in csv.DictReader(f)]
    rest, dev = stratified_split(read(train), 0.1, seed)
    return {"train": rest, "dev": dev, "test": read(test)}


def sick(train: Path, trial: Path, test: Path) -> dict[str, list[tuple]]:
    def read(p: Path) -> list[tuple]:
        with p.open(newline="", encoding="utf-8-sig") as f:
            return [(clean(r["sentence_A"]), clean(r["sentence_B"]), r["entailment_judgment"])
                    for r in csv.DictReader(f, delimiter="\t")]
    return {"train": read(train), "dev": read(trial), "test": read(test)}


def imdb_short(archive: Path, max_words: int, n_train: int, n_test: int, seed: int) -> dict[str, list[tuple]]:
    parts: dict[str, list[tuple]] = {"train": [], "test": []}
    with tarfile.open(archive) as tar:
        for m in tar:
            hit = re.fullmatch(r"aclImdb/(train|test)/(pos|neg)/\d+_\d+\.txt", m.name)
            if hit and m.isfile():
                text = clean(tar.extractfile(m).read().decode("utf-8").replace("<br />", " "))
                if len(text.split()) <= max_words:
                    parts[hit[1]].append((text, "positive" if hit[2] == "pos" else "negative"))
    rng = random.Random(seed)
    out = {}
    for name, n in (("train", n_train), ("test", n_test)):
        rows = sorted(parts[name])
        out[name] = rng.sample(rows, min(n, len(rows)))
    return out


def write(out: Path, parts: dict[str, list[tuple]], sources: list[Path]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name} (source)" for p in sources]
    for name, rows in parts.items():
        header = "text\ttext_pair\tlabel\n" if len(rows[0]) == 3 else "text\tlabel\n"
        path = out / f"{name}.tsv"
        atomic_write(path, header + "".join("\t".join(r) + "\n" for r in rows))
        sums.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}")
        words = sorted(sum(len(t.split()) for t in r[:-1]) for r in rows)
        print(f"{name}: {len(rows):,} rows, {len({r[-1] for r in rows})} labels, words per row median "
              f"{words[len(words) // 2]}, max {words[-1]}")
    atomic_write(out / "SHA256SUMS", "\n".join(sums) + "\n")
    print("\n".join(sums))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("task", choices=["banking77", "sick", "imdb-short"])
    ap.add_argument("files", nargs="+", type=Path, help="the source files (see above), then OUT_DIR")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-words", type=int, default=85, help="imdb-short: the longest review kept, in words")
    args = ap.parse_args()
    *sources, out = args.files
    want = {"banking77": 2, "sick": 3, "imdb-short": 1}[args.task]
    if len(sources) != want:
        ap.error(f"{args.task} takes {want} source file(s) and OUT_DIR, got {len(sources)} file(s)")
    for p in sources:
        if not p.is_file():
            ap.error(f"no such file: {p}")
    if args.task == "banking77":
        parts = banking77(*sources, seed=args.seed)
    elif args.task == "sick":
        parts = sick(*sources)
    else:
        parts = imdb_short(sources[0], args.max_words, 1000, 500, args.seed)
    write(out, parts, sources)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
