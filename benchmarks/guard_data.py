"""The guard benchmark's data: Davidson et al. (ICWSM 2017) hate speech and offensive language tweets, as TSV.

    python benchmarks/guard_data.py SOURCE.csv OUT_DIR [--train 6000 --dev 1000 --test 2000 --seed 42]

SOURCE.csv is data/labeled_data.csv of github.com/t-davidson/hate-speech-and-offensive-language (MIT
licence; docs/data.md names the commit and the sha256). Each tweet's majority class (0 hate speech,
1 offensive language, 2 neither) becomes a binary guard label: "flagged" (hate speech or offensive) or
"clean" (neither). Whitespace runs (tabs, newlines) become one space, so a row is one TSV line.
Stratified random splits without overlap (seed 42), written as OUT_DIR/{train,dev,test}.tsv with the
header `text<TAB>label`, plus SHA256SUMS; nothing is written into the project (the data is not committed).
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import random
import re
from pathlib import Path

LABELS = {"0": "flagged", "1": "flagged", "2": "clean"}


def rows(source: Path) -> list[tuple[str, str]]:
    """(text, label) per tweet of the source CSV."""
    with source.open(newline="", encoding="utf-8") as f:
        return [(re.sub(r"\s+", " ", r["tweet"]).strip(), LABELS[r["class"]]) for r in csv.DictReader(f)]


def split(data: list[tuple[str, str]], sizes: dict[str, int], seed: int) -> dict[str, list[tuple[str, str]]]:
    """Stratified samples of the given sizes, without overlap (each label's share as in the whole)."""
    rng = random.Random(seed)
    by = {lab: [r for r in data if r[1] == lab and r[0]] for lab in sorted({r[1] for r in data})}
    for group in by.values():
        rng.shuffle(group)
    total, out, taken = len(data), {}, {lab: 0 for lab in by}
    for name, n in sizes.items():
        part = []
        for lab, group in by.items():
            k = round(n * len(group) / total)
            part += group[taken[lab]:taken[lab] + k]
            taken[lab] += k
        rng.shuffle(part)
        out[name] = part
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--train", type=int, default=6000)
    ap.add_argument("--dev", type=int, default=1000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    data = rows(args.source)
    parts = split(data, {"train": args.train, "dev": args.dev, "test": args.test}, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    sums = [f"{hashlib.sha256(args.source.read_bytes()).hexdigest()}  {args.source.name} (source)"]
    for name, part in parts.items():
        path = args.out / f"{name}.tsv"
        path.write_text("text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in part), encoding="utf-8")
        sums.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}")
        flagged = sum(lab == "flagged" for _, lab in part)
        print(f"{name}: {len(part)} rows, {flagged} flagged ({flagged / len(part):.1%})")
    (args.out / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    print("\n".join(sums))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
