"""Results that read the same on any machine: what benchmarks/ keeps in benchmarks/results/.

A kept result names the data folder as `$ADALAYERS_DATA` and a path inside the checkout relative to the
repository, never the machine's own spelling (`/home/me/src/adalayers/runs/x`, or `../shared/data`, which holds
only where the checkout sits beside the data). A kept YAML config names no data folder at all, so that it runs
as it is on any layout (its `task.data_dir` then falls back to `$ADALAYERS_DATA`, else the default).

    python -m adalayers.lab.portable SRC DEST NAME [NAME ...]

copies the files called NAME under SRC (the summaries of a run folder: `sweep.json sweep.md`, ...) to the same
places under DEST, rewritten so.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
from pathlib import Path

from adalayers.config import TaskConfig
from adalayers.data.tasks.fetch import data_folder

log = logging.getLogger(__name__)

DATA = "$ADALAYERS_DATA"
TEXT = (".json", ".jsonl", ".md", ".txt", ".yaml", ".yml", ".csv")
_DEFAULT = re.escape(TaskConfig.model_fields["data_dir"].default)  # ../shared/data, the configs' default
_YAML_DATA_DIR = re.compile(rf"^[ \t]*data_dir:[ \t]*(?:{_DEFAULT}|{re.escape(DATA)})/?[ \t]*(?:#.*)?\n", re.M)


def data_setting(path: str | Path, repo: Path | None = None) -> str:
    """A data path as a result records it: `$ADALAYERS_DATA[/...]` inside the data folder, else relative to the
    repository (REPO, default: the working directory) when inside it, else as given."""
    repo = (repo or Path.cwd()).resolve()
    p, data = Path(path).expanduser().resolve(), data_folder(None).resolve()
    if p == data or p.is_relative_to(data):
        return "/".join([DATA, *p.relative_to(data).parts])
    return str(p.relative_to(repo)) if p.is_relative_to(repo) else str(path)


def portable(text: str, repo: Path | None = None, yaml: bool = False) -> str:
    """TEXT with the data folder written as `$ADALAYERS_DATA` and the repository's (REPO, default: the working
    directory) own paths relative to it; with `yaml`, a `data_dir:` line naming the default data folder is dropped."""
    repo = (repo or Path.cwd()).resolve()
    folders = {str(data_folder(None).resolve()), str((repo.parent / "shared" / "data").resolve())}
    for folder in sorted(folders, key=len, reverse=True):
        text = text.replace(folder, DATA)
    text = text.replace(str(repo) + "/", "")
    text = re.sub(rf"(?<![\w./-]){_DEFAULT}(?![\w-])", DATA, text)
    return _YAML_DATA_DIR.sub("", text) if yaml else text


def keep(src: Path, dest: Path, names: tuple[str, ...], repo: Path | None = None) -> list[Path]:
    """Copy the files called one of NAMES under SRC to the same places under DEST, text made portable; returns
    the files written."""
    written = []
    for f in sorted(src.rglob("*")):
        if not f.is_file() or f.name not in names:
            continue
        target = dest / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.suffix in TEXT:
            text = portable(f.read_text(encoding="utf-8"), repo, yaml=f.suffix in (".yaml", ".yml"))
            target.write_text(text, encoding="utf-8")
        else:
            shutil.copyfile(f, target)
        written.append(target)
    log.info("kept %d files of %s in %s", len(written), src, dest)
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Copy a run's summaries to benchmarks/results/, paths made portable.")
    ap.add_argument("src", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("names", nargs="+", help="file names to keep (sweep.json, sweep.md, ...)")
    args = ap.parse_args(argv)
    if not keep(args.src, args.dest, tuple(args.names)):
        raise SystemExit(f"portable: no file called {' or '.join(args.names)} under {args.src}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
