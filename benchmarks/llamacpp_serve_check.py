"""Does `adalayers serve --runtime llama.cpp` answer as the default runtime for a real GGUF base? (issue 35's
done-when: qwen2.5-0.5b with task.template chat, and a .gguf path)

    nice -n 10 python benchmarks/llamacpp_serve_check.py --base qwen2.5-0.5b --template chat
    nice -n 10 python benchmarks/llamacpp_serve_check.py --base PATH/TO/FILE.gguf

Two heads at their initial weights (benchmarks/serve_load.untrained_heads: a CoLA-shaped sequence head and a
CoNLL-shaped token head; with --template, the sequence head alone with that task.template: a token
head takes no template, and the heads of one server share theirs), then, for each runtime in turn
(torch, then llama.cpp), `adalayers serve` on 127.0.0.1 and, over HTTP:
  /predict          3 CoLA dev sentences, both heads
  /generate         one prompt, greedy, --new tokens, the sequence head with per-step values
  /generate/stream  the same body: the events' names, and the `done` event's results against /generate's
Reported: whether the two runtimes' JSON has the same shape (every key and list length, values aside), the
labels and tags that agree, the largest difference of a probability (and the probabilities: a head at its
initial weights gives nearly the same to every text), the base's own next token per text (/predict on a decoder
answers it), both generated texts, and whether each
runtime's stream ends with its own /generate answer. The llama.cpp states are the quantized file's, the torch
ones its fp32 conversion's, so values differ by the quantization's error (docs/llm.md, "States").
Results (with the settings) in benchmarks/results/llamacpp_serve_check_<name>.json. One thread.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, sentences, start_server, untrained_heads  # noqa: E402

from adalayers.config import Config  # noqa: E402
from adalayers.store.run import read_config, write_config, write_json  # noqa: E402
from adalayers.lab.portable import data_setting  # noqa: E402
from adalayers.data.tasks.fetch import data_folder  # noqa: E402

PROMPT = "Write a Python function that reverses a string."


def shape(x):
    """The JSON's structure: dict keys and list lengths, every leaf replaced by its type name."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [shape(v) for v in x]
    return type(x).__name__


def stream(url: str, body: dict) -> list[tuple[str, dict]]:
    """The server-sent events of /generate/stream: (event name, data)."""
    events, name = [], None
    with httpx.stream("POST", f"{url}/generate/stream", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line.split(":", 1)[1])))
    return events


def ask(base: str, heads: list[str], runtime: str, texts: list[str], new: int, log) -> dict:
    server, url = start_server(base, heads, 1, ["--runtime", runtime], log, timeout=900)
    try:
        body = {"prompts": [PROMPT], "max_new_tokens": new, "tasks": ["cola"], "steps": True}
        predict = httpx.post(f"{url}/predict", json={"texts": texts}, timeout=600)
        generate = httpx.post(f"{url}/generate", json=body, timeout=600)
        for r in (predict, generate):
            r.raise_for_status()
        events = stream(url, body)
        return {"predict": predict.json(), "generate": generate.json(), "events": events}
    finally:
        server.terminate()
        server.wait(60)


def compare(torch_out: dict, llama_out: dict) -> dict:
    a, b = torch_out["predict"]["results"], llama_out["predict"]["results"]
    labels = [x["tasks"]["cola"]["label"] == y["tasks"]["cola"]["label"] for x, y in zip(a, b)]
    tags = [u == v for x, y in zip(a, b) if "conll" in x["tasks"]
            for u, v in zip(x["tasks"]["conll"]["tags"], y["tasks"]["conll"]["tags"])]
    probs = max(abs(p - y["tasks"]["cola"]["probabilities"][k]) for x, y in zip(a, b)
                for k, p in x["tasks"]["cola"]["probabilities"].items())
    done = {rt: next(d for n, d in out["events"] if n == "done")["results"] for rt, out in
            (("torch", torch_out), ("llama.cpp", llama_out))}
    return {
        "predict_same_shape": shape(torch_out["predict"]) == shape(llama_out["predict"]),
        "generate_keys_same": shape(torch_out["generate"]["results"][0]).keys()
        == shape(llama_out["generate"]["results"][0]).keys(),
        "stream_events": {rt: [n for n, _ in out["events"] if n != "step"] + [f"{sum(n == 'step' for n, _ in out['events'])} step"]
                          for rt, out in (("torch", torch_out), ("llama.cpp", llama_out))},
        "stream_done_equals_generate": {rt: done[rt] == out["generate"]["results"] for rt, out in
                                        (("torch", torch_out), ("llama.cpp", llama_out))},
        "cola_labels_agree": f"{sum(labels)}/{len(labels)}", "conll_tags_agree": f"{sum(tags)}/{len(tags)}",
        "largest_probability_difference": float(f"{probs:.2g}"),
        "cola_probabilities": {rt: [x["tasks"]["cola"]["probabilities"] for x in out["predict"]["results"]]
                               for rt, out in (("torch", torch_out), ("llama.cpp", llama_out))},
        "base_next_token": {rt: [x.get("base") for x in out["predict"]["results"]]
                            for rt, out in (("torch", torch_out), ("llama.cpp", llama_out))},
        "generated": {"torch": torch_out["generate"]["results"][0]["text"],
                      "llama.cpp": llama_out["generate"]["results"][0]["text"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="qwen2.5-0.5b")
    ap.add_argument("--template", default=None, help="the sequence head's task.template (e.g. chat)")
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--data", default=str(data_folder(None)), help="the data folder (default: $ADALAYERS_DATA, else ../shared/data)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    name = Path(args.base).stem if args.base.endswith(".gguf") else args.base
    settings = {**vars(args), "data": data_setting(args.data, ROOT), "threads": 1,
                "base": "a .gguf path" if args.base.endswith(".gguf") else args.base}
    print("settings:", json.dumps(settings), flush=True)
    texts = sentences(Path(args.data))[:3]
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "server.log", "w") as log:
        heads = untrained_heads(args.base, Path(tmp) / "runs")
        if args.template:  # the sequence head alone: token heads take no template, and one server has one
            heads = heads[:1]
            meta = read_config(Path(heads[0]))
            meta["config"]["task"]["template"] = args.template
            write_config(Path(heads[0]), meta)
        outs = {rt: ask(args.base, heads, rt, texts, args.new, log) for rt in ("torch", "llama.cpp")}
    result = compare(outs["torch"], outs["llama.cpp"])
    print(json.dumps(result, indent=1))
    out = Path(args.out or f"benchmarks/results/llamacpp_serve_check_{name}.json")
    write_json(out, {"settings": settings, "check": result})
    print("written", out)


if __name__ == "__main__":
    Config()  # the package imports before any server starts
    main()
