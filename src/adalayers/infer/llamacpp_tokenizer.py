"""llama.cpp's own tokenizer: the GGUF's vocabulary through llama_tokenize / llama_token_to_piece, no transformers.

    tok = GgufTokenizer(engine)                 # an adalayers.infer.llamacpp.LlamaCpp (its loaded model)
    ids = tok.encode("The cat sat.")            # BOS first when the GGUF says so (tokenizer.ggml.add_bos_token)
    tok.offsets("The cat sat.", ids)            # each token's (start, end) characters in the text
    tok.decode(ids[1:])                         # 'The cat sat.'

Special tokens written in the text (a chat template's <start_of_turn>) are read as special tokens, as a Hugging
Face tokenizer reads them. The torch-free serving path (adalayers.infer.gguf_serving) reads it as the rest of the
code reads a transformers tokenizer: tok(texts, truncation=True, max_length=..., return_offsets_mapping=True),
num_special_tokens_to_add, decode, bos_token / eos_token, chat_template and apply_chat_template (the GGUF's
tokenizer.chat_template rendered by Jinja2 as transformers renders it). tests/test_llamacpp_tokenizer.py checks that the ids equal the transformers
tokenizer's (read from the same GGUF) on the test texts of the tasks the project ships.
"""
from __future__ import annotations

import ctypes
import json

from adalayers.errors import DataError

MAX_LENGTH = 100_000  # model_max_length when the GGUF gives no training context


