// Selection helpers for tables of checkboxes (no framework): a header checkbox
// [data-select-all] ticks every name="ids" box of its form, and shift-click ticks the
// range between the last two clicked boxes.  Without JavaScript the boxes work one by one.
(function () {
  "use strict";
  let last = null;
  document.addEventListener("click", function (event) {
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || box.type !== "checkbox") return;
    const form = box.form;
    if (!form) return;
    const boxes = Array.from(form.querySelectorAll('input[type="checkbox"][name="ids"]'));
    if (box.hasAttribute("data-select-all")) {
      boxes.forEach(function (b) { b.checked = box.checked; });
      return;
    }
    if (box.name !== "ids") return;
    if (event.shiftKey && last && boxes.includes(last)) {
      const [from, to] = [boxes.indexOf(last), boxes.indexOf(box)].sort(function (a, b) { return a - b; });
      boxes.slice(from, to + 1).forEach(function (b) { b.checked = box.checked; });
    }
    last = box;
  });
})();
