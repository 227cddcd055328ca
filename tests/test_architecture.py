"""The package's shape as the limits of issue #34: no import circles, at most two imports that run up a floor,
no product module importing the lab, no function over 80 lines and no module over 400; and (issue #57) the
runtime names listed once, in adalayers.runtimes (tests/architecture.py)."""
import architecture as arch

from adalayers import runtimes


def test_no_import_circles():
    assert arch.circles(arch.imports()) == []


def test_imports_run_down_the_floors():
    up = arch.up_imports(arch.imports())
    assert len(up) <= 2, up


def test_the_product_never_imports_the_lab():
    assert arch.lab_imports(arch.imports()) == []


def test_functions_and_modules_stay_short():
    assert arch.long_functions(80) == []
    assert arch.long_modules(400) == []


def test_runtime_names_are_listed_once():
    """No module but the registry lists two runtime names together (a tuple of choices, an argparse choices=)."""
    assert arch.runtime_lists(set(runtimes.names())) == []


def test_the_checker_sees_a_second_runtime_list(tmp_path, monkeypatch):
    pkg = tmp_path / "adalayers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "runtimes.py").write_text("NAMES = ('torch', 'onnx', 'llama.cpp')\n")
    (pkg / "cli.py").write_text("def f(p):\n    p.add_argument('--runtime', choices=['torch', 'llama.cpp'])\n")
    (pkg / "ok.py").write_text("RUNTIME = 'llama.cpp'\nPAIR = ('torch', 'cuda')\n")
    monkeypatch.setattr(arch, "SRC", tmp_path)
    assert arch.runtime_lists({"torch", "onnx", "llama.cpp"}) == [("adalayers.cli", 2)]


def test_the_checker_sees_a_circle(tmp_path, monkeypatch):
    """The checker itself: two modules importing each other are found, a one-way import is not."""
    pkg = tmp_path / "adalayers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from adalayers import b\n")
    (pkg / "b.py").write_text("def f():\n    from adalayers.a import x\n")
    (pkg / "c.py").write_text("import adalayers.a\n")
    monkeypatch.setattr(arch, "SRC", tmp_path)
    assert arch.circles(arch.imports()) == [["adalayers.a", "adalayers.b"]]
