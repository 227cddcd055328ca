"""Issue 40's mixer options: layer dropout (against a longhand reference) and the mixing logits' own
learning rate (the optimiser groups the engine builds from them)."""
import math

import pytest
import torch

from adalayers.config import Config, MixerConfig, validate
from adalayers.engine.loop import FitSettings, adamw
from adalayers.model.mixer import AdaLayersMixer, drop_layers
from adalayers.model.sidetask import SideTask
from adalayers.model.states import Fed


def longhand_drop(w: list[float], uniforms: list[float], q: float) -> list[float]:
    """Keep layer i when its uniform draw is >= q; renormalise the kept weights; none left -> the largest."""
    kept = [x if u >= q else 0.0 for x, u in zip(w, uniforms)]
    if not any(x > 0 for x in kept):
        top = max(range(len(w)), key=lambda i: w[i])
        kept = [w[i] if i == top else 0.0 for i in range(len(w))]
    total = sum(kept)
    return [x / total for x in kept]


@pytest.mark.parametrize("q,seed", [(0.1, 0), (0.5, 1), (0.5, 2), (0.9, 3)])
def test_drop_layers_matches_longhand(q, seed):
    w = torch.softmax(torch.tensor([0.3, -1.0, 2.0, 0.5, 0.0, 1.2]), 0)
    uniforms = torch.rand(6, generator=torch.Generator().manual_seed(seed)).tolist()
    got = drop_layers(w, q, torch.Generator().manual_seed(seed))
    expected = longhand_drop(w.tolist(), uniforms, q)
    assert got.tolist() == pytest.approx(expected, abs=1e-7)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-6)


def test_when_every_layer_is_dropped_the_largest_weight_is_kept():
    w = torch.tensor([0.2, 0.5, 0.3])
    got = drop_layers(w, 0.999999, torch.Generator().manual_seed(0))
    assert got.tolist() == [0.0, 1.0, 0.0]


def test_a_layer_cut_off_stays_out_and_kept_layers_are_kept_at_the_rate_asked():
    w = torch.tensor([0.0, 0.25, 0.25, 0.5])  # layer 0 cut off by the cutoff
    gen, kept, n = torch.Generator().manual_seed(0), torch.zeros(4), 4000
    for _ in range(n):
        kept += (drop_layers(w, 0.3, gen) > 0).float()
    assert kept[0] == 0
    assert ((kept[1:] / n) - 0.7).abs().max() < 0.03  # binomial sd at n=4000: 0.007


def test_pass_weights_drop_only_in_training_and_the_gradient_reaches_kept_logits():
    torch.manual_seed(0)
    mixer = AdaLayersMixer(5, 8, MixerConfig(k=4, alpha=2.0, cutoff=0.0, layer_dropout=0.5))
    with torch.no_grad():
        mixer.p.copy_(torch.tensor([0.1, 0.9, 0.5, -0.4, 0.3]))
    assert torch.equal(mixer.eval().pass_weights(), mixer.layer_weights())
    mixer.train()
    w = mixer.pass_weights(torch.Generator().manual_seed(5))
    uniforms = torch.rand(5, generator=torch.Generator().manual_seed(5)).tolist()
    assert w.tolist() == pytest.approx(longhand_drop(mixer.layer_weights().tolist(), uniforms, 0.5), abs=1e-7)
    (w * torch.arange(5.0)).sum().backward()
    dropped = [i for i, u in enumerate(uniforms) if u < 0.5]
    # without a cutoff, w' is the softmax over the kept logits alone (the full softmax's denominator cancels):
    # a dropped layer's logit gets no gradient, the kept ones do
    assert dropped and all(abs(mixer.p.grad[i]) < 1e-6 for i in dropped)
    assert all(abs(mixer.p.grad[i]) > 1e-3 for i in range(5) if i not in dropped)


def test_layer_dropout_zero_is_the_default_mix():
    torch.manual_seed(0)
    mixer = AdaLayersMixer(4, 8, MixerConfig(k=4)).train()
    assert torch.equal(mixer.pass_weights(), mixer.layer_weights())


def task_with(**mixer) -> SideTask:
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads, cfg.train.lr = 8, 2, 1e-3
    for key, value in mixer.items():
        setattr(cfg.mixer, key, value)
    return SideTask(cfg, 4, 12, ["a", "b"])


def test_logit_lr_scale_one_is_one_group():
    task = task_with()
    groups = Fed(task, None).param_groups()
    assert len(groups) == 1 and groups[0]["params"] == task.trainable_parameters()


