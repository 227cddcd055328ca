"""What several commands share: the config arguments, a group's help, and the JSON the commands print."""
from __future__ import annotations

import argparse
import json


def add_config_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("config", nargs="?" if optional else None,
                   help="YAML config file (see configs/)" + ("; optional with --data" if optional else ""))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field, e.g. --set train.lr=3e-4 (repeatable)")


def print_help(parser: argparse.ArgumentParser) -> int:
    """A command group called without its sub-command: its help, not an argparse error."""
    parser.print_help()
    return 0


def dump(obj) -> str:
    """JSON with indent 2, but each confusion matrix on one line."""
    inline: dict[str, str] = {}

    def walk(o):
        if not isinstance(o, dict):
            return o
        out = {}
        for k, v in o.items():
            if k == "confusion":
                inline[f"@confusion{len(inline)}@"] = json.dumps(v)
                v = f"@confusion{len(inline) - 1}@"
            out[k] = walk(v)
        return out

    text = json.dumps(walk(obj), indent=2)
    for key, value in inline.items():
        text = text.replace(f'"{key}"', value)
    return text
