"""What a decode step runs: the LM head only for rows that need a next token, the heads' last step without it."""
from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from adalayers.config import Config
from adalayers.infer.generate import Generation, Job
from adalayers.infer.params import GenerationParams
from adalayers.infer.sidetasks import Head, SideTasks
from adalayers.model.sidetask import SideTask
from tinydecoders import decoder_backbone

PROMPTS = ["the dog runs quickly and", "a book", "she loves the big movie . it is"]


def _head(bb, name: str, pin: int | None = None) -> Head:
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads, cfg.mixer.pin_layer, cfg.head.skip_bos = 16, 2, pin, bb.adds_bos
    torch.manual_seed(0)
    return Head(name, SideTask(cfg, bb.num_layers, bb.hidden_size, ["no", "yes"]).eval(), Path("."), 64)


@contextlib.contextmanager
def _calls(module: torch.nn.Module):
    """The batch size of every forward of `module` while open (as it runs: after any other pre-hook)."""
    rows: list[int] = []
    handle = module.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    try:
        yield rows
    finally:
        handle.remove()


def _run(side: SideTasks, jobs: list[Job]) -> None:
    loop = Generation(side)
    batch = loop.prefill(jobs)
    while batch is not None:
        batch = loop.step(batch)


def test_the_heads_last_step_skips_the_lm_head():
    bb = decoder_backbone("gemma3")
    side = SideTasks(bb, [_head(bb, "all")])
    with _calls(bb.model.get_output_embeddings()) as lm_rows, _calls(bb.layers[-1]) as last_layer:
        out = side.generate(PROMPTS, max_new_tokens=4, ignore_eos=True)
    assert all(r["tokens"] == 4 for r in out)
    # the prefill and the steps that feed tokens 1..3 need logits; the step that feeds token 4 to the heads does not
    assert lm_rows == [3, 3, 3, 3]
    assert len(last_layer) == 5  # ... but it runs every layer: the head reads the last one


def test_the_lm_head_reads_only_the_rows_that_go_on():
    bb = decoder_backbone("llama")
    side = SideTasks(bb, [_head(bb, "all")])
    alone = [side.generate(PROMPTS[:1], max_new_tokens=2, ignore_eos=True)[0],
             side.generate(PROMPTS[1:2], max_new_tokens=4, ignore_eos=True)[0]]
    short, long = (Job(side, [p], GenerationParams(max_new_tokens=n, ignore_eos=True)) for p, n in ((PROMPTS[0], 2), (PROMPTS[1], 4)))
    with _calls(bb.model.get_output_embeddings()) as lm_rows:
        _run(side, [short, long])
    assert lm_rows == [2, 2, 1, 1]  # after its 2nd token the short row leaves: its last step feeds the heads only
    for got, ref in zip((short.results[0], long.results[0]), alone):
        assert got["token_ids"] == ref["token_ids"]
        torch.testing.assert_close(torch.tensor(list(got["tasks"]["all"]["probabilities"].values())),
                                   torch.tensor(list(ref["tasks"]["all"]["probabilities"].values())),
                                   atol=1e-5, rtol=1e-5)


def test_the_heads_last_step_ends_after_their_deepest_layer():
    bb = decoder_backbone("gpt2")
    side = SideTasks(bb, [_head(bb, "early", pin=1)])  # reads state 1, the first layer's output
    with _calls(bb.layers[0]) as first, _calls(bb.layers[1]) as second:
        r = side.generate(PROMPTS[:1], max_new_tokens=3, ignore_eos=True)[0]
    assert len(first) == 4 and len(second) == 3  # prefill + 3 steps; the last one stops after layer 1
    ids = bb.tokenizer(PROMPTS[0])["input_ids"] + r["token_ids"]
    task = side.heads["early"].task
    batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        task.begin()
        bb(batch, taps=[task.tap])
        one = torch.softmax(task.end(batch["attention_mask"]), -1)[0]
    torch.testing.assert_close(torch.tensor(list(r["tasks"]["early"]["probabilities"].values())), one,
                               atol=1e-5, rtol=1e-5)


def test_a_decode_steps_heads_run_every_layer_at_once_with_the_same_numbers():
    """FusedTap(defer=...): a small pass's states held and run in flush() as one batched product over the
    layers per group of heads (k 8 and 16, one head pinned to a layer) equal each head's own tap (1e-5)."""
    from torch.overrides import TorchFunctionMode

    from adalayers.model.sidetask import shared_tap

    class Count(TorchFunctionMode):
        calls: dict = {}

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls[func.__name__] = Count.calls.get(func.__name__, 0) + 1
            return func(*args, **(kwargs or {}))

    torch.manual_seed(3)
    heads = []
    for k, pin in [(8, None), (16, None), (8, 2), (8, None)]:
        cfg = Config()
        cfg.mixer.k, cfg.head.num_heads, cfg.mixer.pin_layer = k, 2, pin
        task = SideTask(cfg, 5, 12, ["a", "b"]).eval()
        with torch.no_grad():
            task.mixer.p.copy_(torch.randn(5))
        heads.append(task)
    with torch.no_grad():
        heads[3].mixer.p[4] = -1e4  # the last layer unused by this one head only
    states = [torch.randn(3, 1, 12) for _ in range(5)]
    mask = torch.ones(3, 1, dtype=torch.long)
    with torch.inference_mode():
        alone = [h(states, mask) for h in heads]
        for h in heads:
            h.begin()
        tap = shared_tap(heads, defer=3)
        Count.calls = {}
        with Count():
            for i, z in enumerate(states):
                tap(i, z)
            assert "linear" not in Count.calls and "bmm" not in Count.calls  # nothing ran yet: held
            tap.flush()
        assert Count.calls.get("bmm") == 2 and "linear" not in Count.calls  # one product per group (k 8, k 16)
        assert 4 not in heads[3].used_layers() and 4 in heads[0].used_layers() + heads[2].used_layers()
        for a, h in zip(alone, heads):
            assert (a - h.end(mask)).abs().max() <= 1e-5
