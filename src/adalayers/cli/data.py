"""`adalayers data fetch TASK`: put a built-in task's files into the data folder, checked by sha256
(adalayers.data.tasks.fetch does the work)."""
from __future__ import annotations

from adalayers.data.tasks.fetch import SOURCES, data_folder, fetch


def cmd_fetch(args) -> int:
    folder = data_folder(args.dir)
    for line in fetch(args.task, folder):
        print(line)
    src = SOURCES[args.task]
    if src.hub:
        print(f"({args.task} is also on the Hugging Face Hub as {src.hub}; adalayers reads the files above)")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("data", help="get the built-in tasks' data files")
    dsub = p.add_subparsers(dest="data_command", metavar="COMMAND")
    p.set_defaults(fn=lambda args: p.print_help() or 0)
    f = dsub.add_parser("fetch", help="download a task's files from their public source into the data folder, "
                                      "checked by sha256 (offline: says where to place them)")
    f.add_argument("task", choices=sorted(SOURCES), help="the task whose files to fetch")
    f.add_argument("--dir", help="the data folder (default: $ADALAYERS_DATA, else ../shared/data)")
    f.set_defaults(fn=cmd_fetch)
