"""The command line's help texts (a snapshot of the options new users asked about) and its progress output."""
from __future__ import annotations

import argparse
import io
import sys

import pytest
from tqdm import tqdm

from adalayers import cli, progress

# (command, option) -> help text, as `adalayers COMMAND --help` shows it (before argparse's wrapping)
SNAPSHOT = {
    ("serve", "--no-primary"): "stop the base after the deepest layer any head uses (early exit); answers then "
                               "carry no base output (default: off, the base runs to its end)",
    ("serve", "--base"): "the frozen base the heads were trained on: an alias, a model folder or a hub id "
                         "(default: the base the heads' run folders name, when they all name the same one)",
    ("evaluate", "--split"): "which split of the run's task to score (default: test)",
    ("ablate-adapters", "--split"): "the split to re-evaluate on (default: validation, so the test split stays "
                                    "unseen)",
}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return parser._subparsers._group_actions[0].choices[name]


def test_help_snapshot():
    parser = cli.build_parser()
    seen = {(cmd, opt): _subparser(parser, cmd)._option_string_actions[opt].help for cmd, opt in SNAPSHOT}
    assert seen == SNAPSHOT
    assert "COMMAND" not in parser.description and "registered" not in parser.description
    assert parser.description.startswith("Train small side-task heads")


def test_every_option_of_every_command_has_help():
    parser = cli.build_parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            if action.option_strings and action.help is not argparse.SUPPRESS:
                assert action.help, f"adalayers {name} {action.option_strings[0]} has no help"


@pytest.mark.parametrize("argv", [[], ["cache"]])
def test_a_group_alone_prints_its_help(argv, capsys):
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert out.out.startswith("usage: adalayers") and "required" not in out.err
    assert ("ls" in out.out and "build" in out.out) if argv else "train" in out.out


def test_verbose_is_accepted_after_a_command():
    args = cli.build_parser().parse_args(["cache", "ls", "--verbose"])
    assert args.verbose is True
    assert cli.build_parser().parse_args(["cache", "ls"]).verbose is False


def test_plain_lines_when_not_a_terminal():
    buf = io.StringIO()
    stream = progress.PlainLines(buf, interval=0)
    bar = tqdm(range(3), file=stream, mininterval=0, desc="caching")
    for i in bar:
        bar.write(f"epoch {i}", file=stream)
    bar.close()
    print("done", "now", file=stream)
    text = buf.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert [ln for ln in lines if ln.startswith("epoch")] == ["epoch 0", "epoch 1", "epoch 2"]
    assert lines[-1] == "done now" and all(ln.strip() for ln in lines)
    assert any(ln.startswith("caching: 100%") for ln in lines)


def test_bar_lines_are_throttled_but_messages_and_the_last_state_are_kept():
    buf = io.StringIO()
    stream = progress.PlainLines(buf, interval=3600)
    for i in tqdm(range(50), file=stream, mininterval=0, desc="epoch 1"):
        if i == 25:
            tqdm.write("halfway", file=stream)
    lines = buf.getvalue().splitlines()
    bars = [ln for ln in lines if ln.startswith("epoch 1")]
    assert len(bars) <= 4 and bars[-1].startswith("epoch 1: 100%") and "halfway" in lines
    assert "\r" not in buf.getvalue()


def test_transformers_progress_is_silent_unless_verbose(tmp_path, capfd):
    from transformers import BertConfig, BertModel
    from transformers.utils import logging as hf_logging

    BertModel(BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=8)).save_pretrained(tmp_path)
    was_on = hf_logging.is_progress_bar_enabled()
    restore = progress.configure(verbose=True)
    capfd.readouterr()
    BertModel.from_pretrained(tmp_path)
    restore()
    assert "Loading weights" in capfd.readouterr().err
    restore = progress.configure(verbose=False)
    BertModel.from_pretrained(tmp_path)
    restore()
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled() == was_on and not isinstance(sys.stderr, progress.PlainLines)
