"""The sequence head's fused self-attention computes what nn.MultiheadAttention computes."""
import torch

from adalayers.config import HeadConfig
from adalayers.heads import SequenceHead, self_attention


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
