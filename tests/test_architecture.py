"""The package's shape as the limits of issue #34: no import circles, at most two imports that run up a floor,
no product module importing the lab, no function over 80 lines and no module over 400; and of issue #57: no
hasattr/getattr on a batcher (the serve/batching.Batcher protocol is the contract) (tests/architecture.py)."""
import architecture as arch


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
