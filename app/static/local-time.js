// Instants in the viewer's own time zone. Pages render every time as
// <time datetime="…Z" title="… UTC · seconds" data-local="text|hover"> with
// UTC text (app/i18n.py time_tag / ago_tag), and chart clocks; this rewrites "text" ones to the
// local date and time and puts the local time before UTC in every hover.
// Loaded as a file because the CSP forbids inline script; refresh.js calls it
// again on each fragment it swaps in.
"use strict";
(function () {
  var zh = document.documentElement.lang.indexOf("zh") === 0;
  var parts = new Intl.DateTimeFormat(zh ? "zh-Hans-CN" : "en-GB", {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
    second: "2-digit", hourCycle: "h23", timeZoneName: "short"
  });

  function local(date) {
    var p = {};
    parts.formatToParts(date).forEach(function (part) { p[part.type] = part.value; });
    var clock = p.hour + ":" + p.minute + ":" + p.second + " " + p.timeZoneName;
    // The same shapes as the server's (app/i18n.py TIME_PATTERNS).
    return zh ? Number(p.year) + "年" + Number(p.month) + "月" + Number(p.day) + "日 " + clock
              : p.year + "-" + p.month + "-" + p.day + " " + clock;
  }

  var clock = new Intl.DateTimeFormat(zh ? "zh-Hans-CN" : "en-GB", {
    hour: "2-digit", minute: "2-digit", hourCycle: "h23"
  });

  // Chart ticks and hover titles (app/pages/charts.py) start with a UTC
  // "HH:MM" and carry the instant in data-clock.
  function localClocks(root) {
    (root || document).querySelectorAll("[data-clock]").forEach(function (el) {
      if (el.dataset.clocked) { return; }
      el.dataset.clocked = "1";
      var text = el.textContent;
      el.textContent = clock.format(new Date(Number(el.dataset.clock) * 1000)) + text.slice(5);
    });
  }

  function localTimes(root) {
    localClocks(root);
    (root || document).querySelectorAll("time[data-local]").forEach(function (el) {
      if (el.dataset.utc) { return; }  // done already
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) { return; }
      el.dataset.utc = el.title;
      var shown = local(date);
      if (el.dataset.local === "text") { el.textContent = shown; }
      el.title = shown + "\n" + el.dataset.utc;
    });
  }

  window.fleethqLocalTimes = localTimes;
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
})();
