"""Put a built-in task's files into the data folder, checked by sha256.

Each task lists the files its reader needs (paths under the data folder), the public URL each comes
from, and its sha256; files inside an archive name their member, and the archive's own checksum is
checked when known. A file already present with the right checksum is kept; a download is written to a
temporary file, checked, and only then renamed into place, so a failed or wrong download leaves nothing.
Files already present and checked are reported as such with or without a network; only a missing or
changed file needs a download. Without a network (HF_HUB_OFFLINE=1, or no connection) the command says
in one short line which files to place in which folder; the sources are listed in docs/data.md.
"""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from adalayers.errors import DataError
from adalayers.files import sha256 as file_sha256


def github(repo: str, commit: str, path: str) -> str:
    return f"https://github.com/{repo}/raw/{commit}/{path}"


@dataclass(frozen=True)
class RemoteFile:
    path: str                     # under the data folder
    url: str
    sha256: str | None            # of the file written (None: trust the archive's checksum)
    member: str | None = None     # the file inside the archive at `url`
    archive_sha256: str | None = None


@dataclass(frozen=True)
class Source:
    files: list[RemoteFile]
    hub: str = ""                 # where the task is also published on the Hugging Face Hub (other format)
    note: str = ""


STSB = "mieseung/Cutoff_with_Attribution", "0ef7460ee83f01034891e92b4f405d2c14944daf"
SST_ZIP = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
SST_ZIP_SHA = "5c613a4f673fc74097d523a2c83f38e0cc462984d847b82c7aaf36b01cbbbfcc"

SOURCES: dict[str, Source] = {
    "cola": Source([
        RemoteFile("glue/CoLA/train.tsv", github("nyu-mll/CoLA-baselines", "dd095d36",
                                                 "acceptability_corpus/cola_public.zip"),
                   "f320a10f92d3bce6b29152fde322a362eac39238e50d8de0c8815457fdf4fc12",
                   member="cola_public/raw/in_domain_train.tsv"),
        RemoteFile("glue/CoLA/dev.tsv", github("amrnag/Specialized-Transformers", "fa673a93", "data/CoLA/dev.tsv"),
                   "8c013e21dc39957cac37378d87bebe225b694a0d5fe13eded66c2856628833fd")],
        hub="nyu-mll/glue (config cola)"),
    "stsb": Source([
        RemoteFile(f"glue/STS-B/{name}.tsv", github(*STSB, f"glue_data/STS-B/{name}.tsv"), sha)
        for name, sha in (("train", "41c4d978b6162abdcada7e49a982211954cca5459c228db478af333124b257a2"),
                          ("dev", "fe7dc0632a5033562f3cadff991f6e8d9b9b6311861660e78c3c82eb7db67f59"))],
        hub="nyu-mll/glue (config stsb)"),
    "qqp": Source([RemoteFile("qqp/subset.tsv", github(*STSB, "glue_data/QQP/new_dev.tsv"),
                              "9b6abc7c5798b857f8218d9ba46d0e678c2859369a9802cbdc336421e5e8d239")],
                  hub="nyu-mll/glue (config qqp, the full set)", note="a labelled subset of GLUE QQP"),
    "conll2003": Source([
        RemoteFile(f"conll2003/{name}", github("synalp/NER", "c0ea07c8", f"corpus/CoNLL-2003/{name}"), sha)
        for name, sha in (("eng.train", "eac0822f501353f265383ddf1edb0dcd42a1b6eefd3e383d7074db98c38eb41c"),
                          ("eng.testa", "aedc4ccbd1ae9795feaa0e86fe72d195b0258abed9d705b630d1c889276fac1e"),
                          ("eng.testb", "0632f32c090ef31c223135b7fee3187a7cf8e65c4015c7866bb7783428cdd9a6"))],
        hub="eriktks/conll2003"),
    "imdb": Source([RemoteFile("imdb/aclImdb_v1.tar.gz",
                               "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
                               "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe")],
                   hub="stanfordnlp/imdb", note="the official tarball (84 MB), read without unpacking"),
    "sst": Source([RemoteFile(f"sst/{name}.txt", SST_ZIP, None, member=f"trees/{name}.txt", archive_sha256=SST_ZIP_SHA)
                   for name in ("train", "dev", "test")], hub="stanfordnlp/sst (other format)",
                  note="the official PTB trees (tasks sst5 and sst2)"),
}


