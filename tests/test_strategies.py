"""Strategies: parameter counts against formulas, the base left bit-identical, and one epoch of each
strategy through `compare` on tiny synthetic sequence and token tasks."""
import json
import math
import random

import pytest
import torch
import transformers

from adalayers.lab import strategies
from adalayers.model.backbone import Backbone
from adalayers.config import Config
from adalayers.errors import ConfigError
from adalayers.lab.strategies.adapters import AdapterModel, AdaptersConfig
from adalayers.lab.strategies.harness import count_trainable, digest
from adalayers.data.tasks import TASKS, Example, TaskData

from conftest import WORDS, tiny_tokenizer

LAYERS, D, M = 5, 32, 8  # a 5-layer BERT: num_layers = 6 with the embedding output
ALL = ["adalayers", "single-layer:2", "last-layer", "scalar-mix", "concat", "finetune", "finetune-top:3",
       "adapters", "adapters-unshared", "adapters-shared3"]


def tiny_bert(tokenizer, layers=LAYERS, d=D, intermediate=37) -> Backbone:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=d, num_hidden_layers=layers,
                                  num_attention_heads=2, intermediate_size=intermediate, max_position_embeddings=64,
                                  pad_token_id=0)
    return Backbone(transformers.BertModel(cfg), tokenizer, f"tiny-bert-{layers}x{d}")


def _sentences(n, seed):
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(3, 9))] for _ in range(n)]


def tiny_seq(cfg):
    def ex(words):
        return Example(text=" ".join(words), label="pos" if {"good", "great", "love"} & set(words) else "neg")
    splits = {name: [ex(w) for w in _sentences(n, seed)] for name, n, seed in
              (("train", 48, 1), ("validation", 16, 2), ("test", 16, 3))}
    return TaskData("tiny-seq", "sequence", ["neg", "pos"], splits, "mcc")


def tiny_tok(cfg):
    def ex(words):
        return Example(words=words, tags=["B-PER" if w in ("john", "mary") else "O" for w in words])
    splits = {name: [ex(w) for w in _sentences(n, seed)] for name, n, seed in
              (("train", 48, 4), ("validation", 16, 5), ("test", 16, 6))}
    return TaskData("tiny-tok", "token", ["O", "B-PER"], splits, "f1")


TASKS.update({"tiny-seq": tiny_seq, "tiny-tok": tiny_tok})  # what load_task reads, as @register would do


def tiny_config(task="tiny-seq") -> Config:
    cfg = Config()
    cfg.task.name = task
    cfg.head.kind = "token" if task == "tiny-tok" else "sequence"
    cfg.mixer.k, cfg.head.num_heads, cfg.head.dim_feedforward = 8, 2, 16
    cfg.model.max_length = 32
    cfg.train.max_epochs, cfg.train.batch_size, cfg.train.eval_batch_size = 1, 16, 16
    cfg.cache.enabled = False
    return cfg


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and the test machine is shared."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def seq_data():
    return tiny_seq(None)


def build(spec, backbone, data, cfg=None):
    return strategies.make(spec).build(cfg or tiny_config(), backbone, data)


# --- parameter counts ------------------------------------------------------------------------------

def test_adalayers_counts(tok, tmp_path):
    from adalayers.model.sidetask import SideTask
    cfg, C, L, k = tiny_config(), 2, LAYERS + 1, 8
    task = SideTask(cfg, L, D, ["neg", "pos"])
    # per-layer projection d*k (no bias) + one p per layer; head: attention 4k^2 + 4k, output k*C + C
    assert task.num_trainable() == L * D * k + L + 4 * k * k + 4 * k + k * C + C


def test_scalar_mix_and_concat_counts(tok, seq_data):
    backbone, C, L = tiny_bert(tok), 2, LAYERS + 1
    assert count_trainable(build("scalar-mix", backbone, seq_data)) == L + 1 + 4 * D * D + 4 * D + D * C + C
    assert count_trainable(build("concat", backbone, seq_data)) == L * D * C + C


