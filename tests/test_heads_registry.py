"""Heads come from a registry (model.heads.HEADS, one line per head kind): every TaskKind has one, build_head
builds the registered one, an unregistered kind is a one-line ConfigError, and the regression head answers
in the training targets' units."""
import pytest
import torch

from adalayers.config import HeadConfig
from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind
from adalayers.model import heads


def test_every_kind_has_a_registered_head():
    assert set(heads.HEADS) == set(TaskKind)
    for kind, builder in heads.HEADS.items():
        assert isinstance(heads.build_head(kind.value, 16, 3, HeadConfig(num_heads=4)), builder)


def test_an_unregistered_kind_is_refused_naming_the_registered(monkeypatch):
    monkeypatch.delitem(heads.HEADS, TaskKind.TOKENS)
    with pytest.raises(ConfigError, match="no head is registered for 'token' \\(registered: sequence, regression\\)"):
        heads.build_head("tokens", 16, 3, HeadConfig(num_heads=4))


def test_a_new_kind_is_one_registration(monkeypatch):
    monkeypatch.setitem(heads.HEADS, TaskKind.CLASSIFICATION, heads.RegressionHead)
    assert isinstance(heads.build_head("classification", 16, 3, HeadConfig(num_heads=4)), heads.RegressionHead)


def test_the_regression_head_answers_in_the_targets_units():
    torch.manual_seed(0)
    cfg = HeadConfig(num_heads=4, dropout=0.0, target_mean=2.5, target_std=4.0)
    head = heads.build_head(TaskKind.REGRESSION, 16, 1, cfg).eval()
    plain = heads.SequenceHead(16, 1, cfg).eval()
    plain.load_state_dict(head.state_dict())  # the same weights (saved runs load as before)
    F, mask = torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.bool)
    assert torch.allclose(head(F, mask), 2.5 + 4.0 * plain(F, mask).squeeze(-1))
    assert head.loss_scale == 16.0
