"""Every `adalayers ...` command in the README's and docs/' code blocks names a real command and real
options, and (where it has no `...` placeholder or shell variable) parses as written: the docs cannot drift from the CLI."""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from adalayers import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(page: Path) -> list[tuple[int, str]]:
    """(line number, command) for each `adalayers` command in the page's fenced code blocks; continuation
    lines joined, comments and `[optional]` groups dropped, `a && b` split."""
    found, block, pending = [], False, None
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if line.lstrip().startswith("```"):
            block, pending = not block, None
            continue
        if not block:
            continue
        if pending is not None:
            start, text = pending
            text += " " + line.strip()
        elif re.match(r"\s*(\$ )?adalayers [a-z]", line):
            start, text = n, line.strip().removeprefix("$ ")
        else:
            continue
        if text.endswith("\\"):
            pending = (start, text[:-1])
            continue
        pending = None
        text = re.sub(r"\[[^\]]*\]", "", re.sub(r"\s#.*$", "", text))
        for part in text.split("&&"):
            part = part.strip()
            if part.startswith("adalayers "):
                found.append((start, part))
    return found


CASES = [(f"{p.relative_to(ROOT)}:{n}", c) for p in PAGES for n, c in commands(p)]


def test_the_pages_have_commands():
    assert len(CASES) > 30 and any(w.startswith("README.md") for w, _ in CASES)


@pytest.mark.parametrize("where,command", CASES, ids=[w for w, _ in CASES])
def test_a_documented_command_parses(where, command):
    parser = cli.build_parser()
    argv = [a for a in shlex.split(command)[1:] if a != "..."]
    sub = parser._subparsers._group_actions[0].choices
    assert argv[0] in sub, f"{where}: no command {argv[0]!r}"
    cmd = sub[argv[0]]
    if argv[0] in ("cache", "data") and len(argv) > 1:  # groups: the sub-command's own parser
        cmd = cmd._subparsers._group_actions[0].choices[argv[1]]
    unknown = [a.split("=")[0] for a in argv if a.startswith("--") and a.split("=")[0] not in cmd._option_string_actions]
    assert not unknown, f"{where}: {argv[0]} has no option {', '.join(unknown)}"
    if "..." not in command and "$" not in command:  # no placeholder, no shell variable: parses as written
        try:
            parser.parse_args(argv)
        except (SystemExit, argparse.ArgumentError) as e:
            pytest.fail(f"{where}: `{command}` does not parse ({e})")