class GgufTokenizer:
    """The vocabulary of a model llama.cpp loaded (LlamaCpp.model); thread-safe (llama.cpp's vocab is read-only).
    decode is piece() joined (infer/answers.PieceTokenizer: a streamed answer decodes each token's bytes once)."""

    def __init__(self, engine):
        from adalayers.infer.llamacpp import _lib

        self._lib = lib = _lib()
        self.engine = engine  # held: the vocabulary lives as long as the model
        self.vocab = lib.llama_model_get_vocab(engine.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.adds_bos = bool(lib.llama_vocab_get_add_bos(self.vocab))
        self.adds_eos = bool(lib.llama_vocab_get_add_eos(self.vocab))
        self.bos_token_id = _id(lib.llama_vocab_bos(self.vocab))
        self.eos_token_id = _id(lib.llama_vocab_eos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._special: dict[int, bool] = {}
        self.model_max_length = int(lib.llama_model_n_ctx_train(engine.model)) or MAX_LENGTH
        self.chat_template: str | None = None  # set by whoever reads the GGUF's metadata (gguf_serving)
        self.is_fast = True      # character offsets: offsets()
        self.sep_token_id = None  # a decoder's vocabulary: no separator between a pair's texts
        self.pad_token_id = self.eos_token_id if self.eos_token_id is not None else self.bos_token_id

    # --- what the rest of the code reads of a transformers tokenizer ----------------------------------------
    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.piece(self.bos_token_id).decode("utf-8", "replace")

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self.piece(self.eos_token_id).decode("utf-8", "replace")

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return int(self.adds_bos) + int(self.adds_eos)

    def __call__(self, texts, text_pairs=None, truncation: bool = False, max_length: int | None = None,
                 add_special_tokens: bool = True, return_offsets_mapping: bool = False, **_ignored) -> dict:
        """{"input_ids": ids per text (one list for one text), "offset_mapping": per token (start, end)}: a text
        truncated to max_length tokens (special ones included) keeps its first tokens, as transformers does."""
        if text_pairs is not None:
            raise DataError("llama.cpp's tokenizer encodes single texts (a pair is joined into one by task.template)")
        one = isinstance(texts, str)
        ids, offs = [], []
        for text in [texts] if one else texts:
            body = self.encode(text, add_special_tokens=False)
            specials = self.num_special_tokens_to_add() if add_special_tokens else 0
            if truncation and max_length is not None:
                body = body[:max(0, max_length - specials)]
            row = ([self.bos_token_id] if add_special_tokens and self.adds_bos else []) + body + (
                [self.eos_token_id] if add_special_tokens and self.adds_eos else [])
            ids.append(row)
            if return_offsets_mapping:
                offs.append(self.offsets(text, row))
        out = {"input_ids": ids[0] if one else ids}
        if return_offsets_mapping:
            out["offset_mapping"] = offs[0] if one else offs
        return out

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, add_generation_prompt: bool = True,
                            chat_template: str | None = None, **extra) -> str:
        """The conversation rendered by the chat template (`chat_template`, else the GGUF's), in Jinja2's sandbox
        with transformers' settings (trim_blocks, lstrip_blocks, raise_exception, tojson)."""
        template = chat_template or self.chat_template
        if not template:
            raise DataError("the tokenizer has no chat template")
        return _render(template, messages=messages, add_generation_prompt=add_generation_prompt,
                       bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `text` (BOS/EOS as the GGUF asks, with add_special_tokens)."""
        data = text.encode("utf-8", "surrogatepass")
        n = max(8, len(data) + 8)
        while True:
            buf = (ctypes.c_int32 * n)()
            got = self._lib.llama_tokenize(self.vocab, data, len(data), buf, n, add_special_tokens, True)
            if got >= 0:
                return list(buf[:got])
            if -got <= n:
                raise DataError("llama.cpp cannot tokenize the text")
            n = -got

    def piece(self, token: int) -> bytes:
        """The bytes token `token` stands for in a text (a special token's own text; a byte token its byte)."""
        if token not in self._pieces:
            if not 0 <= token < self.n_vocab:
                raise DataError(f"token id {token} is not in the vocabulary (0..{self.n_vocab - 1})")
            buf = ctypes.create_string_buffer(256)
            got = self._lib.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
            if got < 0:
                buf = ctypes.create_string_buffer(-got)
                got = self._lib.llama_token_to_piece(self.vocab, token, buf, -got, 0, True)
            self._pieces[token] = buf.raw[:got]
        return self._pieces[token]

    def is_special(self, token: int) -> bool:
        """A control token (BOS, EOS, a chat template's markers): not text."""
        if token not in self._special:
            if not 0 <= token < self.n_vocab:
                raise DataError(f"token id {token} is not in the vocabulary (0..{self.n_vocab - 1})")
            self._special[token] = bool(self._lib.llama_vocab_is_control(self.vocab, token))
        return self._special[token]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of the ids (bytes joined first, so a character split over byte tokens comes out whole)."""
        pieces = [self.piece(t) for t in ids if not (skip_special_tokens and self.is_special(t))]
        return b"".join(pieces).decode("utf-8", "replace")

    def offsets(self, text: str, ids: list[int]) -> list[tuple[int, int]]:
        """Each token's character span in `text`: (0, 0) for a token the text does not hold where it goes on (an
        added BOS, a normalised piece); a special token written in the text spans its text; a token ending
        inside a character ends after that character."""
        data = text.encode("utf-8", "surrogatepass")
        char_at = [0] * (len(data) + 1)  # byte position -> index of the character it starts or sits in
        pos = 0
        for c, ch in enumerate(text):
            for _ in range(len(ch.encode("utf-8", "surrogatepass"))):
                char_at[pos] = c
                pos += 1
        char_at[len(data)] = len(text)
        out, cursor = [], 0
        for t in ids:
            p = self.piece(t)
            if not p or data[cursor:cursor + len(p)] != p:  # an added BOS, or a piece the text does not hold here
                out.append((0, 0))
                continue
            end = cursor + len(p)
            stop = char_at[end] if end == len(data) or char_at[end] != char_at[end - 1] else char_at[end] + 1
            out.append((char_at[cursor], stop))
            cursor = end
        return out


def _render(template: str, **context) -> str:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent,
                                                                                 ensure_ascii=ensure_ascii)
    return env.from_string(template).render(**context)


def _id(token) -> int | None:
    return int(token) if int(token) >= 0 else None
