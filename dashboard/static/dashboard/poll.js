// Polling regions marked data-poll-visible-only skip their request while the tab is hidden.
// (An htmx trigger filter, "every 5s [document.visibilityState === 'visible']", would do the
// same, but htmx evaluates filters with eval, which the Content-Security-Policy forbids.)
(function () {
  "use strict";
  document.addEventListener("htmx:confirm", function (event) {
    const source = event.detail && event.detail.elt;
    if (source && source.hasAttribute("data-poll-visible-only") && document.visibilityState !== "visible") {
      event.preventDefault();
    }
  });
})();
