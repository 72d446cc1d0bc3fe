// The live part of the page comes rendered from the instance as Server-Sent Events; this
// script only swaps it in, says when the instance is out of reach, and (on the admin API's
// page) posts the resign and transfer forms without leaving the page.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var conn = document.getElementById("conn");
  var lost = function (text) {
    conn.textContent = text;
    conn.className = text ? "lost" : "";
  };
  if (window.EventSource) {
    var events = new EventSource(location.pathname + "?events");
    events.addEventListener("update", function (e) {
      var open = {};
      live.querySelectorAll("details").forEach(function (d, i) { open[i] = d.open; });
      live.innerHTML = e.data;
      live.querySelectorAll("details").forEach(function (d, i) { if (i in open) d.open = open[i]; });
      lost("");
      document.body.dataset.updated = String(Date.now());
    });
    events.addEventListener("error", function () {
      lost("Lost the connection to this instance; retrying. What the page shows may be out of date.");
    });
  }
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (!form.classList.contains("action")) return;
    e.preventDefault();
    var result = document.getElementById("result");
    result.textContent = "Sending…";
    fetch(form.action, { method: "POST" })
      .then(function (r) { return r.text().then(function (t) { result.textContent = r.status + ": " + t; }); })
      .catch(function (err) { result.textContent = "failed: " + err; });
  });
})();
