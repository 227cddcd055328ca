"""train.head_precision=bf16: the side task's products in bf16 while it trains, fp32 everywhere else."""
import pytest
import torch
import torch.nn.functional as nnf

from adalayers.model import bf16
from adalayers import config
from adalayers.errors import ConfigError
from adalayers.model.sidetask import SideTask


def reference(x, w, b):
    """The bf16 product written out: inputs rounded to bf16, products summed in fp32, the result rounded to bf16."""
    r = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    return (r(x) @ r(w).T + r(b)).to(torch.bfloat16).float()


@pytest.mark.parametrize("shape", [(45, 24), (3, 7, 24), (32, 24)])  # rows padded to 64, a 3-d input, no padding
def test_linear_is_the_bf16_product_with_fp32_gradients(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    w, b = torch.randn(16, 24, requires_grad=True), torch.randn(16, requires_grad=True)
    y = bf16.linear(x, w, b, torch.bfloat16)
    assert y.dtype == torch.float32 and y.shape == (*shape[:-1], 16)
    want = reference(x.detach(), w.detach(), b.detach())
    assert torch.allclose(y.detach(), want, rtol=1e-2, atol=1e-2)
    exact = nnf.linear(x, w, b)
    assert not torch.equal(y, exact)  # the product really is in bf16
    assert torch.allclose(y, exact, rtol=3e-2, atol=5e-2)
    g = torch.randn_like(exact)
    grads = torch.autograd.grad((y * g).sum(), [x, w, b])
    exact_grads = torch.autograd.grad((exact * g).sum(), [x, w, b])
    for got, ref in zip(grads, exact_grads):
        assert got.dtype == torch.float32 and got.shape == ref.shape
        assert torch.allclose(got, ref, rtol=5e-2, atol=0.15 * ref.abs().max().item() / 4)
    assert torch.equal(bf16.linear(x, w, b, None), exact)  # no dtype: nnf.linear itself


def task(kind: str, precision: str | None) -> SideTask:
    cfg = config.from_dict({"mixer": {"k": 16, "dropout": 0.0},
                            "head": {"kind": kind, "num_heads": 4, "dim_feedforward": 32, "dropout": 0.0},
                            "train": {"head_precision": precision}})
    torch.manual_seed(0)
    return SideTask(cfg, 3, 24, ["a", "b", "c"])


@pytest.mark.parametrize("kind", ["sequence", "token"])
def test_side_task_trains_in_bf16_and_evaluates_in_fp32(kind):
    """The same weights: training steps differ from fp32 by bf16 rounding only, evaluation is fp32's exactly."""
    fp32, low = task(kind, None), task(kind, "bf16")
    low.load_state_dict(fp32.state_dict())
    states = [torch.randn(4, 9, 24) for _ in range(3)]
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[1, 5:], mask[3, 2:] = False, False
    labels = torch.randint(0, 3, (4, 9) if kind == "token" else (4,))
    fp32.train(), low.train()
    out32, out16 = fp32(states, mask), low(states, mask)
    assert not torch.equal(out32, out16)
    assert torch.allclose(out32, out16, rtol=5e-2, atol=5e-2)
    low.loss(out16, labels).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in low.trainable_parameters())
    fp32.eval(), low.eval()
    assert torch.equal(fp32(states, mask), low(states, mask))


def test_head_precision_is_checked():
    with pytest.raises(ConfigError, match="train.head_precision: must be null or bf16, got 'fp16'"):
        config.from_dict({"train": {"head_precision": "fp16"}})


@pytest.mark.parametrize("flags, warned", [([], True), (["avx512_bf16"], False)])
def test_bf16_without_bf16_instructions_is_warned_about(flags, warned, monkeypatch, caplog):
    from adalayers.model import precision

    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: flags)
    tc = config.from_dict({"train": {"head_precision": "bf16"}}).train
    with caplog.at_level("WARNING", logger="adalayers.model.precision"):
        precision.warn_if_slow(tc, torch.device("cpu"))
        precision.warn_if_slow(config.from_dict({}).train, torch.device("cpu"))  # fp32: nothing to say
    assert [r.getMessage() for r in caplog.records] == (
        ["train.head_precision=bf16 on a CPU without bf16 instructions (AVX512-BF16 or AMX): bf16 products are "
         "emulated there, slower than fp32"] if warned else [])
