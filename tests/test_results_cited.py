"""benchmarks/results/ holds the files that README.md and docs/ cite and nothing else: every file there is cited
(a cited folder covers the files under it; `name.{json,md}` cites both; a benchmark's `--out` stem `name` cites
name.json and name.md), every cited path exists, the scripts'
inputs stay (benchmarks/llm_table.py and benchmarks/train_table.py read results files). It stays small (summaries
over many runs keep the summary and its command; git history keeps each run's files), no results file stores a
machine's absolute path or the checkout-relative `../shared/data` (the data folder is `$ADALAYERS_DATA`), and a
kept page's links and figures point at kept files."""
from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CITED = re.compile(r"(--out[ =]+)?benchmarks/results/([A-Za-z0-9_.{},/-]*[A-Za-z0-9_}/-])")
ABSOLUTE = re.compile(r"(?<![\w.])/(work|tmp|root|home)/")
BESIDE_THE_CHECKOUT = re.compile(r"\.\./shared/")  # where the data sits beside one checkout: $ADALAYERS_DATA instead
LINK = re.compile(r"\]\(([^()\s]+)\)")
AT_MOST_FILES, AT_MOST_BYTES = 250, 4_000_000
TEXT = (".json", ".jsonl", ".md", ".txt", ".yaml", ".csv")


def expand(path: str) -> list[str]:
    """`a_{x,y}.{json,md}` -> a_x.json, a_x.md, a_y.json, a_y.md."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def citations() -> dict[str, tuple[str, bool]]:
    """Each cited results path (relative to benchmarks/results/, no trailing slash) -> (the page and line citing
    it first, whether it is a benchmark's `--out` stem: a script may add a suffix such as `_<base>_T128` to it)."""
    found: dict[str, tuple[str, bool]] = {}
    for page in PAGES:
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            for m in CITED.finditer(line):
                for path in expand(m.group(2).rstrip(".")):
                    found.setdefault(path.rstrip("/"), (f"{page.relative_to(ROOT)}:{n}", bool(m.group(1))))
    return found


def results_files() -> list[str]:
    """The tracked files under benchmarks/results/ (relative to it); untracked run output is not the docs' business."""
    out = subprocess.run(["git", "ls-files", "benchmarks/results"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an unpacked source tree): every file there
        return sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file())
    return sorted(str(Path(line).relative_to("benchmarks/results")) for line in out.stdout.splitlines())


def covers(cited: str, f: str) -> bool:
    """A citation covers the file itself, the files under a folder and the files of an `--out` stem."""
    return f == cited or f.startswith(cited + "/") or (f.startswith(cited + ".") and "/" not in f[len(cited):])


def test_every_cited_results_path_exists():
    files = results_files()
    missing = [f"{where}: benchmarks/results/{p}" for p, (where, stem) in citations().items()
               if not any(covers(p, f) or (stem and f.startswith(p)) for f in files)]
    assert not missing, "cited but not there:\n" + "\n".join(missing)


def test_every_results_file_is_cited():
    cited = citations()
    uncited = [f for f in results_files() if not any(covers(c, f) for c in cited)]
    assert not uncited, "in benchmarks/results/ but cited by no page of README.md or docs/:\n" + "\n".join(uncited)


def test_no_results_file_holds_a_machine_path():
    bad = []
    for f in results_files():
        path = RESULTS / f
        if path.suffix not in TEXT:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if ABSOLUTE.search(line) or BESIDE_THE_CHECKOUT.search(line):
                bad.append(f"benchmarks/results/{f}:{n}: {line.strip()[:120]}")
                break
    assert not bad, "paths of the machine a result ran on (write the data folder as $ADALAYERS_DATA):\n" + "\n".join(bad)


def test_the_results_stay_small():
    files = results_files()
    size = sum((RESULTS / f).stat().st_size for f in files)
    assert len(files) <= AT_MOST_FILES and size <= AT_MOST_BYTES, (
        f"benchmarks/results/ holds {len(files)} files, {size:,} bytes (at most {AT_MOST_FILES}, {AT_MOST_BYTES:,}): "
        "keep a summary over many runs and its command, not every run's files")


def test_a_kept_page_links_to_kept_files():
    files, broken = set(results_files()), []
    for f in sorted(files):
        if not f.endswith(".md"):
            continue
        for m in LINK.finditer((RESULTS / f).read_text(encoding="utf-8")):
            target = m.group(1).split("#")[0]
            if target and "://" not in target and not (RESULTS / f).parent.joinpath(target).exists():
                broken.append(f"benchmarks/results/{f}: {m.group(1)}")
    assert not broken, "links to files not kept:\n" + "\n".join(broken)


def test_what_a_citation_covers():
    assert covers("soak", "soak.json") and covers("soak", "soak.md") and not covers("soak", "soak_quiet.json")
    assert covers("sweep_x", "sweep_x/sweep.json") and not covers("sweep_x", "sweep_x_seeds3/sweep.json")
    assert not covers("multitask", "multitask.d/x.json")


def test_the_expansion_of_cited_names():
    assert expand("soak.{json,md}") == ["soak.json", "soak.md"]
    assert expand("sweep_{cola,imdb}_x/") == ["sweep_cola_x/", "sweep_imdb_x/"]


def test_a_kept_result_names_the_data_folder_and_no_machine(tmp_path, monkeypatch):
    from adalayers.lab.portable import data_setting, keep

    data, repo = tmp_path / "data", tmp_path / "checkout"
    monkeypatch.setenv("ADALAYERS_DATA", str(data))
    run = tmp_path / "run" / "sweep_x"
    (run / "layer_3").mkdir(parents=True)
    (run / "sweep.json").write_text(f'{{"train": "{data}/glue/CoLA/train.tsv", "config": "{repo}/configs/cola.yaml", '
                                    '"data_dir": "../shared/data", "cache": "/tmp/c"}')
    (run / "best_config.yaml").write_text("task:\n  name: cola\n  data_dir: ../shared/data   # or set it\n")
    (run / "layer_3" / "log.jsonl").write_text("{}\n")
    written = keep(tmp_path / "run", tmp_path / "kept", ("sweep.json", "best_config.yaml"), repo)
    assert sorted(p.name for p in written) == ["best_config.yaml", "sweep.json"]
    kept = (tmp_path / "kept" / "sweep_x" / "sweep.json").read_text()
    assert kept == ('{"train": "$ADALAYERS_DATA/glue/CoLA/train.tsv", "config": "configs/cola.yaml", '
                    '"data_dir": "$ADALAYERS_DATA", "cache": "/tmp/c"}')
    assert (tmp_path / "kept" / "sweep_x" / "best_config.yaml").read_text() == "task:\n  name: cola\n"
    assert data_setting(data / "imdb", repo) == "$ADALAYERS_DATA/imdb"
    assert data_setting(repo / "tests" / "fixtures", repo) == "tests/fixtures"


def test_the_readme_stays_short_and_its_tables_fit_a_laptop_screen():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    wide = [f"README.md:{n}: {len(line)} characters" for n, line in enumerate(readme.splitlines(), start=1)
            if line.startswith("|") and len(line) > 110]
    assert len(readme.encode()) <= 12 * 1024 and not wide, (
        f"README.md: {len(readme.encode()):,} bytes (at most {12 * 1024:,}); move detail into docs/\n" + "\n".join(wide))
