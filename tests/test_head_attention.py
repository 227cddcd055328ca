"""The heads: fused self-attention computes what nn.MultiheadAttention computes; attention dropout is its own setting."""
import pytest
import torch

from adalayers.config import HeadConfig
from adalayers.model.heads import SequenceHead, self_attention


def test_fused_attention_matches_multihead_attention():
    torch.manual_seed(0)
    head = SequenceHead(16, 3, HeadConfig(num_heads=4)).eval()
    x = torch.randn(3, 7, 16)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    expected, _ = head.attn(x, x, x, key_padding_mask=~mask.bool(), need_weights=False)
    got = self_attention(head.attn, x, mask)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got[1], self_attention(head.attn, x, torch.ones_like(mask))[1], atol=1e-3)


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_attention_dropout_is_its_own_setting(kind):
    from adalayers.model.heads import build_head

    x, mask = torch.randn(2, 6, 16), torch.ones(2, 6, dtype=torch.bool)
    follows = build_head(kind, 16, 3, HeadConfig(num_heads=4, dropout=0.25, encoder_layers=2))
    attns = [m for m in follows.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    assert attns and all(a.dropout == 0.25 for a in attns)  # None: the head's dropout, as before

    only_attention = build_head(kind, 16, 3, HeadConfig(num_heads=4, dropout=0.0, attention_dropout=0.5)).train()
    assert not torch.equal(only_attention(x, mask), only_attention(x, mask))
    none = build_head(kind, 16, 3, HeadConfig(num_heads=4, dropout=0.0, attention_dropout=0.0)).train()
    assert torch.equal(none(x, mask), none(x, mask))


def test_token_head_feed_forward_on_real_tokens_matches_the_padded_encoder():
    """Values and gradients at every real token equal nn.TransformerEncoder's over the padded batch."""
    from adalayers.model.heads import TokenHead

    torch.manual_seed(0)
    head = TokenHead(16, 5, HeadConfig(num_heads=4, encoder_layers=2, dim_feedforward=24, dropout=0.0))
    F = torch.randn(3, 9, 16, requires_grad=True)
    mask = torch.zeros(3, 9, dtype=torch.bool)
    mask[0, :9], mask[1, :3], mask[2, :6] = True, True, True
    got = head(F, mask)
    want = head.out(head.encoder(F, src_key_padding_mask=~mask))
    assert torch.allclose(got[mask], want[mask], atol=1e-5)
    g_got = torch.autograd.grad(got[mask].square().sum(), [F, *head.parameters()])
    g_want = torch.autograd.grad(want[mask].square().sum(), [F, *head.parameters()])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_got, g_want))
    assert torch.equal(got[~mask], torch.zeros_like(got[~mask]))  # padding is simply not computed


@pytest.mark.parametrize("padding", ["right", "left", "holes"])
@pytest.mark.parametrize("attention_dropout", [0.0, 0.3])
def test_attention_in_length_groups_equals_one_padded_call(padding, attention_dropout, monkeypatch):
    """A training token head attends in groups of rows of similar length (attend_packed); values and
    gradients equal the one padded call that eval mode makes, whatever the padding: right, left (a
    decoder's), a mask with holes, and a row without any real token. With attention dropout (its
    mask taken out) the groups take the written-out formula instead of the fused kernel: the same."""
    from adalayers.model import heads

    monkeypatch.setattr(heads, "ATTENTION_GROUP", 3)
    if attention_dropout:
        monkeypatch.setattr(heads, "dropout", lambda x, p: x)
    torch.manual_seed(0)
    head = heads.TokenHead(16, 5, HeadConfig(num_heads=4, encoder_layers=2, dim_feedforward=24, dropout=0.0,
                                             attention_dropout=attention_dropout))
    B, T = 11, 13
    lengths = torch.tensor([13, 1, 7, 0, 4, 9, 2, 13, 5, 6, 3])
    cols = torch.arange(T)[None, :]
    mask = cols < lengths[:, None] if padding == "right" else cols >= T - lengths[:, None]
    if padding == "holes":
        mask = torch.rand(B, T) < 0.6
        mask[3] = False
    F = torch.randn(B, T, 16, requires_grad=True)
    out = {}
    for mode in ("train", "eval"):
        getattr(head, mode)()
        got = head(F, mask)
        out[mode] = (got, torch.autograd.grad(got[mask].square().sum(), [F, *head.parameters()]))
    (a, ga), (b, gb) = out["train"], out["eval"]
    assert torch.allclose(a, b, atol=1e-5) and torch.equal(a[~mask], torch.zeros_like(a[~mask]))
    assert all(torch.allclose(x, y, atol=1e-5) for x, y in zip(ga, gb))


def test_written_out_attention_with_dropout_is_the_fused_formula(monkeypatch):
    """Training with attention dropout on a CPU, attend() writes the attention out (for the cheap mask);
    with the mask taken out it equals scaled_dot_product_attention, padding keys masked."""
    from adalayers.model import heads

    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(16, 4, dropout=0.3, batch_first=True).train()
    qkv = torch.randn(3, 7, 48)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 4:], mask[2, 1:] = False, False
    monkeypatch.setattr(heads, "dropout", lambda x, p: x)
    got = heads.attend(attn, qkv, mask)
    attn.eval()
    assert torch.allclose(got, heads.attend(attn, qkv, mask), atol=1e-6)
