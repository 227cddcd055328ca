"""Decoder LLMs as bases: layer taps, causal semantics (BOS, padding side, positions), last-token pooling."""
from __future__ import annotations

import pytest
import torch

from adalayers.model.backbone import Backbone
from adalayers.config import Config
from adalayers.data.encoding import collate
from adalayers.errors import ModelError
from adalayers.model.heads import last_token
from adalayers.model.sidetask import SideTask
from tinydecoders import DECODERS, decoder_backbone, decoder_model, decoder_tokenizer

TEXTS = ["the dog runs quickly and the cat sees mary", "a book", "she loves the big movie ."]


def _taps(bb: Backbone, batch: dict) -> dict[int, torch.Tensor]:
    got = {}
    bb(batch, taps=[lambda i, h: got.__setitem__(i, h.clone())])
    return got


@pytest.mark.parametrize("kind", DECODERS)
def test_taps_equal_output_hidden_states(kind):
    bb = decoder_backbone(kind)
    assert bb.is_causal and bb.num_layers == 4 and bb.hidden_size == 32
    batch = bb.tokenize(TEXTS)
    taps = _taps(bb, batch)
    ref = bb.model(**bb.model_inputs(batch), output_hidden_states=True).hidden_states
    assert len(ref) == bb.num_layers
    for i, h in enumerate(ref):  # the last one after the final norm, as transformers reports it
        assert torch.equal(taps[i], h), (kind, i)


@pytest.mark.parametrize("kind", DECODERS)
def test_left_padded_batch_equals_single_texts(kind):
    bb = decoder_backbone(kind)
    assert bb.tokenizer.padding_side == "left" and bb.tokenizer.pad_token is not None
    batch = bb.tokenize(TEXTS)
    together = _taps(bb, batch)
    for b, text in enumerate(TEXTS):
        alone = _taps(bb, bb.tokenize([text]))
        n = alone[0].shape[1]
        assert batch["attention_mask"][b, -n:].all() and not batch["attention_mask"][b, :-n].any()
        for i in range(bb.num_layers):
            torch.testing.assert_close(together[i][b, -n:], alone[i][0], atol=1e-5, rtol=1e-5)


def _task(bb: Backbone, pooling: str, kind: str = "sequence") -> SideTask:
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads, cfg.mixer.dropout, cfg.head.dropout = 16, 2, 0.0, 0.0
    cfg.head.kind, cfg.head.pooling, cfg.head.skip_bos = kind, pooling, bb.adds_bos
    torch.manual_seed(1)
    return SideTask(cfg, bb.num_layers, bb.hidden_size, ["a", "b", "c"]).eval()


def _predict(bb: Backbone, task: SideTask, batch: dict) -> torch.Tensor:
    task.begin()
    bb(batch, taps=[task.tap])
    return task.end(batch["attention_mask"])


@pytest.mark.parametrize("kind,pooling", [("gpt2", "mean"), ("llama", "last"), ("gemma3", "mean"), ("gemma3", "last")])
def test_prediction_does_not_depend_on_padding(kind, pooling):
    """Left padding (tokenizer, generation) and right padding (training batches) give each text its own output."""
    bb = decoder_backbone(kind)
    task = _task(bb, pooling)
    with torch.no_grad():
        left = _predict(bb, task, bb.tokenize(TEXTS))
        ids = bb.tokenizer(TEXTS)["input_ids"]
        right = _predict(bb, task, collate([{"input_ids": x} for x in ids], list(range(len(ids))),
                                           bb.tokenizer.pad_token_id))
        for b, text in enumerate(TEXTS):
            alone = _predict(bb, task, bb.tokenize([text]))[0]
            torch.testing.assert_close(left[b], alone, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(right[b], alone, atol=1e-5, rtol=1e-5)


def test_bos_is_masked_out():
    """Gemma's BOS state is the same for every text and huge: with skip_bos it cannot move a prediction."""
    bb = decoder_backbone("gemma3")
    assert bb.adds_bos and bb.tokenizer("a book")["input_ids"][0] == bb.tokenizer.bos_token_id
    for kind in ("sequence", "token"):
        task = _task(bb, "mean", kind)
        batch = bb.tokenize(TEXTS)
        mask = batch["attention_mask"]
        with torch.no_grad():
            task.begin()
            bb(batch, taps=[task.tap])
            acc = task.take()
            first = (mask.cumsum(1) == 1) & mask.bool()
            loud = acc.masked_fill(first.unsqueeze(-1), 1e5)
            out, out_loud = task.read(acc, mask), task.read(loud, mask)
        real = (mask.bool() & ~first) if kind == "token" else slice(None)
        torch.testing.assert_close(out[real], out_loud[real])
        task.skip_bos = False
        with torch.no_grad():
            assert not torch.allclose(task.read(acc, mask)[real], task.read(loud, mask)[real])


def test_last_pooling_picks_last_real_token():
    x = torch.arange(2 * 5 * 3, dtype=torch.float).view(2, 5, 3)
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    assert torch.equal(last_token(x, left), x[[0, 1], [4, 4]])
    assert torch.equal(last_token(x, right), x[[0, 1], [2, 1]])
    # a sequence head with pooling=last reads nothing after the last real token... and changes with it
    bb = decoder_backbone("gpt2")
    task = _task(bb, "last")
    acc = torch.randn(2, 5, 16)
    with torch.no_grad():
        base = task.read(acc, left)
        moved = acc.clone()
        moved[0, 4] += 1
        assert not torch.allclose(task.read(moved, left)[0], base[0])


def test_load_decoder_folder(tmp_path):
    """A saved GPT-2 (no pad token) loads for causal LM: hooks read the layers, the LM head still runs."""
    tok = decoder_tokenizer(bos=False)
    decoder_model("gpt2", len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    bb = Backbone.load(str(tmp_path))
    assert type(bb.model).__name__ == "GPT2LMHeadModel" and bb.tokenizer.pad_token == "</s>"
    out = bb(bb.tokenize(TEXTS), taps=[lambda i, h: None])
    assert out.logits.shape == (3, 1, len(tok))  # next-token logits of the last (real) position


def test_gguf_errors(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        Backbone.load(str(bad))
    with pytest.raises(ModelError, match="GGUF file not found"):
        Backbone.load(str(tmp_path / "missing.gguf"))


def test_cache_keeps_a_huge_bos_state_finite():
    """Gemma's BOS state leaves float16's range; stored as inf it made every head's gradient NaN."""
    from adalayers.store.cache.source import to_fp16

    h = torch.tensor([[1.5e5, -2e5, 3.0], [0.5, 70000.0, -1.0]])
    stored = to_fp16(h)
    assert stored.dtype == torch.float16 and torch.isfinite(stored).all()
    assert stored[0, 2] == 3.0 and stored[1, 0] == 0.5 and stored[0, 0] == 65504.0 and stored[0, 1] == -65504.0
    # a head fed the stored (clamped) BOS row, masked out, trains with finite gradients
    bb = decoder_backbone("gemma3")
    task = _task(bb, "mean")
    task.train()
    batch = bb.tokenize(TEXTS)
    z = {}
    bb(batch, taps=[lambda i, s: z.__setitem__(i, s.clone())])
    first = (batch["attention_mask"].cumsum(1) == 1) & batch["attention_mask"].bool()
    task.begin()
    for i in range(bb.num_layers):
        task.tap(i, to_fp16(z[i].masked_fill(first.unsqueeze(-1), 1e6)).float())
    task.loss(task.end(batch["attention_mask"]), torch.tensor([0, 1, 2])).backward()
    assert all(torch.isfinite(p.grad).all() for p in task.parameters() if p.grad is not None)
