"""Multi-task learning: the dependency graph, PCGrad, SMART, schedules, and a tiny compare-multitask run."""
import json
import random

import pytest
import torch
import transformers

from adalayers.model.backbone import Backbone
from adalayers.errors import ConfigError
from adalayers.lab.multitask import pcgrad, smart
from adalayers.lab.multitask.config import SmartConfig, from_dict
from adalayers.lab.multitask.data import collate, encode_rows
from adalayers.lab.multitask.heads import CLASSES, ONE_LOGIT, VALUE
from adalayers.lab.multitask.model import MultitaskModel
from adalayers.lab.multitask.schedule import plan
from adalayers.lab.multitask.trainer import task_loss
from adalayers.data.tasks import TASKS, Example, TaskData

from conftest import WORDS, tiny_tokenizer

torch.set_num_threads(1)


def _sent(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7)))


def _task(name, kind, labels, pair, n=(24, 8, 8)):
    def make(cfg):
        rng = random.Random(name)
        splits = {}
        for split, count in zip(("train", "validation", "test"), n):
            rows = []
            for _ in range(count):
                a, b = _sent(rng), _sent(rng) if pair else None
                good = "good" in a or "great" in a
                label = rng.uniform(0, 5) if kind == "regression" else labels[int(good) % len(labels)]
                rows.append(Example(text=a, text_pair=b, label=label))
            splits[split] = rows
        return TaskData(name, kind, labels, splits, "pearson" if kind == "regression" else "accuracy")
    return make


TASKS.update({"t-sent": _task("t-sent", "sequence", ["neg", "mid", "pos"], False),
              "t-para": _task("t-para", "sequence", ["no", "yes"], True),
              "t-sim": _task("t-sim", "regression", [], True)})


def tiny_backbone() -> Backbone:
    torch.manual_seed(0)
    tok = tiny_tokenizer()
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                                  intermediate_size=24, max_position_embeddings=64, pad_token_id=0)
    return Backbone(transformers.BertModel(cfg), tok, "tiny-bert")


def mt_config(**kw) -> dict:
    tasks = [{"name": "t-sent", "head": "sentiment", "hidden": 8},
             {"name": "t-para", "head": "bilinear", "hidden": 8, "depends_on": ["t-sent"]},
             {"name": "t-sim", "head": "cosine", "hidden": 8, "depends_on": ["t-para"]}]
    return {"tasks": tasks, "base": "tiny", "max_length": 16, "batch_size": 8, "max_epochs": 1, **kw}


def _model(cfg):
    from adalayers.lab.multitask.trainer import load_tasks
    datas = load_tasks(cfg)
    return MultitaskModel(tiny_backbone(), cfg.tasks, datas, cfg.freeze, cfg.freeze_upstream), datas


def _backward(model, datas, cfg, task):
    model.zero_grad(set_to_none=True)
    d = datas[task]
    rows = encode_rows(d.splits["train"], model_tok, 16, model.forms[task], d.kind, d.labels)
    task_loss(model, task, collate(rows, list(range(8)), 0), cfg, 1.0, None).backward()
    return {name: any(p.grad is not None and p.grad.abs().sum() > 0 for p in h.parameters())
            for name, h in model.heads.items()}


model_tok = tiny_tokenizer()


def test_dependency_graph_freezes_exactly_the_upstream_heads():
    cfg = from_dict(mt_config())
    model, datas = _model(cfg)
    assert model.forms == {"t-sent": "single", "t-para": "bi", "t-sim": "bi"}
    # t-sim reads t-para, which reads t-sent: both upstream heads frozen, the base still learns
    assert _backward(model, datas, cfg, "t-sim") == {"t-sent": False, "t-para": False, "t-sim": True}
    assert any(p.grad is not None for p in model.shared_parameters())
    assert _backward(model, datas, cfg, "t-para") == {"t-sent": False, "t-para": True, "t-sim": False}
    assert _backward(model, datas, cfg, "t-sent") == {"t-sent": True, "t-para": False, "t-sim": False}
    cfg = from_dict(mt_config(freeze_upstream=False))
    model, datas = _model(cfg)
    assert _backward(model, datas, cfg, "t-sim") == {"t-sent": True, "t-para": True, "t-sim": True}


