"""The mixer's running sum against a slow, obvious stacked implementation."""
import math

import pytest
import torch
import torch.nn.functional as nnf

from torch.overrides import TorchFunctionMode

from adalayers.config import MixerConfig
from adalayers.model.mixer import AdaLayersMixer, sinusoidal_positions


class CountLinear(TorchFunctionMode):
    """Counts the linear calls of the projections (inputs of width d = 12) made while it is active."""
    calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.linear and args[1].shape[-1] == 12:
            CountLinear.calls += 1
        return func(*args, **(kwargs or {}))


def reference(mixer: AdaLayersMixer, states: list[torch.Tensor]) -> torch.Tensor:
    """Stack every projected layer, weight with the cut-off softmax, sum - written out longhand."""
    cfg = mixer.cfg
    logits = [cfg.alpha * mixer.p[i].item() for i in range(mixer.num_layers)]
    if cfg.pin_layer is not None:
        logits = [x if i == cfg.pin_layer else -math.inf for i, x in enumerate(logits)]
    top = max(logits)
    exp = [math.exp(x - top) for x in logits]
    w = [e / sum(exp) for e in exp]
    w = [x if (x > cfg.cutoff or x == max(w)) else 0.0 for x in w]
    w = [x / sum(w) for x in w]
    f = []
    for i, z in enumerate(states):
        h = nnf.gelu(z) @ mixer.proj[i].weight.T
        mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        f.append((h - mean) / torch.sqrt(var + 1e-5))
    stacked = torch.stack(f, dim=-1)                     # (B, T, k, l)
    F = (stacked * torch.tensor(w)).sum(-1)
    if cfg.positional:
        T, k = F.shape[1], F.shape[2]
        pe = torch.zeros(T, k)
        for t in range(T):
            for j in range(0, k, 2):
                pe[t, j] = math.sin(t / 10000 ** (j / k))
                pe[t, j + 1] = math.cos(t / 10000 ** (j / k))
        F = F + pe
    return F


@pytest.mark.parametrize("cutoff,pin,positional", [(0.0, None, False), (0.05, None, True), (0.01, 2, True)])
def test_running_sum_matches_stacked_reference(cutoff, pin, positional):
    torch.manual_seed(0)
    cfg = MixerConfig(k=8, alpha=3.0, cutoff=cutoff, dropout=0.0, positional=positional, pin_layer=pin)
    mixer = AdaLayersMixer(5, 16, cfg).eval()
    with torch.no_grad():
        mixer.p.copy_(torch.tensor([0.1, 0.9, 0.5, -0.4, 0.3]))
    states = [torch.randn(2, 7, 16) for _ in range(5)]
    expected = reference(mixer, states)
    with torch.no_grad():
        got = mixer(states)
    assert got.shape == (2, 7, 8)
    assert torch.allclose(got, expected, atol=1e-6), (got - expected).abs().max()


def test_cutoff_zeroes_small_weights_and_renormalises():
    cfg = MixerConfig(k=4, alpha=1.0, cutoff=0.1, dropout=0.0, positional=False)
    mixer = AdaLayersMixer(4, 8, cfg)
    with torch.no_grad():
        mixer.p.copy_(torch.tensor([3.0, 3.0, 0.0, -3.0]))  # softmax ~ [0.49, 0.49, 0.02, 0.001]
    w = mixer.layer_weights()
    assert w[2] == 0 and w[3] == 0
    assert torch.isclose(w.sum(), torch.tensor(1.0))
    assert torch.isclose(w[0], torch.tensor(0.5))
    assert mixer.used_layers() == [0, 1]


