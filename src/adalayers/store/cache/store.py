"""The on-disk store of hidden states: one folder per key, numpy .npy files plus a JSON manifest.

    <root>/<key>/
        manifest.json    written last: the key's fields, shapes, every file's size and sha256,
                         and a checksum of the manifest itself
        offsets.npy      int64 (rows + 1): row r's tokens are offsets[r]:offsets[r+1]
        s000-l03.npy     float16 (tokens of shard 0, d): layer 3 of shard 0's rows, no padding

Every layer of every shard is its own file, memory-mapped on read, so a run that uses layer 3
only ever opens s*-l03.npy. A file's sha256 is checked the first time a process opens it.
An entry is filled in a temporary folder and renamed into place while holding `<key>.lock`,
so concurrent builders never see (or leave) half an entry. A build split across processes
(`cache build --shard i/N`, or under torchrun) fills `.parts-<key>-ofN/`, each process its shards
and a part file checksumming them; the last one to finish writes the manifest over all of them.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from adalayers.errors import AdaLayersError
from adalayers.files import sha256, write_json

log = logging.getLogger(__name__)
FORMAT = 1
MANIFEST = "manifest.json"
OFFSETS = "offsets.npy"


class CacheError(AdaLayersError):
    """The cache cannot serve a batch (its rows do not match) or cannot be built."""


class CacheDamaged(Exception):
    """An entry failed a check; the caller rebuilds it."""


def layer_file(shard: int, layer: int) -> str:
    return f"s{shard:03d}-l{layer:02d}.npy"


def key_of(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def _manifest_checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def plan_shards(lengths: np.ndarray, hidden: int, shard_mb: float) -> list[tuple[int, int]]:
    """Split rows into consecutive shards of about shard_mb per layer file (at least one row each)."""
    cap = max(1, int(shard_mb * 1e6) // (2 * hidden))
    shards, start, tokens = [], 0, 0
    for r, n in enumerate(lengths.tolist()):
        if tokens and tokens + n > cap:
            shards.append((start, r))
            start, tokens = r, 0
        tokens += n
    shards.append((start, len(lengths)))
    return shards


@dataclass
class Plan:
    """Where a batch's tokens live: per shard, the tokens' rows in the file and their (b, t) in the batch."""
    lengths: np.ndarray
    parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # (shard, file rows, b, t, k)
    # k: the tokens' places in the batch's rows concatenated (the order of hidden[mask])


class Layout:
    """Rows -> shards -> token positions; shared by the writer and the reader."""

    def __init__(self, offsets: np.ndarray, shards: list[tuple[int, int]]):
        self.offsets = offsets
        self.shards = shards
        self.row_starts = np.array([a for a, _ in shards])
        self.tok_starts = offsets[self.row_starts]

    @property
    def num_rows(self) -> int:
        return len(self.offsets) - 1

    def shard_tokens(self, s: int) -> int:
        a, b = self.shards[s]
        return int(self.offsets[b] - self.offsets[a])

    def plan(self, rows: np.ndarray) -> Plan:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise CacheError(f"row index out of range (the cache holds {self.num_rows} rows)")
        n = self.offsets[rows + 1] - self.offsets[rows]
        b = np.repeat(np.arange(len(rows)), n)
        t = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
        g = np.repeat(self.offsets[rows], n) + t
        shard = np.searchsorted(self.row_starts, np.repeat(rows, n), side="right") - 1
        parts = []
        for s in np.unique(shard).tolist():
            k = np.flatnonzero(shard == s)
            parts.append((s, g[k] - self.tok_starts[s], b[k], t[k], k))
        return Plan(n, parts)


class Entry:
    """A finished entry, opened for reading. Layer files are mapped (and checksummed) on first use."""

    def __init__(self, folder: Path, manifest: dict, offsets: np.ndarray):
        self.folder, self.manifest = folder, manifest
        self.layout = Layout(offsets, [tuple(s) for s in manifest["shards"]])
        self.hidden = manifest["hidden_size"]
        self._arrays: dict[tuple[int, int], np.ndarray] = {}
        self.opened: set[str] = set()  # file names mapped so far (tests check that unused layers stay closed)

    def array(self, shard: int, layer: int) -> np.ndarray:
        if (shard, layer) not in self._arrays:
            name = layer_file(shard, layer)
            path = self.folder / name
            info = self.manifest["files"].get(name)
            if info is None or not path.is_file():
                raise CacheDamaged(f"{name} is missing")
            if path.stat().st_size != info["bytes"]:
                raise CacheDamaged(f"{name} has {path.stat().st_size} bytes, the manifest says {info['bytes']}")
            if sha256(path) != info["sha256"]:
                raise CacheDamaged(f"{name} does not match its checksum")
            try:
                arr = np.load(path, mmap_mode="r")
            except (ValueError, OSError) as e:
                raise CacheDamaged(f"{name} is not a readable .npy file ({e})") from None
            if arr.dtype != np.float16 or arr.shape != (self.layout.shard_tokens(shard), self.hidden):
                raise CacheDamaged(f"{name} has shape {arr.shape} {arr.dtype}")
            self._arrays[(shard, layer)] = arr
            self.opened.add(name)
        return self._arrays[(shard, layer)]

    def read(self, plan: Plan, layer: int, out: torch.Tensor) -> None:
        """Fill `out` with layer `layer` of the planned rows: packed (N, d) in the order of hidden[mask],
        or a zeroed (B, T, d) tensor at out[b, t].

        Packed, the float16 rows are gathered in batch order first and converted in one copy into
        `out`: a quarter of the time of converting, then scattering them (a cached token-head step
        reads every used layer of every batch this way)."""
        if out.dim() == 2:
            parts = plan.parts
            if len(parts) == 1:
                rows = self.array(parts[0][0], layer)[parts[0][1]]  # one shard: k is 0..N-1 already
            else:
                rows = np.empty(tuple(out.shape), dtype=np.float16)
                for shard, pos, _, _, k in parts:
                    rows[k] = self.array(shard, layer)[pos]
            out.copy_(torch.from_numpy(rows))
            return
        for shard, pos, b, t, _ in plan.parts:
            values = torch.from_numpy(self.array(shard, layer)[pos]).to(out.device, out.dtype)
            out[torch.from_numpy(b).to(out.device), torch.from_numpy(t).to(out.device)] = values


def open_entry(root: Path, key: str, fields: dict) -> Entry:
    """The entry for `key`, after cheap checks (manifest, sizes, offsets); raises CacheDamaged or FileNotFoundError."""
    folder = root / key
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(path)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        ok = manifest.get("checksum") == _manifest_checksum(manifest)
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise CacheDamaged(f"{MANIFEST} is not valid JSON ({e})") from None
    if not ok:
        raise CacheDamaged(f"{MANIFEST} was edited (its checksum does not match)")
    if manifest.get("fields") != fields:
        raise CacheDamaged(f"{MANIFEST} describes other data than its key")
    for name, info in manifest["files"].items():
        f = folder / name
        if not f.is_file():
            raise CacheDamaged(f"{name} is missing")
        if f.stat().st_size != info["bytes"]:
            raise CacheDamaged(f"{name} has {f.stat().st_size} bytes, the manifest says {info['bytes']}")
    if sha256(folder / OFFSETS) != manifest["files"][OFFSETS]["sha256"]:
        raise CacheDamaged(f"{OFFSETS} does not match its checksum")
    offsets = np.load(folder / OFFSETS)
    if offsets.ndim != 1 or len(offsets) != manifest["rows"] + 1 or offsets[-1] != manifest["tokens"]:
        raise CacheDamaged(f"{OFFSETS} does not fit the manifest")
    return Entry(folder, manifest, offsets)


@contextlib.contextmanager
def locked(root: Path, key: str):
    """Hold `<key>.lock` (an flock: released by the OS if the holder dies)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("cache: waiting for another process that is building %s ...", key)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def parts_folder(root: Path, key: str, parts: int) -> Path:
    """Where the processes of a sharded build (`cache build --shard i/N`, or torchrun) put their files."""
    return root / f".parts-{key}-of{parts:03d}"


