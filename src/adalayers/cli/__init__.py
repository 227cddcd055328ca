"""adalayers: train small side-task heads on the hidden states of a frozen transformer, and serve them all from one forward pass.

One module per command: each module in COMMAND_MODULES defines add_commands(subparsers). Other packages add
commands through the entry-point group `adalayers.commands` (ENTRY_POINT_GROUP): each entry point names a function
add_commands(subparsers), called after the product's own commands, so it may also extend one of them (the lab
adds `train --seeds` this way). In pyproject.toml:

    [project.entry-points."adalayers.commands"]
    my-command = "my_package.cli:add_commands"
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from importlib.metadata import entry_points

from adalayers.cli.common import print_help as _print_help  # also for data/tasks/fetch.py
from adalayers.errors import AdaLayersError

log = logging.getLogger(__name__)

# The product's commands: one module each, defining add_commands(subparsers). One line per module.
COMMAND_MODULES: list[str] = [
    "adalayers.cli.train",
    "adalayers.cli.evaluate",
    "adalayers.cli.predict",
    "adalayers.cli.cache",
    "adalayers.cli.serve",
    "adalayers.cli.predict_files",
    "adalayers.cli.data",
    "adalayers.cli.export",
    "adalayers.cli.push",
    "adalayers.cli.sign",
]
# Commands that load run folders or exports: they take --trust-unverified (adalayers.store.trust)
RUN_COMMANDS = ("predict", "predict-files", "serve", "export", "evaluate", "push")
ENTRY_POINT_GROUP = "adalayers.commands"


def plugin_commands() -> list:
    """The installed entry points of ENTRY_POINT_GROUP, by name (one name once: the first installed wins)."""
    found: dict = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return [found[name] for name in sorted(found)]


def _add_plugin(sub, ep) -> None:
    """One entry point's commands; a plugin that fails to load costs its own commands, not the CLI."""
    try:
        ep.load()(sub)
    except Exception as e:  # noqa: BLE001 - any error of a third-party plugin; named in one line
        log.warning("adalayers: the commands of %s (%s) are not available: %s: %s",
                    ep.name, ep.value, type(e).__name__, e)


# Commands no plugin extends, parsed without the plugins' modules (the lab's import torch; `serve` on llama.cpp
# runs without it)
WITHOUT_PLUGINS = ("serve",)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; `command`: the one about to run (one of WITHOUT_PLUGINS: no plugin is loaded)."""
    parser = argparse.ArgumentParser(prog="adalayers", description=__doc__.splitlines()[0].partition(": ")[2].capitalize())
    parser.add_argument("--verbose", action="store_true", help="also show transformers' own progress bars "
                                                              "(e.g. 'Loading weights')")
    parser.set_defaults(fn=lambda args: _print_help(parser))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:  # each adds its own sub-commands: add_commands(sub)
        importlib.import_module(module).add_commands(sub)
    if command not in WITHOUT_PLUGINS:
        for ep in plugin_commands():
            _add_plugin(sub, ep)
    _verbose_everywhere(sub)
    for name in RUN_COMMANDS:
        if name in sub.choices:
            sub.choices[name].add_argument("--trust-unverified", action="store_true",
                                           help="load run folders and exports that lack a checksum entry "
                                                "(written by an older adalayers), each with a warning")
    return parser


def _verbose_everywhere(sub) -> None:
    """--verbose is accepted after any (sub-)command too: `adalayers train ... --verbose`."""
    for p in sub.choices.values():
        if "--verbose" not in p._option_string_actions:
            p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)
        for action in p._subparsers._group_actions if p._subparsers else []:
            _verbose_everywhere(action)


# Commands that run under torchrun (their parsers set torchrun=True): one data-parallel training, or each
# process building its shard of the cache. compare and compare-multitask run each strategy in a process of
# its own and time inference and memory in one, so they are refused there with a one-line message.
TORCHRUN_COMMANDS = ("train", "sweep-layers", "cache build")


def _command_words(argv: list[str] | None) -> list[str]:
    words = []
    for a in sys.argv[1:] if argv is None else argv:
        if a.startswith("-") or len(words) == 2:
            break
        words.append(a)
    return words[:1] if words[:1] != ["cache"] else words


def main(argv: list[str] | None = None) -> int:
    from adalayers.progress import setup_logging
    from adalayers.launch import launched, stop_process_group

    setup_logging()  # messages to stderr; the command's own output stays on stdout
    args = build_parser((_command_words(argv) or [None])[0]).parse_args(argv)
    from adalayers import progress

    if launched() and not getattr(args, "torchrun", False):
        from adalayers.engine import distributed

        if distributed.is_main():  # every process stops; one says why
            print(f"error: 'adalayers {' '.join(_command_words(argv))}' does not run under torchrun; under torchrun: "
                  f"{', '.join(TORCHRUN_COMMANDS)} (launch this one without torchrun)", file=sys.stderr)
        return 2
    if getattr(args, "trust_unverified", False):
        from adalayers.store import trust

        trust.trust_process()
    restore = progress.configure(verbose=args.verbose)
    try:
        return args.fn(args)
    except AdaLayersError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        restore()
        stop_process_group()  # leave a torchrun process group cleanly


if __name__ == "__main__":
    sys.exit(main())
