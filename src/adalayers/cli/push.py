"""`adalayers push RUN --repo user/name`: upload a run folder to the Hugging Face Hub with a generated model card
(adalayers.store.hub does the work)."""
from __future__ import annotations

from pathlib import Path

from adalayers.store.hub import push, upload_operations


def cmd_push(args) -> int:
    ops = upload_operations(Path(args.run), args.repo)
    if args.dry_run:
        for op in ops:
            print(op.path_in_repo)
        return 0
    print(push(Path(args.run), args.repo, args.private, args.revision))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("push", help="upload a run folder to the Hugging Face Hub with a generated model card")
    p.add_argument("run", help="run folder")
    p.add_argument("--repo", required=True, help="Hub repo id, user/name")
    p.add_argument("--private", action="store_true", help="create the repo as private")
    p.add_argument("--revision", help="branch to commit to (created if missing; default: main)")
    p.add_argument("--dry-run", action="store_true", help="list the files that would be uploaded, upload nothing")
    p.set_defaults(fn=cmd_push)