def test_freeze_modes_and_head_widths():
    model, _ = _model(from_dict(mt_config(freeze="top:1")))
    trainable = {".".join(n.split(".")[:3]) for n, p in model.model.named_parameters() if p.requires_grad}
    assert trainable == {"encoder.layer.2"}
    model, _ = _model(from_dict(mt_config(freeze="all")))
    assert model.shared_parameters() == []
    # t-para's projection reads y (16) + t-sent's 3 probabilities; t-sim's reads y + t-para's 1
    assert model.heads["t-para"].a.in_features == 19 and model.heads["t-sim"].a.in_features == 17


def test_cycle_rejected_with_its_path():
    cfg = mt_config()
    cfg["tasks"][0]["depends_on"] = ["t-sim"]
    with pytest.raises(ConfigError, match="cycle: t-sent -> t-sim -> t-para -> t-sent"):
        from_dict(cfg)
    cfg["tasks"][0]["depends_on"] = ["nope"]
    with pytest.raises(ConfigError, match="'nope' is not among the tasks"):
        from_dict(cfg)


def test_two_input_head_cannot_feed_a_one_input_head():
    cfg = mt_config()
    cfg["tasks"][0]["depends_on"] = ["t-para"]
    cfg["tasks"][1]["depends_on"] = []
    with pytest.raises(ConfigError, match="cannot take the output of t-para"):
        _model(from_dict(cfg))


def test_pcgrad_conflicting_gradients_projected():
    big, small = torch.tensor([2.0, 0.0]), torch.tensor([-1.0, 1.0])
    # small conflicts with big (dot -2): its component along big is removed -> [0, 1]; big kept
    assert torch.allclose(pcgrad.combine([small, big]), torch.tensor([2.0, 1.0]))
    assert torch.allclose(pcgrad.combine([big, small]), torch.tensor([2.0, 1.0]))


def test_pcgrad_agreeing_gradients_summed_unchanged():
    a, b, c = torch.tensor([1.0, 2.0, 0.0]), torch.tensor([0.5, 0.0, 1.0]), torch.tensor([3.0, 1.0, 1.0])
    assert torch.allclose(pcgrad.combine([a, b, c]), a + b + c)


def test_pcgrad_three_tasks_projects_against_each_conflict():
    g1, g2, g3 = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([-1.0, 1.0, 0.0]), torch.tensor([0.0, -1.0, 1.0])
    out = pcgrad.combine([g1, g2, g3])
    # g2 vs g1: -> [0, 1, 0]; then vs g3 (dot -1, |g3|^2 2): + 0.5 g3 -> [0, 0.5, 0.5]
    # g3 vs g1: dot 0; vs g2 (dot -1, |g2|^2 2): + 0.5 g2 -> [-0.5, -0.5, 1]
    assert torch.allclose(out, g1 + torch.tensor([0.0, 0.5, 0.5]) + torch.tensor([-0.5, -0.5, 1.0]))
    assert torch.allclose(pcgrad.combine([g1]), g1)


def test_smart_perturbation_within_eps():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    fn = lambda es: lin(es[0]).sum(1) + lin(es[1]).sum(1)  # noqa: E731  two sides, classes
    embeds = [torch.randn(2, 5, 4), torch.randn(2, 6, 4)]
    clean = fn(embeds)
    deltas = smart.perturb(fn, embeds, clean, CLASSES, eps=0.01, sigma=0.05, steps=3, step_size=0.5)
    assert [d.shape for d in deltas] == [e.shape for e in embeds]
    assert all(d.abs().max() <= 0.01 + 1e-7 for d in deltas)
    assert all(d.abs().max() > 0.009 for d in deltas)  # the ascent reached the ball's edge
    assert smart.smoothness(fn, embeds, clean, CLASSES, SmartConfig(eps=0.01, steps=2, step_size=0.5)) > 0


def test_head_outputs_use_the_engine_loss():
    """One logit s is the two-class logits [0, s]: the engine's cross-entropy on them is BCE of s."""
    import torch.nn.functional as nnf

    torch.manual_seed(0)
    s, y = torch.randn(6), torch.tensor([0, 1, 1, 0, 1, 0])
    assert torch.allclose(ONE_LOGIT.loss(s, y), nnf.binary_cross_entropy_with_logits(s, y.float()), atol=1e-6)
    assert ONE_LOGIT.predictions(s) == (s > 0).long().tolist() and ONE_LOGIT.width(2) == 1
    assert torch.allclose(ONE_LOGIT.feature(s), torch.softmax(ONE_LOGIT.logits(s), -1)[:, 1:])
    logits = torch.randn(6, 3)
    assert torch.allclose(CLASSES.loss(logits, y), nnf.cross_entropy(logits, y)) and CLASSES.width(3) == 3
    v, t = torch.randn(6), torch.randn(6)
    assert torch.allclose(VALUE.loss(v, t), ((v - t) ** 2).mean()) and VALUE.feature(v).shape == (6, 1)


