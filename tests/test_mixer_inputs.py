"""The mixer checks what it is given, as AllenNLP's ScalarMix does: a wrong number of hidden states, a
layer the base does not have, or states of another width is a one-line ModelError naming expected and got."""
import pytest
import torch

from adalayers.config import Config, MixerConfig
from adalayers.errors import ModelError
from adalayers.model.mixer import AdaLayersMixer, layer_features
from adalayers.model.sidetask import SideTask


def mixer() -> AdaLayersMixer:
    torch.manual_seed(0)
    return AdaLayersMixer(4, 16, MixerConfig(k=8, dropout=0.0, positional=False)).eval()


@pytest.mark.parametrize("n", [3, 5])
def test_a_wrong_number_of_states_is_refused(n):
    with pytest.raises(ModelError, match=f"expects 4 hidden states .*got {n}$"):
        mixer()([torch.randn(2, 3, 16) for _ in range(n)])


def test_a_wrong_width_is_refused_naming_both():
    m = mixer()
    with pytest.raises(ModelError, match="width 16, got 12 \\(layer 1\\)"):
        m([torch.randn(2, 3, 16)] + [torch.randn(2, 3, 12)] * 3)
    with pytest.raises(ModelError, match="width 16, got 12"):
        m.add(None, 0, torch.randn(2, 3, 12), m.layer_weights())


def test_a_layer_the_base_lacks_is_refused():
    m = mixer()
    with pytest.raises(ModelError, match="layers 0..3 .*got layer 4"):
        m.add(None, 4, torch.randn(2, 3, 16), torch.ones(5))


def test_side_task_forward_checks_the_count():
    task = SideTask(Config(), 4, 16, ["a", "b"]).eval()
    with pytest.raises(ModelError, match="got 2$"):
        task([torch.randn(1, 3, 16)] * 2, torch.ones(1, 3))
    assert task([torch.randn(1, 3, 16)] * 4, torch.ones(1, 3)).shape == (1, 2)


def test_layer_features_for_several_heads_equal_each_heads_own():
    """One GEMM over stacked W_i gives each head's f_i (the fused and exported paths rely on it)."""
    torch.manual_seed(1)
    a, ws = torch.randn(2, 3, 16), [torch.randn(8, 16) for _ in range(3)]
    stacked = layer_features(a, torch.cat(ws), 8)
    assert stacked.shape == (2, 3, 3, 8)
    for h, w in enumerate(ws):
        assert torch.allclose(stacked[..., h, :], layer_features(a, w, 8)[..., 0, :], atol=1e-6)
