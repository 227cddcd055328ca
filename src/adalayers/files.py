"""Files written whole or not at all, and their digests: the foundation under run folders, caches,
checkpoints and model conversions.

    atomic_write(path, data)   temporary file beside `path`, fsync, rename: readers never see half a file
    write_json(path, obj)      the same for JSON (indent 2, newline at the end)
    sha256(path)               of a file's bytes, or of a folder's relative paths and bytes in sorted order
    cache_root()               $ADALAYERS_CACHE, else ~/.cache/adalayers

Files are created with the mode the umask allows (0666 & ~umask), as open() would.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """The folder for converted models, joined model files, exported graphs and hidden-state caches."""
    return Path(os.environ.get("ADALAYERS_CACHE") or Path.home() / ".cache" / "adalayers").expanduser()


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """0666 without the bits the umask removes (what open() would create)."""
    return 0o666 & ~umask()


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def append_jsonl(path: Path, obj) -> None:
    """Append a line by rewriting the whole (small) file atomically."""
    old = Path(path).read_text(encoding="utf-8") if Path(path).exists() else ""
    atomic_write(path, old + json.dumps(obj) + "\n")


def sha256(path: Path) -> str:
    """sha256 of a file's bytes; of a folder (an extracted dataset), of every file's relative path and bytes
    in sorted order, so renaming, adding or changing any file changes it."""
    h, path = hashlib.sha256(), Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if file != path:
            h.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def remove_if_empty(folder: Path) -> None:
    """Delete `folder` when it holds nothing (e.g. a run that failed before its first file)."""
    try:
        Path(folder).rmdir()  # only succeeds on an empty folder
    except OSError:
        pass
