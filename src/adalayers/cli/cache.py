"""`adalayers cache build CONFIG [--shard I/N]` (also under torchrun), `adalayers cache ls`, `adalayers cache rm KEY|--all`.

The cache store is imported inside each command: it imports torch, and the CLI's parser imports every command
module (`serve` on llama.cpp runs without torch)."""
from __future__ import annotations

import time
from pathlib import Path

from adalayers.cli.common import add_config_args, print_help


def _root(args) -> Path:
    from adalayers.store.cache.source import cache_dir

    return Path(args.dir).expanduser() / "states" if args.dir else cache_dir()


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'i/N' -> (i, N) with 0 <= i < N."""
    from adalayers.store.cache.store import CacheError

    if text is None:
        return None
    i, slash, n = text.partition("/")
    if not (slash and i.strip().isdigit() and n.strip().isdigit() and 0 <= int(i) < int(n)):
        raise CacheError(f"--shard {text!r}: expected i/N with 0 <= i < N, e.g. --shard 0/4")
    return int(i), int(n)


def cmd_build(args) -> int:
    from adalayers.store.cache.source import cached_source
    from adalayers.store.cache.store import CacheError
    from adalayers import config
    from adalayers.recipes import service
    from adalayers.engine import distributed

    part = parse_shard(args.shard)
    cfg = config.load(args.config, args.overrides)
    backbone, data, encoded = service.prepare(cfg)  # under torchrun: joins the process group
    if part is None and distributed.active():
        part = (distributed.rank(), distributed.world_size())
    source = cached_source(cfg, backbone, data, encoded)
    if source is None:
        raise CacheError("the cache was not built (see the message above)")
    todo = []
    for split in encoded:
        t0 = time.perf_counter()
        if part is None:
            entry = source.entry(split)
        else:
            entry = source.build_part(split, *part)
            if entry is None:
                print(f"{split:<10} {source.keys[split]}  part {part[0]}/{part[1]} written "
                      f"({time.perf_counter() - t0:.1f}s); the entry is complete once every part is")
                todo.append(split)
                continue
        _report(source, split, entry, t0)
    distributed.barrier()
    if distributed.active() and distributed.is_main():  # the last rank to finish assembled each entry
        for split in todo:
            _report(source, split, source.entry_if_built(split), time.perf_counter())
    if distributed.is_main():
        print(f"cache folder: {source.root}")
    return 0


def _report(source, split: str, entry, t0: float) -> None:
    from adalayers.store.cache.store import CacheDamaged
    try:  # check every file's checksum, so a later run never meets a damaged layer
        for s in range(len(entry.layout.shards)):
            for layer in range(entry.manifest["num_layers"]):
                entry.array(s, layer)
    except CacheDamaged as e:
        entry = source.rebuild(split, str(e), entry.manifest.get("build"))
    size = sum(info["bytes"] for info in entry.manifest["files"].values())
    print(f"{split:<10} {source.keys[split]}  {entry.manifest['rows']:>7,} rows  "
          f"{entry.manifest['tokens']:>10,} tokens  {size / 1e6:>9.1f} MB  ({time.perf_counter() - t0:.1f}s)")


def cmd_ls(args) -> int:
    from adalayers.store.cache.store import list_entries
    root = _root(args)
    rows = list_entries(root)
    unfinished = len(list(root.glob(".tmp-*"))) if root.is_dir() else 0
    if unfinished:
        print(f"({unfinished} unfinished temporary folders: being built now, or left by a builder that died; "
              f"'adalayers cache rm --all' removes the latter)")
    if not rows:
        print(f"no cached hidden states in {root}")
        return 0
    print(f"{'key':<24}  {'task':<10} {'split':<10} {'base':<12} {'rows':>8} {'tokens':>11} {'MB':>9}  "
          f"{'created':<19}  status")
    for r in rows:
        print(f"{r['key']:<24}  {str(r.get('task', '?')):<10} {str(r.get('split', '?')):<10} "
              f"{str(r.get('base', '?'))[:12]:<12} {r.get('rows') or 0:>8,} {r.get('tokens') or 0:>11,} "
              f"{r['bytes'] / 1e6:>9.1f}  {str(r.get('created', '')):<19}  {r['status']}")
    print(f"{len(rows)} entries, {sum(r['bytes'] for r in rows) / 1e6:.1f} MB in {root}")
    return 0


def cmd_rm(args) -> int:
    from adalayers.store.cache.store import CacheError, list_entries, remove, remove_unfinished
    root = _root(args)
    entries = [r["key"] for r in list_entries(root)]
    if args.all:
        keys = entries
    else:
        if not args.keys:
            raise CacheError("name the keys to remove (see 'adalayers cache ls') or give --all")
        keys = []
        for k in args.keys:
            match = [e for e in entries if e.startswith(k)]
            if len(match) != 1:
                raise CacheError(f"{k!r} matches {len(match)} cache entries in {root}"
                                 + (f": {', '.join(match)}" if match else ""))
            keys += match
    for k in keys:
        remove(root, k)
        print(f"removed {k}")
    if args.all and root.is_dir():
        for name in remove_unfinished(root):
            print(f"removed unfinished {name}")
    if not keys:
        print(f"nothing to remove in {root}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("cache", help="build, list and remove cached hidden states")
    csub = p.add_subparsers(dest="cache_command", metavar="COMMAND")
    p.set_defaults(fn=lambda args: print_help(p))
    b = csub.add_parser("build", help="compute and store the base's hidden states for a config's dataset")
    add_config_args(b)
    b.add_argument("--shard", metavar="I/N",
                   help="build only part I of N (0-based) of every split, e.g. one task of a job array; the last "
                        "part to finish writes the entry's manifest (under torchrun the ranks split the work "
                        "without this)")
    b.set_defaults(fn=cmd_build, torchrun=True)
    for name, fn, help in [("ls", cmd_ls, "list cached entries"), ("rm", cmd_rm, "remove cached entries")]:
        c = csub.add_parser(name, help=help)
        c.add_argument("--dir", help="cache folder (default: $ADALAYERS_CACHE or ~/.cache/adalayers)")
        c.set_defaults(fn=fn)
    rm = csub.choices["rm"]
    rm.add_argument("keys", nargs="*", help="keys (or unique prefixes) from 'adalayers cache ls'")
    rm.add_argument("--all", action="store_true", help="remove every entry")
