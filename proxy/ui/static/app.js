// mtp-proxy's live page: polls the admin API and draws what it answers. No library, no build.
// The admin key comes from the URL's fragment (#key=...), which browsers never send to a
// server, and goes out only as an Authorization header to this proxy's /admin/ endpoints.
"use strict";

(() => {
  const POLL_MS = 1500;
  const SLOW_EVERY = 3; // the routing mix, learned table and chart: every third poll
  const KEEP_ROWS = 300; // recent requests held by the page
  const SVG = "http://www.w3.org/2000/svg";
  const DEPTH_COLOURS = ["#8a94a6", "#2c9f8f", "#2b6cb0", "#805ad5", "#dd6b20", "#c53030",
    "#b7791f", "#319795"];
  const DASHES = ["", "6 3", "2 3", "8 3 2 3"];

  const page = {
    key: null, after: 0, rows: [], tick: 0, timer: null, session: null,
    profiles: {}, levels: [1], shapes: {}, updates: 0, generation: 0,
  };

  const $ = (selector) => document.querySelector(selector);

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name === "data") Object.assign(node.dataset, value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value);
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const fixed = (value, digits = 1) =>
    typeof value === "number" && isFinite(value) ? value.toFixed(digits) : "–";
  const percent = (value) =>
    typeof value === "number" && isFinite(value) ? Math.round(value * 100) + "%" : "–";
  const count = (value) => (typeof value === "number" ? String(value) : "–");
  const clock = (unix) => new Date(unix * 1000).toLocaleTimeString([], { hour12: false });

  function ago(unix) {
    const seconds = Math.max(0, Date.now() / 1000 - unix);
    if (seconds < 90) return Math.round(seconds) + " s ago";
    if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
    return Math.round(seconds / 3600) + " h ago";
  }

  function uptime(seconds) {
    if (typeof seconds !== "number") return "–";
    const h = Math.floor(seconds / 3600);
    const m = Math.floor((seconds % 3600) / 60);
    const s = Math.floor(seconds % 60);
    return h ? `${h}h${String(m).padStart(2, "0")}m` : `${m}m${String(s).padStart(2, "0")}s`;
  }

  function depthOf(model, profile) {
    const depths = page.profiles[model] || {};
    return profile in depths ? depths[profile] : null;
  }

  // A load level in words: the requests decoding together a figure was measured at.
  function loadWords(level) {
    if (level === null || level === undefined) return "–";
    if (level === 0 || level === "any") return "any load (pool)";
    const levels = page.levels;
    const n = Number(level);
    if (n <= 1) return "alone";
    const next = levels.find((l) => l > n);
    if (next === undefined) return `${n}+ decoding`;
    return next - 1 === n ? `${n} decoding` : `${n}-${next - 1} decoding`;
  }

  function colourOf(depth) {
    return typeof depth === "number" ? DEPTH_COLOURS[depth % DEPTH_COLOURS.length] : "#999";
  }

  function sessionColour(session) {
    let hash = 0;
    for (const char of session) hash = (hash * 31 + char.charCodeAt(0)) >>> 0;
    return `hsl(${hash % 360}, 55%, 42%)`;
  }

  // --- key, modes and polling ----------------------------------------------------------------

  function keyFromFragment() {
    const key = new URLSearchParams(location.hash.slice(1)).get("key");
    return key && key.trim() ? key.trim() : null;
  }

  function show(mode, status, bad) {
    document.body.dataset.state = mode;
    $("#nokey").hidden = mode !== "nokey";
    $("#problem").hidden = !["refused", "disabled"].includes(mode);
    $("#live").hidden = mode !== "live";
    const line = $("#status");
    line.textContent = status;
    line.classList.toggle("bad", Boolean(bad));
  }

  function forget() {
    page.after = 0;
    page.rows = [];
    page.tick = 0;
    page.session = null;
    for (const body of document.querySelectorAll("#live tbody")) body.replaceChildren();
    $("#depths .cards").replaceChildren();
    $("#drafting .verdicts").replaceChildren();
    $("#warnings").hidden = true;
  }

  function start() {
    clearTimeout(page.timer);
    page.generation += 1;
    forget();
    page.key = keyFromFragment();
    if (!page.key) {
      const example = `${location.origin}${location.pathname}#key=ADMIN_KEY`;
      $("#example").textContent = example;
      show("nokey", "no admin key: nothing is read from the proxy");
      return;
    }
    show("loading", "reading the proxy…");
    poll(page.generation);
  }

  async function api(path) {
    const response = await fetch(new URL("../admin/" + path, location.href), {
      headers: { Authorization: "Bearer " + page.key },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    if (!response.ok) {
      const problem = new Error(`${path.split("?")[0]} answered HTTP ${response.status}`);
      problem.status = response.status;
      throw problem;
    }
    return response.json();
  }

  async function poll(generation) {
    const slow = page.tick % SLOW_EVERY === 0;
    page.tick += 1;
    try {
      const [backends, depths, recent, routing, chart, drafting] = await Promise.all([
        api("backends"),
        api("depths"),
        api(`requests?after=${page.after}&limit=${KEEP_ROWS}`),
        slow ? api("routing") : null,
        slow ? api("chart") : null,
        slow ? api("drafting") : null,
      ]);
      if (generation !== page.generation) return; // the key changed meanwhile
      page.profiles = depths.profiles;
      page.levels = depths.levels || [1];
      page.shapes = Object.fromEntries(depths.backends.map((b) => [b.name, b]));
      renderBackends(backends.backends);
      renderDepths(depths.backends);
      renderWarnings(depths.warnings || []);
      addRequests(recent);
      if (routing) {
        renderMix(routing.mix);
        renderLearned(routing.learned);
      }
      if (chart) renderChart(chart);
      if (drafting) renderDrafting(drafting.backends);
      page.updates += 1;
      document.body.dataset.updates = String(page.updates);
      const ready = backends.backends.filter((b) => b.state === "ready").length;
      show("live", `updated ${clock(Date.now() / 1000)} · ${ready}/${backends.backends.length} ` +
        `backends ready · ${page.rows.length} recent requests shown`);
    } catch (problem) {
      if (generation !== page.generation) return;
      if (problem.status === 401) {
        forget();
        $("#problem-title").textContent = "The admin key was refused (401)";
        $("#problem-text").textContent = "The key after #key= is not this proxy's " +
          "server.admin_key. Fix the address and the page reads the proxy again.";
        show("refused", "admin key refused: nothing shown", true);
        return; // until the fragment changes
      }
      if (problem.status === 404) {
        forget();
        $("#problem-title").textContent = "The admin endpoints are off (404)";
        $("#problem-text").textContent = "This proxy has no server.admin_key: set one in " +
          "its config file (or MTP_PROXY_SERVER__ADMIN_KEY), restart it, and open this " +
          "page with #key=THAT_KEY.";
        show("disabled", "admin endpoints disabled", true);
        return;
      }
      const mode = document.body.dataset.state === "live" ? "live" : "loading";
      show(mode, `cannot read the proxy (${problem.message}); retrying`, true);
    }
    page.timer = setTimeout(() => poll(generation), POLL_MS);
  }

  // --- backends ------------------------------------------------------------------------------

  function pill(value, title) {
    return value ? el("span", { class: `pill ${value}`, text: value, title }) : "–";
  }

  // The backend's speculative type, and its draft model's file where it drafts with one.
  function speculation(b) {
    if (!b.spec_type) return "–";
    return b.draft_model ? `${b.spec_type} (${b.draft_model})` : b.spec_type;
  }

  function renderBackends(backends) {
    const rows = backends.map((b) => {
      const shape = page.shapes[b.name];
      const serves = shape && shape.shape === "one-process"
        ? "one process, depth per request" : `${b.profile} (depth ${depthOf(b.model, b.profile)})`;
      const template = b.chat_template ? b.chat_template.late_system : null;
      // Neutral: a template that refuses late system messages is mended by the proxy, no
      // fault; only one left refused (compat.system_turns off) is a warning.
      const words = b.late_system_words || "";
      const templateTitle = template ? `the chat template's answer to a system message ` +
        `that is not first: ${template}` + (b.chat_template.reason ?
          ` (${b.chat_template.reason})` : "") : null;
      return el("tr", { data: { backend: b.name, state: b.state } },
        el("td", { text: b.name }),
        el("td", { text: b.model }),
        el("td", { class: "c-serves", text: serves }),
        el("td", { class: "c-spec", data: { specType: b.spec_type || "" },
          text: speculation(b) }),
        el("td", { class: "c-state" }, pill(b.state)),
        el("td", {}, pill(b.draft_control, b.draft_control_reason)),
        el("td", { class: "c-template", data: { lateSystem: template || "" } },
          words ? el("span", { class: `pill neutral${words.includes("refused (") ? " warn" : ""}`,
            text: words.replace("late system messages: ", ""), title: templateTitle }) : "–"),
        el("td", { class: "num", text: `${count(b.in_flight)} / ${count(b.slots)}` }),
        el("td", { class: "num", text: count(b.queued) }),
        el("td", { class: "num", text: count(b.restarts) }),
        el("td", { text: uptime(b.uptime_s) }),
        el("td", { class: "wrap", text: b.last_error || "" }));
    });
    $("#backends tbody").replaceChildren(...rows);
  }

  // --- does drafting pay: the start-up calibration, and the learned rows of the same load ---

  function speedupSpan(ratio) {
    return el("span", { class: `speedup ${ratio >= 1 ? "up" : "down"}`,
      text: `×${ratio.toFixed(2)}` });
  }

  function learnedBeside(level) {
    if (!level.learned.length) return el("small", { text: "not learned at this load yet" });
    return level.learned.map((l) => el("div", {
      class: `learned${l.trusted ? "" : " untrusted"}`,
      data: { speedup: l.speedup.toFixed(3), profile: l.profile },
      title: `off ${fixed(l.off_tok_s)} tok/s (${fixed(l.samples[0])} samples), ${l.profile} ` +
        `${fixed(l.tok_s)} tok/s (${fixed(l.samples[1])} samples)` +
        (l.trusted ? "" : ": too few samples to be trusted yet"),
    }, `${l.request_class} ${l.profile} (depth ${l.depth}) `, speedupSpan(l.speedup)));
  }

  function renderDrafting(rows) {
    const blocks = rows.map((b) => {
      const body = b.levels.map((level) => el("tr", { data: { level: String(level.level) } },
        el("td", { text: level.words }),
        el("td", { class: "num", text: `${fixed(level.off_tok_s)} tok/s` }),
        el("td", { class: "num", text: `${fixed(level.deep_tok_s)} tok/s` }),
        el("td", { class: "num c-speedup", data: { speedup: level.ratio.toFixed(3) } },
          speedupSpan(level.ratio)),
        el("td", { class: "c-verdict" }, level.pays ? "drafting pays" : "off wins",
          el("small", { text: level.cold_role === "rules" ? "first requests: the content rules"
            : `first requests: ${level.cold_role}` })),
        el("td", { class: "wrap c-learned" }, learnedBeside(level))));
      return el("div", { class: "verdict-block", data: { backend: b.backend } },
        el("p", { class: "verdict" }, el("strong", { text: b.backend }), ": ", b.verdict),
        el("table", {},
          el("thead", {}, el("tr", {},
            el("th", { text: "load" }), el("th", { class: "num", text: "depth 0" }),
            el("th", { class: "num", text: `depth ${b.deepest}` }),
            el("th", { class: "num", text: "speedup" }), el("th", { text: "verdict" }),
            el("th", { text: "learned at the same load (class, depth, speedup against off)" }))),
          el("tbody", {}, body)),
        el("small", { text: `calibrated ${b.measured_at ? ago(b.measured_at) : "–"}` +
          ` on ${b.slots} slot${b.slots === 1 ? "" : "s"}` }));
    });
    $("#drafting .verdicts").replaceChildren(...blocks);
    $("#drafting .empty").hidden = blocks.length > 0;
  }

  // --- what the operator must hear: a learned file not read whole, a failed save -------------

  function renderWarnings(warnings) {
    $("#warnings").hidden = !warnings.length;
    $("#warnings ul").replaceChildren(...warnings.map((text) => el("li", { text })));
  }

  // --- the depth each process runs now -------------------------------------------------------

  function renderDepths(backends) {
    const cards = backends.map((b) => {
      const lines = [el("p", { class: "why", text: b.why })];
      if (b.decoding.length) {
        const now = b.decoding.map((d) => `${d.requests} at ${d.profile} (depth ${d.depth})`);
        lines.push(el("p", { text: "decoding: " + now.join(", ") }));
      }
      if (b.busy) {
        const measured = Object.entries(b.busy.samples)
          .map(([profile, n]) => `${profile} ${fixed(n)}`).join(", ") || "nothing yet";
        lines.push(el("p", {},
          `busy epoch: ${b.busy.profile} (depth ${b.busy.depth}), ${b.busy.left} admissions ` +
          `left${b.busy.exploring ? ", exploring" : ""}`,
          el("small", { text: `requests measured busy at each depth: ${measured}` })));
      }
      if (b.last) {
        lines.push(el("p", {},
          `last request: ${b.last.profile ?? "–"} (depth ${b.last.depth ?? "–"}), ` +
          `${b.last.reason ?? "not routed"}, ${ago(b.last.at)}`,
          el("small", { text: b.last.detail || "" })));
      }
      const depth = typeof b.depth === "number" ? String(b.depth) : "–";
      // The depth decoding now, else the last request's (a one-slot process is never busy):
      // the metric mtp_proxy_backend_depth's figure. The proxy's word where it has none yet.
      const now = b.depth_now;
      const big = now ? String(now.depth) : b.now;
      return el("div", { class: "card", data: { backend: b.name, depth,
        depthNow: now ? String(now.depth) : "", depthSource: now ? now.source : "" } },
        el("div", {},
          el("span", { class: "big", text: big }),
          el("strong", { text: b.name }),
          now ? el("small", { class: "now-source", text: nowWords(now) }) : null,
          el("small", { text: b.shape === "pool" ? `pool process: ${b.profile}` :
            `one process · ${count(b.in_flight)} of ${count(b.slots)} slots in use` })),
        lines);
    });
    $("#depths .cards").replaceChildren(...cards);
  }

  function nowWords(now) {
    if (now.source === "decoding") return `depth ${now.depth} (${now.profile}): decoding now`;
    if (now.source === "pool") return `depth ${now.depth}: this pool process runs ${now.profile}`;
    return `depth ${now.depth} (${now.profile}): its last request, ${ago(now.at)}; ` +
      "nothing decodes now";
  }

  // --- recent requests -----------------------------------------------------------------------

  function addRequests(recent) {
    if (recent.last < page.after) { // the proxy restarted: its sequence began again
      page.after = 0;
      page.rows = [];
    }
    if (recent.requests.length) {
      page.rows = recent.requests.slice().reverse().concat(page.rows).slice(0, KEEP_ROWS);
      page.after = recent.requests[recent.requests.length - 1].seq;
      renderRequests();
    } else if (!page.rows.length) {
      renderRequests();
    }
  }

  function filterBy(session) {
    page.session = page.session === session ? null : session;
    renderRequests();
  }

  function requestRow(r) {
    const failed = r.status >= 400;
    const depth = r.client_depth ? el("span", { text: `${r.profile} (client's depth)` })
      : r.profile === null ? "–"
        : el("span", {}, el("span", { class: "depth", text: count(r.depth) }), " ", r.profile);
    const session = r.session ? el("button", {
      class: "session", type: "button", text: r.session, title: "show only this session",
      onclick: () => filterBy(r.session),
    }) : "–";
    if (r.session) session.style.setProperty("background", sessionColour(r.session));
    const drafted = r.drafted ? [`${r.drafted} / ${count(r.accepted)}`,
      el("small", { text: percent(r.accepted / r.drafted) })] : "–";
    const prompt = [count(r.prompt_tokens),
      r.cached_tokens ? el("small", { text: `${r.cached_tokens} cached` }) : null];
    return el("tr", {
      class: failed ? "failed" : null,
      data: { id: r.request_id, seq: String(r.seq) },
    },
      el("td", { text: clock(r.at), title: new Date(r.at * 1000).toISOString() }),
      el("td", { text: r.api + (r.stream ? " · stream" : "") }),
      el("td", { class: "c-model" }, r.sent_model || r.model,
        r.sent_model ? el("small", { text: `served by ${r.model}` }) : null),
      el("td", {}, session),
      el("td", { class: "c-class" }, r.request_class || "–",
        r.level !== null && r.level !== undefined ? el("small", { text: loadWords(r.level) })
          : null),
      el("td", { class: "c-depth", data: { depth: count(r.depth) } }, depth),
      el("td", { class: "wrap c-reason" }, r.reason || "–",
        el("small", { text: r.detail || r.error || "" })),
      el("td", { class: "num c-prompt" }, prompt),
      el("td", { class: "num c-output", text: count(r.output_tokens) }),
      el("td", { class: "num c-drafted" }, drafted),
      el("td", { class: "num c-speed", text: fixed(r.decode_tok_s) }),
      el("td", { class: "num", text: fixed(r.duration_s, 2) }),
      el("td", { class: "c-status", text: String(r.status), title: r.error || null }));
  }

  function renderRequests() {
    const rows = page.session ? page.rows.filter((r) => r.session === page.session) : page.rows;
    $("#requests tbody").replaceChildren(...rows.map(requestRow));
    $("#requests .empty").hidden = page.rows.length > 0;
    const filter = $("#session-filter");
    filter.textContent = page.session
      ? `session ${page.session} only (click its tag again for all)` : "newest first";
  }

  // --- routing mix and learned table ---------------------------------------------------------

  function renderMix(mix) {
    const totals = {};
    for (const row of mix) totals[row.model] = (totals[row.model] || 0) + row.count;
    const rows = mix.filter((row) => row.count > 0).map((row) => {
      const share = totals[row.model] ? row.count / totals[row.model] : 0;
      const bar = el("div", { class: "bar" });
      bar.style.setProperty("width", `${Math.max(share * 12, 0.1)}rem`);
      return el("tr", {},
        el("td", { text: row.model }),
        el("td", {}, el("span", { class: "depth", text: count(depthOf(row.model, row.profile)) }),
          " ", row.profile),
        el("td", { text: row.reason }),
        el("td", { class: "num", text: String(row.count) }),
        el("td", {}, bar, el("small", { text: percent(share) })));
    });
    $("#mix tbody").replaceChildren(...rows);
    $("#mix .empty").hidden = rows.length > 0;
  }

  function profileOrder(model, profiles) {
    return [...profiles].sort((a, b) =>
      (depthOf(model, a) ?? 99) - (depthOf(model, b) ?? 99) || a.localeCompare(b));
  }

  function renderLearned(learned) {
    const groups = new Map(); // model -> (class -> {row, cells by profile})
    for (const row of learned) {
      if (!groups.has(row.model)) groups.set(row.model, new Map());
      const classes = groups.get(row.model);
      // One row per class and load level: off and a depth side by side only when both were
      // measured at the same load.
      const key = `${row.request_class}@${row.load_level}`;
      if (!classes.has(key)) classes.set(key, { row, cells: {} });
      classes.get(key).cells[row.profile] = row;
    }
    const rows = [];
    for (const [model, classes] of groups) {
      const known = new Set();
      for (const { cells } of classes.values()) Object.keys(cells).forEach((p) => known.add(p));
      const order = profileOrder(model, known);
      const off = order.find((p) => depthOf(model, p) === 0);
      rows.push(el("tr", { class: "model-head" },
        el("th", { text: model }), el("th", { text: "class" }), el("th", { text: "load" }),
        order.map((p) => el("th", { text: `${p} (depth ${count(depthOf(model, p))})` }))));
      for (const [label, { row, cells }] of classes) {
        const base = off && cells[off] ? cells[off].decode_tok_s : null;
        rows.push(el("tr", { data: { model, class: label } },
          el("td", { text: "" }),
          el("td", { text: `${row.bucket} ${row.kind}` }),
          el("td", { text: loadWords(row.level) }),
          order.map((p) => learnedCell(cells[p], p === off, base))));
      }
    }
    $("#learned tbody").replaceChildren(...rows);
    $("#learned .empty").hidden = rows.length > 0;
  }

  function learnedCell(row, isOff, base) {
    if (!row) return el("td", { text: "–" });
    const speedup = !isOff && base && row.decode_tok_s ? row.decode_tok_s / base : null;
    const parts = [el("span", { class: "speed", text: `${fixed(row.decode_tok_s)} tok/s` })];
    if (speedup !== null) {
      parts.push(" ", el("span", {
        class: `speedup ${speedup >= 1 ? "up" : "down"}`, text: `×${speedup.toFixed(2)}`,
      }));
    }
    const acceptance = isOff ? "the reference (off)" : `acceptance ${percent(row.acceptance)}`;
    parts.push(el("small", { text: `${acceptance} · ${row.samples} samples` }));
    return el("td", {
      class: `cell${row.trusted ? "" : " untrusted"}`,
      title: row.trusted ? "trusted" : "too few samples to be trusted yet",
      data: { profile: row.profile, level: String(row.load_level),
        speedup: speedup === null ? "" : speedup.toFixed(3) },
    }, parts);
  }

  // --- chart ---------------------------------------------------------------------------------

  const PLOT = { left: 46, right: 12, top: 10, bottom: 22, width: 900 };

  function renderChart(chart) {
    const now = Date.now() / 1000;
    const from = now - chart.window_s;
    $("#chart-window").textContent =
      `last ${Math.round(chart.window_s / 60)} minutes, one point per ${chart.step_s} s`;
    const models = [...new Set(chart.lines.map((l) => l.model))];
    // One line per depth and load level: a depth measured beside others is another line than
    // the same depth alone, dashed by level, and the legend says which.
    const levels = [...new Set(chart.lines.map((l) => l.level))].sort((a, b) => a - b);
    const legend = chart.lines.map((line) => {
      const item = el("span", {
        data: { profile: line.profile, level: String(line.level) },
        text: `${models.length > 1 ? line.model + " · " : ""}${line.profile} (depth ` +
          `${count(line.depth)}), ${loadWords(line.level)}`,
      });
      item.style.setProperty("--swatch", colourOf(line.depth));
      return item;
    });
    $("#chart .legend").replaceChildren(...legend);
    const style = (line) => ({
      colour: colourOf(line.depth),
      dash: DASHES[(levels.indexOf(line.level) + models.indexOf(line.model)) % DASHES.length],
    });
    plot($("#speed-plot"), chart.lines, "decode_tok_s", from, now, 170, null,
      (v) => v.toFixed(0), "tok/s", style);
    plot($("#acceptance-plot"), chart.lines, "acceptance", from, now, 150, 1,
      (v) => Math.round(v * 100) + "%", "acceptance", style);
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
    return 10 * power;
  }

  function plot(node, lines, key, from, to, height, fixedMax, label, title, style) {
    const { left, right, top, bottom, width } = PLOT;
    const values = lines.flatMap((l) => l.points.map((p) => p[key])).filter((v) => v !== null);
    const max = fixedMax ?? niceMax(Math.max(0, ...values));
    const x = (t) => left + ((t - from) / (to - from)) * (width - left - right);
    const y = (v) => top + (1 - v / max) * (height - top - bottom);
    const parts = [];
    for (const fraction of [0, 0.5, 1]) {
      const value = max * fraction;
      parts.push(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(value),
        y2: y(value) }));
      parts.push(svg("text", { x: left - 6, y: y(value) + 4, "text-anchor": "end" },
        label(value)));
    }
    const span = to - from;
    for (let back = 0; back <= span; back += 300) {
      parts.push(svg("text", { x: x(to - back), y: height - 6, "text-anchor": "middle" },
        back === 0 ? "now" : `-${Math.round(back / 60)}m`));
    }
    parts.push(svg("text", { x: left + 4, y: top + 10 }, title));
    for (const line of lines) {
      const points = line.points.filter((p) => p[key] !== null && p.at >= from);
      if (!points.length) continue;
      const { colour, dash } = style(line);
      const coords = points.map((p) => `${x(p.at).toFixed(1)},${y(p[key]).toFixed(1)}`);
      parts.push(svg("polyline", { points: coords.join(" "), fill: "none", stroke: colour,
        "stroke-width": 2, "stroke-dasharray": dash }));
      for (const p of points) {
        const dot = svg("circle", { cx: x(p.at), cy: y(p[key]), r: 2.6, fill: colour });
        dot.append(svg("title", {}, `${line.profile}, ${loadWords(line.level)}, at ` +
          `${clock(p.at)}: ${label(p[key])} (${p.requests} requests)`));
        parts.push(dot);
      }
    }
    node.replaceChildren(...parts);
  }

  // --- start ---------------------------------------------------------------------------------

  $("#keyform").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("#keyinput");
    const key = input.value.trim();
    input.value = "";
    if (key) location.hash = "key=" + encodeURIComponent(key);
  });
  window.addEventListener("hashchange", start);
  start();
})();
