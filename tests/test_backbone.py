"""The frozen base: taps see exactly the hidden states, and attaching heads changes nothing in the base."""
import torch

from adalayers.config import Config
from adalayers.model.sidetask import SideTask
from adalayers.model.states import LiveStates

from conftest import tiny_backbone

TEXTS = ["the book was written by john .", "john sees the big dog", "a good movie"]


def reference_states(backbone, batch):
    """What the model says its hidden states are, the usual way (all at once)."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if backbone.is_encoder_decoder:
        inputs.pop("token_type_ids", None)
        inputs["decoder_input_ids"] = backbone._decoder_inputs(inputs["input_ids"])
        out = backbone.model(**inputs, output_hidden_states=True)
        return out.encoder_hidden_states
    return backbone.model(**inputs, output_hidden_states=True).hidden_states


def test_taps_see_every_hidden_state(backbone):
    batch = backbone.tokenize(TEXTS)
    seen = {}
    backbone(batch, taps=[lambda i, z: seen.__setitem__(i, z.clone())])
    expected = reference_states(backbone, batch)
    assert sorted(seen) == list(range(backbone.num_layers))
    # the last entry of HF's list may include a final norm (BART does not; BERT's is the raw layer output)
    for i in range(backbone.num_layers):
        assert torch.equal(seen[i], expected[i]), i


def test_base_output_bit_identical_with_heads_attached(backbone):
    batch = backbone.tokenize(TEXTS)
    plain = backbone(batch)
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads = 8, 2
    tasks = [SideTask(cfg, backbone.num_layers, backbone.hidden_size, ["a", "b"]) for _ in range(2)]
    for t in tasks:
        t.eval()
        t.begin()
    with_heads = backbone(batch, taps=[t.tap for t in tasks])
    assert torch.equal(plain.last_hidden_state, with_heads.last_hidden_state)
    assert torch.equal(plain.pooled, with_heads.pooled)


def test_training_a_head_leaves_the_base_untouched(backbone):
    before = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads = 8, 2
    task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, ["a", "b"])
    opt = torch.optim.AdamW(task.parameters(), lr=1e-2)
    batch = backbone.tokenize(TEXTS)
    for _ in range(3):
        task.train()
        LiveStates(backbone).run(batch, [task])
        loss = task.loss(task.end(batch["attention_mask"]), torch.tensor([0, 1, 1]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(p.grad is None and not p.requires_grad for p in backbone.model.parameters())
    assert all(p.grad is not None for p in task.mixer.proj.parameters())
    after = backbone.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_early_exit_gives_the_same_side_predictions(backbone):
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads, cfg.mixer.pin_layer = 8, 2, 1
    task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, ["a", "b"]).eval()
    batch = backbone.tokenize(TEXTS)
    LiveStates(backbone).run(batch, [task], primary=True)
    full = task.end(batch["attention_mask"])
    out = LiveStates(backbone).run(batch, [task], primary=False)   # stops after layer 1
    early = task.end(batch["attention_mask"])
    assert out.last_hidden_state is None
    assert torch.allclose(full, early, atol=1e-6)


def test_decoder_states_of_an_encoder_decoder(tokenizer):
    bb = tiny_backbone("bart", tokenizer, states="decoder")
    seen = {}
    batch = bb.tokenize(TEXTS)
    bb(batch, taps=[lambda i, z: seen.__setitem__(i, z)])
    inputs = dict(batch)
    inputs.pop("token_type_ids", None)
    out = bb.model(**inputs, decoder_input_ids=bb._decoder_inputs(batch["input_ids"]), output_hidden_states=True)
    assert len(seen) == len(out.decoder_hidden_states)
    assert torch.equal(seen[2], out.decoder_hidden_states[2])


def test_fingerprint_tells_bases_apart(tokenizer):
    a, b = tiny_backbone("bert", tokenizer), tiny_backbone("bert", tokenizer)
    assert a.fingerprint() == b.fingerprint()            # same seed, same weights
    with torch.no_grad():
        b.model.embeddings.word_embeddings.weight[5, 0] += 1
    b._fingerprint = None
    assert a.fingerprint() != b.fingerprint()
