/* curvecast compare page: the overlay, the ranking and the verdict, redrawn every 10 s. */
(function () {
  "use strict";

  var cc = window.cc;
  var CFG = cc.CFG, getJSON = cc.getJSON, query = cc.query, el = cc.el;
  var setLive = cc.setLive, draw = cc.draw, xRangeFromEvent = cc.xRangeFromEvent;

  function compareUrl(range) {
    return CFG.data + "/compare" + query({
      runs: (CFG.run_ids || []).join(","),
      horizon: CFG.horizon,
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

  cc.onReady(initCompare);
})();
