"""llama.cpp's own tokenizer (adalayers.infer.llamacpp_tokenizer) against the transformers tokenizer read from the
same GGUF, as the llama.cpp runtime reads it (built once, kept, read back: adalayers.model.gguf_models.tokenizer):
the same ids on the test texts of every task the project ships (sentence pairs: each text alone; CoNLL: the words
joined by spaces, as served), and in a process where torch and transformers cannot be imported.
IMDB's 25,000 test reviews are read in part (the first --imdb-texts, 2,000 by default, both labels): the rest is
the same kind of text and would make the test minutes long.
The default run compares a fixed sample of each task's texts (SAMPLE, chosen by _sample: every text with a
non-ASCII character up to a third of it, the longest, those with rare ASCII symbols, the rest evenly spread), so CI
stays within its ~10 minutes; ADALAYERS_TOKENIZER_EVERY_TEXT=1 compares every text (about 18,000)."""
from __future__ import annotations

import functools
import os
import string
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from adalayers.infer.llamacpp import LlamaCpp, gguf_path  # noqa: E402
from adalayers.infer.llamacpp_tokenizer import GgufTokenizer  # noqa: E402

from tinygguf import write_tiny_llama  # noqa: E402

TASKS = ["cola", "sst2", "sst5", "stsb", "qqp", "conll2003", "imdb"]
IMDB_TEXTS = 2000
SAMPLE = 300  # texts per task in the default run (of 1,043 to 4,700)
EVERY_TEXT = os.environ.get("ADALAYERS_TOKENIZER_EVERY_TEXT") == "1"
COMMON = set(string.ascii_letters + string.digits + " .,'!?-")


def _installed(alias: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    from adalayers.model.model_packages import SPLIT_GGUF
    try:
        for dist, _ in SPLIT_GGUF[alias].parts:
            distribution(dist)
    except PackageNotFoundError:
        return False
    return True


@functools.cache  # read once for both bases
def _test_texts(task: str) -> list[str]:
    from adalayers.config import Config
    from adalayers.data.tasks import load_task

    cfg = Config()
    cfg.task.name = task
    data = load_task(cfg)
    split = data.splits.get("test") or data.splits["validation"]
    if task == "imdb":
        split = split[:IMDB_TEXTS // 2] + split[-IMDB_TEXTS // 2:]
    texts = []
    for ex in split:
        texts += [" ".join(ex.words)] if ex.words is not None else [ex.text] + ([ex.text_pair] if ex.text_pair else [])
    return texts


def _sample(texts: list[str], size: int = SAMPLE) -> list[str]:
    """At most `size` of `texts`, the same ones at every run, in their order: those with a non-ASCII character (up to
    a third of `size`, the longest first), then the longest texts and those with rare ASCII symbols (a sixth each),
    then texts evenly spread over the rest."""
    if len(texts) <= size:
        return list(texts)
    by_length = sorted(range(len(texts)), key=lambda i: (-len(texts[i]), i))
    picked: dict[int, None] = {}
    groups = ([i for i in by_length if not texts[i].isascii()], size // 3), (by_length, size // 6), \
        ([i for i in by_length if texts[i].isascii() and not set(texts[i]) <= COMMON], size // 6)
    for group, most in groups:
        picked.update(dict.fromkeys([i for i in group if i not in picked][:most]))
    rest = [i for i in range(len(texts)) if i not in picked]
    step = len(rest) / (size - len(picked))
    picked.update(dict.fromkeys(rest[int(k * step)] for k in range(size - len(picked))))
    return [texts[i] for i in sorted(picked)]


def test_the_sample_is_fixed_and_holds_the_unusual_and_the_longest_texts():
    texts = [f"plain text {i}" for i in range(1000)] + ["caf\u00e9 " * k for k in range(1, 151)] \
        + ["a <b> & c"] * 3 + ["x" * 5000]
    got = _sample(texts)
    assert len(got) == SAMPLE and got == _sample(texts) and got == [t for t in texts if t in got]  # in their order
    assert sum(not t.isascii() for t in got) >= SAMPLE // 3 and "caf\u00e9 " * 150 in got and "x" * 5000 in got
    assert got.count("a <b> & c") == 3 and _sample(texts[:10]) == texts[:10]
    plain = [t for t in got if t.startswith("plain")]
    assert plain[0] == "plain text 0" and int(plain[-1].split()[-1]) > 900  # spread over all of them


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["gemma3-270m", "qwen2.5-0.5b"])
def test_the_ids_equal_transformers_on_each_tasks_test_texts(alias, real_base_cache):
    if not _installed(alias):
        pytest.skip(f"{alias}'s packages are not installed")
    from adalayers.model import gguf_models
    from adalayers.model.model_packages import SPLIT_GGUF

    path = gguf_path(alias)  # joined once, in the user's cache (conftest.real_base_cache)
    engine = LlamaCpp(path, n_ctx=64, n_seq=1, n_batch=64, threads=1, read_states=False)
    ours = GgufTokenizer(engine)
    gguf_models.tokenizer(path, SPLIT_GGUF[alias].sha256)  # built from the GGUF (once per cache) ...
    theirs = gguf_models.tokenizer(path, SPLIT_GGUF[alias].sha256)  # ... and read back, as the runtime reads it
    differ, total = {}, 0
    for task in TASKS:
        texts = _test_texts(task) if EVERY_TEXT else _sample(_test_texts(task))
        want = theirs(texts)["input_ids"]
        bad = [t for t, w in zip(texts, want) if ours.encode(t) != w]
        total += len(texts)
        if bad:
            differ[task] = (len(bad), len(texts), bad[:2])
    assert not differ, differ
    assert total > (10_000 if EVERY_TEXT else SAMPLE * len(TASKS) - 1)
    engine.close()


def test_tokenizer_runs_without_torch_and_round_trips(tmp_path):
    """The tiny GGUF's byte vocabulary in a process where torch and transformers cannot be imported: ids, the
    text back, and each token's character span."""
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from adalayers.infer.llamacpp import LlamaCpp\n"
            "from adalayers.infer.llamacpp_tokenizer import GgufTokenizer\n"
            f"e = LlamaCpp({str(path)!r}, n_ctx=64, n_seq=1, n_batch=64, threads=1)\n"
            "t = GgufTokenizer(e)\ntext = 'the cat sat'\nids = t.encode(text)\n"
            "assert t.decode(ids, skip_special_tokens=True) == text, (ids, t.decode(ids))\n"
            "spans = [s for s in t.offsets(text, ids) if s != (0, 0)]\n"
            "assert ''.join(text[a:b] for a, b in spans) == text, spans\nprint(len(ids))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) >= len("the cat sat")
