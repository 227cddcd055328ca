"""A GGUF base's transformers tokenizer, built from the file's vocabulary once and read back from a folder
(adalayers.model.gguf_models.tokenizer): the same ids, offsets, special tokens and chat template as building it
again, and a folder that would not read back the same is never kept."""
from __future__ import annotations

import pytest

pytest.importorskip("gguf", reason="the gguf package writes the tiny GGUF files")

from adalayers.files import cache_root  # noqa: E402
from adalayers.model import gguf_models  # noqa: E402
from adalayers.store.cache.source import tokenizer_hash  # noqa: E402

from tinygguf import write_tiny_llama  # noqa: E402

TEXTS = ["the cat sat", "Ünïcödé κύριος δούλος", "  spaces  and\ttabs\n", "a"]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"


def _kept(digest: str):
    return cache_root() / "models" / f"gguf-{digest[:16]}-tokenizer"


def test_the_tokenizer_is_built_once_and_reads_back_the_same(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    path = write_tiny_llama(tmp_path / "tiny.gguf", chat_template=TEMPLATE)
    built = gguf_models.tokenizer(path, "ab" * 32)
    assert (_kept("ab" * 32) / ".complete").is_file()

    def no_rebuild(*a, **kw):
        raise AssertionError("the vocabulary was read again")
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", no_rebuild)
    kept = gguf_models.tokenizer(path, "ab" * 32)
    assert gguf_models.same_tokenizer(built, kept)
    a, b = built(TEXTS, return_offsets_mapping=True), kept(TEXTS, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"] and a["offset_mapping"] == b["offset_mapping"]
    msgs = [{"role": "user", "content": "hi"}]
    assert kept.apply_chat_template(msgs, tokenize=False) == built.apply_chat_template(msgs, tokenize=False)


def test_the_first_load_keys_the_cache_as_every_later_load(tmp_path, monkeypatch):
    """A real base's vocabulary is built into its model's tokenizer class (Qwen2's for qwen2.5-0.5b), which the
    folder does not read back into; the class name is part of the hidden-states cache's key, so a first run that
    kept the built object wrote a cache (12.6 GB, an hour) that no later run found. Here the built tokenizer is
    given a class of its own, as a model's is."""
    from transformers import AutoTokenizer

    build = AutoTokenizer.from_pretrained

    def of_a_model_class(*a, **kw):
        tok = build(*a, **kw)
        tok.__class__ = type("ModelTokenizerFast", (type(tok),), {})
        return tok
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", of_a_model_class)
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    first, later = gguf_models.tokenizer(path, "12" * 32), gguf_models.tokenizer(path, "12" * 32)
    assert type(first) is type(later) and tokenizer_hash(first) == tokenizer_hash(later)


def test_a_folder_that_reads_back_otherwise_is_not_kept(tmp_path, monkeypatch):
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    monkeypatch.setattr(gguf_models, "same_tokenizer", lambda a, b: False)
    tok = gguf_models.tokenizer(path, "cd" * 32)
    assert tok("the cat")["input_ids"]
    assert not _kept("cd" * 32).exists()
    assert not any(p.name.startswith(".tokenizer-") for p in _kept("cd" * 32).parent.iterdir())


def test_same_tokenizer_sees_a_changed_normalizer(tmp_path):
    from tokenizers import normalizers

    path = write_tiny_llama(tmp_path / "tiny.gguf")
    a = gguf_models.tokenizer(path, "ef" * 32)
    b = gguf_models.tokenizer(path, "ef" * 32)
    assert gguf_models.same_tokenizer(a, b)
    b.backend_tokenizer.normalizer = normalizers.NFC()  # what Qwen2's tokenizer class adds on its own
    assert not gguf_models.same_tokenizer(a, b)