def test_cutoff_gradient_flows_only_through_kept_layers():
    cfg = MixerConfig(k=4, alpha=1.0, cutoff=0.1, dropout=0.0, positional=False)
    mixer = AdaLayersMixer(3, 8, cfg)
    with torch.no_grad():
        mixer.p.copy_(torch.tensor([2.0, 0.0, -4.0]))   # weights ~ [0.87, 0.12, 0.002] -> last one cut
    states = [torch.randn(2, 3, 8) for _ in range(3)]
    mixer(states).sum().backward()
    assert mixer.proj[2].weight.grad is None          # never projected
    assert mixer.proj[0].weight.grad.abs().sum() > 0
    # renormalised weights of the kept layers: d/dp matches finite differences
    target = torch.randn(2, 3, 4)
    def objective(p):
        with torch.no_grad():
            mixer.p.copy_(p)
        return (mixer(states) * target).sum()
    mixer.zero_grad()
    p0 = torch.tensor([2.0, 0.0, -4.0])
    objective(p0).backward()
    grad = mixer.p.grad.clone()
    eps = 1e-3
    for i in range(2):
        d = torch.zeros(3)
        d[i] = eps
        with torch.no_grad():
            num = (objective(p0 + d) - objective(p0 - d)) / (2 * eps)
        assert torch.isclose(grad[i], num, rtol=2e-2, atol=2e-3), (i, grad[i], num)


def test_pinned_layer_is_the_only_one_used():
    mixer = AdaLayersMixer(6, 8, MixerConfig(k=4, pin_layer=3))
    w = mixer.layer_weights()
    assert w.tolist() == [0, 0, 0, 1.0, 0, 0]
    assert mixer.used_layers() == [3]


def test_entropy_penalty_value():
    mixer = AdaLayersMixer(4, 8, MixerConfig(k=4, cutoff=0.0))
    assert torch.isclose(mixer.entropy(), torch.tensor(math.log(4)))  # p = ones -> uniform


def test_positions_table_shape_and_values():
    pe = sinusoidal_positions(5, 6)
    assert pe.shape == (5, 6)
    assert pe[0, 0] == 0 and pe[0, 1] == 1


def test_shared_tap_equals_each_heads_own_tap():
    """Several heads fed by one GELU and one fused GEMM per layer give the numbers of separate taps."""
    from adalayers.config import Config
    from adalayers.model.sidetask import SideTask, shared_tap

    torch.manual_seed(0)
    heads = []
    for k, pin in [(8, None), (16, None), (8, 2)]:
        cfg = Config()
        cfg.mixer.k, cfg.head.num_heads, cfg.mixer.pin_layer = k, 2, pin
        heads.append(SideTask(cfg, 4, 12, ["a", "b", "c"]).eval())
    states = [torch.randn(2, 5, 12) for _ in range(4)]
    mask = torch.ones(2, 5, dtype=torch.long)
    alone = [h(states, mask) for h in heads]
    for h in heads:
        h.begin()
    tap = shared_tap(heads)
    for i, z in enumerate(states):
        tap(i, z)
    together = [h.end(mask) for h in heads]
    for a, b in zip(alone, together):
        assert torch.allclose(a, b, atol=1e-5)


def test_fused_tap_one_gemm_per_layer_equals_per_head_path():
    """Four heads (sequence, token, regression, one pinned to a single layer) through adalayers.model.fused:
    one linear call per layer for all heads of one k, and logits equal to each head's own tap within
    1e-5 (only the float summation order of the batched GEMM differs). Padded and packed input."""
    from adalayers.config import Config
    from adalayers.model.sidetask import SideTask, shared_tap

    torch.manual_seed(1)
    heads = []
    for kind, pin in [("sequence", None), ("token", None), ("regression", None), ("sequence", 3)]:
        cfg = Config()
        cfg.head.kind, cfg.mixer.k, cfg.head.num_heads, cfg.mixer.pin_layer = kind, 8, 2, pin
        task = SideTask(cfg, 5, 12, [] if kind == "regression" else ["a", "b", "c"]).eval()
        with torch.no_grad():
            task.mixer.p.copy_(torch.randn(5) * 0.3)
        heads.append(task)
    states = [torch.randn(3, 6, 12) for _ in range(5)]
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.inference_mode():
        alone = [h(states, mask) for h in heads]
        for packed in (False, True):
            for h in heads:
                h.begin()
            tap = shared_tap(heads)
            CountLinear.calls = 0
            with CountLinear():
                for i, z in enumerate(states):
                    tap(i, z[mask.bool()] if packed else z)
            used = set().union(*(h.used_layers() for h in heads))
            assert len(used) >= 3 and CountLinear.calls == len(used)  # one GEMM per layer, not one per head
            together = [h.end(mask) for h in heads]
            for h, a, b in zip(heads, alone, together):
                assert a.shape == b.shape
                if h.kind == "token":  # padding positions' logits are never read (packed input has none)
                    a, b = a[mask.bool()], b[mask.bool()]
                assert (a - b).abs().max() <= 1e-5


