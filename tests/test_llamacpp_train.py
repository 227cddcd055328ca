"""`cache build`, `train` and `evaluate` with the frozen base run by llama.cpp (model.runtime: llama.cpp), on a tiny
F32 GGUF base written by the test and a small sentiment task: a head trained on llama.cpp's states is the same
kind of run folder (it serves on both runtimes), its cache entries are keyed apart from the default runtime's,
`evaluate --runtime llama.cpp` gives the default runtime's metrics (the states agree within 5e-3 on an F32 file),
and what llama.cpp cannot run is refused in one line."""
from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from adalayers import config  # noqa: E402
from adalayers.cli import main  # noqa: E402
from adalayers.recipes import service  # noqa: E402
from adalayers.store.cache.source import cached_source  # noqa: E402
from adalayers.store.cache.store import list_entries  # noqa: E402
from runs_util import assert_json_close  # noqa: E402
from test_files_task import sentiment_rows, write_csv  # noqa: E402
from tinygguf import write_tiny_llama  # noqa: E402

TEXTS = ["the cat sat on the mat", "a man in the other room", "there"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A config file for a small sentiment task on the tiny GGUF base; its cache (and the base's conversion) in
    the test's own folder."""
    root = tmp_path_factory.mktemp("llamacpp_train")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADALAYERS_CACHE", str(root / "cache"))
        gguf = write_tiny_llama(root / "tiny-llama.gguf")
        train = write_csv(root / "train.csv", sentiment_rows(160, 1), ["text", "label"])
        test = write_csv(root / "test.csv", sentiment_rows(40, 2), ["text", "label"])
        cfg = {"task": {"train": str(train), "test": str(test)}, "model": {"base": str(gguf), "max_length": 32},
               "mixer": {"k": 16}, "head": {"num_heads": 2, "dim_feedforward": 32},
               "train": {"lr": 1e-2, "batch_size": 16, "eval_batch_size": 48, "max_epochs": 6, "early_stopping": 10,
                         "num_threads": 1, "device": "cpu"},
               "cache": {"dir": str(root / "cache")}}
        path = root / "task.yaml"
        path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
        yield {"root": root, "config": path, "cache": root / "cache" / "states"}


LLAMA = ["--set", "model.runtime=llama.cpp"]


def _entries(cache) -> set[str]:
    return {e["key"] for e in list_entries(cache)}


@pytest.fixture(scope="module")
def llama_run(task):
    """`adalayers cache build` then `adalayers train` from the cache, both on llama.cpp's states."""
    assert main(["cache", "build", str(task["config"]), *LLAMA]) == 0
    built = _entries(task["cache"])
    assert len(built) == 3  # train, validation (10% of train), test
    run = task["root"] / "run_llama"
    assert main(["train", str(task["config"]), *LLAMA, "--out", str(run)]) == 0
    assert _entries(task["cache"]) == built  # trained from the entries just built
    return run


def test_train_on_llama_cpp_states_records_the_runtime_and_serves_on_both(llama_run):
    meta = json.loads((llama_run / "config.json").read_text())
    assert meta["config"]["model"]["runtime"] == "llama.cpp"  # a reader knows what the head was trained on
    metrics = json.loads((llama_run / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.9 and metrics["base_params"] > 0
    # the same head file on both runtimes: the same labels, values within llama.cpp's precision
    assert_json_close(service.predict(llama_run, TEXTS, runtime="llama.cpp"), service.predict(llama_run, TEXTS), 2e-3)


def test_cache_entries_of_the_two_runtimes_have_different_keys(task):
    cfg = config.load(task["config"])
    sources = {}
    for runtime in ("torch", "llama.cpp"):
        cfg.model.runtime = runtime
        backbone, data, encoded = service.prepare(cfg)
        sources[runtime] = cached_source(cfg, backbone, data, encoded)
    torch_src, llama_src = sources["torch"], sources["llama.cpp"]
    assert torch_src.fields["train"]["fingerprint"] == llama_src.fields["train"]["fingerprint"]  # same heads load
    for split in torch_src.keys:
        assert torch_src.keys[split] != llama_src.keys[split]
        assert {k: v for k, v in llama_src.fields[split].items() if k != "runtime"} == torch_src.fields[split]
        assert llama_src.fields[split]["runtime"] == "llama.cpp" and "runtime" not in torch_src.fields[split]


def test_train_live_on_llama_cpp_states(task):
    run = task["root"] / "run_live"
    assert main(["train", str(task["config"]), *LLAMA, "--set", "cache.enabled=false", "--out", str(run)]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] >= 0.9
    assert json.loads((run / "config.json").read_text())["config"]["model"]["runtime"] == "llama.cpp"


def test_evaluate_on_llama_cpp_gives_the_default_runtimes_metrics(task, capsys):
    run = task["root"] / "run_torch"
    assert main(["train", str(task["config"]), "--set", "cache.enabled=false", "--out", str(run)]) == 0
    capsys.readouterr()
    results = {}
    for runtime in ("torch", "llama.cpp"):
        assert main(["evaluate", str(run), "--runtime", runtime]) == 0
        results[runtime] = json.loads(capsys.readouterr().out)
        assert json.loads((run / "eval_test.json").read_text())["runtime"] == runtime
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "runtime")}  # noqa: E731
    assert_json_close(strip(results["llama.cpp"]), strip(results["torch"]), 0.03)  # at most one of 40 rows
    assert service.evaluate(run)["runtime"] == "torch"  # default: the runtime the run was trained on


def test_evaluate_defaults_to_the_runtime_trained_on(llama_run):
    assert service.evaluate(llama_run)["runtime"] == "llama.cpp"


@pytest.mark.parametrize("sets, problem", [
    (["train.device=cuda"], "train.device: model.runtime=llama.cpp runs the base on the CPU"),
    (["train.precision=bf16"], "train.precision: model.runtime=llama.cpp gives the states of its GGUF as they are"),
    (["model.base=minilm-l6"], "the llama.cpp runtime runs GGUF bases"),
    (["model.runtime=vllm"], "model.runtime: must be torch or llama.cpp"),
])
def test_what_llama_cpp_cannot_run_is_refused_in_one_line(task, sets, problem, capsys):
    args = [a for s in sets for a in ("--set", s)]
    assert main(["train", str(task["config"]), *LLAMA, *args, "--out", str(task["root"] / "refused")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert problem in err[-1] and "Traceback" not in "\n".join(err)
    assert not (task["root"] / "refused").exists()


def test_compare_refuses_llama_cpp(task, capsys):
    assert main(["compare", str(task["config"]), *LLAMA, "--strategies", "adalayers",
                 "--out", str(task["root"] / "cmp")]) == 2
    assert "compare's strategies (fine-tuning, adapters, full passes) need the base as a torch module" in \
        capsys.readouterr().err


def test_a_batch_larger_than_the_context_runs_in_groups(task):
    """More rows than the llama.cpp context has sequences: the rows run in groups, each state gathered over them,
    as one pass of a context that holds them all (what training's and evaluation's batches may need)."""
    import torch

    from adalayers.infer.llamacpp_backbone import LlamaCppBackbone

    cfg = config.load(task["config"])
    texts = [r[0] for r in sentiment_rows(11, 3)]
    seen = {}
    for n_seq in (4, 16):
        base = LlamaCppBackbone.load(cfg.model.base, n_ctx=1024, n_seq=n_seq, threads=1)
        batch = base.tokenizer(texts, padding=True, return_tensors="pt")
        states = {}
        out = base(batch, taps=[lambda i, z, states=states: states.__setitem__(i, z.clone())])
        seen[n_seq] = states, out.logits
    (grouped, logits_g), (whole, logits_w) = seen[4], seen[16]
    assert sorted(grouped) == sorted(whole) == list(range(base.num_layers))
    for i in whole:
        assert grouped[i].shape == whole[i].shape == (11, batch["input_ids"].shape[1], base.hidden_size)
        torch.testing.assert_close(grouped[i], whole[i], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits_g, logits_w, atol=1e-3, rtol=1e-3)


def test_evaluate_on_llama_cpp_a_head_trained_with_bf16(task, capsys):
    """A head trained with train.precision: bf16 (refused with model.runtime: llama.cpp) is evaluated on llama.cpp
    in fp32 on the CPU, not refused."""
    run = task["root"] / "run_bf16"
    assert main(["train", str(task["config"]), "--set", "cache.enabled=false", "--set", "train.precision=bf16",
                 "--set", "train.max_epochs=1", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--runtime", "llama.cpp"]) == 0
    assert json.loads(capsys.readouterr().out)["runtime"] == "llama.cpp"
    assert json.loads((run / "config.json").read_text())["config"]["train"]["precision"] == "bf16"  # unchanged
