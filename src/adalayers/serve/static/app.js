// The playground page of `adalayers serve` (served at GET /; see serve/routers/ui.py).
// Plain JavaScript, no libraries: every call goes to this service (GET /tasks, POST /predict,
// POST /generate/stream). Every text the page shows is set as text (textContent / text nodes),
// never parsed as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const KEY = "adalayers-api-key";
  const KINDS = { sequence: "classification", regression: "regression", token: "tokens" };
  const PALETTE = ["#4c6ef5", "#f76707", "#2f9e44", "#e03131", "#ae3ec9", "#1098ad", "#f59f00", "#5c7cfa",
                   "#d6336c", "#66a80f"];
  const state = { key: sessionStorage.getItem(KEY), info: null, stream: null, typeColors: new Map() };

  // --- DOM helpers: attributes and text only, never markup -----------------------------------
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);  // strings become text nodes
    }
    return node;
  }

  function svg(tag, attrs = {}) {
    const node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs)) {
      if (name === "text") node.textContent = value;
      else if (name === "class") node.setAttribute("class", value);
      else node.setAttribute(name, String(value));
    }
  }

  function colorOf(type) {  // one colour per entity type, the same everywhere on the page
    if (!state.typeColors.has(type)) state.typeColors.set(type, PALETTE[state.typeColors.size % PALETTE.length]);
    return state.typeColors.get(type);
  }

  // --- calls and their one-line errors ---------------------------------------------------------
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function detailOf(body) {  // the service's {"detail": ...}: a sentence, or pydantic's list of problems
    if (body && typeof body.detail === "string") return body.detail;
    if (body && Array.isArray(body.detail)) {
      return body.detail.map((d) => {
        const where = (d.loc || []).filter((part) => part !== "body").join(".");
        return (where ? where + ": " : "") + (d.msg || JSON.stringify(d));
      }).join("; ");
    }
    return null;
  }

  async function call(path, body, signal) {
    const headers = {};
    if (body !== undefined) headers["content-type"] = "application/json";
    if (state.key) headers.authorization = "Bearer " + state.key;
    let response;
    try {
      response = await fetch(path, { method: body === undefined ? "GET" : "POST", headers, signal,
                                     body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(0, "cannot reach the service (" + e.message + ")");
    }
    if (response.ok) return response;
    const raw = await response.text();
    let detail = null;
    try { detail = detailOf(JSON.parse(raw)); } catch (_) { detail = null; }
    const retry = response.headers.get("retry-after");
    const message = response.status + " " + response.statusText + ": " + (detail || raw.trim() || "no detail")
      + (retry ? " (retry after " + retry + " s)" : "");
    if (response.status === 401) askKey();
    throw new ApiError(response.status, message);
  }

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = false;
  }

  function clearError() {
    $("error").textContent = "";
    $("error").hidden = true;
  }

  function report(e, status) {
    if (e.name === "AbortError") return;
    showError(e instanceof ApiError ? e.message : "error: " + e.message);
    if (status) status.textContent = "";
  }

  function askKey() {
    $("key-form").hidden = false;
    $("key-input").value = "";
    $("key-input").focus();
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("key-input").value.trim();
    sessionStorage.setItem(KEY, state.key);
    $("key-form").hidden = true;
    clearError();
    load();
  });

  // --- the heads ------------------------------------------------------------------------------
  async function load() {
    try {
      state.info = await (await call("/tasks")).json();
    } catch (e) {
      $("heads-empty").textContent = "not loaded";
      return report(e);
    }
    const info = state.info;
    $("base-info").textContent = "base: " + info.base + " · " + info.tasks.length + " head(s) · max_length "
      + info.max_length;
    $("heads").replaceChildren(...info.tasks.map((task) => headCard(task, info.base)));
    $("heads-empty").hidden = info.tasks.length > 0;
    $("heads-empty").textContent = "no heads loaded";
    $("predict-section").hidden = false;
    $("pair-box").hidden = !info.tasks.some((t) => t.pairs);
    $("generate-section").hidden = !info.generates;
    if (info.generates) fillGuard(info.tasks);
  }

  function kindText(task) {
    return (KINDS[task.kind] || task.kind) + (task.pairs ? " · sentence pairs" : "");
  }

  function headCard(task, base) {
    const labels = task.labels && task.labels.length ? task.labels.join(", ") : "-";
    return el("div", { class: "card head", "data-task": task.name },
      el("h3", { text: task.name }),
      el("div", { class: "kind", text: kindText(task) }),
      el("div", { class: "labels" }, el("span", { class: "muted", text: "labels: " }), labels),
      el("div", { class: "labels" }, el("span", { class: "muted", text: "base: " }), base),
      el("div", { class: "muted small", text: "layer weights (" + task.used_layers.length + " of "
        + task.layer_weights.length + " layers read)" }),
      layerChart(task.layer_weights, task.used_layers));
  }

  function layerChart(weights, used) {
    const width = 240, height = 56, gap = 1, bar = width / weights.length;
    const top = Math.max(...weights, 1e-9);
    const chart = svg("svg", { class: "layers", viewBox: `0 0 ${width} ${height + 12}`, role: "img",
                               "aria-label": "learned layer weights" });
    weights.forEach((w, i) => {
      const h = Math.max(1, (w / top) * height);
      const rect = svg("rect", { x: i * bar + gap / 2, y: height - h, width: Math.max(1, bar - gap), height: h,
                                 fill: used.includes(i) ? "#4c6ef5" : "#ced4da", "data-layer": i });
      const title = svg("title");
      title.textContent = "layer " + i + ": " + w.toFixed(4);
      rect.append(title);
      chart.append(rect);
    });
    for (const [x, anchor, label] of [[0, "start", "layer 0"], [width, "end", String(weights.length - 1)]]) {
      const text = svg("text", { x, y: height + 11, "text-anchor": anchor, class: "axis" });
      text.textContent = label;
      chart.append(text);
    }
    return chart;
  }

  // --- one head's answer ----------------------------------------------------------------------
  function answerCard(task, output) {
    const card = el("div", { class: "card answer", "data-task": task.name },
      el("h3", { text: task.name }), el("div", { class: "kind", text: kindText(task) }));
    if (output === undefined || output === null) {
      card.append(el("div", { class: "muted", text: task.pairs ? "give a second text" : "no answer" }));
    } else if (task.kind === "token") {
      card.append(tokenView(output));
    } else if (task.kind === "regression") {
      card.append(el("div", { class: "value", text: Number(output.value).toFixed(4) }));
    } else {
      card.append(el("div", { class: "label", text: output.label }), probabilityBars(output.probabilities));
    }
    return card;
  }

  function probabilityBars(probabilities) {
    const rows = Object.entries(probabilities).sort((a, b) => b[1] - a[1]);
    return el("div", { class: "bars" }, ...rows.map(([label, p], i) => {
      const fill = el("div", { class: "fill" + (i === 0 ? " top" : "") });
      fill.style.width = (100 * p).toFixed(1) + "%";
      return el("div", { class: "bar-row", "data-label": label },
        el("span", { class: "bar-label", text: label }), el("div", { class: "bar" }, fill),
        el("span", { class: "bar-value", text: (100 * p).toFixed(1) + "%" }));
    }));
  }

  function tokenView(output) {
    // entities (IOB tags) by their word ranges; other tag sets: every word whose tag is not "O"
    const words = output.words || [], tags = output.tags || [], scores = output.scores || [];
    const spans = output.entities
      ? output.entities.map((e) => ({ a: e.words[0], b: e.words[1], type: e.type }))
      : tags.map((t, i) => ({ a: i, b: i + 1, type: t })).filter((s) => s.type !== "O");
    const starts = new Map(spans.map((s) => [s.a, s]));
    const text = el("p", { class: "tagged" });
    for (let i = 0; i < words.length;) {
      if (i > 0) text.append(" ");
      const span = starts.get(i);
      if (!span) {
        text.append(el("span", { title: tags[i] + (scores[i] == null ? "" : " " + scores[i].toFixed(3)) },
                       words[i]));
        i += 1;
        continue;
      }
      const mark = el("mark", { class: "ent", "data-type": span.type,
                                title: span.type + ": " + tags.slice(span.a, span.b).join(" ") },
        words.slice(span.a, span.b).join(" "), el("span", { class: "ent-type", text: span.type }));
      mark.style.backgroundColor = colorOf(span.type) + "33";
      mark.style.borderColor = colorOf(span.type);
      text.append(mark);
      i = Math.max(span.b, i + 1);
    }
    const found = [...new Set(spans.map((s) => s.type))];
    const legend = el("div", { class: "muted small", text: found.length ? "" : "no spans tagged" });
    for (const type of found) {
      const swatch = el("span", { class: "swatch" });
      swatch.style.backgroundColor = colorOf(type);
      legend.append(el("span", { class: "legend-item" }, swatch, type));
    }
    return el("div", {}, text, legend);
  }

  // --- predict --------------------------------------------------------------------------------
  $("predict-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!state.info) return;
    clearError();
    const text = $("text").value, second = $("text-pair").value;
    const single = state.info.tasks.filter((t) => !t.pairs), pairs = state.info.tasks.filter((t) => t.pairs);
    const asks = [];  // single-text heads: one request; sentence-pair heads: one request, when a second text is given
    if (single.length) asks.push(ask({ texts: [text], tasks: single.map((t) => t.name), base: false }));
    if (pairs.length && second.trim()) {
      asks.push(ask({ texts: [[text, second]], tasks: pairs.map((t) => t.name), base: false }));
    }
    $("predict-status").textContent = "running …";
    $("predict-button").disabled = true;
    try {
      const answers = Object.assign({}, ...(await Promise.all(asks)));
      $("predictions").replaceChildren(...state.info.tasks.map((t) => answerCard(t, answers[t.name])));
      $("predict-status").textContent = "";
    } catch (e) {
      report(e, $("predict-status"));
    } finally {
      $("predict-button").disabled = false;
    }
  });

  async function ask(body) {
    const answer = await (await call("/predict", body)).json();
    return answer.results[0].tasks;
  }

  // --- generate (decoder bases) ---------------------------------------------------------------
  function fillGuard(tasks) {
    const select = $("guard-head");
    select.replaceChildren(el("option", { value: "", text: "none" }),
      ...tasks.filter((t) => t.kind === "sequence").map((t) => el("option", { value: t.name, text: t.name })));
    select.onchange = () => {
      const task = tasks.find((t) => t.name === select.value);
      $("guard-label").replaceChildren(...(task ? task.labels : []).map((l) => el("option", { value: l, text: l })));
      if (task) $("guard-label").value = task.labels[task.labels.length - 1];
      $("guard-label").disabled = $("guard-threshold").disabled = !task;
    };
    select.onchange();
  }

  $("stop-button").addEventListener("click", () => { if (state.stream) state.stream.abort(); });

  $("generate-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!state.info || state.stream) return;
    clearError();
    const body = { prompts: [$("prompt").value], max_new_tokens: Number($("max-new").value), steps: true };
    const guardHead = $("guard-head").value;
    if (guardHead) {
      body.guard = { [guardHead]: { label: $("guard-label").value, threshold: Number($("guard-threshold").value) } };
    }
    const run = { steps: 0, series: {}, max: body.max_new_tokens, guard: body.guard || {} };
    state.stream = new AbortController();
    $("generate-button").disabled = true;
    $("stop-button").disabled = false;
    $("generate-status").textContent = "prefill …";
    try {
      const response = await call("/generate/stream", body, state.stream.signal);
      resetGeneration(body.prompts[0]);
      await readEvents(response, (name, data) => onEvent(run, name, data));
      if ($("generation").dataset.state !== "done") throw new Error("the stream ended before its last event");
    } catch (e) {
      if (e.name === "AbortError") $("generate-status").textContent = "stopped after " + run.steps + " tokens";
      report(e, e.name === "AbortError" ? null : $("generate-status"));
    } finally {
      state.stream = null;
      $("generate-button").disabled = false;
      $("stop-button").disabled = true;
    }
  });

  function resetGeneration(prompt) {
    const box = $("generation");
    box.hidden = false;
    box.dataset.state = "prefill";
    box.dataset.steps = "0";
    $("gen-prompt").textContent = prompt;
    $("gen-answer").replaceChildren();
    $("gen-finish").replaceChildren();
    $("gen-charts").replaceChildren();
    $("gen-prompt-tasks").replaceChildren();
    $("gen-final-tasks").replaceChildren();
  }

  async function readEvents(response, handle) {  // server-sent events from a POST (EventSource only GETs)
    const reader = response.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (data) handle(name, JSON.parse(data));
      }
      if (done) return;
    }
  }

  function tasksByName() {
    return Object.fromEntries(state.info.tasks.map((t) => [t.name, t]));
  }

  function onEvent(run, name, data) {
    const box = $("generation"), tasks = tasksByName();
    if (name === "prompt") {
      const mine = data.results[0];
      $("gen-prompt-tasks").replaceChildren(...Object.keys(mine).map((n) => answerCard(tasks[n], mine[n])));
      box.dataset.state = "streaming";
      $("generate-status").textContent = "generating …";
    } else if (name === "step") {
      const piece = data.tokens[0];
      if (piece !== null) $("gen-answer").append(el("span", { class: "piece", text: piece }));
      run.steps += 1;
      box.dataset.steps = String(run.steps);
      for (const [head, perPrompt] of Object.entries(data.values || {})) {
        const value = perPrompt[0];
        (run.series[head] = run.series[head] || []).push(Array.isArray(value) ? value : [value]);
      }
      drawCharts(run, tasks);
    } else if (name === "done") {
      const result = data.results[0];
      $("gen-answer").replaceChildren(el("span", { class: "answer", text: result.text }));  // the exact text
      const finish = el("span", { class: "finish finish-" + result.finish, text: "finish: " + result.finish });
      $("gen-finish").replaceChildren(finish, el("span", { class: "muted", text: " · " + result.tokens + " tokens" }));
      $("gen-final-tasks").replaceChildren(
        ...Object.keys(result.tasks).map((n) => answerCard(tasks[n], result.tasks[n])));
      box.dataset.state = "done";
      box.dataset.finish = result.finish;
      $("generate-status").textContent = "";
    }
  }

  function drawCharts(run, tasks) {
    $("gen-charts").replaceChildren(...Object.entries(run.series).map(([head, rows]) =>
      stepChart(tasks[head], rows, run.max, run.guard[head])));
  }

  function stepChart(task, rows, maxSteps, guard) {
    // classification: one line per label (its probability, 0..1); regression: the value, scaled to its range
    const width = 600, height = 70, pad = 4;
    const regression = task.kind === "regression";
    const flat = rows.map((r) => r[0]);
    const lo = regression ? Math.min(...flat) : 0, hi = regression ? Math.max(...flat) : 1;
    const x = (i) => pad + (i / Math.max(1, maxSteps - 1)) * (width - 2 * pad);
    const y = (v) => height - pad - ((v - lo) / (hi - lo || 1)) * (height - 2 * pad);
    const chart = svg("svg", { class: "steps", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none",
                               "data-task": task.name, role: "img" });
    const labels = regression ? ["value"] : task.labels;
    const legend = el("div", { class: "legend small" }, el("strong", { text: task.name }));
    labels.forEach((label, j) => {
      const color = PALETTE[j % PALETTE.length];
      chart.append(svg("polyline", { points: rows.map((r, i) => x(i) + "," + y(r[j])).join(" "), fill: "none",
                                     stroke: color, "stroke-width": 2, "data-label": label,
                                     "vector-effect": "non-scaling-stroke" }));
      const swatch = el("span", { class: "swatch" });
      swatch.style.backgroundColor = color;
      const last = rows[rows.length - 1][j];
      legend.append(el("span", { class: "legend-item" }, swatch, label + " " + last.toFixed(3)));
      if (guard && guard.label === label) {
        chart.append(svg("line", { x1: 0, x2: width, y1: y(guard.threshold), y2: y(guard.threshold), stroke: color,
                                   "stroke-dasharray": "4 3", "vector-effect": "non-scaling-stroke",
                                   class: "guard-line" }));
      }
    });
    if (guard) {
      legend.append(el("span", { class: "muted", text: "guard: stops at " + guard.label + " ≥ "
        + Number(guard.threshold.toPrecision(4)) }));
    }
    if (regression) legend.append(el("span", { class: "muted", text: " range " + lo.toFixed(3) + " … " + hi.toFixed(3) }));
    return el("div", { class: "step-chart" }, legend, chart);
  }

  load();
})();
