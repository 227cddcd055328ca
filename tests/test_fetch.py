"""`adalayers data fetch`: offline it names the folder in one line; with a network (here a loopback HTTP
server standing in for the public host) it writes only files whose sha256 matches."""
from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from functools import partial

import pytest

from adalayers import cli
from adalayers.errors import DataError
from adalayers.data.tasks import fetch


def test_offline_says_which_folder_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["data", "fetch", "cola", "--dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err == ("error: offline (HF_HUB_OFFLINE=1): place glue/CoLA/train.tsv, glue/CoLA/dev.tsv under "
                   + str((tmp_path / "data").resolve()) + " (sources: docs/data.md)")
    assert "http" not in err  # the URLs are in docs/data.md, not in the one line
    assert not (tmp_path / "data").exists()


def _toy_files(tmp_path, monkeypatch, url="http://127.0.0.1:9/unreachable"):
    """A task 'toy' of two files; the first one placed in tmp_path/data with its right checksum."""
    good, other = b"a\t1\n", b"b\t0\n"
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    monkeypatch.setitem(fetch.SOURCES, "toy", fetch.Source([fetch.RemoteFile("toy/train.tsv", f"{url}/a", sha(good)),
                                                            fetch.RemoteFile("toy/dev.tsv", f"{url}/b", sha(other))]))
    data = tmp_path / "data"
    (data / "toy").mkdir(parents=True)
    (data / "toy" / "train.tsv").write_bytes(good)
    return data, other


def test_offline_with_the_files_present_and_checked_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data, other = _toy_files(tmp_path, monkeypatch)
    assert cli.main(["data", "fetch", "toy", "--dir", str(data)]) == 2  # dev.tsv missing: only it is named
    err = capsys.readouterr().err.strip()
    assert "place toy/dev.tsv under" in err and "train.tsv" not in err
    (data / "toy" / "dev.tsv").write_bytes(other)
    assert cli.main(["data", "fetch", "toy", "--dir", str(data)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{data / 'toy' / 'train.tsv'}: present, sha256 ok", f"{data / 'toy' / 'dev.tsv'}: present, sha256 ok"]
    (data / "toy" / "dev.tsv").write_bytes(other + b"changed")  # present but changed: offline, it must be placed
    assert cli.main(["data", "fetch", "toy", "--dir", str(data)]) == 2
    assert "place toy/dev.tsv under" in capsys.readouterr().err


def test_every_task_of_the_issue_has_a_source():
    assert {"cola", "imdb", "conll2003", "sst", "stsb", "qqp"} <= set(fetch.SOURCES)
    for src in fetch.SOURCES.values():
        assert all(f.sha256 or f.archive_sha256 for f in src.files)


def test_data_alone_prints_its_help(capsys):
    assert cli.main(["data"]) == 0 and "fetch" in capsys.readouterr().out


@pytest.fixture()
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join(timeout=5)


def test_download_is_checked_before_it_lands(server, tmp_path, monkeypatch):
    root, url = server
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    good = b"gj04\t1\t\tOur friends won't buy this analysis.\n"
    (root / "train.tsv").write_bytes(good)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pack/dev.tsv", b"dev rows\n")
    (root / "pack.zip").write_bytes(buf.getvalue())
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    monkeypatch.setitem(fetch.SOURCES, "toy", fetch.Source([
        fetch.RemoteFile("toy/train.tsv", f"{url}/train.tsv", sha(good)),
        fetch.RemoteFile("toy/dev.tsv", f"{url}/pack.zip", sha(b"dev rows\n"), member="pack/dev.tsv",
                         archive_sha256=sha(buf.getvalue()))]))
    data = tmp_path / "data"
    lines = fetch.fetch("toy", data)
    assert (data / "toy" / "train.tsv").read_bytes() == good and (data / "toy" / "dev.tsv").read_bytes() == b"dev rows\n"
    assert all("sha256 ok" in ln for ln in lines)
    assert all("present" in ln for ln in fetch.fetch("toy", data))  # a second fetch keeps the checked files

    (data / "toy" / "train.tsv").unlink()
    (root / "train.tsv").write_bytes(good.replace(b"1", b"0"))  # the host now serves other bytes
    with pytest.raises(DataError, match="does not match the expected .*nothing was written"):
        fetch.fetch("toy", data)
    assert not (data / "toy" / "train.tsv").exists() and not list((data / "toy").glob(".*tmp"))

    monkeypatch.setitem(fetch.SOURCES, "gone", fetch.Source([fetch.RemoteFile("x/y.tsv", f"{url}/nope.tsv", "0" * 64)]))
    with pytest.raises(DataError, match=r"could not download from 127.0.0.1:\d+ \(.*\): place x/y.tsv under .* \(sources: docs/data.md\)$"):
        fetch.fetch("gone", data)


def test_every_source_url_is_in_docs_data_md():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text(encoding="utf-8")
    for src in fetch.SOURCES.values():
        for f in src.files:
            url = f.url if "conll2003" not in f.path or f.path.endswith("eng.train") else f.url.rsplit("/", 1)[0]
            assert url in docs, url


def test_the_readme_quickstart_fetch_works_offline_as_written(monkeypatch, capsys):
    """The README's quickstart, from the clone's root with the data folder beside it, sets nothing first."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert "export" not in block and re.search(r"^adalayers data fetch cola", block, re.M)
    if not (root.parent / "shared" / "data" / "glue" / "CoLA" / "train.tsv").is_file():
        pytest.skip("no ../shared/data beside the clone")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(root)
    assert cli.main(["data", "fetch", "cola"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["../shared/data/glue/CoLA/train.tsv: present, sha256 ok",
                       "../shared/data/glue/CoLA/dev.tsv: present, sha256 ok"]
