"""Side tasks read during text generation: one pass of a decoder LLM serves its text and every head.

    side = SideTasks.load("gemma3-270m", ["runs/cola_gemma"])
    side.generate(["Write one sentence about cats."], max_new_tokens=32)
    # [{"prompt", "text", "finish": "length"|"eos"|"guard", "tokens",
    #   "prompt_tasks": {name: prediction on the prompt},          <- from the prefill's hooks
    #   "tasks": {name: prediction on prompt + answer (or on the answer alone, per head)},
    #   "steps": {name: [one value per generated token]}}]         <- sequence heads, with steps=True

How. The prompts are left-padded (every row's last token sits in the last column) and run once
(prefill) with the layer hooks on: each head's accumulator F (B, T, k) is filled exactly as in
SideTasks.predict, and the prompt predictions are read from it, with no extra forward. Each decode
step then feeds one token per row with the KV cache on; the hooks see Z_i of that one position and
each head's accumulator grows by one column. Mixer and projections act per token and a decoder
token never sees later ones, so after the last step F equals what one pass over the whole text
gives, and so does every head's prediction (tests/test_generate.py checks 1e-5). The last
generated token is fed once more (one extra decode step) so that the heads also read it.

Rows that end (end-of-text token, or a guard) keep being fed padding so the batch stays
rectangular; those positions are left out of every head's mask. With `steps` (or a `guard`),
sequence heads are read after every step: the head (small next to the base) runs on the F so far.
A guard {head: (label, threshold)} stops a row once that head gives the label at least that
probability (a streaming guard, e.g. a policy head).
"""
from __future__ import annotations

import re
from typing import Iterator

import torch

from adalayers.infer.outputs import head_output
from adalayers.infer.torch_runtime import cache_of, torch_forward
from adalayers.errors import DataError, ModelError
from adalayers.kinds import TaskKind


def _sample(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int,
            generator: torch.Generator | None, top_p: float = 1.0) -> torch.Tensor:
    """Greedy argmax, or a draw from p = softmax(logits / temperature) restricted to the top_k (0 = all)
    and to the nucleus: the most likely tokens whose probabilities, in decreasing order, sum to top_p
    (a token is kept when the mass before it is below top_p; the first one always)."""
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / max(temperature, 1e-6)
    if top_k and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        probs, order = torch.softmax(logits, -1).sort(-1, descending=True)
        cut = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.masked_fill(cut.scatter(-1, order, cut), float("-inf"))
    probs = torch.softmax(logits, -1)
    return torch.multinomial(probs.cpu() if generator is not None else probs, 1,
                             generator=generator).squeeze(-1).to(logits.device)