def data_folder(folder: str | None) -> Path:
    """--dir, else $ADALAYERS_DATA, else ../shared/data (the configs' task.data_dir)."""
    from adalayers.config import TaskConfig

    return Path(folder or os.environ.get("ADALAYERS_DATA") or TaskConfig.model_fields["data_dir"].default).expanduser()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def place_message(task: str, folder: Path, why: str, missing: list[str] | None = None) -> str:
    """One short line: what is wrong, which files to put where (the sources are in docs/data.md)."""
    files = ", ".join(missing if missing is not None else [f.path for f in SOURCES[task].files])
    return f"{why}: place {files} under {folder.resolve()} (sources: docs/data.md)"


def checked(f: RemoteFile, folder: Path) -> bool:
    """The file is in the data folder with its recorded sha256."""
    path = folder / f.path
    return path.is_file() and bool(f.sha256) and file_sha256(path) == f.sha256


def download(url: str, timeout: float = 60.0) -> bytes:
    import httpx

    with httpx.Client(follow_redirects=True, timeout=timeout) as client:
        r = client.get(url)
        r.raise_for_status()
        return r.content


def write_checked(path: Path, data: bytes, sha256: str | None, source: str) -> None:
    """Check, then write atomically: a wrong download never lands in the data folder."""
    if sha256 and sha256_bytes(data) != sha256:
        raise DataError(f"{source}: sha256 {sha256_bytes(data)[:16]}... does not match the expected "
                        f"{sha256[:16]}...; nothing was written")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def member(archive: bytes, name: str, source: str) -> bytes:
    try:
        if zipfile.is_zipfile(io.BytesIO(archive)):
            with zipfile.ZipFile(io.BytesIO(archive)) as z:
                return z.read(name)
        with tarfile.open(fileobj=io.BytesIO(archive)) as t:
            return t.extractfile(name).read()
    except (KeyError, AttributeError, tarfile.TarError, zipfile.BadZipFile) as e:
        raise DataError(f"{source}: no readable member {name!r} ({e})") from None


def fetch(task: str, folder: Path, get=download) -> list[str]:
    """Put `task`'s files under `folder`; returns one line per file (kept, or downloaded and checked)."""
    if task not in SOURCES:
        raise DataError(f"no public source known for {task!r} (known: {', '.join(SOURCES)})")
    files = SOURCES[task].files
    present = {f.path for f in files if checked(f, folder)}
    missing = [f.path for f in files if f.path not in present]
    if missing and offline():
        raise DataError(place_message(task, folder, "offline (HF_HUB_OFFLINE=1)", missing))
    done, archives = [], {}
    for f in files:
        path = folder / f.path
        if f.path in present:
            done.append(f"{path}: present, sha256 ok")
            continue
        try:
            if f.url not in archives:
                archives[f.url] = get(f.url)
        except Exception as e:  # noqa: BLE001  (no network, DNS, HTTP error: all end in the same advice)
            reason = (str(e).splitlines()[0] if str(e) else type(e).__name__)[:80]
            raise DataError(place_message(task, folder, f"could not download from {urlsplit(f.url).netloc} ({reason})",
                                          missing)) from None
        data = archives[f.url]
        if f.member:
            if f.archive_sha256 and sha256_bytes(data) != f.archive_sha256:
                raise DataError(f"{f.url}: sha256 does not match the expected {f.archive_sha256[:16]}...; "
                                f"nothing was written")
            data = member(data, f.member, f.url)
        write_checked(path, data, f.sha256, f.url + (f" ({f.member})" if f.member else ""))
        done.append(f"{path}: downloaded from {f.url}, {len(data):,} bytes, sha256 ok")
    return done
