"""A guard head on real data (benchmarks/guard_data.py's splits), against linear probes and a separate guard.

    # quality: train the head (adalayers train --data ..., 3 seeds), then its test F1 (flagged) and AUROC,
    # beside logistic-regression probes on the same frozen states (every layer; mean and last-token pooling)
    python benchmarks/guard_bench.py quality --data $ADALAYERS_DATA/davidson --base minilm-l6 --seeds 0,1,2
    python benchmarks/guard_bench.py quality --data $ADALAYERS_DATA/davidson --base gemma3-270m \\
        --runtime llama.cpp --seeds 0

    # cost: per request, as a share of the LLM's own generation time, side by side in one run
    python benchmarks/guard_bench.py cost --llm gemma3-270m --runtime llama.cpp \\
        --guard runs/guard/gemma3-270m_llama.cpp_s0 --separate runs/guard/minilm-l6_s0 --new 32 --repeats 5

quality writes benchmarks/results/guard_<base>[_<runtime>].json; cost writes the --llm's entry of
benchmarks/results/guard_cost.json (one entry per LLM; a rerun replaces its own).
Runs go under --runs (default runs/guard, not committed); a run folder trained by the same command is reused.

cost, per repeat (configurations in a rotating order, medians of the per-repeat ratios to `gen`):
    gen            the LLM generates --new tokens (eos ignored), no head
    in-pass        the same generation with the guard head read at the prompt and after every token
                   (a guard rule that never trips, so the work is the same length)
    prompt-stop    a generation whose guard trips on the prompt (threshold 0): what such a request costs
    prefill        the LLM's one pass over the prompt (predict with the head): compared with prompt-stop
    sep-prompt     the separate guard model (the MiniLM head) on the prompt, before generating
    sep-answer     the separate guard model on prompt + answer, after generating
    llm-reread     a second pass of the LLM (with the head) over prompt + answer: the LLM as its own separate guard
Wall times with one torch thread and one llama.cpp thread, CPU times beside them (the machine may be shared).
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from adalayers.files import atomic_write

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
log = logging.getLogger("guard_bench")
POSITIVE = "flagged"


def read_split(path: Path) -> tuple[list[str], list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r["text"] for r in rows], [r["label"] for r in rows]


def train(data: Path, base: str, runtime: str, seed: int, out: Path, extra: list[str]) -> dict:
    """adalayers train --data on the splits -> its metrics.json. A run folder trained by the same command
    (out/guard_bench.json) is reused; one trained otherwise (other --set values, an older run) is trained again."""
    cmd = ["adalayers", "train", "--data", str(data / "train.tsv"), "--validation", str(data / "dev.tsv"),
           "--test", str(data / "test.tsv"), "--text", "text", "--label", "label", "--out", str(out), "--overwrite",
           "--set", f"model.base={base}", "--set", f"model.runtime={runtime}", "--set", f"train.seed={seed}",
           "--set", f"task.positive_label={POSITIVE}", *[a for s in extra for a in ("--set", s)]]
    stamp = out / "guard_bench.json"
    if not ((out / "metrics.json").exists() and stamp.exists() and json.loads(stamp.read_text()) == cmd):
        print("$", " ".join(cmd), flush=True)
        subprocess.run([sys.executable, "-m", "adalayers.cli", *cmd[1:]], check=True)
        atomic_write(stamp, json.dumps(cmd))
    return json.loads((out / "metrics.json").read_text())


def head_scores(run: Path, splits: tuple[str, ...] = ("test", "validation")) -> dict[str, np.ndarray]:
    """P(flagged) of the trained head on each example of each split, from the same cached states training read
    (the code path of `adalayers evaluate`; the base loaded once for all of them)."""
    from adalayers.recipes import service
    from adalayers.recipes.evaluate import row_outputs
    from adalayers.store import run as runlib

    cfg = runlib.run_config(run)
    backbone, data, encoded = service.prepare(cfg)
    task, _, _ = runlib.load_head(run, backbone)
    source = service.make_source(cfg, backbone, data, encoded)
    out = {}
    for split in splits:
        outs = row_outputs(task, source, encoded[split], cfg.train.eval_batch_size, backbone.tokenizer.pad_token_id or 0)
        out[split] = np.array([float(p[data.labels.index(POSITIVE)]) for p in outs])
    return out


def binary(y_true: np.ndarray, p: np.ndarray, threshold: float = 0.5) -> dict:
    from sklearn.metrics import f1_score, roc_auc_score

    return {"f1_flagged": float(f1_score(y_true, p >= threshold)), "auroc": float(roc_auc_score(y_true, p))}


def validation_threshold(y_val: np.ndarray, p_val: np.ndarray) -> float:
    """The guard's threshold P an operator would set (`--guard HEAD:flagged>=P`): the one with the highest
    validation F1 of the flagged class (scores at or above it flagged; of equal ones, the nearest to 0.5)."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, thresholds = precision_recall_curve(y_val, p_val)
    f1 = 2 * precision[:-1] * recall[:-1] / np.maximum(precision[:-1] + recall[:-1], 1e-12)
    best = np.flatnonzero(f1 >= f1.max() - 1e-12)
    return float(thresholds[best[np.argmin(np.abs(thresholds[best] - 0.5))]])