@pytest.mark.parametrize("kind", [CLASSES, ONE_LOGIT, VALUE])
def test_smart_loss_zero_for_a_constant_model(kind):
    const = torch.tensor([0.3, -1.2, 2.0]) if kind == CLASSES else torch.tensor(0.7)
    fn = lambda es: const.expand(es[0].shape[0], *const.shape) + 0 * es[0].sum()  # noqa: E731
    embeds = [torch.randn(4, 5, 8, requires_grad=True)]
    loss = smart.smoothness(fn, embeds, fn(embeds), kind, SmartConfig(eps=0.1, steps=2, step_size=0.1))
    assert float(loss.detach()) == 0.0


def test_smart_bregman_zero_right_after_the_copy_and_positive_after_a_change():
    lin = torch.nn.Linear(4, 2)
    ema = smart.EMA(lin, beta=0.5)
    x = torch.randn(3, 4)
    assert smart.bregman(ema, lin, CLASSES, lin(x), x).item() == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        lin.weight.add_(1.0)
    assert smart.bregman(ema, lin, CLASSES, lin(x), x).item() > 0
    ema.update(lin)
    assert torch.allclose(ema.params["weight"], lin.weight - 0.5)


def test_schedules():
    sizes = {"a": 30, "b": 10, "c": 20}  # batches of 10: 3, 1, 2
    rr = plan("round_robin", sizes, 10, 0)
    assert [s[0][0] for s in rr] == ["a", "b", "c", "a", "c", "a"]
    for kind in ("round_robin", "proportional"):
        steps = plan(kind, sizes, 10, 0)
        for t, n in sizes.items():  # every row of every task exactly once
            assert sorted(i for s in steps for task, idx in s if task == t for i in idx) == list(range(n))
    prop = [s[0][0] for s in plan("proportional", sizes, 10, 0)]
    assert sorted(prop) == sorted(["a"] * 3 + ["b"] + ["c"] * 2)
    assert [[s[0][0] for s in plan("proportional", sizes, 10, seed)] for seed in range(6)] != [prop] * 6
    joint = plan("joint", sizes, 10, 0)
    assert len(joint) == 2 and all([t for t, _ in s] == ["a", "b", "c"] for s in joint)


def test_compare_multitask_tiny_run(tmp_path):
    from adalayers.cli import main

    folder = tmp_path / "tiny-bert"
    bb = tiny_backbone()
    bb.model.save_pretrained(folder)
    bb.tokenizer.save_pretrained(folder)
    cfg = mt_config(base=str(folder), smart={"enabled": False, "steps": 1, "eps": 0.01})
    cfg_path = tmp_path / "mt.yaml"
    cfg_path.write_text(json.dumps(cfg))  # JSON is YAML
    out = tmp_path / "cmp"
    assert main(["compare-multitask", str(cfg_path), "--out", str(out), "--epochs", "1", "--train-rows", "16",
                 "--eval-rows", "8"]) == 0
    s = json.loads((out / "compare_multitask.json").read_text())
    assert [r["variant"] for r in s["variants"]] == ["baseline", "progressive", "pcgrad", "smart", "freeze-top3",
                                                    "adalayers", "adalayers-progressive"]
    by = {r["variant"]: r for r in s["variants"]}
    for r in s["variants"]:
        assert set(r["results"]) == {"t-sent", "t-para", "t-sim"}
        assert r["results"]["t-sim"]["test"]["n"] == 8 and r["trainable_params"] > 0
    # the progressive heads read upstream outputs (wider inputs); top:3 of 3 layers leaves the embeddings frozen
    assert by["progressive"]["trainable_params"] > by["baseline"]["trainable_params"]
    assert by["freeze-top3"]["trainable_params"] < by["baseline"]["trainable_params"]
    # AdaLayers with progressive sharing: the same heads plus one linear map per upstream output
    # (t-para reads t-sent's 3 probabilities: 3x2 + 2; t-sim reads t-para's 2: 2x1 + 1)
    assert by["adalayers-progressive"]["trainable_params"] == by["adalayers"]["trainable_params"] + 8 + 3
    assert by["adalayers-progressive"]["results"]["t-sent"] == by["adalayers"]["results"]["t-sent"]
    md = (out / "compare_multitask.md").read_text()
    assert "| smart |" in md and "t-sim dev pearson" in md
    # the start-up estimate is kept (out/estimate.json) and shown beside each variant's measured time
    estimates = json.loads((out / "estimate.json").read_text())
    assert set(estimates) == set(by) and all(v >= 0 for v in estimates.values())  # tiny data: may round to 0
    assert f"| {by['smart']['train_seconds']:.0f} | {estimates['smart']:.0f} |" in md and "estimated s" in md
    assert (out / "compare_multitask.png").stat().st_size > 1000
    with pytest.raises(ConfigError, match="unknown"):
        from adalayers.lab.multitask.compare import compare
        compare(from_dict(cfg), out, variants=["nope"])


