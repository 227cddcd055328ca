"""A head as a user names it: a task name and its run folder, parsed once where it enters (the CLI, SideTasks.load).

    HeadSpec.parse("runs/cola")           -> HeadSpec("cola", runs/cola)
    HeadSpec.parse("acc=runs/cola")       -> HeadSpec("acc", runs/cola)
    HeadSpec.parse("user/cola-minilm")    -> HeadSpec("cola-minilm", its Hub snapshot)   (adalayers.store.hub)
    parse_heads(args.heads, "--heads")    -> [HeadSpec, ...]; a bad one is a ConfigError naming "--heads ..."
    parse_heads(heads)                    -> the same from Python, naming "heads[1] ..."; HeadSpecs pass as they are

Everything past the edge (loading, caching, export) takes HeadSpecs: a Hub id is resolved once, here.
Import-light: the Hub is imported only when an argument is a Hub id that is not a local folder.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adalayers.errors import ConfigError


@dataclass(frozen=True)
class HeadSpec:
    name: str   # the task name its answers carry
    path: Path  # its run folder (a Hub id's local snapshot); an export folder's head: the name alone

    @classmethod
    def parse(cls, arg: str | Path, where: str = "--heads") -> "HeadSpec":
        """'runs/cola' -> ('cola', runs/cola); 'acc=runs/cola' -> ('acc', runs/cola). A Hub id 'user/name[@rev]'
        that is not a local folder is fetched: ('name', its snapshot). `where` names the argument in errors."""
        from adalayers.store.hub import resolve_run

        arg = str(arg)
        if not arg.strip():
            raise ConfigError(f"{where} {arg!r}: empty; give RUN_FOLDER or NAME=RUN_FOLDER")
        name, sep, path = arg.partition("=")
        if sep and name and "/" not in name:
            if not path:
                raise ConfigError(f"{where} {arg!r}: no run folder after '='; give NAME=RUN_FOLDER")
            return cls(_task_name(name, arg, where), resolve_run(path))
        return cls(_task_name(Path(arg.partition("@")[0]).name, arg, where), resolve_run(arg))

    def __str__(self) -> str:
        return f"{self.name}={self.path}"


def parse_heads(args, where: str = "heads") -> list[HeadSpec]:
    """Each of `args` (str, Path or HeadSpec) as a HeadSpec. `where` names the argument in errors: "--heads" on the
    command line; from Python the argument's name, each item by its index ("heads[1]")."""
    if isinstance(args, (str, Path, HeadSpec)):
        raise ConfigError(f"{where}: a list of heads, got one {type(args).__name__} ({str(args)!r}); wrap it in [...]")
    flag = where.startswith("--")
    return [a if isinstance(a, HeadSpec) else HeadSpec.parse(a, where if flag else f"{where}[{i}]")
            for i, a in enumerate(args)]


def _task_name(name: str, arg: str, where: str) -> str:
    """A task name every answer can carry: valid UTF-8 (argv bytes that are not arrive as lone surrogates)
    and printable."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise ConfigError(f"{where} {shown}: the task name is not valid UTF-8; name it with NAME=RUN_FOLDER") from None
    if not name.isprintable():
        raise ConfigError(f"{where} {arg!r}: the task name holds unprintable characters; name it with NAME=RUN_FOLDER")
    return name
