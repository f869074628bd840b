/* Sagaplane dashboard: relative times, copy buttons, confirmation dialogs, live refresh over the
   websocket, polling of export progress. Served as a static file (CSP: no inline script). */
(function () {
  "use strict";

  // ---- relative times: <time datetime=... data-relative> keeps "3 minutes ago" current.
  var UNITS = [["year", 31536000], ["month", 2592000], ["week", 604800], ["day", 86400],
               ["hour", 3600], ["minute", 60]];
  function relative(date) {
    var secs = Math.round((Date.now() - date.getTime()) / 1000);
    var abs = Math.abs(secs);
    if (abs < 45) return "just now";
    for (var i = 0; i < UNITS.length; i++) {
      var n = Math.floor(abs / UNITS[i][1]);
      if (n >= 1 || i === UNITS.length - 1) {
        n = Math.max(n, 1);
        var text = n + " " + UNITS[i][0] + (n === 1 ? "" : "s");
        return secs >= 0 ? text + " ago" : "in " + text;
      }
    }
    return "";
  }
  function refreshTimes(root) {
    (root || document).querySelectorAll("time[data-relative]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d.getTime())) el.textContent = relative(d);
    });
  }

  // ---- copy buttons: <button data-copy="element-id">
  function copyText(button) {
    var target = document.getElementById(button.getAttribute("data-copy"));
    if (!target) return;
    var text = target.textContent.trim();
    var done = function () {
      var label = button.getAttribute("data-label") || button.textContent;
      button.setAttribute("data-label", label);
      button.textContent = "Copied";
      button.setAttribute("aria-live", "polite");
      setTimeout(function () { button.textContent = label; }, 2000);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { selectAndCopy(target); done(); });
    } else {
      selectAndCopy(target);
      done();
    }
  }
  function selectAndCopy(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    try { document.execCommand("copy"); } catch (e) { /* the text stays selected for Ctrl+C */ }
  }

  document.addEventListener("click", function (ev) {
    var button = ev.target.closest("button[data-copy]");
    if (button) { ev.preventDefault(); copyText(button); }
  });

  // ---- confirmations: <form data-confirm="what happens" [data-confirm-warning="..."]> asks in a
  // modal <dialog> (showModal: the browser traps focus; Escape cancels) named after the button
  // pressed: Cancel has the focus, the button's own label confirms. Confirm submits the form once
  // through requestSubmit(submitter) (validation runs, the button's name/value is kept); Cancel and
  // Escape submit nothing; focus goes back to the button. Without script the form just submits.
  var confirming = null; // {form, submitter, opener} while the dialog is open
  function confirmDialog() {
    var dialog = document.getElementById("confirm-dialog");
    if (dialog) return dialog;
    dialog = document.createElement("dialog");
    dialog.id = "confirm-dialog";
    dialog.className = "confirm-dialog";
    dialog.setAttribute("aria-labelledby", "confirm-dialog-title");
    dialog.setAttribute("aria-describedby", "confirm-dialog-text confirm-dialog-warning");
    dialog.innerHTML =
      '<h2 id="confirm-dialog-title"></h2><p id="confirm-dialog-text"></p>' +
      '<p id="confirm-dialog-warning" class="confirm-warning" hidden></p>' +
      '<form method="dialog" class="confirm-actions">' +
      '<button type="submit" value="cancel" id="confirm-dialog-cancel">Cancel</button>' +
      '<button type="submit" value="confirm" id="confirm-dialog-ok" class="danger"></button></form>';
    dialog.addEventListener("close", confirmClosed);
    document.body.appendChild(dialog);
    return dialog;
  }
  function actionLabel(button) {
    if (!button) return "Confirm";
    var label = button.getAttribute("aria-label") || button.textContent || button.value || "";
    return label.replace(/\s+/g, " ").trim() || "Confirm";
  }
  function askToConfirm(form, submitter) {
    var dialog = confirmDialog();
    var label = actionLabel(submitter);
    var warning = form.getAttribute("data-confirm-warning") || "";
    confirming = { form: form, submitter: submitter, opener: submitter || document.activeElement };
    dialog.querySelector("#confirm-dialog-title").textContent = label + "?";
    dialog.querySelector("#confirm-dialog-text").textContent = form.getAttribute("data-confirm");
    var warn = dialog.querySelector("#confirm-dialog-warning");
    warn.textContent = warning ? "⚠ Warning: " + warning : "";
    warn.hidden = !warning;
    dialog.querySelector("#confirm-dialog-ok").textContent = label;
    dialog.returnValue = "";
    dialog.showModal();
    dialog.querySelector("#confirm-dialog-cancel").focus();
  }
  function confirmClosed() {
    var dialog = document.getElementById("confirm-dialog");
    var asked = confirming;
    confirming = null;
    if (!asked) return;
    if (asked.opener && asked.opener.isConnected) asked.opener.focus();
    if (dialog.returnValue === "confirm" && asked.form.isConnected) {
      asked.form.setAttribute("data-confirmed", "1"); // lets this one submission through
      if (asked.submitter) asked.form.requestSubmit(asked.submitter);
      else asked.form.requestSubmit();
      asked.form.removeAttribute("data-confirmed");
      return;
    }
    // Regions not refreshed while the dialog was open (its form inside them) catch up now.
    document.querySelectorAll("[data-held]").forEach(function (region) {
      region.removeAttribute("data-held");
      fetchInto(region, region.hasAttribute("data-refresh-url") ? "data-refresh-url" : "data-live-url");
    });
  }
  document.addEventListener("submit", function (ev) {
    var form = ev.target.closest("form[data-confirm]");
    if (!form) return;
    if (form.getAttribute("data-confirmed") === "1") return;
    ev.preventDefault();
    if (!confirming) askToConfirm(form, ev.submitter);
  });

  // ---- live regions: <div data-live-url="/sagas/rows?..." [data-live-saga="id"] [data-live-on="type"]>
  // On any event (for this saga, when data-live-saga is set; of this type, when data-live-on is
  // set: the navigation's approvals count) the fragment is fetched again.
  var liveRegions = [];
  var pending = null;
  function refreshLive(event) {
    liveRegions.forEach(function (region) {
      var only = region.getAttribute("data-live-saga");
      if (only && event && Array.isArray(event.sagas) &&
          !event.sagas.some(function (s) { return s && s.saga_id === only; })) return;
      var type = region.getAttribute("data-live-on");
      if (type && event && event.type !== type) return;
      region.setAttribute("data-dirty", "1");
    });
    if (pending) return;
    pending = setTimeout(function () {
      pending = null;
      liveRegions.forEach(function (region) {
        if (region.getAttribute("data-dirty") !== "1") return;
        region.removeAttribute("data-dirty");
        fetchInto(region);
      });
    }, 150);
  }
  // The form a confirmation dialog asks about is not replaced under it: fetched once it closes.
  function held(region) {
    if (!confirming || !region.contains(confirming.form)) return false;
    region.setAttribute("data-held", "1");
    return true;
  }
  function fetchInto(region, attribute) {
    if (held(region)) return Promise.resolve(null);
    var url = region.getAttribute(attribute || "data-live-url");
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        if (held(region)) return null; // a dialog opened while this was on its way
        // Keep open inspectors open across a refresh.
        var open = {};
        region.querySelectorAll("details[open][id]").forEach(function (d) { open[d.id] = true; });
        var focused = focusSignature(region);
        region.innerHTML = html;
        region.querySelectorAll("details[id]").forEach(function (d) { if (open[d.id]) d.open = true; });
        refocus(region, focused);
        refreshTimes(region);
        whenStale(region);
        region.dispatchEvent(new CustomEvent("live:updated", { bubbles: true }));
        return true;
      })
      .catch(function () { return false; /* next event or reconnect tries again */ });
  }

  // ---- focus survives a refresh: the same control (same id, name, label and text) is focused
  // again in the new fragment; never a different one (Enter must not press another button).
  var FOCUSABLE = "a[href], button, input, select, textarea, summary";
  function signature(el) {
    return [el.tagName, el.id, el.getAttribute("name"), el.getAttribute("aria-label"),
            el.textContent.replace(/\s+/g, " ").trim()].join("|");
  }
  function focusSignature(region) {
    var el = document.activeElement;
    return el && el !== region && region.contains(el) ? signature(el) : null;
  }
  function refocus(region, wanted) {
    if (!wanted) return;
    var match = Array.prototype.filter.call(region.querySelectorAll(FOCUSABLE), function (el) {
      return signature(el) === wanted;
    });
    if (match.length === 1) match[0].focus();
  }

  // ---- a live region whose fragment holds <span data-stale-at="ISO"> is fetched again a moment
  // after that time although no record arrives (a lease expiring: time passing is not a record).
  function whenStale(region) {
    var marker = region.querySelector("[data-stale-at]");
    if (region._staleTimer) { clearTimeout(region._staleTimer); region._staleTimer = null; }
    if (!marker) return;
    var at = new Date(marker.getAttribute("data-stale-at")).getTime();
    if (isNaN(at)) return;
    var wait = Math.min(Math.max(at - Date.now(), 0) + 1000, 3600000);
    region._staleTimer = setTimeout(function () { region._staleTimer = null; fetchInto(region); }, wait);
  }

  // ---- refreshed regions: <div data-refresh-url="..." data-refresh-seconds="3"> (the fleet's
  // gauges: gate decisions are not websocket events). Fetched again every few seconds while the
  // tab is visible, never two fetches at once; [data-refresh-status] says whether it keeps up.
  function refreshEvery(region) {
    var seconds = Math.max(1, parseFloat(region.getAttribute("data-refresh-seconds")) || 5);
    var busy = false;
    var tick = function () {
      if (busy || document.hidden) return;
      busy = true;
      fetchInto(region, "data-refresh-url").then(function (ok) {
        busy = false;
        if (ok === null) return; // held under a confirmation dialog
        document.querySelectorAll("[data-refresh-status]").forEach(function (el) {
          el.setAttribute("data-state", ok ? "live" : "offline");
          el.textContent = ok ? "Live" : "Reconnecting…";
        });
        if (ok) document.documentElement.setAttribute("data-refreshed", String(Date.now()));
      });
    };
    tick();
    setInterval(tick, seconds * 1000);
  }
  function setLiveState(state, text) {
    document.querySelectorAll("[data-live-status]").forEach(function (el) {
      el.setAttribute("data-state", state);
      el.textContent = text;
    });
  }
  function connect(attempt) {
    var proto = location.protocol === "https:" ? "wss://" : "ws://";
    var ws;
    try { ws = new WebSocket(proto + location.host + "/ws/events"); } catch (e) { return retry(attempt); }
    ws.onopen = function () {
      setLiveState("live", "Live");
      document.documentElement.setAttribute("data-live", "open");
      if (attempt > 0) refreshLive(null); // catch up on whatever happened while disconnected
      attempt = 0;
    };
    ws.onmessage = function (msg) {
      var data = null;
      try { data = JSON.parse(msg.data); } catch (e) { data = null; }
      refreshLive(data);
      notifyApproval(data);
    };
    ws.onclose = function () {
      document.documentElement.setAttribute("data-live", "closed");
      setLiveState("offline", "Reconnecting…");
      retry(attempt + 1);
    };
  }
  function retry(attempt) {
    var delay = Math.min(30000, 500 * Math.pow(2, Math.min(attempt, 6)));
    setTimeout(function () { connect(attempt); }, delay);
  }

  // ---- browser notifications, opt-in per browser: <button data-notify-toggle> (shown only where
  // the browser has notifications) asks the permission and remembers the choice; then a new
  // approval request, heard on any open dashboard page, shows a notification that opens it.
  var NOTIFY_KEY = "sagaplane.notify-approvals";
  function notifying() {
    try {
      return "Notification" in window && Notification.permission === "granted" &&
        window.localStorage.getItem(NOTIFY_KEY) === "1";
    } catch (e) { return false; }
  }
  function showNotifyState() {
    document.querySelectorAll("[data-notify-toggle]").forEach(function (button) {
      var on = notifying();
      button.hidden = false;
      button.setAttribute("aria-pressed", on ? "true" : "false");
      button.textContent = on ? "Browser notifications: on" : "Notify me in this browser";
    });
  }
  function toggleNotify() {
    if (notifying()) {
      window.localStorage.removeItem(NOTIFY_KEY);
      showNotifyState();
      return;
    }
    Notification.requestPermission().then(function (answer) {
      if (answer === "granted") window.localStorage.setItem(NOTIFY_KEY, "1");
      showNotifyState();
    });
  }
  function notifyApproval(event) {
    if (!event || event.type !== "approval.event" || event.kind !== "created" || !notifying()) return;
    var a = event.approval || {};
    var note = new Notification("Approval requested: " + (a.tool || "an action"), {
      body: (a.reason ? a.reason + " · " : "") + "needs " + (a.required || 1) + " approval(s)",
      tag: "approval-" + a.id
    });
    note.onclick = function () { window.focus(); window.location.assign("/approvals/" + a.id + "/"); };
  }

  // ---- polling: <div data-poll-url="..." data-poll-done="0|1"> (export progress)
  function poll(region) {
    if (region.getAttribute("data-poll-done") === "1") return;
    setTimeout(function () {
      fetch(region.getAttribute("data-poll-url"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var holder = document.createElement("div");
          holder.innerHTML = html;
          var fresh = holder.firstElementChild;
          if (fresh) { region.replaceWith(fresh); refreshTimes(fresh); poll(fresh); }
        })
        .catch(function () { poll(region); });
    }, 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    refreshTimes();
    setInterval(refreshTimes, 30000);
    if ("Notification" in window) {
      showNotifyState();
      document.querySelectorAll("[data-notify-toggle]").forEach(function (button) {
        button.addEventListener("click", toggleNotify);
      });
    }
    liveRegions = Array.prototype.slice.call(document.querySelectorAll("[data-live-url]"));
    liveRegions.forEach(whenStale);
    if (liveRegions.length && "WebSocket" in window) connect(0);
    document.querySelectorAll("[data-poll-url]").forEach(poll);
    document.querySelectorAll("[data-refresh-url]").forEach(refreshEvery);
  });
})();
