"""llama.cpp's own tokenizer: the GGUF's vocabulary through llama_tokenize / llama_token_to_piece, no transformers.

    tok = GgufTokenizer(engine)                 # an adalayers.infer.llamacpp.LlamaCpp (its loaded model)
    ids = tok.encode("The cat sat.")            # BOS first when the GGUF says so (tokenizer.ggml.add_bos_token)
    tok.offsets("The cat sat.", ids)            # each token's (start, end) characters in the text
    tok.decode(ids[1:])                         # 'The cat sat.'

Special tokens written in the text (a chat template's <start_of_turn>) are read as special tokens, as a Hugging
Face tokenizer reads them. tests/test_llamacpp_tokenizer.py checks that the ids equal the transformers
tokenizer's (read from the same GGUF) on the test texts of the tasks the project ships.
"""
from __future__ import annotations

import ctypes

from adalayers.errors import DataError


class GgufTokenizer:
    """The vocabulary of a model llama.cpp loaded (LlamaCpp.model); thread-safe (llama.cpp's vocab is read-only)."""

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
        return bool(self._lib.llama_vocab_is_control(self.vocab, token))

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


def _id(token) -> int | None:
    return int(token) if int(token) >= 0 else None
