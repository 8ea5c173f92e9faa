// Live parts of a page without a full reload: an element with
// data-refresh-url gets that URL's HTML (a server-rendered, escaped fragment)
// every data-refresh-s seconds (default 15, at least 5). Loaded as a file
// because the CSP forbids inline script.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-refresh-url]").forEach(function (el) {
    var every = Math.max(5, Number(el.dataset.refreshS) || 15) * 1000;
    var timer = setInterval(function () {
      if (document.hidden) { return; }  // a background tab need not poll
      fetch(el.dataset.refreshUrl, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (response) {
          // A redirect means the session ended: stop rather than paste the login page in.
          if (response.redirected) { clearInterval(timer); return null; }
          return response.ok ? response.text() : null;
        })
        .then(function (html) {
          if (html === null) { return; }
          el.innerHTML = html;
          if (window.fleethqLocalTimes) { window.fleethqLocalTimes(el); }  // local-time.js
        })
        .catch(function () { /* transient network error: try again next tick */ });
    }, every);
  });
});