def test_linear_heads_read_the_cross_encoder_input_and_train(tmp_path):
    from adalayers.lab.multitask import trainer

    cfg = from_dict({"tasks": [{"name": "t-sent", "head": "linear"},
                               {"name": "t-para", "head": "linear", "depends_on": ["t-sent"], "weight": 0.5},
                               {"name": "t-sim", "head": "linear"}],
                     "base": "tiny", "max_length": 16, "batch_size": 8, "max_epochs": 1, "schedule": "proportional",
                     "freeze": "top:2", "smart": {"enabled": True, "eps": 0.01}})
    r = trainer.train(cfg, tiny_backbone(), log=lambda *a: None)
    assert r["forms"] == {"t-sent": "single", "t-para": "cross", "t-sim": "cross"}
    assert set(r["results"]["t-sim"]["test"]) >= {"pearson", "spearman"}
    assert r["results"]["t-para"]["validation"]["n"] == 8


@pytest.mark.parametrize("task,head", [("t-sent", "cosine"), ("t-sim", "sentiment"), ("t-sim", "bilinear")])
def test_head_must_fit_the_task(task, head):
    cfg = mt_config()
    for t in cfg["tasks"]:
        t["depends_on"] = []
        if t["name"] == task:
            t["head"] = head
    with pytest.raises(ConfigError, match=f"task {task}"):
        _model(from_dict(cfg))


def test_compare_multitask_resumes_per_variant(tmp_path, caplog):
    """Finished variants are kept and skipped; a missing one is run; other settings are refused."""
    from adalayers.lab.multitask.compare import RESULTS, compare

    cfg = from_dict(mt_config(max_train_examples=16, max_eval_examples=8, max_epochs=1))
    bb, out = tiny_backbone(), tmp_path / "cmp"
    caplog.set_level("INFO")
    compare(cfg, out, variants=["baseline", "freeze-top3"], backbone=bb)
    assert "estimate for the 2 variant(s) still to run" in caplog.text
    files = {n: out / RESULTS / f"{n}.json" for n in ("baseline", "freeze-top3")}
    first = {n: (f.stat().st_mtime_ns, json.loads(f.read_text())) for n, f in files.items()}
    files["freeze-top3"].unlink()  # as if the run had been killed during freeze-top3
    caplog.clear()
    s = compare(cfg, out, variants=["baseline", "freeze-top3"], backbone=bb, estimate=False)
    assert "finished earlier (kept from" in caplog.text and "[baseline] starting" not in caplog.text
    assert "[freeze-top3] starting" in caplog.text
    assert files["baseline"].stat().st_mtime_ns == first["baseline"][0]  # kept, not rewritten
    assert [r["variant"] for r in s["variants"]] == ["baseline", "freeze-top3"]
    assert s["variants"][0]["results"] == first["baseline"][1]["results"]
    assert json.loads(files["freeze-top3"].read_text())["results"] == first["freeze-top3"][1]["results"]
    s = compare(cfg, out, variants=["baseline", "smart", "freeze-top3"], backbone=bb, train=False)
    assert [r["variant"] for r in s["variants"]] == ["baseline", "freeze-top3"] and s["not_run"] == ["smart"]
    assert "| smart | not run |" in (out / "compare_multitask.md").read_text()
    assert not (out / RESULTS / "smart.json").exists()
    # an AdaLayers variant killed after some of its heads finished: those heads are shown, marked unfinished
    compare(cfg, out, variants=["adalayers"], backbone=bb, estimate=False)
    (out / RESULTS / "adalayers.json").unlink()
    (out / "adalayers" / "t-para" / "metrics.json").unlink()
    s = compare(cfg, out, variants=["baseline", "adalayers"], backbone=bb, train=False)
    assert s["not_run"] == ["adalayers"] and s["partial"]["adalayers"]["tasks"] == ["t-sent", "t-sim"]
    row = next(r for r in (out / "compare_multitask.md").read_text().splitlines() if r.startswith("| adalayers"))
    assert "unfinished: t-sent, t-sim only" in row and row.count("not run") == 2
    with pytest.raises(ConfigError, match="other settings"):
        compare(from_dict(mt_config(max_train_examples=16, max_eval_examples=8, max_epochs=2)), out,
                variants=["baseline"], backbone=bb)
    with pytest.raises(ConfigError, match="other settings"):
        compare(cfg, out, variants=["baseline"], backbone=bb, adalayers_lr=1e-4)


