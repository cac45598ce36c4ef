// Draw every <pre class="mermaid"> with the local mermaid.min.js (no module, no CDN).
(function () {
  function draw() {
    if (!window.mermaid) { return; }
    var theme = document.documentElement.dataset.theme === "dark" ? "dark" : "default";
    // "loose" lets diagram nodes link to other pages of the book (our own, trusted content)
    window.mermaid.initialize({ startOnLoad: false, securityLevel: "loose", theme: theme });
    window.mermaid.run({ querySelector: "pre.mermaid" });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
