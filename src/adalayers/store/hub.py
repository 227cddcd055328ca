"""A run folder as a Hugging Face Hub repo: push it with a model card, load it back by id.

    adalayers push runs/cola --repo user/cola-minilm [--private] [--revision BRANCH]
    SideTasks.load("minilm-l6", ["user/cola-minilm@main"]); adalayers predict user/cola-minilm "text"

Upload: config.json, head.safetensors, metrics.json, log.jsonl, eval_*.json and report figures
(*.png) when present, and a generated README.md (`model_card`): its YAML header follows the
Hub's conventions (library_name, base_model, datasets, tags, model-index with the test metrics),
its body gives task, labels, base (alias and fingerprint), metrics, trainable parameters, the
learned layer weights, the config that trained it and a usage snippet.

Loading (`resolve_run`): an existing local folder is used as it is; otherwise `user/name[@rev]`
is fetched with huggingface_hub.snapshot_download into the Hub cache, and the folder it returns
is read like any run folder (the checksum and base-fingerprint checks apply). With
HF_HUB_OFFLINE=1 a cached id loads; an uncached one fails with one line.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from adalayers.store import run as runlib
from adalayers.errors import RunError
from adalayers.kinds import TaskKind

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
FILES = ["config.json", runlib.HEAD, "metrics.json", "log.jsonl"]
BASE_IDS = {"minilm-l6": "sentence-transformers/all-MiniLM-L6-v2",
            "mpnet-base": "sentence-transformers/all-mpnet-base-v2"}
DATASETS = {"cola": ("nyu-mll/glue", "cola"), "stsb": ("nyu-mll/glue", "stsb"), "qqp": ("nyu-mll/glue", "qqp"),
            "conll2003": ("eriktks/conll2003", None), "conll": ("eriktks/conll2003", None),
            "imdb": ("stanfordnlp/imdb", None), "sst": ("stanfordnlp/sst", None)}
TASK_TYPES = {"sequence": "text-classification", "regression": "text-classification",
              "token": "token-classification"}


def resolve_run(arg: str | Path) -> Path:
    """A run folder, or a Hub id `user/name[@revision]` downloaded (or found in the cache) -> its folder."""
    path = Path(arg).expanduser()
    if path.is_dir() or not HUB_ID.match(str(arg)):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo, _, revision = str(arg).partition("@")
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=FILES + ["*.json", "*.png"]))
    except LocalEntryNotFoundError:
        raise RunError(f"{arg}: no such run folder, and the Hub id is not in the cache "
                       "(offline, HF_HUB_OFFLINE=1, or the Hub is unreachable)") from None
    except (RepositoryNotFoundError, HfHubHTTPError, ValueError, OSError) as e:
        raise RunError(f"{arg}: no such run folder, and the Hub id cannot be fetched "
                       f"({str(e).splitlines()[0]})") from None


def _metrics(run: Path) -> dict:
    path = Path(run) / "metrics.json"
    if not path.is_file():
        raise RunError(f"{run}: no metrics.json (push a finished run)")
    return json.loads(path.read_text(encoding="utf-8"))


def card_data(run: Path):
    """The card's YAML header as huggingface_hub.ModelCardData."""
    from huggingface_hub import EvalResult, ModelCardData

    meta, metrics = runlib.read_config(run), _metrics(run)
    task = meta["config"]["task"]["name"]
    kind = meta.get("kind") or meta["config"]["head"].get("kind") or TaskKind.CLASSIFICATION
    dataset, dataset_config = DATASETS.get(task, (task, None))
    results = [EvalResult(task_type=TASK_TYPES[kind], dataset_type=dataset, dataset_name=task,
                          dataset_config=dataset_config, dataset_split="test", metric_type=name,
                          metric_value=round(float(value), 4), metric_name=name)
               for name, value in metrics.get("test", {}).items()
               if isinstance(value, (int, float)) and name != "n"]
    base = meta["base"]["name"]
    return ModelCardData(library_name="adalayers", base_model=BASE_IDS.get(base, base),
                         datasets=[dataset] if dataset in {d for d, _ in DATASETS.values()} else None,
                         tags=["adalayers", "side-task-head", TASK_TYPES[kind]], pipeline_tag=TASK_TYPES[kind],
                         model_name=f"adalayers-{task}-{base}", eval_results=results or None)