def test_stored_settings_may_lack_settings_added_later():
    from adalayers.lab.multitask.adalayers import same_settings

    want = {"config": {"lr": 1e-3, "precision": "fp32"}, "epochs": 3}
    assert same_settings({"config": {"lr": 1e-3}, "epochs": 3}, want)
    assert not same_settings({"config": {"lr": 1e-4}, "epochs": 3}, want)
    assert not same_settings({"config": {"lr": 1e-3, "gone": 1}, "epochs": 3}, want)


def test_progressive_adalayers_head_reads_frozen_upstream_outputs():
    from adalayers.config import Config
    from adalayers.lab.multitask.adalayers import ProgressiveTask
    from adalayers.model.sidetask import SideTask

    torch.manual_seed(0)
    cfg = Config()
    cfg.mixer.k, cfg.head.num_heads = 8, 2
    up_cfg = Config()
    up_cfg.mixer.k, up_cfg.head.num_heads = 8, 2
    up = SideTask(up_cfg, 3, 16, ["a", "b", "c"])
    cfg.head.kind, cfg.head.target_mean, cfg.head.target_std = "regression", 2.5, 1.5
    task = ProgressiveTask(cfg, 3, 16, [], {"up": up})
    states, mask = [torch.randn(4, 5, 16) for _ in range(3)], torch.ones(4, 5, dtype=torch.long)
    plain = SideTask(cfg, 3, 16, [])
    plain.load_state_dict({k: v for k, v in task.state_dict().items() if not k.startswith(("upstream", "extra"))})
    task.eval(), plain.eval()
    assert torch.allclose(task(states, mask), plain(states, mask))  # W_u starts at 0: the plain head
    with torch.no_grad():
        task.extra.weight.fill_(1.0)
    # sum of the upstream's probabilities is 1, so W_u = 1 adds exactly target_std * 1 to every prediction
    assert torch.allclose(task(states, mask), plain(states, mask) + 1.5, atol=1e-5)
    task.train()
    assert not task.upstream.training  # frozen upstream: no dropout
    task.loss(task(states, mask), torch.full((4,), 2.0)).backward()
    assert all(p.grad is None for p in task.upstream.parameters())
    assert task.extra.weight.grad is not None and task.mixer.p.grad is not None
    assert task.num_trainable() == plain.num_trainable() + 3 + 1


def test_a_task_may_cap_its_own_training_rows():
    """tasks[i].max_train_examples wins over the run's (a QQP subset beside SST-5 in full), for the fine-tuned
    variants' data and the AdaLayers heads' run configs alike; a cap below 1 and an unknown device are refused."""
    from adalayers.lab.multitask.adalayers import head_config
    from adalayers.lab.multitask.compare import markdown
    from adalayers.lab.multitask.trainer import load_tasks

    tasks = mt_config()["tasks"]
    tasks[1]["max_train_examples"] = 5
    cfg = from_dict(mt_config(tasks=tasks, max_train_examples=12))
    assert {t: len(d.splits["train"]) for t, d in load_tasks(cfg).items()} == {"t-sent": 12, "t-para": 5, "t-sim": 12}
    assert [head_config(cfg, t, 1, 1).task.max_train_examples for t in ("t-sent", "t-para")] == [12, 5]
    summary = {"main_metric": {"t-sent": "accuracy"}, "config": cfg.to_dict(), "command": "c", "variants": [],
               "torch_threads": 1, "base_params": 1}
    assert "Train rows per task t-sent 12, t-para 5, t-sim 12," in markdown(summary)
    tasks[1]["max_train_examples"] = 0
    with pytest.raises(ConfigError, match=r"tasks\[1\]\.max_train_examples: must be at least 1"):
        from_dict(mt_config(tasks=tasks))
    with pytest.raises(ConfigError, match="device: must be auto, cpu or cuda"):
        from_dict(mt_config(device="gpu"))


