// Receipt dashboard: live updates over Server-Sent Events. No library, no inline script (CSP).
// The server renders every fragment (escaped by its templates); this file only swaps them in.
"use strict";

(function () {
  function indicator(on) {
    var el = document.querySelector("[data-live-indicator]");
    if (el) { el.hidden = !on; }
  }

  // A stream the server refused (signed out, token revoked) is closed for good by the browser:
  // say so instead of silently going stale.
  function watchClosed(source) {
    source.addEventListener("error", function () {
      if (source.readyState !== EventSource.CLOSED) { return; }
      var note = document.querySelector("[data-stale-notice]");
      if (note) { note.hidden = false; }
    });
  }

  // The jobs list: the server sends the first page's rows and the counts whenever they change.
  function liveList(tbody) {
    var source = new EventSource(tbody.dataset.liveUrl);
    source.onopen = function () { indicator(true); };
    source.onerror = function () { indicator(false); };
    watchClosed(source);
    source.addEventListener("jobs", function (event) {
      var data = JSON.parse(event.data);
      tbody.innerHTML = data.html;
      Object.keys(data.counts).forEach(function (status) {
        var cell = document.querySelector('[data-count="' + status + '"]');
        if (cell) { cell.textContent = data.counts[status]; }
      });
    });
  }

  // A job or objective page: each event means "something changed"; refetch the rendered body.
  function liveBody(container, eventNames, onTerminal) {
    var source = null;
    var pending = false;

    function terminal() {
      var summary = container.querySelector("[data-terminal]");
      return summary !== null && summary.dataset.terminal === "true";
    }

    function stop() {
      if (source) { source.close(); source = null; }
      indicator(false);
      if (onTerminal) { onTerminal(); }
    }

    function refresh() {
      if (pending) { return; }
      pending = true;
      fetch(container.dataset.fragmentUrl, { credentials: "same-origin", cache: "no-store" })
        .then(function (response) {
          if (response.status === 401 || response.redirected) { stop(); return null; }
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          if (html !== null && html !== undefined) {
            container.innerHTML = html;
            if (terminal()) { stop(); }
          }
        })
        .catch(function () { /* the next event retries */ })
        .finally(function () { pending = false; });
    }

    if (terminal() || !container.dataset.eventsUrl) { return; }
    source = new EventSource(container.dataset.eventsUrl);
    source.onopen = function () { indicator(true); };
    source.onerror = function () { indicator(false); };
    watchClosed(source);
    eventNames.forEach(function (name) { source.addEventListener(name, refresh); });
  }

  // A bulk operation's page, opened by the confirm form: run its pages one request after another
  // (each answers {done}); the totals follow from the operation's audit stream (liveBody) and
  // after each page. An error stops the run and says so; Continue resumes it where it stopped.
  function drive(form, container) {
    var stopped = document.querySelector("[data-operation-stopped]");

    function refresh() {
      fetch(container.dataset.fragmentUrl, { credentials: "same-origin", cache: "no-store" })
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) { if (html) { container.innerHTML = html; } })
        .catch(function () { /* the next page refreshes it */ });
    }

    function step() {
      fetch(form.action, {
        method: "POST",
        body: new FormData(form),
        credentials: "same-origin",
        headers: { "Accept": "application/json" }
      })
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.json();
        })
        .then(function (progress) {
          refresh();
          if (progress.done) { form.hidden = true; } else { step(); }
        })
        .catch(function () { if (stopped) { stopped.hidden = false; } });
    }

    step();
  }

  document.addEventListener("DOMContentLoaded", function () {
    // Choosing a filter value applies it (the Filter button stays for text fields).
    document.querySelectorAll("form.filters select").forEach(function (select) {
      select.addEventListener("change", function () { select.form.submit(); });
    });
    var rows = document.getElementById("job-rows");
    if (rows && rows.dataset.liveUrl) { liveList(rows); }
    var job = document.getElementById("job-body");
    if (job) {
      liveBody(job, ["job"], function () {
        var actions = document.getElementById("job-actions");
        if (actions) { actions.hidden = true; }
      });
    }
    var objective = document.getElementById("objective-body");
    // "receipt": the objective's stream moved; "task": a task's job started (or was retried).
    if (objective) { liveBody(objective, ["receipt", "task"], null); }
    var operation = document.getElementById("operation-body");
    if (operation) {
      var next = document.getElementById("operation-next");
      // "receipt": the operation recorded a page (whoever ran it).
      liveBody(operation, ["receipt"], function () { if (next) { next.hidden = true; } });
      if (next && next.dataset.drive === "true") { drive(next, operation); }
    }
  });
})();