def test_probes_in_the_fused_tap_need_no_gemm_and_equal_each_probe_alone():
    """Probes (head.type probe: identity W_i on one pinned layer) beside mixer heads through FusedTap, layer by layer
    and deferred (all layers at once): each probe's and head's logits equal its own tap's, and the projections'
    linear calls are the mixer heads' only (one per layer they read), none for a probe."""
    from types import SimpleNamespace

    from adalayers.config import Config
    from adalayers.model.sidetask import SideTask, shared_tap
    from adalayers.recipes.probes import probe_task

    torch.manual_seed(2)
    base = SimpleNamespace(hidden_size=12, num_layers=5, adds_bos=False, device="cpu")
    probes = [probe_task(Config(), base, ["a", "b", "c"], layer, pooling, torch.randn(3, 12), torch.randn(3))
              for layer, pooling in [(1, "mean"), (1, "last"), (3, "mean")]]
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads, cfg.mixer.pin_layer = 8, 2, 2
    mixer = SideTask(cfg, 5, 12, ["a", "b", "c"]).eval()
    heads = [probes[0], mixer, probes[1], probes[2]]
    states = [torch.randn(2, 5, 12) for _ in range(5)]
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    with torch.inference_mode():
        alone = [h(states, mask) for h in heads]
        for defer in (0, 64):
            for h in heads:
                h.begin()
            tap = shared_tap(heads, defer=defer)
            CountLinear.calls = 0
            with CountLinear():
                for i, z in enumerate(states):
                    tap(i, z)
                tap.flush()
            assert CountLinear.calls == (1 if defer == 0 else 0)  # the mixer head's layer 2 only (deferred: bmm)
            for a, b in zip(alone, [h.end(mask) for h in heads]):
                assert (a - b).abs().max() <= 1e-5


def test_max_layer_mixes_only_the_states_up_to_it_on_both_evaluations():
    """mixer.max_layer: the states past it weigh 0 (never projected, never read: a decoder's final state left out),
    the same in the torch mixer and the numpy heads; a max_layer past the base, or a pinned or starting layer past
    it, is a one-line ConfigError."""
    import numpy as np

    from adalayers.errors import ConfigError
    from adalayers.infer.numpy_heads import layer_weights

    torch.manual_seed(0)
    cfg = MixerConfig(k=4, max_layer=2, cutoff=0.0)
    m = AdaLayersMixer(5, 8, cfg)
    with torch.no_grad():
        m.p.copy_(torch.randn(5) * 0.05)
    w = m.layer_weights().detach()
    assert w[3:].tolist() == [0.0, 0.0] and w[:3].sum().item() == pytest.approx(1.0) and m.used_layers() == [0, 1, 2]
    assert np.allclose(layer_weights(m.p.detach().numpy(), cfg.alpha, cfg.cutoff, None, cfg.max_layer), w.numpy())
    z = [torch.randn(2, 3, 8) for _ in range(5)]
    acc = None
    for i, zi in enumerate(z):
        acc = m.add(acc, i, zi, w)
    ref = sum(w[i] * nnf.layer_norm(nnf.gelu(z[i]) @ m.proj[i].weight.T, (4,)) for i in range(3))
    assert torch.allclose(acc, ref, atol=1e-5)
    for bad, msg in ((MixerConfig(max_layer=5), "mixer.max_layer"),
                     (MixerConfig(max_layer=2, pin_layer=3), "mixer.pin_layer"),
                     (MixerConfig(max_layer=2, init_layer=4), "mixer.init_layer")):
        with pytest.raises(ConfigError, match=msg):
            AdaLayersMixer(5, 8, bad)
