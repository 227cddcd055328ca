"""A tiny Llama-architecture GGUF file, written with the `gguf` package: random F32 weights and a
byte-level BPE vocabulary (256 byte tokens, a few merges, BOS/EOS), small enough to write in
milliseconds and read by both llama.cpp and transformers."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


def write_tiny_llama(path: Path, layers: int = 3, d: int = 64, heads: int = 4, kv_heads: int = 2,
                     ff: int = 128, seed: int = 0, chat_template: str | None = None) -> Path:
    """`chat_template`: a Jinja chat template written into the metadata (tokenizer.chat_template), as an
    instruction-tuned model's file has one; None: none, as a pretrained base's."""
    import gguf

    rng = np.random.default_rng(seed)
    byte = _byte_tokens()
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r", "o n", "r e"]
    tokens = byte + [a + b for a, b in (m.split(" ") for m in merges)] + ["<s>", "</s>"]
    bos, eos = len(tokens) - 2, len(tokens) - 1
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(d // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (vocab - 2) + [gguf.TokenType.CONTROL] * 2)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(True)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def t(name, *shape, scale=0.1):
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    hd = d // heads
    t("token_embd.weight", vocab, d, scale=0.5)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        t(f"blk.{i}.attn_q.weight", heads * hd, d)
        t(f"blk.{i}.attn_k.weight", kv_heads * hd, d)
        t(f"blk.{i}.attn_v.weight", kv_heads * hd, d)
        t(f"blk.{i}.attn_output.weight", d, heads * hd)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        t(f"blk.{i}.ffn_gate.weight", ff, d)
        t(f"blk.{i}.ffn_up.weight", ff, d)
        t(f"blk.{i}.ffn_down.weight", d, ff)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
    t("output.weight", vocab, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