def part_name(part: int, parts: int) -> str:
    return f"part-{part:03d}-of-{parts:03d}.json"


def _checksummed(folder: Path, names) -> dict:
    files = {}
    for name in sorted(names):
        path = folder / name
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[name] = {"bytes": path.stat().st_size, "sha256": sha256(path)}
    return files


def _finish(folder: Path, root: Path, key: str, manifest: dict) -> Path:
    """Write the manifest (last) into a filled folder and rename the folder into place as the entry."""
    manifest = {**manifest, "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "build": secrets.token_hex(8)}
    manifest["checksum"] = _manifest_checksum(manifest)
    write_json(folder / MANIFEST, manifest)  # last: an entry without a valid manifest is never read
    final = root / key
    if final.exists():  # a damaged entry: move it aside first (a folder cannot replace a full one)
        trash = root / f".old-{key}-{secrets.token_hex(4)}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(folder, final)
    return final


class Writer:
    """Fills a new entry; `commit()` checksums it, writes the manifest, renames it in.

    With `part=(i, N)` it is process i of a build split across N processes: it fills only the
    shards s with s % N == i, in a folder shared by the N processes, and `commit_part()` checksums
    its files into part-i-of-N.json (written last). The process that finds every part present
    assembles the entry (assemble_parts): one manifest listing and checksumming every shard's files.
    """

    def __init__(self, root: Path, key: str, fields: dict, info: dict, lengths: np.ndarray,
                 num_layers: int, hidden: int, shard_mb: float, part: tuple[int, int] | None = None):
        self.root, self.key, self.fields, self.info = root, key, fields, info
        self.num_layers, self.hidden, self.part = num_layers, hidden, part
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        self.layout = Layout(offsets, plan_shards(lengths, hidden, shard_mb))
        shards = range(len(self.layout.shards))
        if part is None:
            for stale in root.glob(f".tmp-{key}-*"):  # left by a builder that died (we hold the lock)
                shutil.rmtree(stale, ignore_errors=True)
            self.tmp = root / f".tmp-{key}-{os.getpid()}-{secrets.token_hex(4)}"
            self.tmp.mkdir(parents=True)
            self.own = list(shards)
        else:
            i, n = part
            self.tmp = parts_folder(root, key, n)
            self.tmp.mkdir(parents=True, exist_ok=True)
            self.own = [s for s in shards if s % n == i]
            (self.tmp / part_name(i, n)).unlink(missing_ok=True)
        tmp_offsets = self.tmp / f".{OFFSETS}.{os.getpid()}.tmp"  # every part writes the same offsets
        with open(tmp_offsets, "wb") as f:
            np.save(f, offsets)
        os.replace(tmp_offsets, self.tmp / OFFSETS)
        self.arrays = {(s, l): np.lib.format.open_memmap(self.tmp / layer_file(s, l), mode="w+", dtype=np.float16,
                                                          shape=(self.layout.shard_tokens(s), hidden))
                       for s in self.own for l in range(num_layers)}

    def write(self, plan: Plan, layer: int, values: np.ndarray) -> None:
        """values: (tokens, d) for the planned rows, concatenated in batch order."""
        for shard, pos, _, _, k in plan.parts:
            self.arrays[(shard, layer)][pos] = values if len(plan.parts) == 1 else values[k]

    def _flush(self) -> list[str]:
        names = [layer_file(s, l) for s, l in self.arrays]
        for arr in self.arrays.values():
            arr.flush()
        self.arrays.clear()
        return names

    def _manifest(self, files: dict) -> dict:
        return {"format": FORMAT, "key": self.key, "fields": self.fields, **self.info,
                "rows": self.layout.num_rows, "tokens": int(self.layout.offsets[-1]),
                "num_layers": self.num_layers, "hidden_size": self.hidden, "dtype": "float16",
                "shards": [list(s) for s in self.layout.shards], "files": files}

    def commit(self) -> Path:
        files = _checksummed(self.tmp, self._flush() + [OFFSETS])
        return _finish(self.tmp, self.root, self.key, self._manifest(files))

    def commit_part(self) -> None:
        """This process's shards are written: checksum them into its part file (written last)."""
        i, n = self.part
        files = _checksummed(self.tmp, self._flush())
        write_json(self.tmp / part_name(i, n), {**self._manifest(files), "part": i, "parts": n, "own": self.own})

    def abort(self) -> None:
        self.arrays.clear()
        if self.part is None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def missing_parts(root: Path, key: str, parts: int) -> list[int]:
    folder = parts_folder(root, key, parts)
    return [i for i in range(parts) if not (folder / part_name(i, parts)).is_file()]


def assemble_parts(root: Path, key: str, fields: dict, parts: int) -> Path | None:
    """Once every part of a sharded build is written: one entry whose manifest lists and checksums
    every shard's files (and the offsets), written last. None while parts are missing. Call it
    holding the key's lock."""
    folder = parts_folder(root, key, parts)
    if missing_parts(root, key, parts):
        return None
    metas = [json.loads((folder / part_name(i, parts)).read_text(encoding="utf-8")) for i in range(parts)]
    files: dict = {}
    for m in metas:
        if m["fields"] != fields or m["shards"] != metas[0]["shards"]:
            raise CacheError(f"{folder}: part {m['part']} of {parts} was built from other data or settings; "
                             f"remove the folder ('adalayers cache rm --all') and build again")
        files.update(m["files"])
    expected = {layer_file(s, l) for s in range(len(metas[0]["shards"])) for l in range(metas[0]["num_layers"])}
    if set(files) != expected:
        raise CacheError(f"{folder}: the parts do not cover every shard; remove the folder and build again")
    files.update(_checksummed(folder, [OFFSETS]))
    manifest = {k: v for k, v in metas[0].items() if k not in ("part", "own", "files")}
    manifest["files"] = dict(sorted(files.items()))
    for i in range(parts):
        (folder / part_name(i, parts)).unlink()
    return _finish(folder, root, key, manifest)


def incomplete_build(root: Path, key: str) -> str | None:
    """A sharded build of `key` that is missing parts: a message saying which, else None."""
    for folder in sorted(root.glob(f".parts-{key}-of*")):
        parts = int(folder.name.rsplit("-of", 1)[1])
        missing = missing_parts(root, key, parts)
        if missing:
            todo = ", ".join(f"--shard {i}/{parts}" for i in missing)
            return (f"cache entry {key} is incomplete: {len(missing)} of {parts} shard parts are missing "
                    f"({todo}); finish them with 'adalayers cache build CONFIG {todo.split(', ')[0]}' (one "
                    f"per missing part), or remove the parts with 'adalayers cache rm --all'")
    return None


def list_entries(root: Path) -> list[dict]:
    """Every entry under root with its manifest's summary, or a note when it is damaged."""
    out = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        row = {"key": folder.name, "bytes": sum(f.stat().st_size for f in folder.iterdir() if f.is_file())}
        try:
            m = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
            if m.get("checksum") != _manifest_checksum(m):
                raise ValueError("manifest edited")
            row.update({k: m.get(k) for k in ("task", "split", "base", "rows", "tokens", "num_layers", "created")})
            row["status"] = "ok"
        except (OSError, ValueError, AttributeError) as e:
            row["status"] = f"damaged ({type(e).__name__})"
        out.append(row)
    return out


def remove(root: Path, key: str) -> None:
    with locked(root, key):
        folder = root / key
        if folder.exists():
            trash = root / f".old-{key}-{secrets.token_hex(4)}"
            os.replace(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
    (root / f"{key}.lock").unlink(missing_ok=True)


def remove_unfinished(root: Path) -> list[str]:
    """Temporary folders left by builders that died (skipping any whose key is being built right now)."""
    removed = []
    for folder in sorted(root.glob(".tmp-*")) + sorted(root.glob(".old-*")) + sorted(root.glob(".parts-*")):
        key = folder.name.split("-")[1]
        with open(root / f"{key}.lock", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed
