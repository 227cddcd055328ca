"""Several sequence / regression heads' end() batched (sidetask.end_all, heads.sequence_heads) against a slow,
obvious per-head reference and against each head's own end()."""
import pytest
import torch
import torch.nn.functional as nnf

from adalayers.config import Config
from adalayers.model import sidetask
from adalayers.model.heads import pool
from adalayers.model.sidetask import SideTask, end_all, over_states

L, D = 4, 12


def make(kind: str, k: int, pooling: str = "mean", seed: int = 0, **mixer) -> SideTask:
    cfg = Config()
    cfg.head.kind, cfg.mixer.k, cfg.head.num_heads, cfg.head.pooling = kind, k, 2, pooling
    for name, value in mixer.items():
        setattr(cfg.mixer, name, value)
    if kind == "regression":
        cfg.head.target_mean, cfg.head.target_std = 2.5, 1.5
    torch.manual_seed(seed)
    task = SideTask(cfg, L, D, [] if kind == "regression" else ["a", "b", "c"]).eval()
    with torch.no_grad():
        task.mixer.p.copy_(torch.randn(L) * 0.3)
    return task


def obvious(task: SideTask, states: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """The mixer's all-layers forward, then nn.MultiheadAttention's own forward, GELU, pooling, output."""
    F = task.mixer(states)  # positions 0..T-1: the same as the head's at every real token of right-padded rows
    attn = task.head.attn
    x = nnf.gelu(attn(F, F, F, key_padding_mask=~mask.bool(), need_weights=False)[0])
    return task.head.output(pool(x, mask, task.head.pooling))


@pytest.fixture
def batched(monkeypatch):
    """The sizes of the groups that sequence_heads ran."""
    sizes = []
    real = sidetask.sequence_heads

    def spy(heads, F, mask):
        sizes.append(len(heads))
        return real(heads, F, mask)

    monkeypatch.setattr(sidetask, "sequence_heads", spy)
    return sizes


def test_batched_heads_equal_the_obvious_per_head_reference(batched):
    tasks = [make("sequence", 16, "mean", 1), make("sequence", 16, "max", 2), make("regression", 16, "last", 3),
             make("sequence", 16, "first", 4), make("token", 16, seed=5), make("sequence", 8, seed=6)]
    torch.manual_seed(0)
    states = [torch.randn(3, 7, D) for _ in range(L)]
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 2:] = 0
    with torch.inference_mode():
        together = over_states(tasks, states, mask, end_all)
        alone = over_states(tasks, states, mask, lambda ts, m: [t.end(m) for t in ts])
        for t, a, b in zip(tasks, alone, together):
            assert a.shape == b.shape
            if t.kind == "token":
                a, b = a[mask.bool()], b[mask.bool()]
            else:
                assert (obvious(t, states, mask) - b).abs().max() <= 1e-5
            assert (a - b).abs().max() <= 1e-5
    assert batched == [4]  # the four k = 16 sequence / regression heads in one group; the others alone
    assert len({tuple(y.argmax(-1).tolist()) for y in together[:2] + together[3:4]}) > 1  # not all alike


def test_batched_heads_follow_skip_bos_and_the_mixers_finish(batched):
    """Heads that differ in skip_bos or in finish() (gelu_after_sum) are never batched together."""
    tasks = [make("sequence", 16, seed=1, gelu_after_sum=True), make("sequence", 16, seed=2, gelu_after_sum=True),
             make("sequence", 16, seed=3), make("sequence", 16, seed=4, positional=False),
             make("sequence", 16, seed=5, positional=False)]
    tasks[4].skip_bos = True
    torch.manual_seed(1)
    states = [torch.randn(2, 6, D) for _ in range(L)]
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    with torch.inference_mode():
        together = over_states(tasks, states, mask, end_all)
        alone = over_states(tasks, states, mask, lambda ts, m: [t.end(m) for t in ts])
    assert batched == [2]
    for a, b in zip(alone, together):
        assert (a - b).abs().max() <= 1e-5