def test_logit_lr_scale_moves_the_logits_that_much_faster_in_adams_first_step():
    """Adam's first step moves every parameter by about lr * sign(grad): p by 1e-3 * 10, the rest by 1e-3."""
    torch.manual_seed(0)
    task = task_with(logit_lr_scale=10.0, cutoff=0.0)
    groups = Fed(task, None).param_groups()
    flat = [q for g in groups for q in g["params"]]
    assert len(flat) == len(task.trainable_parameters()) == len({id(q) for q in flat})
    opt = adamw(groups, FitSettings(lr=1e-3, max_epochs=1), torch.device("cpu"))
    before_p, w_before = task.mixer.p.detach().clone(), task.mixer.proj[0].weight.detach().clone()
    states, mask = [torch.randn(3, 5, 12) for _ in range(4)], torch.ones(3, 5, dtype=torch.long)
    task.loss(task(states, mask), torch.tensor([0, 1, 1])).backward()
    opt.step()
    p_step = (task.mixer.p.detach() - before_p).abs()
    w_step = (task.mixer.proj[0].weight.detach() - w_before).abs()
    assert p_step.max().item() == pytest.approx(1e-2, rel=1e-3)
    assert w_step.max().item() == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("field,value,message", [
    ("layer_dropout", 1.0, "mixer.layer_dropout: must be in [0, 1), got 1.0"),
    ("layer_dropout", -0.1, "mixer.layer_dropout: must be in [0, 1), got -0.1"),
    ("logit_lr_scale", 0.0, "mixer.logit_lr_scale: must be positive, got 0.0"),
    ("logit_lr_scale", math.nan, "mixer.logit_lr_scale: must be a finite number, got nan"),
])
def test_out_of_range_options_are_one_line_errors(field, value, message):
    cfg = Config()
    setattr(cfg.mixer, field, value)
    assert message in validate(cfg)


def test_freeze_after_stops_the_layer_weights_and_nothing_else_also_across_a_resume(tmp_path, monkeypatch):
    """mixer.freeze_after=1: the layer weights of epochs 2-3 are epoch 1's, while the head goes on learning; a run
    stopped after epoch 2 and resumed freezes them too; without the option they move."""
    import json

    from adalayers.recipes import service
    from tinymodels import imdb_tarball, tiny_bert, tiny_config

    monkeypatch.delenv("ADALAYERS_DATA", raising=False)
    model = tiny_bert(tmp_path / "model")
    imdb_tarball(tmp_path / "data", per_class=12, test_per_class=6)

    class Stop(Exception):
        pass

    def stop_after_2(epoch, metric):
        if epoch == 2:
            raise Stop

    def weights(run, on_epoch=None, **train):
        cfg = tiny_config(model, tmp_path / "data", "imdb", train={"early_stopping": 100, **train},
                          mixer={"freeze_after": 1} if run != "free" else {})
        service.train(cfg, tmp_path / run, resume=None, on_epoch=on_epoch)
        log = [json.loads(x) for x in (tmp_path / run / "log.jsonl").read_text().splitlines()]
        return [e["layer_weights"] for e in log], [e["train_loss"] for e in log]

    frozen, losses = weights("frozen", max_epochs=3)
    assert frozen[1] == frozen[0] and frozen[2] == frozen[0] and len(set(losses)) == 3
    free, _ = weights("free", max_epochs=3)
    assert free[1] != free[0]
    assert free[0] == frozen[0]  # the first epoch is the same run
    # stopped after epoch 2, then resumed: the weights stay frozen
    with pytest.raises(Stop):
        weights("resumed", on_epoch=stop_after_2, max_epochs=3)
    resumed, _ = weights("resumed", max_epochs=3)
    assert resumed == frozen


@pytest.mark.parametrize("layers,init,share,favoured", [(7, 3, 0.5, 3), (13, "middle", 0.5, 6), (19, "middle", 0.3, 9),
                                                        (5, 0, 0.8, 0)])
def test_a_warm_start_starts_the_weights_at_the_share_asked(layers, init, share, favoured):
    mixer = AdaLayersMixer(layers, 8, MixerConfig(k=4, init_layer=init, init_share=share))
    w = mixer.layer_weights().tolist()
    rest = (1 - share) / (layers - 1)
    assert w == pytest.approx([share if i == favoured else rest for i in range(layers)], abs=1e-6)


