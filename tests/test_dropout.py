"""adalayers.model.dropout: Bernoulli with p on a 2^-15 grid, the inverse scale, torch's own off the CPU and in eval."""
import pytest
import torch

from adalayers.model.dropout import Dropout, dropout


@pytest.mark.parametrize("p", [0.03, 0.2, 0.5])
def test_keeps_a_fraction_one_minus_p_and_scales_by_its_inverse(p):
    torch.manual_seed(0)
    x = torch.ones(1000, 1001)  # an odd count: the last 32-bit word is used half
    y = dropout(x, p)
    q = round(p * 2 ** 15) / 2 ** 15
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - q)) < 5 * ((q * (1 - q)) / x.numel()) ** 0.5
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - q)))
    assert abs(y.mean().item() - 1) < 0.01  # unbiased
    # neither half of a 32-bit word is biased: even and odd positions keep alike
    flat = kept.flatten()
    assert abs(flat[0::2].float().mean().item() - flat[1::2].float().mean().item()) < 0.01


def test_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(0)
    x = torch.randn(64, 33, requires_grad=True)
    y = dropout(x, 0.2)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g * x.detach(), y.detach())


def test_seeded_eval_zero_and_module():
    x = torch.randn(50, 40)
    torch.manual_seed(1)
    a = dropout(x, 0.2)
    torch.manual_seed(1)
    assert torch.equal(a, dropout(x, 0.2))
    assert dropout(x, 0.2, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    m = Dropout(0.2)
    assert m.state_dict() == {} and m.eval()(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)
