/* curvecast run page: live updates, zoom re-fetch, alerts and the forecast box. */
(function () {
  "use strict";

  var cc = window.cc;
  var CFG = cc.CFG, getJSON = cc.getJSON, query = cc.query, num = cc.num, el = cc.el;
  var fmtLoss = cc.fmtLoss, fmtStep = cc.fmtStep, fmtDuration = cc.fmtDuration;
  var setLive = cc.setLive, draw = cc.draw, drawn = cc.drawn;
  var xRangeFromEvent = cc.xRangeFromEvent;
  var LAG = 64; // re-ask this many steps back: points of a step may arrive a little late
  var MAX_TRACE_POINTS = 8000; // beyond this a live chart is redrawn from downsampled data

  function runFiguresUrl(charts, range) {
    return CFG.data + "/runs/" + CFG.run_id + "/figures" + query({
      charts: charts ? charts.join(",") : null,
      key: CFG.key,
      start: range ? range[0] : null,
      end: range ? range[1] : null,
    });
  }

  var firstData = cc.firstData(runFiguresUrl());

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
      ["fitted_at", "fit_status", "prefix", "horizon", "total_steps", "run_status", "last_step"].forEach(function (k) {
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
      // A series drawn with markers while it had few points (figures.base.SPARSE_POINTS)
      // becomes a plain line once it has grown.
      var grown = (gd.data || []).map(function (t, i) {
        return t.meta && t.meta.sparse && t.x && t.x.length > 20 ? i : -1;
      }).filter(function (i) { return i >= 0; });
      if (grown.length) {
        grown.forEach(function (i) { delete gd.data[i].meta.sparse; });
        Plotly.restyle(gd, { mode: "lines" }, grown);
      }
    });
    Object.keys(fresh).forEach(function (k) {
      var xs = fresh[k].x;
      cursor[k] = Math.max(cursor[k] === undefined ? -1 : cursor[k], xs[xs.length - 1]);
    });
    redraw.filter(function (v, i, a) { return a.indexOf(v) === i; }).forEach(function (id) {
      refetchChart(id, run.zoom[id] || "auto");
    });
    return fresh;
  }

  // The eval loss drawn on the loss chart (its series other than the training loss), if any.
  function evalKey() {
    var gd = document.getElementById("chart-loss");
    var key = null;
    ((gd && gd.data) || []).forEach(function (t) {
      var m = t.meta;
      if (m && m.role === "last" && m.key && m.key !== "loss") key = m.key;
    });
    return key;
  }

  // The "Train loss reached" card in the server's words (views._loss_reached_kpi): the loss the
  // run reached (the poll's loss_reached, the forecast's "reached" rule), its step, and the last
  // eval loss with its step. A poll without a new eval point keeps the one shown.
  function setLossReached(reached, fresh) {
    if (!reached) return;
    var detail = "at step " + fmtStep(reached.step) + ", median of the last 1% of steps";
    if (!/^(loss|train_loss|train\/loss)$/.test(reached.key)) {
      setKpi("last_loss", fmtLoss(num(reached.value)), detail + "; no training loss logged");
      return;
    }
    setKpi("last_loss", fmtLoss(num(reached.value)), lastLossDetail(detail, fresh));
  }

  function lastLossDetail(detail, fresh) {
    var key = evalKey();
    var ev = key ? fresh[key] : null;
    if (ev && ev.x.length) {
      return detail + "; last eval loss " + fmtLoss(ev.last[ev.last.length - 1]) +
        " at step " + fmtStep(ev.x[ev.x.length - 1]);
    }
    var box = document.querySelector('[data-kpi="last_loss"] .kpi-detail');
    var shown = box ? box.textContent : "";
    var at = shown.indexOf("; last eval loss");
    return at >= 0 ? detail + shown.slice(at) : detail;
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
        // The step REST reports (its `step`: the rule's last evaluation while the alert was
        // open), not one of its other steps: the table and the API must agree.
        el("td", { class: "num", text: fmtStep(a.step) }),
        el("td", { text: String(a.summary || "") }),
        el("td", { class: "muted", title: String(a.started_at || ""), text: cc.fmtTime(a.started_at) }),
      ]));
    });
  }

  function alertsSignature(alerts) {
    return alerts.map(function (a) { return a.id + ":" + a.state; }).sort().join("|");
  }

  function pollRun() {
    var keys = chartKeys();
    var maxCursor = -1;
    Object.keys(run.state.cursor).forEach(function (k) { maxCursor = Math.max(maxCursor, run.state.cursor[k]); });
    // One request for the run, its new points, the forecast and the alerts (each as its REST
    // route answers it, read together): four requests every 2 s per open page cost the
    // service more than the answers themselves.
    var params = { horizon: run.state.horizon, key: CFG.key };
    if (keys.length) {
      params.keys = keys.join(",");
      params.start = Math.max(0, maxCursor - LAG + 1);
      params.max_points = 2000;
    }
    return getJSON(CFG.data + "/runs/" + CFG.run_id + "/live" + query(params)).then(function (res) {
      var info = res.run, metrics = res.metrics, forecast = res.forecast, alerts = res.alerts;
      run.lastRun = info;
      var status = document.getElementById("run-status");
      if (status && status.textContent !== info.status) {
        status.textContent = info.status;
        status.className = "badge status-" + info.status;
      }
      setKpi("progress", fmtStep(info.last_step), null);
      setLossReached(res.loss_reached, extendCharts(metrics.series || []) || {});
      var refresh = [];
      if (forecast && forecast.fitted_at !== run.state.fitted_at) {
        run.state.fitted_at = forecast.fitted_at;
        refresh.push("loss", "evolution");
      }
      var list = alerts.alerts || [];
      var sig = alertsSignature(list);
      if (run.alertsSig !== null && sig !== run.alertsSig) refresh = Object.keys(drawn);
      if (sig !== run.alertsSig) renderAlerts(list);
      run.alertsSig = sig;
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

  function sentence(text) {
    // One message as one sentence: trimmed, ending with its full stop.
    text = String(text || "").trim();
    return /[.!?]$/.test(text) ? text : text + ".";
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
      var path = base + query({ horizon: step, key: CFG.key });
      setRest("/api/v1" + path);
      answer("ask-step-answer", ["Asking…"]);
      getJSON(CFG.api + path).then(function (f) {
        var p = f.prediction;
        var key = f.key || "loss";
        // A step the run is past: the loss it had there (REST's prediction.reached: the series
        // smoothed over the last 1% of the steps up to it).
        var had = p && p.reached !== null && p.reached !== undefined ? p.reached : null;
        if (!p || p.value === null) {
          // Written from REST's fields, one sentence each: REST's message joins the fit's
          // message and the step's ("... with a wide interval step 10 is before ...") and
          // names its own fields ("is in prediction.reached").
          var lines = [];
          if (had !== null) {
            lines.push("Reached at step " + fmtStep(p.step) + ": ", el("b", { text: fmtLoss(had) }),
              " (" + key + ", data). ");
          }
          if (f.status === "pending") {
            lines.push("No forecast yet: " + sentence(f.message || "the first fit comes seconds after the first points"));
          } else if (p && f.c !== null && f.c !== undefined) {
            // The fit has a curve (REST's c): the step comes before the steps it was fitted to.
            lines.push("No forecast at step " + fmtStep(p.step) + ": the curve is fitted to " + key +
              (f.burn_in ? " after the burn-in (step " + fmtStep(f.burn_in) + ")" : "") +
              (f.fitted_upto_step ? " up to step " + fmtStep(f.fitted_upto_step) : "") +
              " and describes the loss from there on, not before" +
              (f.status !== "ok" ? " (fit status: " + f.status.replace(/_/g, " ") + ")." : "."));
          } else {
            lines.push("No forecast (" + f.status.replace(/_/g, " ") + "): " + sentence(f.message || "the fit has no curve"));
          }
          answer("ask-step-answer", lines, had === null);
          return;
        }
        var last = run.lastRun ? run.lastRun.last_step : (run.state && run.state.last_step);
        var nodes = ["Loss at step " + fmtStep(p.step) + ": ", el("b", { text: fmtLoss(p.value) }),
          " (" + Math.round(f.confidence * 100) + "% interval " + fmtLoss(p.lo) + " – " + fmtLoss(p.hi) + ")"];
        if (had !== null) {
          nodes.push(" — the fitted curve's value; the run is past this step and had ",
            el("b", { text: fmtLoss(had) }), " there (" + (f.key || "loss") + ").");
        } else if (last !== null && last !== undefined && step <= last) {
          nodes.push(" — this step is already behind the run: this is the fitted curve's value.");
        }
        var planned = run.state && run.state.total_steps;
        if (had === null && planned && step > planned) {
          // As the loss box says of a target past the end: a number, but not one this run gets to.
          nodes.push(" — past the run's planned last step (" + fmtStep(planned) +
            "): where the loss would be had the run gone on.");
        }
        if (f.off_model) nodes.push(" Warning: the recent loss departs from the fitted curve.");
        // The statuses whose answers extend the current loss (contract.LEVEL_EXTENDING_STATUSES,
        // from the page's config): the number is not the fitted curve's, and the message says why.
        if (CFG.level_extending.indexOf(f.status) >= 0) nodes.push(" (" + f.status.replace(/_/g, " ") + ": " + sentence(f.message) + ")");
        answer("ask-step-answer", nodes);
      }, function (err) { answer("ask-step-answer", [err.message], true); });
    });
    lossForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var loss = parseFloat(document.getElementById("ask-loss-input").value);
      if (!isFinite(loss)) { answer("ask-loss-answer", ["Enter a loss value."], true); return; }
      var path = base + "/target" + query({ loss: loss, key: CFG.key });
      setRest("/api/v1" + path);
      answer("ask-loss-answer", ["Asking…"]);
      getJSON(CFG.api + path).then(function (t) {
        var target = t.target;
        if (!target) { answer("ask-loss-answer", ["No forecast yet: the first fit comes seconds after the first points."], true); return; }
        if (target.reached) {
          // Answered from the data, not the model (the same answer as REST's reached: true).
          answer("ask-loss-answer", ["Already reached: the smoothed " + (t.key || "loss") + " was at " +
            fmtLoss(loss) + " or below from step ", el("b", { text: fmtStep(target.step) }), " on."]);
          return;
        }
        if (!target.reachable) {
          answer("ask-loss-answer", ["Not reachable: a loss of " + fmtLoss(loss) + " is " +
            (target.reason || "at or below the fitted asymptote f*") +
            " — the run is not forecast to get there."]);
          return;
        }
        var interval = " (interval " + fmtStep(target.lo) + " – " + (target.hi === null ? "beyond reach" : fmtStep(target.hi)) + ")";
        // Past the planned last step of a running run: REST marks the target, its reason says
        // so and there is no ETA (a run that ended gets the reason that it ended, below).
        var end = run.state && run.state.total_steps;
        var running = !run.state || !run.state.run_status || run.state.run_status === "running";
        var pastEnd = running && target.past_planned_end;
        if (target.reason && !pastEnd) {
          // A reachable target with a reason: the run ended before the data got there (REST's
          // reason says so), so the step is where it was heading, not a forecast.
          answer("ask-loss-answer", ["Not reached: the run ended before its smoothed " + (t.key || "loss") +
            " got to " + fmtLoss(loss) + ". Had it gone on, the fitted curve puts it at step ",
            el("b", { text: fmtStep(target.step) }), interval + "."]);
          return;
        }
        var nodes = ["Loss " + fmtLoss(loss) + " is forecast at step ", el("b", { text: fmtStep(target.step) }), interval];
        if (t.status && t.status !== "ok") nodes.push(" [fit status: " + t.status.replace(/_/g, " ") + "]");
        var eta = t.eta;
        if (pastEnd) {
          nodes.push(", after the run's planned last step" + (end ? " (" + fmtStep(end) + ")" : "") + ": not in this run.");
        } else if (eta && eta.seconds !== null && eta.seconds !== undefined) {
          // 0 s: the fitted curve is below the target already, the smoothed data not yet (a
          // target the data reached is answered above): due now, not "reached".
          nodes.push(eta.seconds <= 0 ? "; due now by the fitted curve (the data are not there yet)." :
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
      getJSON(CFG.api + "/runs/" + CFG.run_id + "/alerts").then(function (a) {
        var list = a.alerts || [];
        run.alertsSig = alertsSignature(list);
        renderAlerts(list);
      }, function () { renderAlerts([]); });
      setLive(CFG.run_status === "running" ? "" : "paused", "live · updated " + new Date().toLocaleTimeString());
      scheduleRunPoll(CFG.run_status);
    }, function (err) {
      showNotice("Could not load the charts: " + err.message);
      setLive("stale", "error");
      scheduleRunPoll("error");
    });
  }

  cc.onReady(initRun);
})();
