/* curvecast dashboards: what every page's script shares.
 *
 * Plain JavaScript, no build step. Figures are built on the server (dashboards/figures/)
 * and drawn here with plotly.js; the scripts only move data. Every piece of text from the
 * server goes into the page through textContent, never innerHTML (the one exception is the
 * runs table body, which the server renders with autoescaping).
 *
 * One script per page sits beside this one (run.js, compare.js, runs.js); each takes what it
 * needs from window.cc. All are loaded with `defer` before plotly.js, in this order, so a
 * page's first data request starts while plotly.js is still being parsed.
 */
(function () {
  "use strict";

  var CFG = JSON.parse(document.getElementById("cc-config").textContent);
  var PLOT_CONFIG = {
    responsive: true,
    displaylogo: false,
    // A short toolbar: it is drawn over the figure's top-right corner, beside the title.
    modeBarButtonsToRemove: ["lasso2d", "select2d", "zoomIn2d", "zoomOut2d"],
    toImageButtonOptions: { format: "png", scale: 2 },
  };
  var bench = (window.__cc = { firstChart: null, rendered: {} });

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

  function pad2(n) { return (n < 10 ? "0" : "") + n; }

  function fmtTime(iso) {
    // A moment for people, in UTC to the second (fmt.when on the server writes the same):
    // "2026-11-28 13:53:10 UTC", not the raw ISO timestamp.
    if (!iso) return "—";
    var d = new Date(iso);
    if (isNaN(d.getTime())) return String(iso);
    return d.getUTCFullYear() + "-" + pad2(d.getUTCMonth() + 1) + "-" + pad2(d.getUTCDate()) + " " +
      pad2(d.getUTCHours()) + ":" + pad2(d.getUTCMinutes()) + ":" + pad2(d.getUTCSeconds()) + " UTC";
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
    });
    return fig;
  }

  function keepUserChoices(gd, layout) {
    // Keep the scale (linear/log) the user picked with the chart's buttons across redraws,
    // with the range the figure gives for that scale (layout.meta.ranges: a log axis left to
    // autoscale would stretch down to the forecast band's lowest edge).
    var ranges = (layout.meta && layout.meta.ranges) || {};
    ["xaxis", "yaxis", "yaxis2"].forEach(function (ax) {
      var cur = gd.layout && gd.layout[ax];
      if (!cur || !layout[ax]) return;
      var want = cur.type;
      if (want && want !== "-" && want !== (layout[ax].type || "linear")) {
        layout[ax].type = want;
        var given = ranges[ax] && ranges[ax][want];
        if (given) { layout[ax].range = given; layout[ax].autorange = false; }
        else { layout[ax].autorange = true; delete layout[ax].range; }
      }
    });
    var menus = gd.layout && gd.layout.updatemenus;
    (layout.updatemenus || []).forEach(function (m, i) {
      if (menus && menus[i] && menus[i].active !== undefined) m.active = menus[i].active;
    });
  }

  var drawn = {};

  function sizeBox(gd, layout) {
    // The figure's height goes to its box, and Plotly sizes the chart to the box. With
    // `responsive`, a window resize relayouts with autosize, which drops layout.height: the
    // chart then took the box's own height (its CSS min-height, 120 px) and overlapped the
    // cards below it. The width follows the box too, whatever the window does.
    if (layout.height) {
      gd.style.height = layout.height + "px";
      delete layout.height;
    }
    layout.autosize = true;
  }

  function draw(id, fig, onFirst) {
    var gd = document.getElementById("chart-" + id);
    // Without plotly.js (it failed to load) the server's static preview stays.
    if (!gd || !fig || typeof Plotly === "undefined") return Promise.resolve();
    prepare(fig);
    sizeBox(gd, fig.layout);
    if (!drawn[id]) {
      drawn[id] = true;
      // The server's static preview of this chart (if any) gives way to the interactive one.
      var preview = gd.querySelector(".static-preview");
      if (preview) preview.remove();
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

  function compareHref(ids, horizon, key) {
    // The compare page's address; pages.compare_href builds the same on the server, so the
    // runs list, the run page and the compare page's picker all agree on it.
    return "/compare?runs=" + ids.map(encodeURIComponent).join(",") +
      (horizon ? "&horizon=" + encodeURIComponent(String(horizon)) : "") +
      (key ? "&key=" + encodeURIComponent(key) : "");
  }

  function onReady(fn) {
    // The pages' scripts are deferred and run before plotly.js (also deferred) has run,
    // while readyState is already "interactive": DOMContentLoaded fires after all of them.
    if (document.readyState === "complete") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }

  function firstData(url) {
    // The page preloads exactly its first data URL (<link rel="preload" id="cc-first-data">):
    // ask for it now, while plotly.js is still loading.
    var preload = document.getElementById("cc-first-data");
    var pending = getJSON(preload ? preload.href : url);
    pending.catch(function () { /* reported where it is awaited */ });
    return pending;
  }

  window.cc = {
    CFG: CFG, ApiError: ApiError, getJSON: getJSON, query: query, num: num, fmtLoss: fmtLoss,
    fmtStep: fmtStep, fmtDuration: fmtDuration, fmtTime: fmtTime, el: el, setLive: setLive, draw: draw,
    drawn: drawn, xRangeFromEvent: xRangeFromEvent, onReady: onReady, firstData: firstData,
    compareHref: compareHref,
  };
})();
