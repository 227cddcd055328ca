"""The llama.cpp runtime: a GGUF base run by llama.cpp, the heads fed through its eval callback.

    base = LlamaCppBackbone.load("gemma3-270m")            # or a .gguf path
    SideTasks.from_backbone(base, ["runs/cola_gemma"]).predict(["The book was written by John."])

LlamaCppBackbone is a Runtime (adalayers.infer.runtime) and its own base: a forward with layer taps as
Backbone's (so TappedRuntime's pass), rows_per_pass (one llama_batch per pass), decoder() (LlamaCppDecoder)
and generation_room (the share of the one context that serve's continuous batching may hold).

Texts are tokenized by the same Hugging Face tokenizer as on the default runtime (read from the GGUF's
own metadata), so both runtimes see the same ids, BOS and template; each row of a batch becomes one
llama.cpp sequence at positions 0..n-1 (what the default runtime counts from the mask), and the rows
run as one llama_batch. The states arrive per token (adalayers.infer.llamacpp) and are laid out as
(B, T, d) with the batch's left padding zero, as the layer hooks give them, so the heads' taps, masks
and outputs are the same code on both runtimes.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from adalayers.data.windows import consecutive
from adalayers.data.templates import prepends_bos
from adalayers.model.backbone import BaseOutput, Tap
from adalayers.infer.llamacpp import LlamaCpp, Row, Sequences, gguf_path  # noqa: F401  (gguf_path: here too)
from adalayers.infer.llamacpp_share import ContextShare
from adalayers.infer.runtime import TappedRuntime

log = logging.getLogger(__name__)
MAX_BATCH = 4096  # tokens of one llama_decode at most (n_batch = n_ubatch), whatever the context


class LlamaCppBackbone(ContextShare, TappedRuntime):
    """The llama.cpp runtime, and the base it runs (tokenizer, sizes, fingerprint, a forward with layer taps)."""

    is_causal, is_encoder_decoder, states = True, False, "decoder"
    runtime_name = "llama.cpp"  # what a cache entry of its states is keyed on beside the fingerprint
    device = torch.device("cpu")

    def __init__(self, engine: LlamaCpp, tokenizer, name: str, path: Path):
        self.engine, self.tokenizer, self.name, self.path = engine, tokenizer, name, path
        self.num_layers = engine.num_states
        self.hidden_size = engine.d
        if tokenizer.pad_token is None:  # as Backbone: pad with end-of-text (always masked out)
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.bos_token
        tokenizer.padding_side = "left"
        self.adds_bos = prepends_bos(tokenizer)
        self._fingerprint: str | None = None

    @classmethod
    def load(cls, name: str, n_ctx: int = 4096, n_seq: int = 32, threads: int | None = None,
             read_states: bool = True) -> "LlamaCppBackbone":
        from adalayers.model import gguf_models, model_packages

        path = gguf_path(name)
        # one decode takes at most n_batch tokens in one graph (the eval callback needs n_ubatch = n_batch), and
        # llama.cpp reserves its compute buffer for n_ubatch tokens' logits (Gemma 3: 1 MB a token): a larger
        # context does not make the batch larger (at n_ctx 32768 the context could not be made at all)
        engine = LlamaCpp(path, n_ctx=n_ctx, n_seq=n_seq, n_batch=min(n_ctx, MAX_BATCH), threads=threads,
                          read_states=read_states)
        known = model_packages.SPLIT_GGUF.get(name)  # its sha256 is pinned: no need to hash the file again
        tokenizer = gguf_models.tokenizer(path, known.sha256 if known else None)  # built once, then ~1 s
        return cls(engine, tokenizer, name, path)

    @property
    def base(self) -> "LlamaCppBackbone":
        return self

    # what the Predictor and run folders ask of a base
    model = None  # no torch module

    def fingerprint(self) -> str:
        """The default runtime's fingerprint of the same GGUF (config + its dequantized weights), so a head trained
        on either runtime loads on both. Computed once per file from its conversion and kept beside it."""
        if self._fingerprint is None:
            from adalayers.model.backbone import gguf_fingerprint

            self._fingerprint = gguf_fingerprint(self.path)
        return self._fingerprint

    def num_parameters(self) -> int:
        return self.engine.n_params

    def __call__(self, batch: dict, taps: list[Tap] = (), stop_after: int | None = None) -> BaseOutput:
        """As Backbone's forward (TappedRuntime.forward calls it): taps get Z_i (B, T, d), zero on padding; logits
        (B, 1, vocab) of each row's last token (None when stopped early). The rows run as one llama_batch when they
        fit the context (free sequences, n_batch tokens); a larger batch (training's, evaluation's) runs in groups
        of rows that fit, each state gathered over the groups before the taps see it."""
        ids, mask = batch["input_ids"], batch["attention_mask"].bool()
        groups = self._groups(mask.sum(1).tolist())
        if len(groups) == 1:
            logits = self._pass(ids, mask, taps, stop_after)
        else:
            held: dict[int, list[torch.Tensor]] = {}
            keep = [lambda i, z: held.setdefault(i, []).append(z)] if taps else []
            parts = [self._pass(ids[a:b], mask[a:b], keep, stop_after) for a, b in groups]
            for i in sorted(held):
                z = torch.cat(held[i])
                for tap in taps:
                    tap(i, z)
            logits = None if stop_after is not None else torch.cat(parts)
        if logits is None:
            return BaseOutput(None, None, None)
        return BaseOutput(None, None, logits.unsqueeze(1))

    def _groups(self, lengths: list[int]) -> list[tuple[int, int]]:
        """Consecutive rows [a, b) in groups of at most the free sequences and n_batch tokens (a row longer than
        n_batch stays alone: llama.cpp refuses it in one line)."""
        return consecutive(lengths, self.engine.n_batch, max(1, self.engine.free_sequences))

    def _pass(self, ids: torch.Tensor, mask: torch.Tensor, taps, stop_after: int | None) -> torch.Tensor | None:
        seqs = self.engine.acquire(ids.shape[0])
        try:
            return self.run(ids, mask, seqs, taps, stop_after)
        finally:
            self.engine.release(seqs)

    def run(self, ids: torch.Tensor, mask: torch.Tensor, seqs: list[int], taps, stop_after: int | None = None,
            start: torch.Tensor | None = None) -> torch.Tensor | None:
        """Row b's real tokens (mask) appended to sequence seqs[b] from position start[b] (0: a new sequence), all
        rows as one llama_batch; each tap gets Z_i laid out as ids, (B, T, d), zero where mask is False. Every
        position's output is asked for while a tap reads the last state (llama.cpp computes the last layer only
        for output rows). -> next-token logits (B, vocab) at each row's last token, or None when stopped early."""
        B, T = ids.shape
        start = torch.zeros(B, dtype=torch.long) if start is None else start
        rows = [Row(ids[b][mask[b]].tolist(), seq=seqs[b], start=int(start[b])) for b in range(B)]
        flat = mask.flatten()
        dense = bool(flat.all())  # a decode step: one token per row, no padding

        def scatter(i: int, z: np.ndarray) -> None:
            if dense:
                full = torch.from_numpy(z)
            else:
                full = torch.zeros(B * T, self.hidden_size)
                full[flat] = torch.from_numpy(z)
            for tap in taps:
                tap(i, full.view(B, T, self.hidden_size))

        logits = self.engine.run(rows, [scatter] if taps else [], stop_after)
        return None if logits is None else torch.from_numpy(logits)

    def decoder(self) -> "LlamaCppDecoder":
        return LlamaCppDecoder(self)