def test_finetune_counts_and_exact_trainable_set(tok, seq_data):
    backbone, C = tiny_bert(tok), 2
    model = build("finetune", backbone, seq_data)
    pooler = sum(p.numel() for p in backbone.model.pooler.parameters())
    assert count_trainable(model) == backbone.num_parameters() - pooler + D * C + C

    model = build("finetune-top:3", backbone, seq_data)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    expected = {f"base.model.encoder.layer.{i}.{n}" for i in (2, 3, 4)
                for n, _ in backbone.model.encoder.layer[i].named_parameters()} | {"head.out.weight", "head.out.bias"}
    assert trainable == expected
    assert not any(".embeddings." in n or ".layer.0." in n or ".layer.1." in n or "pooler" in n for n in trainable)
    with pytest.raises(ConfigError):
        build("finetune-top:6", backbone, seq_data)


@pytest.mark.parametrize("spec,modules,hidden", [("adapters", LAYERS, False),
                                                 ("adapters-unshared", 2 * LAYERS, True),
                                                 ("adapters-shared3", math.ceil(LAYERS / 3), False)])
def test_adapter_counts(tok, seq_data, spec, modules, hidden):
    backbone, C = tiny_bert(tok), 2
    cfg = tiny_config()
    model = strategies.make(spec, [f"size={M}"]).build(cfg, backbone, seq_data)
    per_module = 2 * M * D + D + M            # down d*m + m, up m*d + d
    layer_norms = LAYERS * 2 * (2 * D)        # two LayerNorms per layer, weight + bias
    head = (D * D + D if hidden else 0) + D * C + C
    assert sum(p.numel() for p in model.adapters.parameters()) == modules * per_module
    assert count_trainable(model) == modules * per_module + layer_norms + head


def test_adapter_counts_match_the_seed_report_on_a_bert_base_shape(tok, seq_data):
    """Table 1 of the report (BERT-base, m = 64): 1,189,632 / 3,006,720 / 396,544."""
    backbone = tiny_bert(tok, layers=12, d=768, intermediate=8)
    cfg = tiny_config()
    count = {s: strategies.make(s).build(cfg, backbone, seq_data) for s in
             ("adapters", "adapters-unshared", "adapters-shared3")}
    adapters = {s: sum(p.numel() for p in m.adapters.parameters()) for s, m in count.items()}
    assert adapters["adapters"] == 1_189_632
    assert adapters["adapters-shared3"] == 396_544
    unshared = count["adapters-unshared"]
    without_last = count_trainable(unshared) - sum(p.numel() for p in unshared.head.out.parameters())
    assert without_last == 3_006_720  # adapters + encoder layer norms + the tanh layer


# --- behaviour -----------------------------------------------------------------------------------

def test_adapters_switched_off_give_the_base_back(tok, seq_data):
    backbone = tiny_bert(tok)
    conf = AdaptersConfig(size=M, train_layer_norms=False)
    model = AdapterModel(backbone, "sequence", ["neg", "pos"], conf).eval()
    with torch.no_grad():
        for p in model.adapters.parameters():
            p.normal_(0, 0.5)
    batch = backbone.tokenize(["john sees the big dog", "a good movie"])
    base = backbone(batch).last_hidden_state
    with torch.no_grad():
        adapted = model.core()(**batch).last_hidden_state
        model.disabled = set(range(1, LAYERS + 1))
        off = model.core()(**batch).last_hidden_state
    assert not torch.allclose(adapted, base, atol=1e-4)
    assert torch.equal(off, base)


def test_bad_strategy_names_and_settings_are_config_errors():
    with pytest.raises(ConfigError, match="unknown strategy"):
        strategies.make("lora")
    with pytest.raises(ConfigError, match="size"):
        strategies.make("adapters", ["size=0"])
    with pytest.raises(ConfigError, match="unknown field"):
        strategies.make("finetune", ["lrr=1e-5"])
    with pytest.raises(ConfigError, match="takes no"):
        strategies.make("adapters:3")


