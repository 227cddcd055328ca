"""A GGUF base's transformers tokenizer, built from the file's vocabulary once and read back from a folder
(adalayers.model.gguf_models.tokenizer): the same ids, offsets, special tokens and chat template as building it
again, and a folder that would not read back the same is never kept."""
from __future__ import annotations

import pytest

pytest.importorskip("gguf", reason="the gguf package writes the tiny GGUF files")

from adalayers.files import cache_root  # noqa: E402
from adalayers.model import gguf_models  # noqa: E402

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
