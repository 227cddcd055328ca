"""task.files: the options of your own data files (task 'files'), and their flat spelling.

`task: {train: x.csv}` and `--set task.train=x.csv` name the options of task.files without the `files.`
(configs, the `--data` shortcut and run folders written before task.files write them so): nest_files and
nest_overrides move them in. adalayers.config builds TaskConfig on FilesConfig.
"""
from __future__ import annotations

from typing import Annotated, Literal

from adalayers.kinds import ALIASES as TASK_KINDS
from adalayers.settings import Section, check, setting

FILE_FORMATS = ("csv", "tsv", "jsonl", "conll", "hf")
FILES_OPTIONS = ("train", "validation", "test", "format", "kind", "text", "text_pair", "label", "header", "label_names",
                 "tag_scheme")


class FilesConfig(Section):
    """Your own data: what task 'files' reads (adalayers/data/tasks/files.py)."""
    train: str | None = setting(None, "Your training data: a .csv, .tsv, .jsonl or CoNLL file, or a folder saved "
                                      "by a Hugging Face dataset's save_to_disk (or a hub name, with a network). "
                                      "Relative paths are read from the current folder.")
    validation: str | None = setting(None, "Validation file (hf: split name). None = a stratified "
                                           "validation_fraction of train.")
    test: str | None = setting(None, "Test file (hf: split name). None = no test split: only validation is "
                                     "reported.")
    format: Literal[FILE_FORMATS] | None = setting(None, "csv, tsv (no quoting, as GLUE), jsonl, conll or hf. None "
                                                         "= from train's extension (.csv .tsv .jsonl .conll; a "
                                                         "folder = hf).")
    kind: Annotated[str, check(lambda v: v in TASK_KINDS, "must be classification, regression or tokens")] | None \
        = setting(None, "classification, regression or tokens. None = guessed: CoNLL or lists of tags -> tokens, "
                        "numbers with decimals -> regression, anything else -> classification.")
    text: str | int | None = setting(None, "Column with the text: a header name / JSON key, or a 0-based number "
                                           "in a file without header. None = 'text' ('tokens' for token tasks; "
                                           "CoNLL: 0).")
    text_pair: str | int | None = setting(None, "Column with the second text of a sentence-pair task.")
    label: str | int | None = setting(None, "Column with the label (token tasks: the list of tags; CoNLL: the tag "
                                            "column's number). None = 'label' ('tags' for token tasks; CoNLL: -1, "
                                            "last).")
    header: bool | None = setting(None, "CSV/TSV: the first row names the columns. None = yes when text/label are "
                                        "names, no when they are numbers.")
    label_names: dict = setting({}, "Rename label values and fix their order, e.g. {0: negative, 1: positive}; "
                                    "every label value must be listed. Empty = the values, sorted.")
    tag_scheme: Literal["iob1", "iob2"] = setting("iob2", "Token tags: iob2 (used as they are) or iob1 (converted "
                                                          "to IOB2, e.g. the original CoNLL-2003 files).")


def nest_files(task: dict) -> dict:
    """A task mapping with the options of your own files given flat (train: x.csv, as configs, the shortcut
    and run folders written before task.files write them) moved into task.files, over what it holds."""
    flat = {k: task[k] for k in FILES_OPTIONS if k in task}
    if not flat:
        return task
    files = task.get("files", {})
    rest = {k: v for k, v in task.items() if k not in flat}
    return {**rest, "files": {**files, **flat}} if isinstance(files, dict) else task  # else: refused as it is


def nest_overrides(overrides: list[str] | None) -> list[str]:
    """--set task.train=x is --set task.files.train=x (the options of your own files may be named flat)."""
    out = []
    for item in overrides or []:
        key, eq, value = item.partition("=")
        section, _, name = key.strip().partition(".")
        out.append(f"task.files.{name}{eq}{value}" if section == "task" and name in FILES_OPTIONS else item)
    return out
