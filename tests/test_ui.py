"""The playground page (GET /) in a real headless Chromium (Debian's `chromium`, driven by Playwright) against
`adalayers serve` under uvicorn in a subprocess on 127.0.0.1, with tiny random models and saved heads.

Every request the browser makes to a host other than 127.0.0.1 is blocked and recorded (there must be none).
With ADALAYERS_SCREENSHOTS=DIR the same tests save DIR/playground-predict.png and DIR/playground-generate.png
(docs/serving.md shows them): ADALAYERS_SCREENSHOTS=docs/img python -m pytest -q tests/test_ui.py
"""
from __future__ import annotations

import os
import re
import shutil
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from fastapi.testclient import TestClient

from adalayers.backbone import Backbone
from adalayers.config import ServeConfig
from adalayers.serve.api import SideTasks
from adalayers.serve.app import create_app
from adalayers.serve.routers.ui import STATIC

from runs_util import NER, make_run
from test_serve_hardening import KEY, Server
from tinydecoders import decoder_backbone
from tinymodels import tiny_bert

ROOT = Path(__file__).resolve().parents[1]
SENT = "John Smith lives in New York and loves the big dog ."
PROBE = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> & done'
SHOTS = os.environ.get("ADALAYERS_SCREENSHOTS")
ENC_HEADS = ("acc", "ner", "score", "para")
DEC_HEADS = ("acc", "ner")


# --- without a browser: the routes, the flag, the files ------------------------------------------
@pytest.fixture(scope="module")
def enc_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui-enc")
    base_dir = tiny_bert(root / "tiny-bert")
    base = Backbone.load(str(base_dir))
    return {"base": base_dir, "root": root, "backbone": base,
            "acc": make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3),
            "ner": make_run(root / "ner", base, "token", NER, seed=4),
            "score": make_run(root / "score", base, "regression", [], seed=2),
            "para": make_run(root / "para", base, "sequence", ["different", "same"], seed=5, pairs=True)}


@pytest.fixture(scope="module")
def enc_side(enc_runs):
    return SideTasks.from_backbone(enc_runs["backbone"], [enc_runs[h] for h in ENC_HEADS])