def at_validation_threshold(y_val: np.ndarray, p_val: np.ndarray, y_test: np.ndarray, p_test: np.ndarray) -> dict:
    """Test F1 (flagged) at the threshold chosen on validation, and that threshold."""
    from sklearn.metrics import f1_score

    t = validation_threshold(y_val, p_val)
    return {"f1_flagged_val_threshold": float(f1_score(y_test, p_test >= t)), "val_threshold": t}


def probes(run: Path) -> dict:
    """Logistic-regression probes on the run's frozen states (linear_probes.features: every layer, mean and
    last-token pooling; C and the layer chosen on validation F1 of the flagged class)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.preprocessing import StandardScaler

    from adalayers import config
    from adalayers.recipes import service
    from linear_probes import features

    cfg = config.from_dict(json.loads((run / "config.json").read_text())["config"], [])
    backbone, data, encoded = service.prepare(cfg)
    source = service.make_source(cfg, backbone, data, encoded)
    skip_bos = backbone.adds_bos if cfg.head.skip_bos is None else bool(cfg.head.skip_bos)
    pos = data.labels.index(POSITIVE)
    pad = backbone.tokenizer.pad_token_id or 0
    feats = {n: features(source, encoded[n], list(range(backbone.num_layers)), skip_bos, cfg.train.eval_batch_size,
                         pad) for n in ("train", "validation", "test")}
    result = {}
    for kind, k in (("mean", 0), ("last", 1)):
        best = None
        for layer in range(backbone.num_layers):
            xs = {n: feats[n][k][layer] for n in feats}
            ys = {n: (feats[n][2] == pos).astype(int) for n in feats}
            scale = StandardScaler().fit(xs["train"])
            for c in (0.001, 0.01, 0.1, 1.0):
                clf = LogisticRegression(C=c, max_iter=2000, random_state=0).fit(scale.transform(xs["train"]),
                                                                                 ys["train"])
                val = f1_score(ys["validation"], clf.predict(scale.transform(xs["validation"])))
                if best is None or val > best[0]:
                    p = clf.predict_proba(scale.transform(xs["test"]))[:, 1]
                    p_val = clf.predict_proba(scale.transform(xs["validation"]))[:, 1]
                    best = (val, {"layer": layer, "C": c, "validation_f1": float(val), **binary(ys["test"], p),
                                  **at_validation_threshold(ys["validation"], p_val, ys["test"], p)})
        result[kind] = best[1]
        log.info("probe %s: %s", kind, best[1])
    return result


def quality(args) -> int:
    data = Path(args.data)
    texts, labels = read_split(data / "test.tsv")
    y = np.array([lab == POSITIVE for lab in labels], dtype=int)
    y_val = np.array([lab == POSITIVE for lab in read_split(data / "dev.tsv")[1]], dtype=int)
    tag = args.base + ("" if args.runtime == "torch" else f"_{args.runtime}")
    runs = {s: Path(args.runs) / f"{tag}_s{s}" for s in args.seeds}
    result = {"settings": {"data": data.name, "base": args.base, "runtime": args.runtime, "seeds": args.seeds,
                           "set": args.set, "test_rows": len(texts), "flagged_share": float(y.mean()),
                           "torch_threads": __import__("torch").get_num_threads(),
                           "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)"},
              "head": {}}
    for s, run in runs.items():
        m = train(data, args.base, args.runtime, s, run, args.set)
        scored = head_scores(run)
        p, p_val = scored["test"], scored["validation"]
        if (len(p), len(p_val)) != (len(y), len(y_val)):
            raise SystemExit(f"{run}: {len(p)} test and {len(p_val)} validation scores for the files' {len(y)} "
                             f"and {len(y_val)} rows")
        scores = {**binary(y, p), **at_validation_threshold(y_val, p_val, y, p)}
        result["head"][s] = {**scores, "train_f1_flagged": m["test"].get("positive_f1"),
                             "train_seconds": m.get("train_seconds")}
        print(f"seed {s}: {result['head'][s]}", flush=True)
    for key in ("f1_flagged", "auroc", "f1_flagged_val_threshold"):
        result[f"head_median_{key}"] = statistics.median(r[key] for r in result["head"].values())
    result["probes"] = probes(runs[args.seeds[0]])
    out = HERE / "results" / f"guard_{tag}.json"
    atomic_write(out, json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "settings"}, indent=2))
    print(f"-> {out}")
    return 0


def cost(args) -> int:
    import torch

    from adalayers.infer.sidetasks import SideTasks

    torch.set_num_threads(1)
    if str(args.guard) == "shaped":  # no head trained on the LLM: one of configs/cola.yaml's shape, untrained
        from adalayers.model.backbone import Backbone
        from generation_overhead import heads_for  # the work of a head does not depend on its weights

        backbone = Backbone.load(args.llm)
        llm, positive = SideTasks(backbone, heads_for(backbone, 1), primary=False, max_length=128), "acceptable"
    elif args.runtime == "llama.cpp" and args.path == "serve":  # what `serve --runtime llama.cpp` runs: no torch
        from adalayers.infer.gguf_serving import GgufPredictor

        llm, positive = GgufPredictor.load(args.llm, [str(args.guard)], threads=1), POSITIVE
    else:
        llm = SideTasks.load(args.llm, [str(args.guard)], primary=True, runtime=args.runtime, threads=1)
        positive = POSITIVE
    sep = SideTasks.load(None, [str(args.separate)], primary=False)
    head = llm.names[0]
    texts, _ = read_split(Path(args.data) / "test.tsv")
    prompts = texts[:args.prompts]
    gen = dict(max_new_tokens=args.new, ignore_eos=True)
    confs = {
        "gen": lambda p: llm.generate([p], tasks=[], **gen),
        "in-pass": lambda p: llm.generate([p], tasks=[head], guard={head: (positive, 2.0)}, **gen),
        "prompt-stop": lambda p: llm.generate([p], tasks=[head], guard={head: (positive, 0.0)}, **gen),
        "prefill": lambda p: llm.predict([p], tasks=[head]),
        "sep-prompt": lambda p: sep.predict([p]),
        "sep-answer": lambda p: sep.predict([p + answers[p]]),
        "llm-reread": lambda p: llm.predict([p + answers[p]], tasks=[head]),
    }
    answers = {p: llm.generate([p], tasks=[], **gen)[0]["text"] for p in prompts}
    for p in prompts[:1]:  # warm every path once
        for f in confs.values():
            f(p)
    names = list(confs)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        for n in order:
            w0, c0 = time.perf_counter(), time.process_time()
            for p in prompts:
                confs[n](p)
            wall[n].append(time.perf_counter() - w0)
            cpu[n].append(time.process_time() - c0)
    share = {n: statistics.median(w / g for w, g in zip(wall[n], wall["gen"])) for n in names}
    cpu_share = {n: statistics.median(c / g for c, g in zip(cpu[n], cpu["gen"])) for n in names}
    stop_vs_prefill = statistics.median(a / b for a, b in zip(wall["prompt-stop"], wall["prefill"]))
    result = {"settings": {"llm": args.llm, "runtime": "torch" if str(args.guard) == "shaped" else args.runtime,
                           "path": type(llm).__name__, "guard": str(args.guard),
                           "separate": str(args.separate), "new_tokens": args.new, "prompts": len(prompts),
                           "repeats": args.repeats, "threads": 1,
                           "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)"},
              "median_wall_s_per_request": {n: statistics.median(wall[n]) / len(prompts) for n in names},
              "share_of_gen_wall": share, "share_of_gen_cpu": cpu_share,
              "in_pass_extra_share": share["in-pass"] - 1.0, "prompt_stop_vs_prefill": stop_vs_prefill}
    out = HERE / "results" / "guard_cost.json"  # one file, an entry per LLM (this run's replaces its own)
    runs = json.loads(out.read_text()) if out.is_file() else {}
    atomic_write(out, json.dumps({**runs, args.llm: result}, indent=2, sort_keys=True) + "\n")
    print(json.dumps(result, indent=2))
    print(f"-> {out}")
    return 0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--data", required=True)
    q.add_argument("--base", default="minilm-l6")
    q.add_argument("--runtime", default="torch")
    q.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    q.add_argument("--runs", default="runs/guard")
    q.add_argument("--set", action="append", default=[], help="a config override for adalayers train")
    c = sub.add_parser("cost")
    c.add_argument("--data", required=True)
    c.add_argument("--llm", default="gemma3-270m")
    c.add_argument("--runtime", default="llama.cpp")
    c.add_argument("--path", choices=("serve", "torch"), default="serve",
                   help="llama.cpp: the LLM as `serve` runs it (GgufPredictor: numpy heads, no torch), or torch heads "
                        "on llama.cpp's states (SideTasks)")
    c.add_argument("--guard", type=Path, required=True, help="the in-pass guard head's run (on --llm), or 'shaped': "
                   "an untrained head of configs/cola.yaml's shape on --llm (torch runtime)")
    c.add_argument("--separate", type=Path, required=True, help="the separate guard's run (e.g. on minilm-l6)")
    c.add_argument("--new", type=int, default=32)
    c.add_argument("--prompts", type=int, default=4)
    c.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    return quality(args) if args.cmd == "quality" else cost(args)


if __name__ == "__main__":
    raise SystemExit(main())
