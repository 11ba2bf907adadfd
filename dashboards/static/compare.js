/* curvecast compare page: the overlay, the ranking and the verdict, redrawn every 10 s, and
 * the picker that adds runs to the comparison (runs of the first run's project first). */
(function () {
  "use strict";

  var cc = window.cc;
  var CFG = cc.CFG, getJSON = cc.getJSON, query = cc.query, el = cc.el;
  var setLive = cc.setLive, draw = cc.draw, xRangeFromEvent = cc.xRangeFromEvent;

  function compareUrl(range) {
    return CFG.data + "/compare" + query({
      runs: (CFG.run_ids || []).join(","),
      horizon: CFG.horizon,
      key: CFG.key,
      start: range ? range[0] : null,
      end: range ? range[1] : null,
    });
  }

  var firstData = cc.firstData(compareUrl());

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
        el("td", { class: "num", text: r.loss_reached }),
        el("td", { class: "num", text: r.last_eval_loss }),
        el("td", { class: "num" }, [r.forecast, el("div", { class: "muted small", text: r.interval })]),
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

  // --- the picker ------------------------------------------------------------------------

  var PICKER_LIMIT = 200; // runs listed per project (newest first), then filtered as typed
  var PICKER_SHOWN = 30;
  var picker = { runs: null, error: null };

  function loadPickerRuns() {
    // The REST list of runs (GET /api/v1/runs): the first run's project, then every project
    // the caller may see; runs already compared are left out.
    var chosen = {};
    (CFG.run_ids || []).forEach(function (id) { chosen[id] = true; });
    var own = getJSON(CFG.api + "/runs" + query({ project: CFG.project, limit: PICKER_LIMIT }));
    var all = getJSON(CFG.api + "/runs" + query({ limit: PICKER_LIMIT }));
    return Promise.all([own, all]).then(function (pages) {
      var seen = {}, out = [];
      pages.forEach(function (page) {
        (page.runs || []).forEach(function (r) {
          if (chosen[r.id] || seen[r.id]) return;
          seen[r.id] = true;
          out.push(r);
        });
      });
      picker.runs = out;
    }, function (err) { picker.error = err.message; });
  }

  function matches(run, words) {
    var hay = (run.name + " " + run.project + " " + run.id).toLowerCase();
    return words.every(function (w) { return hay.indexOf(w) >= 0; });
  }

  function addRun(id) {
    window.location.href = cc.compareHref((CFG.run_ids || []).concat([id]), CFG.horizon, CFG.key);
  }

  function renderPicker() {
    var list = document.getElementById("picker-results");
    var input = document.getElementById("picker-search");
    list.textContent = "";
    list.hidden = false;
    if (picker.error) {
      list.appendChild(el("li", { class: "empty", text: "Could not list runs: " + picker.error }));
      return;
    }
    if (picker.runs === null) {
      list.appendChild(el("li", { class: "empty", text: "Loading runs…" }));
      return;
    }
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var found = picker.runs.filter(function (r) { return matches(r, words); });
    found.slice(0, PICKER_SHOWN).forEach(function (r) {
      var button = el("button", { type: "button", class: "picker-item", "data-run-id": r.id }, [
        el("span", { class: "picker-name", text: r.name || r.id.slice(0, 8) }),
        el("span", { class: "muted small", text: r.project + " · " + r.status + " · step " + cc.fmtStep(r.last_step) }),
      ]);
      button.addEventListener("click", function () { addRun(r.id); });
      list.appendChild(el("li", { role: "option" }, [button]));
    });
    if (!found.length) {
      list.appendChild(el("li", { class: "empty", text: words.length ? "No other run matches." : "No other runs yet." }));
    } else if (found.length > PICKER_SHOWN) {
      list.appendChild(el("li", { class: "empty", text: (found.length - PICKER_SHOWN) + " more: type to narrow" }));
    }
  }

  function initPicker() {
    var input = document.getElementById("picker-search");
    if (!input || input.disabled) return;
    var list = document.getElementById("picker-results");
    var loading = loadPickerRuns();
    var show = function () { renderPicker(); loading.then(renderPicker); };
    input.addEventListener("focus", show);
    input.addEventListener("input", show);
    input.addEventListener("keydown", function (ev) {
      if (ev.key === "Escape") { list.hidden = true; return; }
      if (ev.key === "Enter") {
        ev.preventDefault();
        var first = list.querySelector(".picker-item");
        if (first) addRun(first.getAttribute("data-run-id"));
      }
    });
    document.addEventListener("click", function (ev) {
      if (!document.getElementById("picker").contains(ev.target)) list.hidden = true;
    });
    // Opened from a run's "Compare with…": one run is no comparison, offer the others now, if
    // there are any (an open "No other runs yet." would only cover the page's verdict).
    if ((CFG.run_ids || []).length === 1) {
      loading.then(function () { if (picker.runs && picker.runs.length) renderPicker(); });
    }
  }

  initPicker(); // deferred: the page is parsed; no need to wait for plotly.js
  cc.onReady(initCompare);
})();
