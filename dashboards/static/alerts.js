/* curvecast alerts page: the table refreshed in place every 10 s (the server renders the rows,
 * with their acknowledge and silence forms). */
(function () {
  "use strict";

  var cc = window.cc;
  var CFG = cc.CFG, ApiError = cc.ApiError, setLive = cc.setLive;

  function initAlerts() {
    setLive("", "live · updated " + new Date().toLocaleTimeString());
    var refresh = function () {
      setTimeout(function () {
        var back = window.location.pathname + window.location.search;
        var url = CFG.data + "/alerts-table" + cc.query({ project: CFG.project, state: CFG.state, back: back });
        fetch(url, { credentials: "same-origin" }).then(function (r) {
          if (!r.ok) throw new ApiError(r.status, r.statusText);
          return r.text();
        }).then(function (rowsHtml) {
          // Server-rendered with autoescaping (dashboards/templates/_alerts_rows.html).
          document.getElementById("alerts-body").innerHTML = rowsHtml;
          // The counts above the table follow the rows.
          document.querySelectorAll("#alert-counts .badge").forEach(function (badge) {
            var state = badge.className.replace(/.*state-/, "");
            badge.textContent = document.querySelectorAll("#alerts-body tr.alert-" + state).length + " " + state;
          });
          setLive("", "live · updated " + new Date().toLocaleTimeString());
          refresh();
        }, function (err) { setLive("stale", "reconnecting… (" + err.message + ")"); refresh(); });
      }, CFG.poll_ms * 5);
    };
    refresh();
  }

  cc.onReady(initAlerts);
})();