def model_card(run: Path, repo: str | None = None) -> str:
    """README.md for the repo: YAML header (card_data) + a readable description."""
    run = Path(run)
    meta, metrics = runlib.read_config(run), _metrics(run)
    data = card_data(run)
    task, base = meta["config"]["task"]["name"], meta["base"]
    kind = meta.get("kind") or meta["config"]["head"].get("kind") or TaskKind.CLASSIFICATION
    repo = repo or f"user/adalayers-{task}"
    weights = metrics.get("layer_weights") or []
    figures = sorted(p.name for p in run.glob("*.png"))
    lines = [f"# adalayers head: {task} on {base['name']}", "",
             f"A side-task head ({kind}) trained with [adalayers](https://pypi.org/project/adalayers/) on the hidden "
             f"states of the frozen base `{base['name']}` (fingerprint `{base['fingerprint']}`; "
             f"{base['num_layers']} layer outputs of width {base['hidden_size']}). The base is not in this repo: "
             "the head loads onto it and refuses any other base.", "",
             f"- labels: {', '.join(meta['labels']) or '(regression)'}",
             f"- trainable parameters: {metrics.get('trainable_params', '?')} "
             f"(base: {metrics.get('base_params', '?')}, frozen)", ""]
    for split in ("validation", "test"):
        if split in metrics:
            shown = {k: round(v, 4) for k, v in metrics[split].items() if isinstance(v, (int, float))}
            lines.append(f"- {split} ({task} {split} split): " + ", ".join(f"{k} {v}" for k, v in shown.items()))
    if weights:
        lines += ["", "## Learned layer weights", "", "| layer | weight |", "|---:|---|"]
        lines += [f"| {i} | {w:.3f} {'█' * round(w * 40)} |" for i, w in enumerate(weights)]
    for fig in figures:
        lines += ["", f"![{fig}]({fig})"]
    lines += ["", "## Trained with", "", "```yaml", yaml.safe_dump(meta["config"], sort_keys=False).rstrip(), "```",
              "", f"`adalayers train CONFIG.yaml --out runs/{task}` with this config "
              f"(`--set section.field=value` for single fields).", "",
              "## Usage", "", "```python", "from adalayers.serve import SideTasks", "",
              f'tasks = SideTasks.load("{base["name"]}", ["{repo}"])',
              'print(tasks.predict(["A sentence to label ."]))', "```", "",
              f"```bash\nadalayers predict {repo} \"A sentence to label .\"\n"
              f"adalayers serve --base {base['name']} --heads {repo}\n```", ""]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines)


def upload_operations(run: Path, repo: str | None = None) -> list:
    """The commit's operations: the run's files (those present) and the generated README.md."""
    from huggingface_hub import CommitOperationAdd

    run = Path(run)
    runlib.read_config(run)
    names = [f for f in FILES if (run / f).is_file()] + sorted(p.name for p in run.glob("eval_*.json")) \
        + sorted(p.name for p in run.glob("*.png"))
    if runlib.HEAD not in names:
        raise RunError(f"{run}: {runlib.HEAD} is missing; nothing to push")
    ops = [CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(run / n)) for n in names]
    return ops + [CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=model_card(run, repo).encode())]


def push(run: Path, repo: str, private: bool = False, revision: str | None = None) -> str:
    """Create the repo if needed and upload the run in one commit; returns the commit URL."""
    from huggingface_hub import HfApi

    ops = upload_operations(run, repo)
    api = HfApi()
    api.create_repo(repo, private=private, exist_ok=True)
    if revision:
        api.create_branch(repo, branch=revision, exist_ok=True)
    info = api.create_commit(repo, ops, commit_message=f"adalayers push {Path(run).name}", revision=revision)
    return info.commit_url
