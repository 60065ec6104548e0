// Render the formulas pymdownx.arithmatex (generic mode) wrapped in <span class="arithmatex">\(...\)</span>
// and <div class="arithmatex">\[...\]</div>, with the vendored KaTeX (docs/assets/katex), offline.
(function () {
  function render() {
    document.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, {
        delimiters: [
          { left: "\\(", right: "\\)", display: false },
          { left: "\\[", right: "\\]", display: true },
        ],
        throwOnError: false,
      });
    });
    document.body.dataset.math = String(document.querySelectorAll(".katex").length);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", render);
  else render();
})();
