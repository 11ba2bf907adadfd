/* curvecast runs list: sorting, ticking runs to compare, and the table refreshed in place. */
(function () {
  "use strict";

  var cc = window.cc;
  var CFG = cc.CFG, ApiError = cc.ApiError, setLive = cc.setLive;

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
      window.location.href = cc.compareHref(selectedRuns());
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
        // A project's page lists that project's runs (its config says so); the runs list
        // the runs its own address filters.
        var url = CFG.data + "/runs-table" + (CFG.rows_query !== undefined ? CFG.rows_query : window.location.search);
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

  cc.onReady(initRuns);
})();