@pytest.mark.parametrize("spec, sets, line", [
    ("finetune", ["lr=0"], "strategy finetune: lr: must be positive, got 0"),
    ("adapters", ["schedule=cosine"], "strategy adapters: schedule: must be constant or linear, got 'cosine'"),
    ("scalar-mix", ["warmup_fraction=1"], "strategy scalar-mix: warmup_fraction: must be in [0, 1), got 1"),
    ("concat", ["keep_fraction=0"], "strategy concat: keep_fraction: must be in (0, 1], got 0"),
    ("concat", ["group_lasso=-1"], "strategy concat: group_lasso: must be at least 0, got -1"),
    ("adapters-shared3", ["classifier=relu"], "strategy adapters-shared3: classifier: must be linear or tanh, "
                                              "got 'relu'"),
    ("finetune-top:0", [], "strategy finetune-top:0: top: must be at least 1, got 0"),
    ("single-layer:-1", [], "strategy single-layer:-1: layer: must be at least 0, got -1"),
    ("adalayers", ["lr=1e-3"], "strategy adalayers: lr: unknown field (it has no fields)"),
])
def test_every_strategy_setting_is_checked_where_it_is_declared(spec, sets, line):
    with pytest.raises(ConfigError) as e:
        strategies.make(spec, sets)
    assert str(e.value).splitlines()[1:] == [f"  - {line}"]


@pytest.mark.parametrize("task", ["tiny-seq", "tiny-tok"])
def test_every_strategy_trains_through_compare_and_leaves_the_base_untouched(tok, tmp_path, task):
    from adalayers.lab.strategies.compare import compare

    backbone = tiny_bert(tok)
    before = digest(backbone.model)
    summary = compare(tiny_config(task), ALL, tmp_path, ["adapters.size=8", "adapters-unshared.size=8"],
                      inference_rows=8, isolate=False, backbone=backbone)
    assert digest(backbone.model) == before
    rows = {r["spec"]: r for r in summary["strategies"]}
    assert list(rows) == ALL
    metric = "mcc" if task == "tiny-seq" else "f1"
    for spec, r in rows.items():
        assert r["base_bit_identical"], spec
        assert r["epochs"] == 1 and metric in r["test"], spec
        assert r["trainable_params"] > 0 and set(r["inference_s_per_1000"]) == {"1", "4"}
    assert rows["finetune"]["trainable_params"] > rows["adapters"]["trainable_params"] > rows["concat"]["trainable_params"]
    assert rows["finetune"]["main_model"].startswith("copy trained")
    assert rows["adalayers"]["main_model"] == "untouched, shared pass"
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert [r["spec"] for r in saved["strategies"]] == ALL
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert "| finetune-top:3 |" in (tmp_path / "compare.md").read_text()

    again = compare(tiny_config(task), ["concat", "finetune"], tmp_path, ["finetune.lr=1e-4"], inference_rows=8,
                    isolate=False, backbone=backbone, resume=True)
    assert again["strategies"][0] == saved["strategies"][4]          # same settings: reused
    assert again["strategies"][1]["config"]["lr"] == 1e-4            # changed settings: trained again

    if task == "tiny-seq":  # the span ablation re-reads the saved adapters and re-evaluates
        from adalayers.lab.strategies.ablation import ablate
        result = ablate(tmp_path / "adapters", backbone=backbone)
        drops = result["relative_drop"]
        assert len(drops) == LAYERS and all(drops[i][j] is None for i in range(LAYERS) for j in range(i))
        assert all(result["scores"][i][j] is not None for i in range(LAYERS) for j in range(i, LAYERS))
        assert (tmp_path / "adapters" / "ablation.png").is_file()


def test_compare_with_seeds_shows_medians_and_ranges(tok, tmp_path):
    import statistics

    from adalayers.lab.seeds import cell
    from adalayers.lab.strategies.compare import compare

    backbone = tiny_bert(tok)
    summary = compare(tiny_config(), ["adalayers", "last-layer"], tmp_path, inference_rows=8, isolate=False,
                      backbone=backbone, seeds=2)
    md = (tmp_path / "compare.md").read_text()
    assert "trained with 2 seeds" in md
    for r in summary["strategies"]:
        folder = tmp_path / r["spec"].replace(":", "-")
        per_seed = [json.loads((folder / f"seed_{n}" / "result.json").read_text()) for n in (0, 1)]
        assert [p["run_config"]["train"]["seed"] for p in per_seed] == [0, 1] and r["seeds"] == [0, 1]
        values = [p["test"]["mcc"] for p in per_seed]
        assert r["test"]["mcc"] == statistics.median(values)
        assert (r["spread"]["test"]["mcc"]["min"], r["spread"]["test"]["mcc"]["max"]) == (min(values), max(values))
        assert f"| {r['spec']} | {cell(r['spread']['test']['mcc'], '{:.3f}')} |" in md
