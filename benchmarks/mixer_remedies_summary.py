"""Issue 40's decision table: every remedy on every cell, from the folders benchmarks/mixer_remedies.py kept.

    python benchmarks/mixer_remedies_summary.py "mpnet-base CoLA=benchmarks/results/mixer_remedies" \
        "MiniLM CoLA=benchmarks/results/mixer_remedies_minilm" ...

Each argument is LABEL=FOLDER, FOLDER holding a results.json of benchmarks/mixer_remedies.py. For every cell: the
old default, the best single layer (of the cell's pinned rows, the one with the highest validation median) and
every other row, as test median (min-max) over the seeds and the difference of medians to the best layer.
Then the issue's rule for a new default, applied to each remedy (rows with 3 or more seeds only):

    level with the best single layer  its test median >= the best layer's lowest seed, on every cell
    no loss where the mixer wins      its test median >= the old default's median minus the old default's
                                      spread (max - min), on every cell where the old default's median is
                                      above the best layer's

A remedy becomes the default only if it passes both on every cell. A cell where a remedy was not run fails it.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from adalayers.lab.seeds import cell as spread_cell


def load(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def pinned(row: dict) -> int | None:
    part = row["settings"].split("pin_layer ")[1].split(",")[0]
    return None if part == "None" else int(part)


def best_layer(rows: dict) -> str | None:
    """The pinned row of highest validation median, among those with the most seeds (a 1-seed row beside
    3-seed rows does not become the cell's reference)."""
    layers = [n for n, r in rows.items() if pinned(r) is not None]
    most = max((len(rows[n]["seeds"]) for n in layers), default=0)
    layers = [n for n in layers if len(rows[n]["seeds"]) == most]
    return max(layers, key=lambda n: rows[n]["validation"]["median"], default=None)


def verdict(name: str, cells: dict[str, dict]) -> tuple[bool, list[str]]:
    """Does row `name` pass the rule on every cell? And why not, cell by cell."""
    reasons = []
    for label, rows in cells.items():
        row, default, layer = rows.get(name), rows.get("default"), best_layer(rows)
        if row is None or len(row["seeds"]) < 3:
            reasons.append(f"{label}: not run over 3 seeds")
            continue
        if default is None or layer is None:
            reasons.append(f"{label}: no default or single-layer row to compare with")
            continue
        med, lay = row["test"]["median"], rows[layer]["test"]
        if med < lay["min"]:
            reasons.append(f"{label}: {med:.4f} below {layer}'s lowest seed {lay['min']:.4f}")
        d = default["test"]
        if d["median"] > lay["median"] and med < d["median"] - (d["max"] - d["min"]):
            reasons.append(f"{label}: {med:.4f} more than a seed spread below the old default {d['median']:.4f}")
    return not reasons, reasons


def table(cells: dict[str, dict]) -> str:
    metric = {label: next(iter(rows.values()))["metric"] for label, rows in cells.items()}
    names = []
    for rows in cells.values():
        names += [n for n in rows if n not in names and n != "default" and pinned(rows[n]) is None]
    head = "| row | " + " | ".join(f"{label} (test {metric[label]})" for label in cells) + " |"
    md = [head, "|---" * (len(cells) + 1) + "|"]

    def line(title: str, pick) -> str:
        out = []
        for rows in cells.values():
            name = pick(rows)
            if name is None or name not in rows:
                out.append("not run")
                continue
            r, text = rows[name], spread_cell(rows[name]["test"])
            if len(r["seeds"]) < 3:
                text += f" ({len(r['seeds'])} seed{'s' if len(r['seeds']) > 1 else ''})"
            layer = best_layer(rows)
            if layer and name != layer:
                text += f"; {r['test']['median'] - rows[layer]['test']['median']:+.4f}"
            out.append(text)
        return f"| {title} | " + " | ".join(out) + " |"

    md.append(line("old default", lambda rows: "default"))
    md.append(line("best single layer (on validation; named below)", best_layer))
    for name in names:
        md.append(line(name, lambda rows, n=name: n))
    layer_names = " / ".join(f"{label}: {best_layer(rows) or '-'}" for label, rows in cells.items())
    md += ["", f"Best single layer per cell: {layer_names}.", "", "The rule for a new default (3 seeds on every cell):", ""]
    for name in ["default", *names]:
        ok, why = verdict(name, cells)
        missing = [w.split(":")[0] for w in why if w.endswith("not run over 3 seeds")]
        measured = [w for w in why if not w.endswith("not run over 3 seeds")]
        text = "passes on every cell" if ok else "fails: " + "; ".join(
            measured + ([f"not run over 3 seeds on {', '.join(missing)}"] if missing else []))
        md.append(f"- {name}: {text}")
    return "\n".join(md) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", metavar="LABEL=FOLDER")
    args = ap.parse_args()
    cells = {}
    for arg in args.cells:
        label, sep, folder = arg.partition("=")
        if not sep or not (Path(folder) / "results.json").is_file():
            raise SystemExit(f"mixer_remedies_summary: {arg!r} is not LABEL=FOLDER with FOLDER/results.json")
        cells[label] = load(Path(folder))
    print(table(cells), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