def test_no_warm_start_is_the_uniform_mix_and_a_pinned_mixer_ignores_it():
    assert AdaLayersMixer(4, 8, MixerConfig(k=4)).layer_weights().tolist() == pytest.approx([0.25] * 4)
    pinned = AdaLayersMixer(4, 8, MixerConfig(k=4, pin_layer=2, init_layer=0))
    assert pinned.layer_weights().tolist() == [0.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("cfg,message", [
    (dict(init_layer=7), "mixer.init_layer: the base has layers 0..6, got 7"),
    (dict(init_layer=1, init_share=0.97), "mixer.init_share: 0.97 starts the other 6 layers at 0.0050 each, at or "
                                          "below mixer.cutoff (0.01)"),
])
def test_a_warm_start_that_cannot_be_is_a_one_line_error(cfg, message):
    from adalayers.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        AdaLayersMixer(7, 8, MixerConfig(k=4, **cfg))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_negative_init_layer_is_refused_by_the_config():
    from adalayers import config as config_mod
    from adalayers.errors import ConfigError

    with pytest.raises(ConfigError, match="mixer.init_layer: a layer number from 0"):
        config_mod.from_dict(Config().to_dict(), ["mixer.init_layer=-1"])
    assert config_mod.from_dict(Config().to_dict(), ["mixer.init_layer=middle"]).mixer.init_layer == "middle"


class OneBatchFeed:
    steps, validate = 1, None

    def epoch(self, epoch, generator):
        return [epoch]


@pytest.mark.parametrize("mixer,expected", [
    (dict(warmup_epochs=2, learn_after=0), [(True, False), (True, False), (True, True), (True, True)]),
    (dict(learn_after=1), [(False, True), (True, True), (True, True), (True, True)]),
    (dict(learn_after=1, freeze_after=2), [(False, True), (True, True), (False, True), (False, True)]),
    (dict(warmup_epochs=1, learn_after=2), [(True, False), (False, True), (True, True), (True, True)]),
])
def test_the_schedule_says_what_learns_in_each_epoch(mixer, expected):
    from adalayers.recipes.train import MixSchedule

    task = task_with(**mixer)
    schedule = MixSchedule(OneBatchFeed(), task, task.cfg.mixer)
    assert MixSchedule.wanted(task.cfg.mixer)
    assert [schedule.learning(epoch) for epoch in (1, 2, 3, 4)] == expected
    assert not MixSchedule.wanted(task_with(pin_layer=1, **mixer).cfg.mixer)  # a pinned mixer trains as usual


@pytest.mark.parametrize("learn_after,max_epochs,held", [(3, 30, 3), (3, 10, 3), (3, 9, 3), (3, 8, 2), (3, 5, 1),
                                                         (3, 2, 0), (5, 10, 3), (0, 30, 0)])
def test_the_uniform_start_is_at_most_a_third_of_the_run(learn_after, max_epochs, held, caplog):
    """mixer.learn_after counts epochs, held to max_epochs // 3 so that a short run still learns its mix."""
    from adalayers.recipes.train import MixSchedule

    task = task_with(learn_after=learn_after)
    m = task.cfg.mixer
    caplog.set_level("INFO", logger="adalayers.recipes.train")
    schedule = MixSchedule(OneBatchFeed(), task, m, max_epochs)
    logits = [schedule.learning(epoch)[0] for epoch in range(1, max_epochs + 1)]
    assert logits == [False] * held + [True] * (max_epochs - held)
    assert MixSchedule.wanted(m, max_epochs) == (held > 0)
    assert ("is held to" in caplog.text) == (held < learn_after)


def test_a_mixer_only_warm_up_moves_the_logits_alone_then_everything(monkeypatch):
    """warmup_epochs=1: an AdamW step in epoch 1 changes p and nothing else; in epoch 2 the rest moves too."""
    from adalayers.recipes.train import MixSchedule

    torch.manual_seed(0)
    task = task_with(warmup_epochs=1, learn_after=0, cutoff=0.0)
    schedule = MixSchedule(OneBatchFeed(), task, task.cfg.mixer)
    opt = adamw(Fed(task, None).param_groups(), FitSettings(lr=1e-3, max_epochs=2), torch.device("cpu"))
    states, mask = [torch.randn(3, 5, 12) for _ in range(4)], torch.ones(3, 5, dtype=torch.long)
    moved = []
    for epoch in (1, 2):
        list(schedule.epoch(epoch, None))
        before = {n: q.detach().clone() for n, q in task.named_parameters()}
        opt.zero_grad(set_to_none=True)
        task.loss(task(states, mask), torch.tensor([0, 1, 1])).backward()
        opt.step()
        moved.append({n for n, q in task.named_parameters() if not torch.equal(q.detach(), before[n])})
    assert moved[0] == {"mixer.p"}
    assert "mixer.p" in moved[1] and any(n.startswith("head.") for n in moved[1]) and \
        any(n.startswith("mixer.proj.") for n in moved[1])
