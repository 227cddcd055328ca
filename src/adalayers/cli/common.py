"""What several commands share: the config arguments, --runtime, a group's help, and the JSON the commands print."""
from __future__ import annotations

import argparse
import json
import logging

from adalayers import runtimes

log = logging.getLogger(__name__)


def add_config_args(p: argparse.ArgumentParser, optional: bool = False) -> None:
    p.add_argument("config", nargs="?" if optional else None,
                   help="YAML config file (see configs/)" + ("; optional with --data" if optional else ""))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field, e.g. --set train.lr=3e-4 (repeatable)")


def add_runtime_arg(p: argparse.ArgumentParser, default: str | None = "torch", trains: bool = False,
                    backend_alias: bool = False, help: str | None = None) -> None:
    """--runtime, its choices the registry's (adalayers.runtimes; trains=True: those that run a base alone).
    backend_alias: --backend too, the old name, deprecated: a logged warning when it is used."""
    p.add_argument("--runtime", default=default, choices=runtimes.names(trains),
                   help=help or runtimes.describe(trains))
    if backend_alias:
        p.add_argument("--backend", dest="runtime", choices=runtimes.names(trains), action=_DeprecatedBackend,
                       help="deprecated: the old name of --runtime (removed in the next release)")


class _DeprecatedBackend(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        log.warning("%s is deprecated and will be removed in the next release; use --runtime %s", option_string,
                    values)
        setattr(namespace, self.dest, values)


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