def check_request(side, prompts: list[str], max_new_tokens: int, tasks: list[str] | None, answer_only, guard,
                  ignore_eos: bool, runtime=None) -> tuple[list[str], dict, set]:
    """A generation request checked (DataError/ModelError naming the problem): (the heads to answer,
    the guard {head: (label, threshold)}, the end-of-text token ids; none with ignore_eos)."""
    backbone = side.backbone
    runtime = runtime or side.runtime.decoder()  # refuses a base that cannot generate
    names = side.check_tasks(tasks)
    for n in list(answer_only) + list(guard or {}):
        if n not in names:
            raise DataError(f"unknown task {n!r} in answer_only/guard; asked: {', '.join(names)}")
    if not prompts:
        raise DataError("no prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise DataError(f"prompt {i + 1} is empty")
    if not 1 <= int(max_new_tokens) <= 4096:
        raise DataError(f"max_new_tokens must be 1..4096, got {max_new_tokens}")
    guard = {n: (lab, float(th)) for n, (lab, th) in (guard or {}).items()}
    for n, (lab, _) in guard.items():
        if side.heads[n].kind == TaskKind.TOKENS or lab not in side.heads[n].task.labels:
            raise DataError(f"guard on {n!r}: needs a sequence head and one of its labels "
                            f"({', '.join(side.heads[n].task.labels)}), got {lab!r}")
    eos = set() if ignore_eos else runtime.eos_ids()  # ignore_eos: always max_new_tokens (benchmarks)
    return names, guard, eos


def stream(side, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
           do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, seed: int | None = None,
           steps: bool = False, answer_only: list[str] | tuple = (),
           guard: dict[str, tuple[str, float]] | None = None, ignore_eos: bool = False, top_p: float = 1.0,
           stop: list[str] | tuple = (), raw: bool = False) -> Iterator[dict]:
    """Generate, yielding {"event": "prompt", "results": [per prompt {task: output}], "token_ids": [per prompt]}
    after the prefill, {"event": "step", "step", "tokens": [text piece per prompt, None once ended],
    "ids": [token id per prompt, None once ended], "values": {task: [per prompt]}} per token, then
    {"event": "done", "results": [...]}.

    stop: strings that end a prompt's answer ("finish": "stop") once its text holds one; the token
    that completes it is the row's last (the heads read it, as a guard's), and "text" is cut before it.
    raw: the prompts are the text the base reads as they are (e.g. a rendered chat): the heads'
    task.template is not applied. The "done" event's "results" is what `generate` returns.
    """
    backbone = side.backbone
    runtime = side.runtime.decoder()
    names, guard, eos = check_request(side, prompts, max_new_tokens, tasks, answer_only, guard, ignore_eos, runtime)
    heads = [side.heads[n] for n in names]
    tok = backbone.tokenizer
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    # The lock and the hooks are held for one forward at a time, never across a yield: a server
    # resumes this generator on any thread (or drops it when the client leaves), and requests of
    # others run between two steps. Grad modes are per thread, so each step sets its own.
    wrapped = list(prompts) if raw else side.wrap(prompts)[0]  # the heads' task.template (e.g. the chat template)
    enc = tok(wrapped, padding=True, truncation=True, max_length=side.max_length, return_tensors="pt",
              return_offsets_mapping=tok.is_fast)
    ids, attn = enc["input_ids"].to(backbone.device), enc["attention_mask"].to(backbone.device)
    real = attn.bool().clone()        # positions the heads read: the prompt, then live answer tokens
    prompt_len = attn.shape[1]
    B = ids.shape[0]
    accs = {h.name: None for h in heads}

    def forward(input_ids, attention) -> torch.Tensor:
        """Prefill (the first call) or one decode step; every head taps it. -> next-token logits (B, vocab)."""
        logits, new = tapped(side, heads, lambda tap: runtime(input_ids, attention, tap))
        for name, step in new.items():
            accs[name] = step if accs[name] is None else torch.cat([accs[name], step], 1)
        return logits

    def read(name: str, mask: torch.Tensor, only_answer: bool = False) -> torch.Tensor:
        if only_answer:
            mask = mask.clone()
            mask[:, :prompt_len] = False
        return read_head(side, name, accs[name], mask, only_answer)

    logits = forward(ids, attn)
    prompt_out = {h.name: read(h.name, real) for h in heads}
    prompt_json = [{h.name: _output(h, prompt_out[h.name][b], _offsets(enc, b), p) for h in heads}
                   for b, p in enumerate(wrapped)]
    prompt_ids = [ids[b][attn[b].bool()].tolist() for b in range(B)]
    yield {"event": "prompt", "results": prompt_json, "token_ids": prompt_ids}
    generated = [[] for _ in range(B)]
    finish = [None] * B
    done = torch.zeros(B, dtype=torch.bool, device=ids.device)
    step_values = {n: [[] for _ in range(B)] for n in names if side.heads[n].kind != TaskKind.TOKENS
                   and (steps or n in guard)}
    for s in range(max_new_tokens):
        nxt = _sample(logits, do_sample, temperature, top_k, generator, top_p)
        nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
        live = ~done & ~torch.isin(nxt, torch.tensor(sorted(eos), dtype=nxt.dtype, device=nxt.device))
        for b in range(B):
            if done[b]:
                continue
            if live[b]:
                generated[b].append(int(nxt[b]))
            else:
                finish[b] = "eos"
        done = done | ~live
        for b in _stopped(tok, prompt_ids, generated, live, stop):  # ends after this token, as a guard
            finish[b], done[b] = "stop", True
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], 1)
        real = torch.cat([real, live.unsqueeze(1)], 1)
        last = s == max_new_tokens - 1 or bool(done.all())
        if last and not heads:
            yield {"event": "step", "step": s, "tokens": _pieces(tok, nxt, live), "ids": _ids(nxt, live), "values": {}}
            break
        logits = forward(nxt.unsqueeze(1), attn)  # the last one: for the heads only
        values = {}
        for n in step_values:
            v = read(n, real, n in answer_only)
            values[n] = v.tolist()
            for b in range(B):
                if live[b]:
                    step_values[n][b].append(v[b].tolist())
        for n, (lab, th) in guard.items():
            fired = live & (torch.as_tensor([row[side.heads[n].task.labels.index(lab)]
                                             for row in values[n]]) >= th).to(live.device)
            for b in torch.nonzero(fired).flatten().tolist():
                finish[b] = "guard"
            done = done | fired
        yield {"event": "step", "step": s, "tokens": _pieces(tok, nxt, live), "ids": _ids(nxt, live), "values": values}
        if last or bool(done.all()):
            break
    final = {h.name: read(h.name, real, h.name in answer_only) for h in heads}
    results = []
    for b, (prompt, read_prompt) in enumerate(zip(prompts, wrapped)):
        answer, answer_offsets = _answer(tok, prompt_ids[b], generated[b])
        r = {"prompt": prompt, "text": _cut(answer, stop), "tokens": len(generated[b]), "token_ids": generated[b],
             "finish": finish[b] or "length", "prompt_tasks": prompt_json[b], "tasks": {}}
        for h in heads:
            r["tasks"][h.name] = _output(h, final[h.name][b], _offsets(enc, b), read_prompt + answer,
                                         [(len(read_prompt) + a, len(read_prompt) + e) for a, e in answer_offsets])
        if step_values:
            r["steps"] = {n: v[b] for n, v in step_values.items()}
        results.append(r)
    yield {"event": "done", "results": results}


