"""The playground page (GET /) in a real headless Chromium (Debian's `chromium`, driven by Playwright) against
`adalayers serve` under uvicorn in a subprocess on 127.0.0.1, with tiny random models and saved heads.

Every request the browser makes to a host other than 127.0.0.1 is blocked and recorded (there must be none).
With ADALAYERS_SCREENSHOTS=DIR the same tests save DIR/playground-predict.png and DIR/playground-generate.png
(docs/serving.md shows them): ADALAYERS_SCREENSHOTS=docs/img python -m pytest -q tests/test_ui.py
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
from fastapi.testclient import TestClient

from adalayers.model.backbone import Backbone
from adalayers.serve.config import ServeConfig
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.app import create_app
from adalayers.serve.routers.ui import STATIC

from runs_util import NER, make_run
from test_serve_hardening import KEY, Server
from tinydecoders import decoder_backbone

ROOT = Path(__file__).resolve().parents[1]
SENT = "John Smith lives in New York and loves the big dog ."
SECOND = "A man lives in a city ."
PROBE = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2"> & done'
SHOTS = os.environ.get("ADALAYERS_SCREENSHOTS")
HEADS = ("acc", "ner", "score", "para")


# --- one tiny decoder LLM with four heads: in-process for the routes, and `adalayers serve` for the browser ----
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny random Llama saved as a model folder, and heads of every kind on it (p: their layer logits)."""
    root = tmp_path_factory.mktemp("ui")
    tiny = decoder_backbone("llama")
    tiny.model.save_pretrained(root / "tiny-llama")
    tiny.tokenizer.save_pretrained(root / "tiny-llama")
    base = Backbone.load(str(root / "tiny-llama"))
    return {"base": root / "tiny-llama", "root": root, "backbone": base,
            "acc": make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3, p=[0.0, 0.02, 0.035, 0.01]),
            "ner": make_run(root / "ner", base, "token", NER, seed=4, p=[-0.5, 0.03, 0.04, 0.02]),
            "score": make_run(root / "score", base, "regression", [], seed=2, p=[0.01, 0.0, 0.02, 0.03]),
            "para": make_run(root / "para", base, "sequence", ["different", "same"], seed=5, pairs=True,
                             p=[0.03, 0.01, 0.0, 0.02])}


@pytest.fixture(scope="module")
def side(runs):
    return SideTasks.from_backbone(runs["backbone"], [runs[h] for h in HEADS])


