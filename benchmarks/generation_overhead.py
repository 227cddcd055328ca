"""What side tasks cost while a decoder LLM generates (SideTasks.generate), on gemma3-270m by default.

    gen        generate alone (the same decode loop, KV cache on, no hooks, no heads)
    gen+1      generate with 1 head   (prompt prediction from the prefill, one accumulator column per
    gen+4      generate with 4 heads   step, the final prediction on prompt + answer)
    gen+1/steps   1 head with per-step values (the head re-run on F after every token: a streaming guard)
    gen+4/steps   4 heads with per-step values
    gen+sep    generate alone, then the prompt classified by a separate pass (SideTasks.predict):
               what one pays without reading the generation pass

Tokens/s = generated tokens / wall time of the call. Every configuration runs once per repeat in a
rotating order (drift in a shared machine's load hits all alike); reported: medians over repeats,
and each configuration's time relative to `gen` in the same repeat (median of the ratios). With one
torch thread the process's CPU time is the work itself, whatever else the machine runs: it is
reported beside the wall time (`cpu_vs_gen`), the figure to quote from a busy machine. Greedy
decoding, a fixed number of new tokens (eos ignored: all rows run to the end). `head_us_per_step`:
the configuration's CPU time less `gen`'s in the same repeat, per decode step of the batch
(microseconds, median over repeats): what the heads add to one step, the extra step at the end included.

The code measured is this checkout's src/, or the one PYTHONPATH names when it is set (so another
checkout's code runs under the same benchmark: PYTHONPATH=../main/src python benchmarks/...).

Heads have configs/cola.yaml's settings and freshly initialised weights with uniform layer weights:
every layer is projected, the most work a head can add (the weights do not change the work).
Memory per head: its parameters, plus its accumulator (B, T, k) after the last step, measured from
the tensors themselves.

    nice -n 10 python benchmarks/generation_overhead.py --base gemma3-270m --batch 1,4 --new 24 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))

from adalayers import config as config_mod  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.store.run import write_json  # noqa: E402
from adalayers.infer.sidetasks import Head, SideTasks  # noqa: E402
from adalayers.model.sidetask import SideTask  # noqa: E402

PROMPTS = ["The history of the city begins in", "Write a short note to a friend about the weather:",
           "Three facts about the moon:", "The recipe needs flour, eggs and", "Once upon a time, a small robot",
           "The meeting is moved to Thursday because", "In this paper we show that", "Dear customer, your order"]


def heads_for(backbone: Backbone, n: int) -> list[Head]:
    cfg = config_mod.load(ROOT / "configs" / "cola.yaml")
    heads = []
    for i in range(n):
        torch.manual_seed(i)
        task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, ["unacceptable", "acceptable"],
                        bos=backbone.adds_bos).eval()
        heads.append(Head(f"head{i}", task, Path("."), cfg.model.max_length))
    return heads


def run_once(side: SideTasks, prompts, new: int, tasks, steps: bool) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and generated tokens of one generate call (eos ignored: every row
    makes `new` tokens)."""
    t0, c0 = time.perf_counter(), time.process_time()
    res = side.generate(prompts, new, tasks, steps=steps, ignore_eos=True)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(r["tokens"] for r in res)
    assert tokens == new * len(prompts), (tokens, new, len(prompts))
    return seconds, cpu, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--new", type=int, default=24, help="new tokens per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/generation_overhead.json")
    ap.add_argument("--label", default="", help="what code this run measures (kept in the settings)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    backbone = Backbone.load(args.base)
    load_s = time.perf_counter() - t0
    side = SideTasks(backbone, heads_for(backbone, 4), primary=False, max_length=64)
    configs = {"gen": ([], False), "gen+1": (["head0"], False), "gen+4": (["head0", "head1", "head2", "head3"], False),
               "gen+1/steps": (["head0"], True), "gen+4/steps": (["head0", "head1", "head2", "head3"], True),
               "gen+sep": ([], False)}
    results = {"settings": {**vars(args), "torch_threads": torch.get_num_threads(),
                            "code": "PYTHONPATH" if os.environ.get("PYTHONPATH") else "this checkout's src", "torch": torch.__version__,
                            "machine": platform.processor() or platform.machine(), "base_load_s": round(load_s, 1),
                            "base_layers": backbone.num_layers, "hidden_size": backbone.hidden_size,
                            "decoding": "greedy, eos ignored", "heads": "configs/cola.yaml, initial weights, "
                            "all layers used", "note": "shared 2-core machine: ratios within a repeat matter; cpu_vs_gen depends "
                            "less on the load than wall time, yet moves by a few percent between repeats"},
               "batches": {}}
    tok = backbone.tokenizer
    for bs in [int(b) for b in args.batch.split(",")]:
        prompts = PROMPTS[:bs]
        times = {c: [] for c in configs}
        cpus = {c: [] for c in configs}
        ratios = {c: [] for c in configs if c != "gen"}
        cpu_ratios = {c: [] for c in configs if c != "gen"}
        step_us = {c: [] for c in configs if c != "gen"}
        tokens = {}
        order = list(configs)
        for rep in range(args.repeats):
            order = order[1:] + order[:1]
            mine, mine_cpu = {}, {}
            for c in order:
                names, steps = configs[c]
                s, cpu, n = run_once(side, prompts, args.new, names, steps)
                if c == "gen+sep":
                    t1, c1 = time.perf_counter(), time.process_time()
                    side.predict(prompts, tasks=["head0"])
                    s, cpu = s + time.perf_counter() - t1, cpu + time.process_time() - c1
                mine[c], mine_cpu[c] = s, cpu
                tokens[c] = n
                times[c].append(s)
                cpus[c].append(cpu)
            for c in ratios:
                ratios[c].append(mine[c] / mine["gen"])
                cpu_ratios[c].append(mine_cpu[c] / mine_cpu["gen"])
                step_us[c].append((mine_cpu[c] - mine_cpu["gen"]) / args.new * 1e6)
            print(f"batch {bs} repeat {rep + 1}: " + ", ".join(f"{c} {mine[c]:.2f}s (cpu {mine_cpu[c]:.2f}s)"
                                                               for c in configs), flush=True)
        # memory per head: parameters + the accumulator after the last step (B, prompt + new, k) fp32
        T = len(tok(prompts, padding=True)["input_ids"][0]) + args.new
        k = side.heads["head0"].task.mixer.k
        head_params = sum(p.numel() * p.element_size() for p in side.heads["head0"].task.parameters())
        results["batches"][str(bs)] = {
            "prompts": bs, "new_tokens": args.new,
            "generated_tokens": tokens,
            "median_seconds": {c: round(statistics.median(v), 3) for c, v in times.items()},
            "tokens_per_s": {c: round(tokens[c] / statistics.median(v), 2) for c, v in times.items()},
            "time_vs_gen": {c: round(statistics.median(v), 3) for c, v in ratios.items()},
            "median_cpu_seconds": {c: round(statistics.median(v), 3) for c, v in cpus.items()},
            "cpu_vs_gen": {c: round(statistics.median(v), 3) for c, v in cpu_ratios.items()},
            "head_us_per_step": {c: round(statistics.median(v)) for c, v in step_us.items()},
            "memory_per_head_bytes": {"parameters": head_params, "accumulator": bs * T * k * 4,
                                      "accumulator_shape": [bs, T, k]},
        }
    write_json(Path(args.out), results)
    print(json.dumps(results["batches"], indent=1))


if __name__ == "__main__":
    main()
