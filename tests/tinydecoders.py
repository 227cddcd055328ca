"""Tiny random decoder LLMs (GPT-2, Llama, Gemma 3, Qwen2, OPT, GPT-NeoX) and word-level tokenizers, built locally."""
from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from adalayers.model.backbone import Backbone
from conftest import WORDS

DECODERS = ("gpt2", "llama", "gemma3", "qwen2", "opt", "gpt_neox")


def decoder_tokenizer(bos: bool) -> PreTrainedTokenizerFast:
    """Whitespace words; with `bos`, '<s>' before every text (as Gemma and Llama); no pad token (as GPT-2)."""
    vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>"] + list(WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",  # as Gemma's, Llama's
                                                           special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def decoder_model(kind: str, vocab_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    ids = dict(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2)
    small = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=37,
                 max_position_embeddings=256, **ids)
    if kind == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=3, n_head=2, n_positions=256, **ids))
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=1, **small))
    if kind == "gemma3":
        cfg = transformers.Gemma3TextConfig(num_key_value_heads=1, head_dim=16, sliding_window=4,
                                            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                            pad_token_id=0, **small)
        return transformers.Gemma3ForCausalLM(cfg)
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=1, **small))
    if kind == "opt":
        cfg = transformers.OPTConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, ffn_dim=37,
                                     word_embed_proj_dim=32, max_position_embeddings=256, pad_token_id=0, **ids)
        return transformers.OPTForCausalLM(cfg)
    if kind == "gpt_neox":
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**small))
    raise ValueError(kind)


def decoder_backbone(kind: str, bos: bool | None = None) -> Backbone:
    """Llama and Gemma tokenizers prepend BOS; GPT-2, Qwen2, OPT(here), GPT-NeoX do not."""
    tok = decoder_tokenizer(kind in ("llama", "gemma3") if bos is None else bos)
    return Backbone(decoder_model(kind, len(tok)), tok, f"tiny-{kind}")


# a chat template every tiny decoder tokenizer can render: "<s>they love CONTENT . it is"
TINY_CHAT = ("{{ bos_token }}{% for m in messages %}they love {{ m['content'] }} .{% endfor %}"
             "{% if add_generation_prompt %} it is{% endif %}")


def chat_decoder_folder(folder) -> Backbone:
    """A tiny Llama with TINY_CHAT saved as a model folder (what `serve --base FOLDER` loads), loaded back."""
    tok = decoder_tokenizer(True)
    tok.chat_template = TINY_CHAT
    decoder_model("llama", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return Backbone.load(str(folder))