class LlamaCppDecoder:
    """Prefill and decode steps on llama.cpp (adalayers.infer.runtime.Decoder): each row of a generation is one
    sequence of the context (Sequences, its cache), held from the prefill until the row leaves."""

    interruptible = False  # the taps run inside llama.cpp's eval callback: an exception there cannot stop it

    def __init__(self, base: LlamaCppBackbone):
        self.base = base

    def eos_ids(self) -> set[int]:
        return self.base.eos_ids()

    def prefill(self, input_ids: torch.Tensor, attention: torch.Tensor, tap) -> tuple[torch.Tensor, "Sequences"]:
        """The prompts' real tokens, each row a new sequence from position 0."""
        seqs = Sequences(self.base.engine, input_ids.shape[0])
        return self.base.run(input_ids, attention.bool(), seqs.ids, [tap] if tap is not None else []), seqs

    def step(self, input_ids: torch.Tensor, attention: torch.Tensor, cache: "Sequences", tap,
             logits_for: list[int] | None = None, stop_after: int | None = None
             ) -> tuple[torch.Tensor | None, "Sequences"]:
        """One token per row appended to its sequence, after the tokens it holds (its attention's ones).
        logits_for=[]: the graph ends after state stop_after (default: the final norm), LM head skipped. Other
        rows' logits cannot be skipped alone here: llama.cpp's last layer computes only the rows whose output is
        asked for, and the heads read every row's final state; the rows of logits_for are picked afterwards."""
        step = attention[:, -input_ids.shape[1]:].bool()
        start = attention.sum(1) - input_ids.shape[1]
        none = logits_for is not None and not logits_for
        stop = (self.base.num_layers - 1 if stop_after is None else stop_after) if none else None
        logits = self.base.run(input_ids, step, cache.ids, [tap] if tap is not None else [], stop, start=start)
        return (logits if logits_for is None or none else logits[logits_for]), cache