def generate(side, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
             **kw) -> list[dict]:
    """Text plus every side task's prediction, from the generation pass itself (see the module doc)."""
    for event in stream(side, prompts, max_new_tokens, tasks, **kw):
        if event["event"] == "done":
            return event["results"]
    raise RuntimeError("generation ended without a result")  # unreachable: stream always ends with done


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _ids(nxt: torch.Tensor, live: torch.Tensor) -> list[int | None]:
    return [int(t) if ok else None for t, ok in zip(nxt.tolist(), live.tolist())]


def _stopped(tok, prompt_ids: list[list[int]], generated: list[list[int]], live: torch.Tensor, stop) -> list[int]:
    """Rows whose answer so far (this step's token included, decoded after the prompt as `_answer`
    does) holds one of the stop strings."""
    if not stop:
        return []
    return [b for b in torch.nonzero(live).flatten().tolist()
            if any(s in answer_text(tok, prompt_ids[b], generated[b]) for s in stop)]


def answer_text(tok, prompt_ids: list[int], generated: list[int]) -> str:
    """The generated tokens' text as it continues the prompt's (decoded after the prompt's tokens, so
    the space a token puts before its word is kept; decoded alone, a tokenizer may strip it)."""
    head = tok.decode(prompt_ids, skip_special_tokens=True)
    full = tok.decode(prompt_ids + generated, skip_special_tokens=True)
    return full[len(head):] if full.startswith(head) else tok.decode(generated, skip_special_tokens=True)


def _cut(text: str, stop) -> str:
    """The text before the first of the stop strings in it (all of it when none is in it)."""
    return text[:min([i for i in (text.find(s) for s in stop) if i >= 0], default=len(text))]


def _pieces(tok, nxt: torch.Tensor, live: torch.Tensor) -> list[str | None]:
    return [tok.decode([int(t)]) if ok else None for t, ok in zip(nxt.tolist(), live.tolist())]


def _answer(tok, prompt_ids: list[int], generated: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """The answer as it continues the prompt's text, and each generated token's character span in it.

    Decoded after the prompt's tokens, so the space a token puts before its word is kept (decoded
    alone, a tokenizer strips it); a leading space belongs to no word.
    """
    spans, prev, text = [], 0, ""
    for j in range(len(generated)):
        text = answer_text(tok, prompt_ids, generated[: j + 1])
        piece = text[prev:]
        spans.append((prev + len(piece) - len(piece.lstrip()), len(text)))
        prev = len(text)
    return text, spans


def _offsets(enc, b: int) -> list[tuple[int, int]] | None:
    """Row b's character offsets per (left-padded) column, when the tokenizer gives them."""
    return [tuple(o) for o in enc["offset_mapping"][b].tolist()] if "offset_mapping" in enc else None


def tapped(side, heads: list, run):
    return side.tapped(heads, run)


def forward_step(side, heads: list, input_ids: torch.Tensor, attention: torch.Tensor, cache):
    return side.tapped(heads, lambda tap: torch_forward(side.backbone, input_ids, attention, cache, tap))


@torch.no_grad()
def read_head(side, name: str, acc: torch.Tensor, mask: torch.Tensor, only_answer: bool = False) -> torch.Tensor:
    """A head's values on its accumulator F under `mask`: class probabilities, or the value."""
    task = side.heads[name].task
    out = task.read(acc, mask, skip_bos=False if only_answer else None).float().cpu()
    return out if task.kind == TaskKind.REGRESSION else torch.softmax(out, -1)


def _output(head, values: torch.Tensor, offsets: list[tuple[int, int]] | None, text: str,
            answer_offsets: list[tuple[int, int]] | None = None) -> dict:
    return head_output(head.kind, head.task.labels, values, text, list(offsets or []) + list(answer_offsets or []))
