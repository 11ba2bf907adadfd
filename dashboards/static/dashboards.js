/* curvecast dashboards: live updates, zoom re-fetch, sorting and the forecast box.
 *
 * Plain JavaScript, no build step. Figures are built on the server (dashboards/figures.py)
 * and drawn here with plotly.js; this file only moves data. Every piece of text from the
 * server goes into the page through textContent, never innerHTML (the one exception is the
 * runs table body, which the server renders with autoescaping).
 *
 * Loaded with `defer` before plotly.min.js, so the first data request starts while plotly.js
 * is still being parsed.
 */
(function () {
  "use strict";

  var CFG = JSON.parse(document.getElementById("cc-config").textContent);
  var PLOT_CONFIG = {
    responsive: true,
    displaylogo: false,
    modeBarButtonsToRemove: ["lasso2d", "select2d"],
    toImageButtonOptions: { format: "png", scale: 2 },
  };
  var LAG = 64; // re-ask this many steps back: points of a step may arrive a little late
  var MAX_TRACE_POINTS = 8000; // beyond this a live chart is redrawn from downsampled data
  var bench = (window.__cc = { firstChart: null, rendered: {} });

  // --- helpers ----------------------------------------------------------------------------

  function ApiError(status, message) {
    this.status = status;
    this.message = message;
  }

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } })
      .then(function (resp) {
        return resp.text().then(function (text) {
          var body = null;
          try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
          if (!resp.ok) {
            throw new ApiError(resp.status, (body && body.message) || resp.statusText || "request failed");
          }
          return body;
        });
      });
  }

  function query(params) {
    var parts = [];
    Object.keys(params).forEach(function (k) {
      var v = params[k];
      if (v !== null && v !== undefined && v !== "") {
        parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(String(v)));
      }
    });
    return parts.length ? "?" + parts.join("&") : "";
  }

  function num(v) {
    if (v === null || v === undefined) return NaN;
    if (typeof v === "number") return v;
    if (v === "Infinity") return Infinity;
    if (v === "-Infinity") return -Infinity;
    return NaN;
  }

  function fmtLoss(v) {
    v = num(v);
    if (isNaN(v)) return "—";
    if (!isFinite(v)) return v > 0 ? "∞" : "−∞";
    return Number(v.toPrecision(4)).toString();
  }

  function fmtStep(v) {
    v = num(v);
    if (!isFinite(v)) return "—";
    return Math.round(v).toLocaleString("en-US");
  }

  function fmtDuration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "—";
    s = Math.max(0, s);
    if (s < 90) return Math.round(s) + " s";
    var m = s / 60;
    if (m < 90) return Math.round(m) + " min";
    var h = Math.floor(Math.round(m) / 60), mm = Math.round(m) % 60;
    if (h < 48) return h + " h" + (mm ? " " + mm + " min" : "");
    return Math.floor(h / 24) + " d " + (h % 24) + " h";
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "class") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    });
    return node;
  }

  function setLive(kind, text) {
    var live = document.getElementById("live");
    if (!live) return;
    live.hidden = false;
    live.className = "live " + kind;
    document.getElementById("live-text").textContent = text;
  }

  var WEBGL = (function () {
    try {
      var canvas = document.createElement("canvas");
      return !!(canvas.getContext("webgl") || canvas.getContext("experimental-webgl"));
    } catch (e) {
      return false;
    }
  })();

  var DTYPES = {
    f8: Float64Array, f4: Float32Array, i4: Int32Array, u4: Uint32Array,
    i2: Int16Array, u2: Uint16Array, i1: Int8Array, u1: Uint8Array,
  };

  function decodeArray(spec) {
    // plotly.py sends numpy arrays as {dtype, bdata} (base64). Plotly decodes them only into
    // its internal copy; decoding here keeps gd.data a real array that extendTraces can grow.
    if (!spec || typeof spec !== "object" || typeof spec.bdata !== "string" || spec.shape) return spec;
    var Ctor = DTYPES[spec.dtype];
    if (!Ctor) return spec;
    var bin = atob(spec.bdata);
    var bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Ctor(bytes.buffer);
  }

  function prepare(fig) {
    fig.data.forEach(function (t) {
      t.x = decodeArray(t.x);
      t.y = decodeArray(t.y);
      // Without WebGL (some locked-down browsers) the same traces draw as SVG.
      if (!WEBGL && t.type === "scattergl") t.type = "scatter";
    });
    return fig;
  }

  function keepUserChoices(gd, layout) {
    // Keep the scale (linear/log) the user picked with the chart's buttons across redraws.
    ["xaxis", "yaxis", "yaxis2"].forEach(function (ax) {
      var cur = gd.layout && gd.layout[ax];
      if (!cur || !layout[ax]) return;
      var want = cur.type;
      if (want && want !== "-" && want !== (layout[ax].type || "linear")) {
        layout[ax].type = want;
        if (want === "log") { layout[ax].autorange = true; delete layout[ax].range; }
      }
    });
    var menus = gd.layout && gd.layout.updatemenus;
    (layout.updatemenus || []).forEach(function (m, i) {
      if (menus && menus[i] && menus[i].active !== undefined) m.active = menus[i].active;
    });
  }

  var drawn = {};

  function draw(id, fig, onFirst) {
    var gd = document.getElementById("chart-" + id);
    if (!gd || !fig) return Promise.resolve();
    prepare(fig);
    if (!drawn[id]) {
      drawn[id] = true;
      return Plotly.newPlot(gd, fig.data, fig.layout, PLOT_CONFIG).then(function () {
        var now = performance.now();
        bench.rendered[id] = now;
        if (bench.firstChart === null) {
          bench.firstChart = now;
          document.documentElement.setAttribute("data-first-chart-ms", String(Math.round(now)));
        }
        gd.setAttribute("data-rendered", "1");
        if (onFirst) onFirst(gd);
      });
    }
    keepUserChoices(gd, fig.layout);
    return Plotly.react(gd, fig.data, fig.layout, PLOT_CONFIG);
  }

  function xRangeFromEvent(gd, ev) {
    var a = ev["xaxis.range[0]"], b = ev["xaxis.range[1]"];
    if (a === undefined && Array.isArray(ev["xaxis.range"])) { a = ev["xaxis.range"][0]; b = ev["xaxis.range"][1]; }
    if (a !== undefined && b !== undefined) {
      if (gd.layout.xaxis && gd.layout.xaxis.type === "log") { a = Math.pow(10, a); b = Math.pow(10, b); }
      return [Math.max(0, Math.floor(a)), Math.ceil(b)];
    }
    if (ev["xaxis.autorange"]) return "auto";
    return null;
  }

  function onReady(fn) {
    // This file is deferred and runs before plotly.min.js (also deferred) has run, while
    // readyState is already "interactive": DOMContentLoaded fires after both.
    if (document.readyState === "complete") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }

  // --- run page ---------------------------------------------------------------------------

  function runFiguresUrl(charts, range) {
    return CFG.data + "/runs/" + CFG.run_id + "/figures" + query({
      charts: charts ? charts.join(",") : null,
      start: range ? range[0] : null,
      end: range ? range[1] : null,
    });
  }

  function compareUrl(range) {
    return CFG.data + "/compare" + query({
      runs: (CFG.run_ids || []).join(","),
      horizon: CFG.horizon,
      start: range ? range[0] : null,
      end: range ? range[1] : null,
    });
  }

  // Start the first data request now, while plotly.js is still loading.
  // The page preloads exactly this URL (<link rel="preload" id="cc-first-data">).
  var preload = document.getElementById("cc-first-data");
  var firstData = null;
  if (CFG.page === "run") firstData = getJSON(preload ? preload.href : runFiguresUrl());
  if (CFG.page === "compare") firstData = getJSON(preload ? preload.href : compareUrl());
  if (firstData) firstData.catch(function () { /* reported where it is awaited */ });

  var run = {
    state: null,
    zoom: {},
    seq: {},
    timers: {},
    alertsSig: null,
    lastRun: null,
  };

  function showNotice(text) {
    var n = document.getElementById("notice");
    if (!n) return;
    n.hidden = !text;
    n.textContent = text || "";
  }

  function renderKpis(kpis) {
    kpis.forEach(function (k) {
      var box = document.querySelector('[data-kpi="' + k.id + '"]');
      if (!box) return;
      box.className = "kpi " + (k.tone || "neutral");
      box.querySelector(".kpi-label").textContent = k.label;
      box.querySelector(".kpi-value").textContent = k.value;
      box.querySelector(".kpi-detail").textContent = k.detail;
      box.title = k.label + ": " + k.value + " — " + k.detail;
    });
  }

  function setKpi(id, value, detail) {
    var box = document.querySelector('[data-kpi="' + id + '"]');
    if (!box) return;
    if (value !== null) box.querySelector(".kpi-value").textContent = value;
    if (detail !== null) box.querySelector(".kpi-detail").textContent = detail;
  }

  function applyRunData(data) {
    var ids = Object.keys(data.charts);
    var chain = Promise.resolve();
    // The loss chart first: it is what a person looks at.
    ids.sort(function (a, b) { return (a === "loss" ? -1 : 0) - (b === "loss" ? -1 : 0); });
    ids.forEach(function (id) {
      chain = chain.then(function () {
        return draw(id, data.charts[id], function (gd) {
          gd.on("plotly_relayout", function (ev) { onRunRelayout(id, gd, ev); });
        });
      });
    });
    if (data.kpis) renderKpis(data.kpis);
    if (data.state) {
      var s = data.state;
      if (!run.state) run.state = { cursor: {} };
      Object.keys(s.cursor || {}).forEach(function (k) {
        var prev = run.state.cursor[k];
        run.state.cursor[k] = prev === undefined ? s.cursor[k] : Math.max(prev, s.cursor[k]);
      });
      ["fitted_at", "fit_status", "prefix", "horizon", "run_status", "last_step"].forEach(function (k) {
        if (k in s) run.state[k] = s[k];
      });
    }
    return chain;
  }

  function onRunRelayout(id, gd, ev) {
    var range = xRangeFromEvent(gd, ev);
    if (range === null) return;
    clearTimeout(run.timers[id]);
    run.timers[id] = setTimeout(function () { refetchChart(id, range); }, 150);
  }

  function refetchChart(id, range) {
    // Zoomed in: ask the server for the visible range (full resolution once it fits);
    // zoomed out again: back to the downsampled overview.
    run.zoom[id] = range === "auto" ? null : range;
    var seq = (run.seq[id] = (run.seq[id] || 0) + 1);
    return getJSON(runFiguresUrl([id], run.zoom[id])).then(function (data) {
      if (seq !== run.seq[id]) return; // a newer zoom superseded this answer
      return applyRunData(data);
    }, function (err) { showNotice("Could not load the zoomed range: " + err.message); });
  }

  function chartKeys() {
    var keys = {};
    Object.keys(drawn).forEach(function (id) {
      var gd = document.getElementById("chart-" + id);
      var meta = gd && gd.layout && gd.layout.meta;
      ((meta && meta.keys) || []).forEach(function (k) { keys[k] = true; });
    });
    return Object.keys(keys);
  }

  function sameKind(target, values) {
    // extendTraces needs the new values in the target's array type (typed arrays stay typed;
    // gaps are NaN there, null in plain arrays).
    if (target && ArrayBuffer.isView(target)) {
      return new target.constructor(values.map(function (v) { return v === null ? NaN : v; }));
    }
    return values;
  }

  function extendCharts(seriesList) {
    var cursor = run.state.cursor;
    var fresh = {};
    seriesList.forEach(function (s) {
      var after = cursor[s.key] === undefined ? -1 : cursor[s.key];
      var idx = [];
      for (var i = 0; i < s.steps.length; i++) if (s.steps[i] > after) idx.push(i);
      if (!idx.length) return;
      var pick = function (arr) {
        return idx.map(function (i) { var v = num(arr[i]); return isFinite(v) ? v : null; });
      };
      fresh[s.key] = {
        x: idx.map(function (i) { return s.steps[i]; }),
        last: pick(s.values),
        min: s.downsampled && s.min ? pick(s.min) : pick(s.values),
        max: s.downsampled && s.max ? pick(s.max) : pick(s.values),
      };
    });
    var redraw = [];
    Object.keys(drawn).forEach(function (id) {
      var gd = document.getElementById("chart-" + id);
      var idx = [], xs = [], ys = [];
      (gd.data || []).forEach(function (t, i) {
        var m = t.meta;
        if (!m || !m.key || !fresh[m.key]) return;
        if ((m.role === "min" || m.role === "max") && !(t.x && t.x.length)) return;
        if (m.role !== "last" && m.role !== "min" && m.role !== "max") return;
        idx.push(i);
        xs.push(sameKind(t.x, fresh[m.key].x));
        ys.push(sameKind(t.y, fresh[m.key][m.role]));
        if (t.x && t.x.length > MAX_TRACE_POINTS) redraw.push(id);
      });
      if (idx.length) Plotly.extendTraces(gd, { x: xs, y: ys }, idx);
    });
    Object.keys(fresh).forEach(function (k) {
      var xs = fresh[k].x;
      cursor[k] = Math.max(cursor[k] === undefined ? -1 : cursor[k], xs[xs.length - 1]);
    });
    var loss = fresh.loss;
    if (loss) {
      var lastLoss = loss.last[loss.last.length - 1];
      setKpi("last_loss", fmtLoss(lastLoss), "training loss at step " + fmtStep(loss.x[loss.x.length - 1]));
    }
    redraw.filter(function (v, i, a) { return a.indexOf(v) === i; }).forEach(function (id) {
      refetchChart(id, run.zoom[id] || "auto");
    });
  }

  function renderAlerts(alerts) {
    var body = document.getElementById("alerts-body");
    if (!body) return;
    body.textContent = "";
    if (!alerts.length) {
      body.appendChild(el("tr", {}, [el("td", { colspan: "6", class: "empty", text: "No alerts for this run." })]));
      return;
    }
    var order = { firing: 0, pending: 1, resolved: 2 };
    alerts.slice().sort(function (a, b) {
      return (order[a.state] === undefined ? 3 : order[a.state]) - (order[b.state] === undefined ? 3 : order[b.state]);
    }).forEach(function (a) {
      body.appendChild(el("tr", {}, [
        el("td", {}, [el("span", { class: "badge state-" + String(a.state || ""), text: String(a.state || "") }),
          a.acknowledged_at ? el("span", { class: "muted small", text: " acknowledged" }) : ""]),
        el("td", { text: String(a.rule || "") }),
        el("td", { text: String(a.severity || "") }),
        el("td", { class: "num", text: fmtStep(firstOf(a, ["fired_step", "since_step", "step"])) }),
        el("td", { text: String(a.summary || "") }),
        el("td", { class: "muted", text: String(a.fired_at || a.started_at || "") }),
      ]));
    });
  }

  function firstOf(obj, keys) {
    for (var i = 0; i < keys.length; i++) {
      if (obj[keys[i]] !== null && obj[keys[i]] !== undefined) return obj[keys[i]];
    }
    return null;
  }

  function alertsSignature(alerts) {
    return alerts.map(function (a) { return a.id + ":" + a.state; }).sort().join("|");
  }

  function pollRun() {
    var api = CFG.api + "/runs/" + CFG.run_id;
    var keys = chartKeys();
    var maxCursor = -1;
    Object.keys(run.state.cursor).forEach(function (k) { maxCursor = Math.max(maxCursor, run.state.cursor[k]); });
    var jobs = [
      getJSON(api),
      keys.length ? getJSON(api + "/metrics" + query({
        keys: keys.join(","), start: Math.max(0, maxCursor - LAG + 1), max_points: 2000,
      })) : Promise.resolve({ series: [] }),
      getJSON(api + "/forecast" + query({ horizon: run.state.horizon })),
      CFG.alerts_api ? getJSON(api + "/alerts").catch(function (e) {
        if (e.status === 404) return { alerts: [] };
        throw e;
      }) : Promise.resolve(null),
    ];
    return Promise.all(jobs).then(function (res) {
      var info = res[0], metrics = res[1], forecast = res[2], alerts = res[3];
      run.lastRun = info;
      var status = document.getElementById("run-status");
      if (status && status.textContent !== info.status) {
        status.textContent = info.status;
        status.className = "badge status-" + info.status;
      }
      setKpi("progress", fmtStep(info.last_step), null);
      extendCharts(metrics.series || []);
      var refresh = [];
      if (forecast && forecast.fitted_at !== run.state.fitted_at) {
        run.state.fitted_at = forecast.fitted_at;
        refresh.push("loss", "evolution");
      }
      if (alerts) {
        var list = alerts.alerts || [];
        var sig = alertsSignature(list);
        if (run.alertsSig !== null && sig !== run.alertsSig) refresh = Object.keys(drawn);
        if (sig !== run.alertsSig) renderAlerts(list);
        run.alertsSig = sig;
      }
      var noTelemetry = Object.keys(drawn).filter(function (id) {
        if (id === "loss" || id === "evolution") return false;
        var gd = document.getElementById("chart-" + id);
        return !(gd.data || []).some(function (t) { return t.x && t.x.length; });
      });
      if (noTelemetry.length && ++run.emptyPolls % 8 === 0) refresh = refresh.concat(noTelemetry);
      var uniq = refresh.filter(function (v, i, a) { return a.indexOf(v) === i; });
      return Promise.all(uniq.map(function (id) { return refetchChart(id, run.zoom[id] || "auto"); }))
        .then(function () {
          setLive(info.status === "running" ? "" : "paused",
            (info.status === "running" ? "live" : "run " + info.status) + " · updated " +
            new Date().toLocaleTimeString());
          return info.status;
        });
    });
  }

  function scheduleRunPoll(status) {
    var delay = status === "running" ? CFG.poll_ms : CFG.poll_ms * 5;
    setTimeout(function () {
      pollRun().then(scheduleRunPoll, function (err) {
        setLive("stale", "reconnecting… (" + (err && err.message ? err.message : "network error") + ")");
        scheduleRunPoll("error");
      });
    }, delay);
  }

  function answer(id, nodes, isError) {
    var out = document.getElementById(id);
    out.textContent = "";
    out.className = "answer" + (isError ? " error" : "");
    nodes.forEach(function (n) { out.appendChild(typeof n === "string" ? document.createTextNode(n) : n); });
  }

  function setRest(path) {
    var code = document.getElementById("ask-rest");
    if (code) code.textContent = "GET " + path;
  }

  function wireAsk() {
    var base = "/runs/" + CFG.run_id + "/forecast";
    var stepForm = document.getElementById("ask-step");
    var lossForm = document.getElementById("ask-loss");
    stepForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var step = parseInt(document.getElementById("ask-step-input").value, 10);
      if (!(step >= 0)) { answer("ask-step-answer", ["Enter a step (a whole number ≥ 0)."], true); return; }
      var path = base + query({ horizon: step });
      setRest("/api/v1" + path);
      answer("ask-step-answer", ["Asking…"]);
      getJSON(CFG.api + path).then(function (f) {
        var p = f.prediction;
        if (!p || p.value === null) {
          answer("ask-step-answer", [f.status === "pending" ? "No forecast yet: " + f.message : "No forecast: " + (f.message || f.status)], true);
          return;
        }
        var last = run.lastRun ? run.lastRun.last_step : (run.state && run.state.last_step);
        var nodes = ["Loss at step " + fmtStep(p.step) + ": ", el("b", { text: fmtLoss(p.value) }),
          " (" + Math.round(f.confidence * 100) + "% interval " + fmtLoss(p.lo) + " – " + fmtLoss(p.hi) + ")"];
        if (last !== null && last !== undefined && step <= last) nodes.push(" — this step is already behind the run: this is the fitted curve's value.");
        if (f.off_model) nodes.push(" Warning: the recent loss departs from the fitted curve.");
        answer("ask-step-answer", nodes);
      }, function (err) { answer("ask-step-answer", [err.message], true); });
    });
    lossForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var loss = parseFloat(document.getElementById("ask-loss-input").value);
      if (!isFinite(loss)) { answer("ask-loss-answer", ["Enter a loss value."], true); return; }
      var path = base + "/target" + query({ loss: loss });
      setRest("/api/v1" + path);
      answer("ask-loss-answer", ["Asking…"]);
      getJSON(CFG.api + path).then(function (t) {
        var target = t.target;
        if (!target) { answer("ask-loss-answer", ["No forecast yet: the first fit comes seconds after the first points."], true); return; }
        if (!target.reachable) {
          answer("ask-loss-answer", ["Not reachable: a loss of " + fmtLoss(loss) +
            " is at or below the fitted asymptote f* — the run is not forecast to get there."]);
          return;
        }
        var nodes = ["Loss " + fmtLoss(loss) + " is forecast at step ", el("b", { text: fmtStep(target.step) }),
          " (interval " + fmtStep(target.lo) + " – " + (target.hi === null ? "beyond reach" : fmtStep(target.hi)) + ")"];
        var eta = t.eta;
        if (eta && eta.seconds !== null && eta.seconds !== undefined) {
          nodes.push(eta.seconds <= 0 ? "; already reached." :
            "; at the current pace in " + fmtDuration(eta.seconds) +
            (eta.at ? " (around " + new Date(eta.at).toLocaleString() + ")" : "") + ".");
        } else {
          nodes.push(".");
        }
        answer("ask-loss-answer", nodes);
      }, function (err) { answer("ask-loss-answer", [err.message], true); });
    });
  }

  function initRun() {
    run.emptyPolls = 0;
    wireAsk();
    setLive("", "loading…");
    firstData.then(function (data) {
      return applyRunData(data);
    }).then(function () {
      if (CFG.alerts_api) {
        getJSON(CFG.api + "/runs/" + CFG.run_id + "/alerts").then(function (a) {
          var list = a.alerts || [];
          run.alertsSig = alertsSignature(list);
          renderAlerts(list);
        }, function () { renderAlerts([]); });
      }
      setLive(CFG.run_status === "running" ? "" : "paused", "live · updated " + new Date().toLocaleTimeString());
      scheduleRunPoll(CFG.run_status);
    }, function (err) {
      showNotice("Could not load the charts: " + err.message);
      setLive("stale", "error");
      scheduleRunPoll("error");
    });
  }

  // --- compare page -----------------------------------------------------------------------

  var cmp = { zoom: null, seq: 0 };

  function applyCompare(data) {
    var verdict = document.getElementById("verdict");
    verdict.textContent = data.verdict.message;
    verdict.className = "verdict" + (data.verdict.clear ? "" : " unclear");
    var body = document.getElementById("compare-body");
    body.textContent = "";
    (data.rows || []).forEach(function (r) {
      var swatch = el("span", { class: "swatch", text: "■" });
      swatch.style.color = r.colour;
      body.appendChild(el("tr", r.best ? { class: "best" } : {}, [
        el("td", {}, [swatch]),
        el("td", {}, [el("a", { href: "/runs/" + encodeURIComponent(r.run_id), text: r.name }),
          r.best ? el("span", { class: "badge status-finished", text: " best" }) : ""]),
        el("td", {}, [el("span", { class: "badge status-" + r.status, text: r.status })]),
        el("td", { class: "num", text: r.last_step }),
        el("td", { class: "num", text: r.last_loss }),
        el("td", { class: "num", text: r.forecast + " " + r.interval }),
        el("td", { class: "num", text: r.f_star }),
      ]));
    });
    return draw("compare", data.charts.compare, function (gd) {
      gd.on("plotly_relayout", function (ev) {
        var range = xRangeFromEvent(gd, ev);
        if (range === null) return;
        clearTimeout(cmp.timer);
        cmp.timer = setTimeout(function () {
          cmp.zoom = range === "auto" ? null : range;
          refreshCompare();
        }, 150);
      });
    }).then(function () { return draw("ranking", data.charts.ranking); });
  }

  function refreshCompare() {
    var seq = ++cmp.seq;
    return getJSON(compareUrl(cmp.zoom)).then(function (data) {
      if (seq === cmp.seq) return applyCompare(data);
    });
  }

  function initCompare() {
    setLive("", "loading…");
    var loop = function () {
      setTimeout(function () {
        refreshCompare().then(function () {
          setLive("", "live · updated " + new Date().toLocaleTimeString());
          loop();
        }, function (err) { setLive("stale", "reconnecting… (" + err.message + ")"); loop(); });
      }, CFG.poll_ms * 5);
    };
    firstData.then(applyCompare).then(function () {
      setLive("", "live · updated " + new Date().toLocaleTimeString());
      loop();
    }, function (err) {
      document.getElementById("verdict").textContent = "Could not load the comparison: " + err.message;
      loop();
    });
  }

  // --- runs list --------------------------------------------------------------------------

  var sortState = { col: null, dir: 1 };

  function sortRows() {
    if (sortState.col === null) return;
    var body = document.getElementById("runs-body");
    var rows = Array.prototype.slice.call(body.querySelectorAll("tr[data-run-id]"));
    var col = sortState.col, dir = sortState.dir;
    rows.sort(function (a, b) {
      var x = a.children[col].getAttribute("data-sort") || "";
      var y = b.children[col].getAttribute("data-sort") || "";
      if (x === "" && y === "") return 0;
      if (x === "") return 1; // missing values last, whatever the direction
      if (y === "") return -1;
      var nx = parseFloat(x), ny = parseFloat(y);
      var cmpv = (!isNaN(nx) && !isNaN(ny) && String(nx) !== "NaN" && /^-?[0-9.e+-]+$/i.test(x) && /^-?[0-9.e+-]+$/i.test(y))
        ? nx - ny : x.localeCompare(y);
      return cmpv * dir;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function selectedRuns() {
    return Array.prototype.slice.call(document.querySelectorAll(".pick-run:checked")).map(function (c) { return c.value; });
  }

  function wirePicks() {
    var button = document.getElementById("compare-selected");
    var update = function () {
      var n = selectedRuns().length;
      button.disabled = n < 1;
      button.textContent = n ? "Compare " + n + " selected" : "Compare selected";
    };
    document.getElementById("runs-body").addEventListener("change", update);
    button.addEventListener("click", function () {
      window.location.href = "/compare?runs=" + selectedRuns().map(encodeURIComponent).join(",");
    });
    update();
  }

  function initRuns() {
    document.querySelectorAll("#runs-table th button").forEach(function (b) {
      b.addEventListener("click", function () {
        var col = parseInt(b.getAttribute("data-col"), 10);
        sortState.dir = sortState.col === col ? -sortState.dir : 1; // first click: ascending
        sortState.col = col;
        document.querySelectorAll("#runs-table th button").forEach(function (o) { o.removeAttribute("aria-sort"); });
        b.setAttribute("aria-sort", sortState.dir > 0 ? "ascending" : "descending");
        sortRows();
      });
    });
    wirePicks();
    setLive("", "live · updated " + new Date().toLocaleTimeString());
    var refresh = function () {
      setTimeout(function () {
        var url = CFG.data + "/runs-table" + window.location.search;
        fetch(url, { credentials: "same-origin" }).then(function (r) {
          if (!r.ok) throw new ApiError(r.status, r.statusText);
          return r.text();
        }).then(function (rowsHtml) {
          var picked = selectedRuns();
          // Server-rendered with autoescaping (dashboards/templates/_runs_rows.html).
          document.getElementById("runs-body").innerHTML = rowsHtml;
          picked.forEach(function (id) {
            var box = document.querySelector('.pick-run[value="' + CSS.escape(id) + '"]');
            if (box) box.checked = true;
          });
          sortRows();
          document.getElementById("runs-body").dispatchEvent(new Event("change"));
          setLive("", "live · updated " + new Date().toLocaleTimeString());
          refresh();
        }, function (err) { setLive("stale", "reconnecting… (" + err.message + ")"); refresh(); });
      }, CFG.poll_ms * 5);
    };
    refresh();
  }

  onReady(function () {
    if (CFG.page === "run") initRun();
    else if (CFG.page === "compare") initCompare();
    else if (CFG.page === "runs") initRuns();
  });
})();
