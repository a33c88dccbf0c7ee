"""The viewer's page: its HTML, CSS and JavaScript, our own and small, served from memory.

The page asks the server's JSON API for samples and builds its elements with ``textContent`` and
attributes (never ``innerHTML`` with data), so whatever a shard holds is shown as text. It loads
nothing from any other host (the server's Content-Security-Policy says so too).

An image the server found broken (its ``problem``), or that the browser cannot display (the
``<img>``'s error event), shows as a "broken image: REASON" mark, not a blank box; the problems
panel lists the shards that can't be read and the latest ``MAX_PROBLEMS`` broken fields found
(the server's ``field_problems`` and the browser's own), each with its ``tarfirst`` command and a
link to the sample. A label with a class name shows as ``3 (dog)``.

Started with ``--summary`` (``/api/problems`` says so), the panel also lists what the summary of
every sample has found, asked again every ``SUMMARY_POLL`` ms until it is done: a progress line,
then each kind of problem with its count and examples, each a link that finds the sample by its
key (``/api/find``, in the shard the summary names) and opens it, and its ``tarfirst`` command.
Without it, a line says that ``--summary`` checks every sample.
"""

from __future__ import annotations

HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tarshow</title>
<link rel="stylesheet" href="/static/viewer.css">
</head>
<body>
<header>
  <h1>tarshow</h1>
  <span id="dataset"></span>
  <form id="nav">
    <button type="button" id="prev" title="previous page (←)">&#9664; Prev</button>
    <button type="button" id="next" title="next page (→)">Next &#9654;</button>
    <label>from # <input id="start" type="number" min="0" value="0"></label>
    <label>per page <select id="count">
      <option>10</option><option>25</option><option selected>50</option><option>100</option><option>200</option>
    </select></label>
    <button type="submit" id="go">Go</button>
  </form>
  <form id="jump">
    <input id="key" placeholder="key" aria-label="key" spellcheck="false">
    <button type="submit" id="jumpbtn">Jump to key</button>
  </form>
  <form id="filterform">
    <input id="filter" placeholder="filter: cls=3 &amp; json.meta.lang=en" aria-label="filter" spellcheck="false">
    <button type="submit" id="filterbtn">Filter</button>
    <button type="button" id="clear">Clear</button>
  </form>
</header>
<div id="status" role="status"></div>
<details id="problems" open hidden><summary id="problemcount"></summary>
  <div id="summaryview" hidden><div id="summaryprogress"></div><div id="summarylist"></div></div>
  <div id="problemlist"></div><div id="summarynote" class="muted"></div>
</details>
<main id="grid"></main>
<div id="detail" hidden>
  <div id="detailbox">
    <button type="button" id="close" title="close (Esc)">&#10005;</button>
    <div id="detailbody"></div>
  </div>
</div>
<script src="/static/viewer.js"></script>
</body>
</html>
"""

CSS = """
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, sans-serif; color: #222; background: #f4f4f4; }
header { position: sticky; top: 0; z-index: 2; display: flex; flex-wrap: wrap; gap: 8px 16px;
  align-items: center; padding: 8px 12px; background: #fff; border-bottom: 1px solid #ccc; }
h1 { font-size: 18px; margin: 0; }
#dataset { color: #555; }
form { display: flex; gap: 6px; align-items: center; margin: 0; }
input, select, button { font: inherit; }
#filter { width: 22em; }
#status { padding: 6px 12px; color: #333; }
#status.error, .problem { color: #a00; }
#problems { margin: 0 12px; padding: 4px 8px; background: #fff; border: 1px solid #e2c0c0; border-radius: 6px;
  max-height: 30vh; overflow: auto; }
#problems summary { color: #a00; cursor: pointer; }
#problemlist .problem { margin: 3px 0; word-break: break-word; }
#problemlist code, #summarylist code { display: block; font-size: 12px; color: #333; background: #f7f7f7;
  padding: 1px 4px; }
#summaryprogress { color: #333; margin: 3px 0; }
#summarylist .kind { margin: 4px 0 6px; }
#summarylist .kindtitle { color: #a00; font-weight: 600; }
#summarylist .example { margin: 2px 0 2px 1em; word-break: break-word; }
.broken { display: block; padding: 10px 6px; margin: 2px 0; background: #fee; color: #a00; border: 1px dashed #c66;
  font-size: 12px; word-break: break-word; }
#grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 10px; padding: 10px 12px; }
.card { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 8px; overflow: hidden; }
.card.current { outline: 3px solid #48f; }
.card .head { display: flex; justify-content: space-between; gap: 6px; margin-bottom: 4px; }
.key { font-family: ui-monospace, monospace; font-weight: 600; word-break: break-all; color: #124; cursor: pointer;
  background: none; border: 0; padding: 0; text-align: left; text-decoration: underline; }
.where { color: #777; font-size: 12px; white-space: nowrap; }
.field { margin: 3px 0; word-break: break-word; }
.name { display: inline-block; min-width: 3em; margin-right: 6px; color: #666;
  font-family: ui-monospace, monospace; font-size: 12px; }
.thumb { display: block; max-width: 100%; max-height: 180px; margin: 2px auto; background: #eee; }
.card audio, .card video { width: 100%; max-height: 180px; }
.text { white-space: pre-wrap; }
.card .text { display: -webkit-box; -webkit-line-clamp: 6; -webkit-box-orient: vertical; overflow: hidden; }
pre { white-space: pre-wrap; word-break: break-word; background: #f7f7f7; padding: 6px; margin: 2px 0;
  max-height: 60vh; overflow: auto; }
.card pre { max-height: 8em; overflow: hidden; font-size: 12px; }
.muted { color: #888; }
#detail { position: fixed; inset: 0; z-index: 5; background: rgba(0,0,0,.45); display: flex;
  justify-content: center; align-items: flex-start; overflow: auto; }
#detail[hidden] { display: none; }
#detailbox { position: relative; background: #fff; margin: 30px; padding: 16px; border-radius: 8px;
  max-width: 1100px; width: 100%; }
#close { position: absolute; right: 10px; top: 10px; }
#detailbody img { max-width: 100%; }
#detailbody video { max-width: 100%; }
#detailbody h2 { font-size: 16px; margin: 0 30px 8px 0; word-break: break-all; }
#detailbody .field { border-top: 1px solid #eee; padding-top: 6px; }
"""

JS = r"""
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const MAX_PROBLEMS = 200;  // the latest broken fields listed
  const SUMMARY_POLL = 1000;  // ms between two asks for the summary's problems while it runs
  // problems: "shard/pos/field" -> {shard, pos, index, key, field, problem, command}, oldest first
  const state = { start: 0, n: 50, filter: "", back: [], next: null, page: [], shardProblems: [], problems: new Map(),
    summary: null };

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "class") node.className = value;
      else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);  // strings become text nodes
    }
    return node;
  }

  function number(n) { return Number(n).toLocaleString("en-US"); }

  function size(n) {
    if (n < 1024) return n + " B";
    if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
    if (n < 1073741824) return (n / 1048576).toFixed(1) + " MiB";
    return (n / 1073741824).toFixed(2) + " GiB";
  }

  function status(text, isError) {
    const s = $("status");
    s.textContent = text;
    s.className = isError ? "error" : "";
  }

  async function getJSON(url) {
    const response = await fetch(url, { headers: { "Accept": "application/json" } });
    const text = await response.text();
    if (!response.ok) throw new Error(text.trim() || response.statusText);
    return JSON.parse(text);
  }

  function saveHash() {
    const params = new URLSearchParams();
    params.set("start", state.start);
    params.set("n", state.n);
    if (state.filter) params.set("filter", state.filter);
    history.replaceState(null, "", "#" + params.toString());
  }

  function readHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const start = parseInt(params.get("start") || "0", 10);
    const n = parseInt(params.get("n") || "50", 10);
    state.start = Number.isFinite(start) && start >= 0 ? start : 0;
    state.n = [10, 25, 50, 100, 200].includes(n) ? n : 50;
    state.filter = params.get("filter") || "";
  }

  function brokenMark(reason) {
    return el("span", { class: "broken" }, "broken image: " + reason);
  }

  function fieldView(sample, f, full) {
    const label = el("span", { class: "name" }, f.name);
    if (f.kind === "image" && f.problem) {
      return el("div", { class: "field image" }, label, brokenMark(f.problem));
    }
    if (f.kind === "image") {
      const img = el("img", { class: full ? "full" : "thumb", src: f.url, alt: sample.key + "." + f.name, decoding: "async" });
      img.addEventListener("error", () => {
        const reason = "the browser cannot display it";
        img.replaceWith(brokenMark(reason));
        noteProblems([{ shard: sample.shard, pos: sample.pos, index: sample.index, key: sample.key, field: f.name,
          problem: reason, command: f.command || "" }]);
      }, { once: true });
      return el("div", { class: "field image" }, label, img);
    }
    if (f.kind === "audio") {
      return el("div", { class: "field audio" }, label, el("audio", { controls: "", preload: "metadata", src: f.url }));
    }
    if (f.kind === "video") {
      return el("div", { class: "field video" }, label, el("video", { controls: "", preload: "metadata", src: f.url }));
    }
    if (f.text !== undefined && f.text !== null) {
      const more = f.truncated ? el("span", { class: "muted" }, " … (" + size(f.size) + ")") : null;
      if (f.kind === "json") return el("div", { class: "field json" }, label, el("pre", {}, f.text), more);
      return el("div", { class: "field text" }, label, el("span", { class: "text" }, f.label || f.text), more);
    }
    return el("div", { class: "field binary" }, label,
      el("a", { href: f.url, download: sample.key.split("/").pop() + "." + f.name }, size(f.size)),
      el("span", { class: "muted" }, " " + (f.type || "binary")));
  }

  function card(sample) {
    const key = el("button", { type: "button", class: "key", title: "show every field" }, sample.key);
    key.addEventListener("click", () => showDetail(sample.shard, sample.pos));
    const node = el("div", { class: "card", "data-key": sample.key, "data-index": sample.index },
      el("div", { class: "head" }, key,
        el("span", { class: "where" }, "#" + number(sample.index) + " · " + sample.shard_name)));
    for (const f of sample.fields) node.append(fieldView(sample, f, false));
    return node;
  }

  // problems of fields: the server's (found on the pages shown) and the browser's own
  function noteProblems(found) {
    for (const p of found || []) {
      const where = p.shard + "/" + p.pos + "/" + p.field;
      state.problems.delete(where);  // found again: now the latest
      state.problems.set(where, p);
    }
    while (state.problems.size > MAX_PROBLEMS) state.problems.delete(state.problems.keys().next().value);
    showProblems();
  }

  function problemView(p) {
    const link = el("a", { href: "#start=" + p.index + "&n=" + state.n, class: "goto", title: "show this sample" },
      p.key + "." + p.field);
    link.addEventListener("click", (e) => { e.preventDefault(); jumpTo(p.index, p.shard, p.pos); });
    return el("div", { class: "problem", "data-field": p.field, "data-key": p.key }, link,
      ": broken image: " + p.problem, p.command ? el("code", {}, p.command) : null);
  }

  function showProblems() {
    const fields = [...state.problems.values()].reverse();  // the latest first
    const count = state.shardProblems.length + fields.length;
    const summary = state.summary && state.summary.enabled ? state.summary : null;
    $("problems").hidden = count === 0 && !summary;
    if (summary) {
      const kinds = summary.kinds.length;
      $("problemcount").textContent = "summary: " + (summary.done && !kinds ? "no problems found" :
        kinds + " kind" + (kinds === 1 ? "" : "s") + " of problem" + (summary.done ? "" : " so far")) +
        (count ? " · " + count + " on the pages viewed" : "");
    } else {
      $("problemcount").textContent = count + " problem" + (count === 1 ? "" : "s") + " found so far";
    }
    $("problemlist").replaceChildren(...state.shardProblems.map((p) => el("div", { class: "problem" }, p)),
      ...fields.map(problemView));
    $("summarynote").textContent = state.summary && !state.summary.enabled ? state.summary.note : "";
  }

  // the summary of every sample (tarshow --serve --summary), as /api/problems has it
  function exampleView(x) {
    const name = (x.key === null ? "" : x.key) + (x.field === null ? "" : (x.key === null ? "" : ".") + x.field);
    let where;
    if (x.key !== null) {
      where = el("a", { href: "#", class: "goto", title: "show this sample" }, name);
      where.addEventListener("click", (e) => { e.preventDefault(); openKey(x.key, x.shard); });
    } else {
      where = el("span", { class: "name" }, name || (x.url === null ? "" : x.url));
    }
    return el("div", { class: "example", "data-key": x.key, "data-field": x.field }, where, ": " + x.reason,
      x.command ? el("code", {}, x.command) : null);
  }

  function kindView(k) {
    const count = k.count === null ? "" : ": " + number(k.count);
    const note = k.tentative ? " (so far: the end of the summary decides)" : "";
    return el("div", { class: "kind", "data-kind": k.kind, "data-field": k.field },
      el("div", { class: "kindtitle" }, k.title + count + note),
      ...k.examples.map(exampleView),
      k.command && !k.examples.some((x) => x.command) ? el("code", {}, k.command) : null);
  }

  function showSummary() {
    const s = state.summary;
    $("summaryview").hidden = !(s && s.enabled);
    if (s && s.enabled) {
      $("summaryprogress").textContent = (s.done ? "" : "checking every sample: ") + s.progress +
        (s.message ? ": " + s.message : "") + (s.note ? " (audio and video not decoded: " + s.note + ")" : "");
      $("summarylist").replaceChildren(...s.kinds.map(kindView));
    }
    showProblems();
  }

  async function loadSummary() {
    try {
      state.summary = await getJSON("/api/problems");
    } catch (e) {
      status(e.message, true);
      return;
    }
    showSummary();
    if (state.summary.enabled && !state.summary.done) setTimeout(loadSummary, SUMMARY_POLL);
  }

  async function openKey(key, shard) {
    let found;
    try {
      found = await getJSON("/api/find?" + new URLSearchParams({ key: key }).toString());
    } catch (err) {
      status(err.message, true);
      return false;
    }
    if (!found.matches.length) {
      status("no sample with key " + JSON.stringify(key), true);
      return false;
    }
    const at = found.matches.find((m) => m.shard === shard) || found.matches[0];
    await jumpTo(at.index, at.shard, at.pos);
    return true;
  }

  async function jumpTo(index, shard, pos) {
    state.filter = "";
    state.back = [];
    state.start = index;
    await load();
    showDetail(shard, pos);
  }

  async function load() {
    saveHash();
    $("start").value = state.start;
    $("count").value = String(state.n);
    $("filter").value = state.filter;
    status("loading…");
    const params = new URLSearchParams({ start: state.start, n: state.n });
    if (state.filter) params.set("filter", state.filter);
    let page;
    try {
      page = await getJSON("/api/page?" + params.toString());
    } catch (e) {
      status(e.message, true);
      return;
    }
    state.next = page.next;
    state.page = page.samples;
    $("grid").replaceChildren(...page.samples.map(card));
    const total = number(page.total) + (page.complete ? "" : "+");
    $("dataset").textContent =
      number(page.shards) + " shard" + (page.shards === 1 ? "" : "s") + ", " + total + " samples";
    state.shardProblems = page.problems || [];
    noteProblems(page.field_problems);
    const shown = page.samples;
    if (state.filter) {
      const upto = page.next === null ? "the end" : "#" + number(page.next);
      status(shown.length + " match" + (shown.length === 1 ? "" : "es") + " for " + JSON.stringify(state.filter) +
        " in samples #" + number(state.start) + " to " + upto + (page.next === null ? "" : " (Next searches on)"));
    } else if (shown.length === 0) {
      status("no samples from #" + number(state.start) + " (there are " + total + ")");
    } else {
      status("samples #" + number(shown[0].index) + " to #" + number(shown[shown.length - 1].index) + " of " + total);
    }
    $("prev").disabled = state.start === 0 && state.back.length === 0;
    $("next").disabled = page.next === null;
  }

  async function showDetail(shard, pos) {
    let sample;
    try {
      sample = await getJSON("/api/sample/" + shard + "/" + pos);
    } catch (e) {
      status(e.message, true);
      return;
    }
    const body = $("detailbody");
    body.replaceChildren(el("h2", {}, sample.key),
      el("div", { class: "where" },
        "#" + number(sample.index) + " · " + sample.shard_name + " · sample " + sample.pos + " of the shard"));
    noteProblems(sample.fields.filter((f) => f.problem).map((f) => ({ shard: sample.shard, pos: sample.pos,
      index: sample.index, key: sample.key, field: f.name, problem: f.problem, command: f.command || "" })));
    for (const f of sample.fields) {
      const view = fieldView(sample, f, true);
      view.append(el("span", { class: "muted" }, " " + size(f.size)));
      body.append(view);
    }
    $("detail").hidden = false;
    for (const c of document.querySelectorAll(".card")) {
      c.classList.toggle("current", c.dataset.index === String(sample.index));
    }
  }

  function closeDetail() {
    for (const m of $("detailbody").querySelectorAll("audio, video")) m.pause();
    $("detail").hidden = true;
  }

  $("next").addEventListener("click", () => {
    if (state.next === null) return;
    state.back.push(state.start);
    state.start = state.next;
    load();
  });
  $("prev").addEventListener("click", () => {
    state.start = state.back.length ? state.back.pop() : Math.max(0, state.start - state.n);
    load();
  });
  $("nav").addEventListener("submit", (e) => {
    e.preventDefault();
    const start = parseInt($("start").value, 10);
    state.start = Number.isFinite(start) && start >= 0 ? start : 0;
    state.n = parseInt($("count").value, 10);
    state.back = [];
    load();
  });
  $("count").addEventListener("change", () => { state.n = parseInt($("count").value, 10); load(); });
  $("filterform").addEventListener("submit", (e) => {
    e.preventDefault();
    state.filter = $("filter").value.trim();
    state.start = 0;
    state.back = [];
    load();
  });
  $("clear").addEventListener("click", () => { state.filter = ""; state.start = 0; state.back = []; load(); });
  $("jump").addEventListener("submit", async (e) => {
    e.preventDefault();
    const key = $("key").value.trim();
    if (key) await openKey(key, null);
  });
  $("close").addEventListener("click", closeDetail);
  $("detail").addEventListener("click", (e) => { if (e.target === $("detail")) closeDetail(); });
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT" || e.target.tagName === "SELECT") return;
    if (e.key === "Escape") closeDetail();
    else if (e.key === "ArrowRight" && !$("next").disabled) $("next").click();
    else if (e.key === "ArrowLeft" && !$("prev").disabled) $("prev").click();
  });
  window.addEventListener("hashchange", () => { readHash(); state.back = []; load(); });  // a link or typed URL
  readHash();
  load();
  loadSummary();
})();
"""
