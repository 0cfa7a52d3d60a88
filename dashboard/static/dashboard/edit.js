// Edit and retry: send the body textarea as a file part (multipart), so a body up to
// SLUICE_MAX_BODY_BYTES is accepted; a url-encoded field stops at Django's 2.5 MB
// (dashboard/views/edits.py).  textarea.value keeps LF line breaks; the server gives the
// body back the line breaks it had.  Without JavaScript the plain field is posted.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-body-as-file")) return;
    const textarea = form.querySelector("textarea[name=body]");
    const input = form.querySelector("input[type=file][name=body_file]");
    if (!textarea || !input || typeof DataTransfer === "undefined") return;
    const files = new DataTransfer();
    files.items.add(new File([textarea.value], "body.txt", { type: "text/plain;charset=utf-8" }));
    input.files = files.files;
    textarea.disabled = true;  // not posted twice
    window.addEventListener("pageshow", function () { textarea.disabled = false; }, { once: true });
  });
})();
