"""The package's shape as the limits of issues #34 and #57: no import circles, no import that runs up a floor
(none: KNOWN_UP is empty), no product module importing the lab, no module but __main__
importing the CLI, no hasattr/getattr on a batcher (the serve/batching.Batcher protocol is the contract), the runtime names
listed once (in adalayers.runtimes), no function over 80 lines and no module over 400 (tests/architecture.py)."""
import architecture as arch

from adalayers import runtimes

# Imports up a floor: none (data/templates.py's GGUF chat template moved to model/chat_templates.py).
KNOWN_UP = []


def test_no_import_circles():
    assert arch.circles(arch.imports()) == []


def test_imports_run_down_the_floors():
    assert arch.up_imports(arch.imports()) == KNOWN_UP


def test_only_main_imports_the_cli():
    assert arch.cli_imports(arch.imports()) == []


def test_the_product_never_imports_the_lab():
    assert arch.lab_imports(arch.imports()) == []


def test_functions_and_modules_stay_short():
    assert arch.long_functions(80) == []
    assert arch.long_modules(400) == []


def test_runtime_names_are_listed_once():
    """No module but the registry lists two runtime names together (a tuple of choices, an argparse choices=)."""
    assert arch.runtime_lists(set(runtimes.names())) == []


def test_the_checker_sees_a_second_runtime_list(tmp_path, monkeypatch):
    _plant(tmp_path, monkeypatch, {
        "runtimes.py": "NAMES = ('torch', 'onnx', 'llama.cpp')\n",
        "cli.py": "def f(p):\n    p.add_argument('--runtime', choices=['torch', 'llama.cpp'])\n",
        "ok.py": "RUNTIME = 'llama.cpp'\nPAIR = ('torch', 'cuda')\n"})
    assert arch.runtime_lists({"torch", "onnx", "llama.cpp"}) == [("adalayers.cli", 2)]


def test_the_checker_sees_a_circle(tmp_path, monkeypatch):
    """The checker itself: two modules importing each other are found, a one-way import is not."""
    _plant(tmp_path, monkeypatch, {"a.py": "from adalayers import b\n",
                                   "b.py": "def f():\n    from adalayers.a import x\n", "c.py": "import adalayers.a\n"})
    assert arch.circles(arch.imports()) == [["adalayers.a", "adalayers.b"]]


def test_no_module_probes_a_batcher():
    assert arch.batcher_probes() == []


def test_the_checker_sees_a_probed_batcher(tmp_path, monkeypatch):
    """The checker itself: hasattr/getattr on anything named batcher, or asking for a member of the Batcher
    protocol, is found; on other objects it is not."""
    pkg = tmp_path / "adalayers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "serve").mkdir()
    (pkg / "serve" / "__init__.py").write_text("")
    (pkg / "serve" / "batching.py").write_text("class Batcher:\n    sliced: int\n\n    def admit(self): ...\n")
    (pkg / "a.py").write_text("def f(state, batcher, b):\n"
                              "    x = hasattr(batcher, 'admit')\n"
                              "    y = getattr(state.batcher, 'generations_stopped', 0)\n"
                              "    z = getattr(b, 'sliced', 0)\n"
                              "    return getattr(state, 'name', None)\n")
    monkeypatch.setattr(arch, "SRC", tmp_path)
    assert arch.batcher_probes() == [("adalayers.a", 2), ("adalayers.a", 3), ("adalayers.a", 4)]


def _plant(tmp_path, monkeypatch, files: dict[str, str]) -> None:
    """A package adalayers under tmp_path with `files` (path -> source), read by the checker instead of src/."""
    for name, text in {"__init__.py": "", **files}.items():
        path = tmp_path / "adalayers" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setattr(arch, "SRC", tmp_path)


def test_the_checker_sees_an_import_up_a_floor(tmp_path, monkeypatch):
    """recipes (floor 5) importing the CLI (floor 7), even lazily, is found; the CLI importing recipes, the lab
    importing the CLI or anything importing the foundation is not an import up."""
    _plant(tmp_path, monkeypatch, {
        "errors.py": "", "cli/__init__.py": "", "cli/train.py": "from adalayers.recipes import service\n",
        "recipes/__init__.py": "", "recipes/service.py": "import adalayers.errors\n",
        "recipes/select.py": "def f():\n    from adalayers.cli import train\n",
        "lab/__init__.py": "", "lab/seeds.py": "from adalayers.cli.train import x\n"})
    assert arch.up_imports(arch.imports()) == [("adalayers.recipes.select", "adalayers.cli.train")]


def test_the_checker_sees_an_import_of_the_cli(tmp_path, monkeypatch):
    """The lab or the product importing the CLI (a module of it, or the package) is found; __main__ and the
    CLI's own modules importing it are not."""
    _plant(tmp_path, monkeypatch, {
        "__main__.py": "from adalayers.cli import main\n", "cli/__init__.py": "from adalayers.cli import common\n",
        "cli/common.py": "", "cli/train.py": "from . import common\n", "infer/__init__.py": "",
        "infer/x.py": "from adalayers import cli\n", "lab/__init__.py": "",
        "lab/seeds.py": "def f():\n    from adalayers.cli.common import y\n"})
    assert arch.cli_imports(arch.imports()) == [("adalayers.infer.x", "adalayers.cli"),
                                                ("adalayers.lab.seeds", "adalayers.cli.common")]