@pytest.mark.parametrize("use_pcgrad", [False, True])
def test_estimate_times_the_trainers_own_steps_of_its_schedule(monkeypatch, use_pcgrad):
    """The fine-tuned estimate times trainer.Steps' steps (PCGrad's projection included) of each kind the
    schedule takes, and counts them from the schedule's own plan of an epoch."""
    from adalayers.lab.multitask import estimate
    from adalayers.lab.multitask.trainer import load_tasks, schedule_kind

    cfg = from_dict(mt_config(pcgrad=use_pcgrad))
    datas = load_tasks(cfg)
    combined = []
    monkeypatch.setattr(pcgrad, "combine", lambda grads: (combined.append(len(grads)), sum(grads))[1])
    costs = estimate.finetune_costs(cfg, tiny_backbone(), datas, probe_steps=2)
    assert costs["kind"] == schedule_kind(cfg) == ("joint" if use_pcgrad else "round_robin")
    want_shapes = [("t-sent", "t-para", "t-sim")] if use_pcgrad else [("t-sent",), ("t-para",), ("t-sim",)]
    assert list(costs["step_s"]) == want_shapes and all(s > 0 for s in costs["step_s"].values())
    assert combined == ([3] * 3 if use_pcgrad else [])  # a warm-up and two timed joint steps, each projecting 3
    # the schedule's steps at their measured costs: here 24 train rows per task in batches of 8
    costs = {**costs, "step_s": {k: 1.0 for k in costs["step_s"]}, "eval_row_s": {t: 0.0 for t in datas}}
    sizes = estimate.rows(datas)
    assert estimate.finetune_seconds(costs, sizes, epochs=2) == 2 * (3 if use_pcgrad else 9)


def test_pcgrad_backward_runs_each_tasks_graph_once_and_keeps_its_gradients():
    """A joint PCGrad step: each task's head gets its gradient from one backward (its own graph only, not a
    backward through the stack of every task's loss), and the shared gradient is PCGrad's combination of the
    per-task gradients (computed here one task at a time, longhand)."""
    from adalayers.lab.multitask.trainer import Steps, load_tasks

    cfg = from_dict(mt_config(pcgrad=True))
    datas = load_tasks(cfg)
    model = MultitaskModel(tiny_backbone(), cfg.tasks, datas, cfg.freeze, cfg.freeze_upstream)
    rows = {t: {"train": encode_rows(d.splits["train"], model_tok, 16, model.forms[t], d.kind, d.labels)}
            for t, d in datas.items()}
    steps = Steps(model, cfg, rows, {s.name: s.weight for s in cfg.tasks}, None)
    batch = {"steps": [(t, list(range(8))) for t in datas]}
    model.eval()  # no dropout: the longhand below sees the same forward
    want = []
    for t in datas:  # longhand: each task's shared gradient alone
        model.zero_grad(set_to_none=True)
        steps({"steps": [(t, list(range(8)))]})[0].backward()
        want.append(pcgrad.flat_grad(steps.shared))
    calls = {t: 0 for t in datas}
    for t, head in model.heads.items():
        for p in head.parameters():
            p.register_hook(lambda g, t=t: calls.__setitem__(t, calls[t] + 1) or g)
    model.zero_grad(set_to_none=True)
    steps.backward(steps(batch))
    per_head = {t: sum(1 for p in model.heads[t].parameters() if p.requires_grad) for t in datas}
    assert calls == per_head  # every head parameter's gradient computed once, by its own task's backward
    assert torch.allclose(pcgrad.flat_grad(steps.shared), pcgrad.combine(want), atol=1e-6)
