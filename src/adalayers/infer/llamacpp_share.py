"""How one llama.cpp context (adalayers.infer.llamacpp.LlamaCpp) is shared between the passes over texts and
the running generations: ContextShare, the part of a llama.cpp runtime that tells the doors about its room
(the torch llama.cpp runtime, infer/llamacpp_backbone, and the torch-free one, infer/gguf_serving).

No torch here: the torch-free serving path runs this module.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from adalayers.infer.llamacpp import end_of_generation

if TYPE_CHECKING:
    from adalayers.infer.llamacpp import LlamaCpp


class ContextShare:
    """What a runtime over one LlamaCpp context (self.engine) tells the doors about its room.

    The context is shared: one pass over texts (/predict) and the running generations (serve's scheduler).
    It is split in two fixed shares, so neither can starve the other:
      a pass holds at most  P_rows sequences and  P_tok = max(pass tokens, max_length) KV tokens (pass_share:
          half of each by default; rows_per_pass: max(1, min(wanted, P_rows, P_tok // max_length, rows that fit
          one pass's tokens)) rows of <= max_length);
      generations hold at most  n_seq - P_rows  sequences and  n_ctx - P_tok  KV tokens (generation_room),
          a row counted at its most: its prompt's tokens + its max_new_tokens (reserved while it runs).
    """
    engine: "LlamaCpp"
    tokenizer: object  # its eos_token_id

    def pass_share(self) -> tuple[int, int]:
        """(P_rows sequences, pass tokens) of the context kept for passes: half of each."""
        return self.engine.n_seq // 2, self.engine.n_ctx // 2

    def pass_tokens(self) -> int:
        """Tokens one pass decodes at once: one llama_decode's n_batch (a runtime that cuts passes: more)."""
        return self.engine.n_batch

    def rows_per_pass(self, max_length: int, wanted: int) -> int:
        """At most `wanted` rows of up to max_length tokens, within the passes' share of the context (above)."""
        rows, tokens = self.pass_share()
        share = min(rows, tokens // max_length, self.pass_tokens() // max_length)
        return max(1, min(wanted, share))

    def generation_room(self, max_length: int) -> tuple[int, int]:
        """(sequences, KV tokens) of the context left to generations beside the passes' share (above)."""
        rows, tokens = self.pass_share()
        return self.engine.n_seq - rows, max(0, self.engine.n_ctx - max(tokens, max_length))

    def prefill_tokens(self) -> int:
        """Prompt tokens one prefill takes (serve's scheduler prefills in groups): one pass's tokens."""
        return self.pass_tokens()

    def eos_ids(self) -> set[int]:
        """The tokens that end a generation: the tokenizer's end of text (self.tokenizer), and llama.cpp's."""
        eos = self.tokenizer.eos_token_id
        return ({eos} if eos is not None else set()) | end_of_generation(self.engine)

    def usage(self) -> dict:
        return {"llamacpp_sequences": self.engine.n_seq, "llamacpp_sequences_free": self.engine.free_sequences,
                "llamacpp_generation_sequences": self.engine.n_seq - self.pass_share()[0]}

    @property
    def continuous_batching(self) -> bool:
        """Rows join and leave a running batch as llama.cpp sequences (Sequences: merged / select)."""
        return True