def test_page_is_served_without_the_key_and_left_out_with_no_ui(enc_side):
    with TestClient(create_app(enc_side, ServeConfig(), api_key=KEY)) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for name in ("app.js", "style.css", "favicon.svg"):
            assert c.get(f"/ui/{name}").status_code == 200, name
            assert f"/ui/{name}" in page.text
        assert c.get("/tasks").status_code == 401  # the page is open, the data is not
        assert c.get("/ui/../auth.py").status_code in (401, 404)
        tasks = c.get("/tasks", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert tasks["generates"] is False and [t["name"] for t in tasks["tasks"]] == list(ENC_HEADS)
    with TestClient(create_app(enc_side, ServeConfig(ui=False))) as c:
        assert c.get("/").status_code == 404 and c.get("/ui/app.js").status_code == 404
        assert c.get("/tasks").status_code == 200


def test_docs_load_nothing_from_outside(enc_side):
    """FastAPI's /docs and /redoc would load their scripts from a CDN; here they come from the package."""
    with TestClient(create_app(enc_side, ServeConfig())) as c:
        for path in ("/docs", "/redoc"):
            html = c.get(path).text
            urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", html)
            assert urls, path
            for url in urls:
                assert not re.match(r"^(https?:)?//", url), (path, url)
                if url.startswith("/static-offline-docs/"):
                    assert c.get(url).status_code == 200, url


def test_page_files_ship_with_the_package_and_never_parse_markup():
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["adalayers.serve"]
    files = sorted(p.relative_to(STATIC.parent) for p in STATIC.rglob("*") if p.is_file())
    assert {"static/index.html", "static/app.js", "static/style.css"} <= {str(f) for f in files}
    for f in files:  # every file of the page is in the wheel (package-data)
        assert any(f.match(g) for g in globs), f
    script = (STATIC / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", script + (STATIC / "index.html").read_text()
                         + (STATIC / "style.css").read_text())


# --- in the browser ------------------------------------------------------------------------------
def _chromium() -> str:
    path = os.environ.get("ADALAYERS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.skip("no chromium installed (apt-get install chromium; or set ADALAYERS_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[browser]')")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def dec_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui-dec")
    tiny = decoder_backbone("llama")
    tiny.model.save_pretrained(root / "tiny-llama")
    tiny.tokenizer.save_pretrained(root / "tiny-llama")
    base = Backbone.load(str(root / "tiny-llama"))
    return {"base": root / "tiny-llama", "root": root,
            "acc": make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3),
            "ner": make_run(root / "ner", base, "token", NER, seed=4)}


@pytest.fixture(scope="module")
def servers(enc_runs, dec_runs, browser):
    """enc: a tiny BERT with four heads, an API key and a 200-character limit; dec: a tiny Llama, no key."""
    (enc_runs["root"] / "key").write_text(KEY + "\n")
    enc = Server(enc_runs, "--api-key-file", str(enc_runs["root"] / "key"), "--max-chars", "200", heads=ENC_HEADS)
    dec = Server(dec_runs, heads=DEC_HEADS)
    try:
        yield {"enc": enc.wait_started(), "dec": dec.wait_started()}
    finally:
        enc.stop()
        dec.stop()


class Page:
    """A fresh browser context on `url`: requests to any other host are aborted and recorded; console
    errors and uncaught exceptions are recorded."""

    def __init__(self, browser, url: str):
        self.context = browser.new_context(viewport={"width": 1100, "height": 900})
        self.outside, self.errors, self.requests = [], [], []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("request", lambda r: self.requests.append(r))
        self.page.goto(url)

    def _route(self, route):
        if urlparse(route.request.url).hostname == "127.0.0.1":
            return route.continue_()
        self.outside.append(route.request.url)
        return route.abort()

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()

    def wait(self, condition: str, timeout: float = 30_000):
        """Until the JavaScript `condition` holds (a function: the page's CSP allows no string eval)."""
        return self.page.wait_for_function(f"() => {condition}", timeout=timeout)

    def shot(self, name: str, selector: str | None = None):
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            target = self.page.locator(selector) if selector else self.page
            kw = {} if selector else {"full_page": True}
            target.screenshot(path=str(Path(SHOTS) / name), **kw)

    def close(self):
        self.context.close()


def _api(server, path: str, body: dict, key: str | None = KEY) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _card(p: Page, section: str, task: str):
    return p.page.locator(f"#{section} .card[data-task='{task}']")


def test_key_heads_predictions_spans_errors_and_escaping(servers, browser):
    server = servers["enc"]
    p = Page(browser, server.url + "/")
    try:
        # no key yet: /tasks answers 401; the page shows the service's line and asks for the key
        p.wait("document.getElementById('error').textContent.includes('401')")
        assert "missing or wrong API key" in p.text("#error") and p.page.is_visible("#key-input")
        p.page.fill("#key-input", "wrong-key")
        p.page.click("#key-form button")
        p.wait("document.getElementById('error').textContent.includes('401') && "
               "!document.getElementById('key-form').hidden")
        sent = [r.headers.get("authorization") for r in p.requests if r.url.endswith("/tasks")]
        assert sent[-1] == "Bearer wrong-key" and "missing or wrong API key" in p.text("#error")
        p.page.fill("#key-input", KEY)
        p.page.click("#key-form button")
        p.page.wait_for_selector("#heads .card")
        assert not p.page.is_visible("#error") and not p.page.is_visible("#key-form")

        # the heads, with one bar per layer of their learned weights
        tasks = httpx.get(f"{server.url}/tasks", headers={"Authorization": f"Bearer {KEY}"}).json()
        cards = p.page.locator("#heads .card")
        assert cards.count() == len(ENC_HEADS)
        for t in tasks["tasks"]:
            card = _card(p, "heads", t["name"])
            assert t["name"] in card.inner_text() and tasks["base"] in card.inner_text()
            assert card.locator("svg.layers rect").count() == len(t["layer_weights"])
            for label in t["labels"]:
                assert label in card.inner_text()
        assert p.page.is_visible("#text-pair") and not p.page.is_visible("#generate-section")

        # one typed text (and a second one for the pair head): every head's answer, as the API gives it
        p.page.fill("#text", SENT)
        p.page.fill("#text-pair", "A man lives in a city .")
        p.page.click("#predict-button")
        p.page.wait_for_selector("#predictions .card[data-task='ner']")
        want = _api(server, "/predict", {"texts": [SENT]})["results"][0]["tasks"]
        pair = _api(server, "/predict", {"texts": [[SENT, "A man lives in a city ."]]})["results"][0]["tasks"]
        assert _card(p, "predictions", "acc").locator(".label").inner_text() == want["acc"]["label"]
        bars = _card(p, "predictions", "acc").locator(".bar-row")
        assert bars.count() == 2 and f"{100 * want['acc']['probabilities']['good']:.1f}%" in \
            _card(p, "predictions", "acc").inner_text()
        assert _card(p, "predictions", "score").locator(".value").inner_text() == f"{want['score']['value']:.4f}"
        assert _card(p, "predictions", "para").locator(".label").inner_text() == pair["para"]["label"]
        entities = want["ner"]["entities"]
        assert entities, "the sample text should give the tiny tagger at least one span"
        marks = _card(p, "predictions", "ner").locator("mark.ent")
        assert marks.count() == len(entities)
        for i, e in enumerate(entities):
            assert marks.nth(i).get_attribute("data-type") == e["type"]
            assert marks.nth(i).inner_text().startswith(e["text"])
        colors = {marks.nth(i).evaluate("m => getComputedStyle(m).borderColor"): e["type"]
                  for i, e in enumerate(entities)}
        assert len(colors) == len({e["type"] for e in entities})  # one colour per entity type
        p.shot("playground-predict.png")

        # markup in a text is shown as text, never run
        p.page.fill("#text", PROBE)
        p.page.click("#predict-button")
        p.wait("document.querySelector('#predictions .card[data-task=\"ner\"]').textContent.includes('<script>')")
        shown = _card(p, "predictions", "ner").locator(".tagged").evaluate(  # the words, without the type badges
            "e => { const c = e.cloneNode(true); c.querySelectorAll('.ent-type').forEach(x => x.remove());"
            " return c.textContent; }")
        assert shown.split() == PROBE.split()
        assert p.page.evaluate("window.__xss") is None
        assert p.page.locator("#predictions script, #predictions img").count() == 0

        # the service's one-line errors: 413 and 422
        p.page.fill("#text", "a" * 201)
        p.page.click("#predict-button")
        p.wait("document.getElementById('error').textContent.includes('413')")
        assert "text 1 has 201 characters; the limit is 200 (--max-chars)" in p.text("#error")
        p.page.fill("#text", "   ")
        p.page.click("#predict-button")
        p.wait("document.getElementById('error').textContent.includes('422')")
        assert "text 1 is empty" in p.text("#error")

        assert p.outside == []
        # the only console errors: Chromium's own line for each 401 answer of the key exchange
        assert p.errors and all("status of 401" in e for e in p.errors[:2]), p.errors
        assert all(re.search(r"status of (401|413|422)", e) for e in p.errors), p.errors
    finally:
        p.close()


def test_streamed_generation_with_live_values_and_a_guard(servers, browser):
    server = servers["dec"]
    p = Page(browser, server.url + "/")
    try:
        p.page.wait_for_selector("#generate-section:not([hidden])")
        prompt, n = "the dog runs quickly and", 12
        p.page.fill("#prompt", prompt)
        p.page.fill("#max-new", str(n))
        # every change of the answer and of the step counter, as the browser saw it
        p.page.evaluate("""() => {
            window.__seen = [];
            new MutationObserver(() => window.__seen.push([document.getElementById('generation').dataset.steps,
                                                           document.getElementById('gen-answer').textContent]))
                .observe(document.getElementById('generation'), {subtree: true, childList: true, attributes: true});
        }""")
        p.page.click("#generate-button")
        p.wait("document.getElementById('generation').dataset.state === 'done'")
        want = _api(server, "/generate", {"prompts": [prompt], "max_new_tokens": n, "steps": True}, None)["results"][0]
        assert p.text("#gen-answer") == want["text"] and p.text("#gen-prompt") == prompt
        assert f"finish: {want['finish']}" in p.text("#gen-finish")
        steps = [int(s) for s, _ in p.page.evaluate("window.__seen") if s]
        assert steps == sorted(steps) and len(set(steps)) >= 2 and steps[-1] >= want["tokens"]
        lengths = [len(a) for s, a in p.page.evaluate("window.__seen") if s and int(s) < steps[-1]]
        assert lengths == sorted(lengths) and lengths[-1] > 0  # the answer grew while it streamed
        line = p.page.locator("svg.steps[data-task='acc'] polyline[data-label='good']")
        assert len(line.get_attribute("points").split()) == len(want["steps"]["acc"])
        assert _card(p, "gen-prompt-tasks", "acc").locator(".label").inner_text() == want["prompt_tasks"]["acc"]["label"]
        assert _card(p, "gen-final-tasks", "acc").locator(".label").inner_text() == want["tasks"]["acc"]["label"]
        assert _card(p, "gen-final-tasks", "ner").locator(".tagged").count() == 1

        # a guard on acc at the highest 'good' probability of that run: it stops there, and says so
        good = [row[1] for row in want["steps"]["acc"]]
        threshold = max(good)
        p.page.select_option("#guard-head", "acc")
        p.page.select_option("#guard-label", "good")
        p.page.fill("#guard-threshold", repr(threshold))
        p.page.click("#generate-button")
        p.wait("document.getElementById('generation').dataset.finish === 'guard'")
        guarded = _api(server, "/generate", {"prompts": [prompt], "max_new_tokens": n, "steps": True,
                                             "guard": {"acc": {"label": "good", "threshold": threshold}}}, None)
        guarded = guarded["results"][0]
        assert guarded["finish"] == "guard" and guarded["tokens"] == good.index(threshold) + 1
        assert p.text("#gen-answer") == guarded["text"] and p.page.is_visible(".finish-guard")
        assert p.page.locator("svg.steps[data-task='acc'] .guard-line").count() == 1
        p.shot("playground-generate.png", "#generate-section")

        # a bad request is answered by the service's line, before any token
        p.page.fill("#max-new", "100000")
        p.page.click("#generate-button")
        p.wait("document.getElementById('error').textContent.includes('422')")
        assert "max_new_tokens" in p.text("#error")
        assert p.outside == [] and all("status of 422" in e for e in p.errors), (p.outside, p.errors)
    finally:
        p.close()


def test_docs_page_works_air_gapped(servers, browser):
    p = Page(browser, servers["dec"].url + "/docs")
    try:
        p.page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
        assert "adalayers" in p.text(".swagger-ui .info .title")
        p.page.wait_for_selector(".opblock-summary-path[data-path='/predict']")
        assert p.outside == [] and p.errors == [], (p.outside, p.errors)
    finally:
        p.close()
