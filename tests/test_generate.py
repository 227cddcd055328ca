"""SideTasks.generate on tiny random decoders: prefill + decode accumulation equals one pass over the whole text."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adalayers.config import Config
from adalayers.errors import DataError, ModelError
from adalayers.infer.sidetasks import Head, SideTasks
from adalayers.model.sidetask import SideTask
from conftest import tiny_backbone, tiny_tokenizer
from tinydecoders import decoder_backbone

PROMPTS = ["the dog runs quickly and", "a book", "she loves the big movie . it is"]


def _head(bb, name: str, kind: str, pooling: str = "mean", seed: int = 0) -> Head:
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads, cfg.head.dim_feedforward = 16, 2, 32
    cfg.head.kind, cfg.head.pooling, cfg.head.skip_bos = kind, pooling, bb.adds_bos
    torch.manual_seed(seed)
    labels = ["O", "B-X", "I-X"] if kind == "token" else ["no", "yes"]
    return Head(name, SideTask(cfg, bb.num_layers, bb.hidden_size, labels).eval(), Path("."), 64)


def _side(kind: str) -> SideTasks:
    bb = decoder_backbone(kind)
    return SideTasks(bb, [_head(bb, "mean", "sequence"), _head(bb, "last", "sequence", "last", 1),
                          _head(bb, "tags", "token", seed=2)])


def _one_pass(side: SideTasks, ids: list[int], name: str) -> torch.Tensor:
    task = side.heads[name].task
    batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        task.begin()
        side.backbone(batch, taps=[task.tap])
        return torch.softmax(task.end(batch["attention_mask"]), -1)[0]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gemma3"])
def test_generate_equals_one_pass(kind):
    side = _side(kind)
    tok, model = side.backbone.tokenizer, side.backbone.model
    out = side.generate(PROMPTS, max_new_tokens=5, steps=True)
    assert len(out) == len(PROMPTS)
    for prompt, r in zip(PROMPTS, out):
        prompt_ids = tok(prompt)["input_ids"]
        # the text is the model's own greedy continuation
        ref = model.generate(torch.tensor([prompt_ids]), max_new_tokens=5, do_sample=False,
                             pad_token_id=tok.pad_token_id)[0, len(prompt_ids):].tolist()
        gen = r["token_ids"]
        assert r["tokens"] == len(gen) and tok.decode(gen, skip_special_tokens=True) == r["text"].strip()
        assert gen == ref[: len(gen)] and (len(gen) == 5 or ref[len(gen)] == tok.eos_token_id)
        assert r["finish"] in ("length", "eos")
        whole = prompt_ids + gen
        for name in ("mean", "last"):
            one = _one_pass(side, whole, name)
            got = torch.tensor(list(r["tasks"][name]["probabilities"].values()))
            torch.testing.assert_close(got, one, atol=1e-5, rtol=1e-5)
            # the prompt's prediction came from the prefill: the one-pass prediction on the prompt alone
            got_prompt = torch.tensor(list(r["prompt_tasks"][name]["probabilities"].values()))
            torch.testing.assert_close(got_prompt, _one_pass(side, prompt_ids, name), atol=1e-5, rtol=1e-5)
            # per-step values: one per generated token, the last one the final prediction
            assert len(r["steps"][name]) == len(gen)
            if gen:
                torch.testing.assert_close(torch.tensor(r["steps"][name][-1]), one, atol=1e-5, rtol=1e-5)
        # the token head tags every word of prompt + answer
        words = (prompt + r["text"]).split()
        assert r["tasks"]["tags"]["words"] == words and None not in r["tasks"]["tags"]["scores"]
        assert r["prompt_tasks"]["tags"]["words"] == prompt.split()


def test_token_head_on_generated_words_equals_one_pass():
    side = _side("llama")
    tok = side.backbone.tokenizer
    r = side.generate(PROMPTS[:1], max_new_tokens=4, tasks=["tags"])[0]
    whole = tok(PROMPTS[0])["input_ids"] + r["token_ids"]
    probs = _one_pass(side, whole, "tags")
    labels = side.heads["tags"].task.labels
    # one token per word here; BOS and generated special tokens (<unk>, <s>) are no words
    words = [j for j, t in enumerate(whole) if tok.decode([t], skip_special_tokens=True)]
    assert len(words) == len(r["tasks"]["tags"]["words"])
    assert r["tasks"]["tags"]["tags"] == [labels[int(probs[j].argmax())] for j in words]


def test_guard_stops_a_row_and_sampling_is_seeded():
    side = _side("gpt2")
    out = side.generate(PROMPTS, max_new_tokens=6, tasks=["mean"], guard={"mean": ("yes", 0.0)})
    # threshold 0 trips on the prompt, after the prefill: nothing is generated
    assert all(r["finish"] == "guard" and r["tokens"] == 0 and r["text"] == "" and r["guard"]["token"] == 0
               for r in out)
    a = side.generate(PROMPTS, max_new_tokens=4, tasks=[], do_sample=True, top_k=5, seed=3)
    b = side.generate(PROMPTS, max_new_tokens=4, tasks=[], do_sample=True, top_k=5, seed=3)
    assert [r["text"] for r in a] == [r["text"] for r in b]


def test_generate_refuses_bad_input():
    side = _side("gpt2")
    with pytest.raises(DataError, match="unknown task"):
        side.generate(PROMPTS, tasks=["nope"])
    with pytest.raises(DataError, match="prompt 2 is empty"):
        side.generate(["a", " "])
    with pytest.raises(DataError, match="max_new_tokens"):
        side.generate(["a"], max_new_tokens=0)
    with pytest.raises(DataError, match="guard"):
        side.generate(["a"], guard={"mean": ("maybe", 0.5)})
    enc = SideTasks(tiny_backbone("bert", tiny_tokenizer()), [])
    with pytest.raises(ModelError, match="not a decoder LLM"):
        enc.generate(["a"])


def test_top_p_keeps_the_nucleus_only():
    """top_p: the most likely tokens whose mass before them is below top_p, sampled in proportion."""
    import numpy as np

    from adalayers.infer.params import Sampling
    from adalayers.infer.sampling import generator, sample

    logits = np.log(np.array([[0.05, 0.5, 0.15, 0.3]], np.float32))
    g = generator(0)
    draws = np.concatenate([sample(logits, Sampling(True, 1.0, 0, 0.8), g) for _ in range(4000)])
    counts = np.bincount(draws, minlength=4) / len(draws)
    assert counts[0] == counts[2] == 0  # 0.5 + 0.3 = 0.8: the 0.15 and 0.05 tokens are out
    assert abs(counts[1] - 0.5 / 0.8) < 0.03 and abs(counts[3] - 0.3 / 0.8) < 0.03
    assert (sample(logits, Sampling(True, 1.0, 0, 1e-6), g) == 1).all()  # the first token always stays
    top2 = np.concatenate([sample(logits, Sampling(True, 1.0, 2, 1.0), g) for _ in range(2000)])
    assert set(top2.tolist()) == {1, 3}  # top_k 2: the two most likely tokens only
    assert (sample(logits, Sampling(False), None) == 1).all()  # greedy