def test_page_is_served_without_the_key_and_left_out_with_no_ui(side):
    with TestClient(create_app(side, ServeConfig(), api_key=KEY)) as c:
        page = c.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for name in ("app.js", "style.css", "favicon.svg"):
            assert c.get(f"/ui/{name}").status_code == 200, name
            assert f"/ui/{name}" in page.text
        assert c.get("/tasks").status_code == 401  # the page is open, the data is not
        assert c.get("/ui/../auth.py").status_code in (401, 404)
        tasks = c.get("/tasks", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert tasks["generates"] is True and [t["name"] for t in tasks["tasks"]] == list(HEADS)
    with TestClient(create_app(side, ServeConfig(ui=False))) as c:
        assert c.get("/").status_code == 404 and c.get("/ui/app.js").status_code == 404
        assert c.get("/tasks").status_code == 200


def test_docs_load_nothing_from_outside(side):
    """FastAPI's /docs and /redoc would load their scripts from a CDN; here they come from the package."""
    with TestClient(create_app(side, ServeConfig())) as c:
        for path in ("/docs", "/redoc"):
            html = c.get(path).text
            urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", html)
            assert urls, path
            for url in urls:
                assert not re.match(r"^(https?:)?//", url), (path, url)
                if url.startswith("/static-offline-docs/"):
                    assert c.get(url).status_code == 200, url


def test_page_files_ship_with_the_package_and_never_parse_markup():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["adalayers.serve"]
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
def loading(runs):
    """`adalayers serve` on the tiny Llama with its four heads, an API key and a 200-character limit, started
    (where chromium and playwright are there) but not waited for: the browser launches while it loads."""
    _chromium()
    pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[browser]')")
    (runs["root"] / "key").write_text(KEY + "\n")
    started = Server(runs, "--api-key-file", str(runs["root"] / "key"), "--max-chars", "200", heads=HEADS)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def browser(loading):
    executable = _chromium()
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def server(loading, browser):
    """The server of `loading`, once it answers."""
    return loading.wait_started()


class Page:
    """A fresh browser context on `url`: requests to any other host are aborted and recorded; console
    errors and uncaught exceptions are recorded. key: the tab already holds it (as after the page asked once);
    headers: sent with every request (for pages that cannot ask, such as /docs)."""

    def __init__(self, browser, url: str, key: str | None = None, headers: dict | None = None):
        self.context = browser.new_context(viewport={"width": 1100, "height": 900}, extra_http_headers=headers)
        self.outside, self.errors, self.requests = [], [], []
        self.context.route("**/*", self._route)
        if key:
            self.context.add_init_script(f"sessionStorage.setItem('adalayers-api-key', {json.dumps(key)})")
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


def _api(server, path: str, body: dict) -> dict:
    r = httpx.post(f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _card(p: Page, section: str, task: str):
    return p.page.locator(f"#{section} .card[data-task='{task}']")


def _words(locator) -> str:
    """A token head's text as shown, without the entity-type badges."""
    return locator.evaluate("e => { const c = e.cloneNode(true); c.querySelectorAll('.ent-type').forEach(x => "
                            "x.remove()); return c.textContent; }")


def test_key_heads_predictions_spans_errors_and_escaping(server, browser):
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
        assert sent == [None, "Bearer wrong-key"] and "missing or wrong API key" in p.text("#error")
        p.page.fill("#key-input", KEY)
        p.page.click("#key-form button")
        p.page.wait_for_selector("#heads .card")
        assert not p.page.is_visible("#error") and not p.page.is_visible("#key-form")

        # the heads, with one bar per layer of their learned weights (the layers they read in colour)
        tasks = httpx.get(f"{server.url}/tasks", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert p.page.locator("#heads .card").count() == len(HEADS)
        for t in tasks["tasks"]:
            card = _card(p, "heads", t["name"])
            assert t["name"] in card.inner_text() and tasks["base"] in card.inner_text()
            for label in t["labels"]:
                assert label in card.inner_text()
            bars = card.locator("svg.layers rect")
            heights = [float(bars.nth(i).get_attribute("height")) for i in range(bars.count())]
            weights = t["layer_weights"]
            assert len(heights) == len(weights) and heights.index(max(heights)) == weights.index(max(weights))
            assert card.locator("svg.layers rect[fill='#4c6ef5']").count() == len(t["used_layers"])
        assert p.page.is_visible("#text-pair") and p.page.is_visible("#generate-section")

        # one typed text (and a second one for the pair head): every head's answer, as the API gives it
        p.page.fill("#text", SENT)
        p.page.fill("#text-pair", SECOND)
        p.page.click("#predict-button")
        p.page.wait_for_selector("#predictions .card[data-task='ner']")
        want = _api(server, "/predict", {"texts": [SENT]})["results"][0]["tasks"]
        pair = _api(server, "/predict", {"texts": [[SENT, SECOND]]})["results"][0]["tasks"]
        acc = _card(p, "predictions", "acc")
        assert acc.locator(".label").inner_text() == want["acc"]["label"] and acc.locator(".bar-row").count() == 2
        assert f"{100 * want['acc']['probabilities']['good']:.1f}%" in acc.inner_text()
        assert _card(p, "predictions", "score").locator(".value").inner_text() == f"{want['score']['value']:.4f}"
        assert _card(p, "predictions", "para").locator(".label").inner_text() == pair["para"]["label"]
        entities = want["ner"]["entities"]
        assert entities, "the sample text should give the tiny tagger at least one span"
        marks = _card(p, "predictions", "ner").locator("mark.ent")
        assert marks.count() == len(entities)
        for i, e in enumerate(entities):
            assert marks.nth(i).get_attribute("data-type") == e["type"] and _words(marks.nth(i)) == e["text"]
        colors = {marks.nth(i).evaluate("m => getComputedStyle(m).borderColor"): e["type"]
                  for i, e in enumerate(entities)}
        assert len(colors) == len({e["type"] for e in entities})  # one colour per entity type
        assert _words(_card(p, "predictions", "ner").locator(".tagged")).split() == SENT.split()
        p.shot("playground-predict.png")

        # markup in a text is shown as text, never run
        p.page.fill("#text", PROBE)
        p.page.click("#predict-button")
        p.wait("document.querySelector('#predictions .card[data-task=\"ner\"]').textContent.includes('<script>')")
        assert _words(_card(p, "predictions", "ner").locator(".tagged")).split() == PROBE.split()
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
        # the only console errors: Chromium's own line for each refused call (two 401s; then 413 and 422, each
        # for the single-text heads' request and the pair head's)
        statuses = [re.search(r"status of (\d+)", e).group(1) for e in p.errors]
        assert statuses == ["401", "401", "413", "413", "422", "422"], p.errors
    finally:
        p.close()


def _guard(steps: list[list[float]], labels: list[str], n: int, prompt: dict) -> tuple[str, float, int]:
    """A guard that fires mid-way through this run: a label and the value at a step where that label's
    probability is higher than at every step before it and than on the prompt (a guard is checked there too,
    after the prefill): the first step whose value reaches it."""
    best = None
    for j, label in enumerate(labels):
        values = [row[j] for row in steps]
        for i, v in enumerate(values):
            if all(v > u for u in values[:i]) and v > prompt[label] and (best is None or abs(i - n // 2) < abs(best[2] - n // 2)):
                best = (label, v, i)
    return best


def test_streamed_generation_with_live_values_and_a_guard(server, browser):
    p = Page(browser, server.url + "/", key=KEY)
    try:
        p.page.wait_for_selector("#generate-section:not([hidden])")
        prompt, n = "the dog runs quickly and", 24
        p.page.fill("#prompt", prompt)
        p.page.fill("#max-new", str(n))
        # what the browser saw: the step counter's every value (attribute old values: each step changed the page),
        # and at each observation (one per task of the page) the step and the answer so far
        p.page.evaluate("""() => {
            const box = document.getElementById('generation');
            window.__counts = []; window.__seen = [];
            new MutationObserver((records) => {
                for (const r of records) if (r.attributeName === 'data-steps') window.__counts.push(r.oldValue);
                window.__seen.push([box.dataset.steps, document.getElementById('gen-answer').textContent]);
            }).observe(box, {subtree: true, childList: true, attributes: true, attributeOldValue: true});
        }""")
        # the stream delivered at 8 KB/s (Chromium's own throttling, as in its developer tools): on a fast machine
        # the tiny decoder's whole answer would otherwise come in one read, and the page would draw it in one task
        cdp = p.context.new_cdp_session(p.page)
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions",
                 {"offline": False, "latency": 0, "downloadThroughput": 8192, "uploadThroughput": -1})
        p.page.click("#generate-button")
        p.wait("document.getElementById('generation').dataset.state === 'done'")
        cdp.send("Network.emulateNetworkConditions",
                 {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        want = _api(server, "/generate", {"prompts": [prompt], "max_new_tokens": n, "steps": True})["results"][0]
        assert p.text("#gen-answer") == want["text"] and p.text("#gen-prompt") == prompt
        assert f"finish: {want['finish']}" in p.text("#gen-finish")
        values = len(want["steps"]["acc"])
        counts = [int(c) for c in p.page.evaluate("window.__counts") if c] + [values]
        assert counts == list(range(values + 1)), counts  # one change per generated token
        seen = [(int(s), a) for s, a in p.page.evaluate("window.__seen") if s]
        assert len({s for s, _ in seen}) >= 3, seen  # the browser saw it between the prefill and the end
        lengths = [len(a) for s, a in seen if 0 < s < values]
        assert lengths == sorted(lengths) and lengths[-1] > 0  # the answer grew while it streamed
        for head, labels in (("acc", ["bad", "good"]), ("score", ["value"]), ("para", ["different", "same"])):
            for label in labels:
                line = p.page.locator(f"svg.steps[data-task='{head}'] polyline[data-label='{label}']")
                assert len(line.get_attribute("points").split()) == len(want["steps"][head]), (head, label)
        prompt_acc = _card(p, "gen-prompt-tasks", "acc").locator(".label").inner_text()
        assert prompt_acc == want["prompt_tasks"]["acc"]["label"]
        assert _card(p, "gen-final-tasks", "acc").locator(".label").inner_text() == want["tasks"]["acc"]["label"]
        assert _words(_card(p, "gen-final-tasks", "ner").locator(".tagged")).split() == (prompt + want["text"]).split()

        # a guard that fires mid-way: the run stops there, says so, and draws the threshold
        label, threshold, at = _guard(want["steps"]["acc"], ["bad", "good"], n,
                                      want["prompt_tasks"]["acc"]["probabilities"])
        p.page.select_option("#guard-head", "acc")
        p.page.select_option("#guard-label", label)
        p.page.fill("#guard-threshold", repr(threshold))
        p.page.click("#generate-button")
        p.wait("document.getElementById('generation').dataset.finish === 'guard'")
        guarded = _api(server, "/generate", {"prompts": [prompt], "max_new_tokens": n, "steps": True,
                                             "guard": {"acc": {"label": label, "threshold": threshold}}})
        guarded = guarded["results"][0]
        assert guarded["finish"] == "guard" and guarded["tokens"] == at + 1
        assert p.text("#gen-answer") == guarded["text"] and p.page.is_visible(".finish-guard")
        assert p.page.locator("svg.steps[data-task='acc'] .guard-line").count() == 1
        p.shot("playground-generate.png", "#generate-section")

        # a bad request is answered by the service's line, before any token
        p.page.fill("#max-new", "100000")
        p.page.click("#generate-button")
        p.wait("document.getElementById('error').textContent.includes('422')")
        assert "max_new_tokens" in p.text("#error")
        assert p.outside == [] and len(p.errors) == 1 and "status of 422" in p.errors[0], (p.outside, p.errors)
    finally:
        p.close()


def test_docs_page_works_air_gapped(server, browser):
    p = Page(browser, server.url + "/docs", headers={"Authorization": f"Bearer {KEY}"})
    try:
        p.page.wait_for_selector(".swagger-ui .info .title", timeout=30_000)
        assert "adalayers" in p.text(".swagger-ui .info .title")
        p.page.wait_for_selector(".opblock-summary-path[data-path='/predict']")
        assert p.outside == [] and p.errors == [], (p.outside, p.errors)
    finally:
        p.close()
