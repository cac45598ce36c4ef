// Draw every <pre class="mermaid"> with the local mermaid.min.js (no module, no CDN).
(function () {
  function draw() {
    if (!window.mermaid) { return; }
    var theme = document.documentElement.dataset.theme === "dark" ? "dark" : "default";
    // "loose" lets diagram nodes link to other pages of the book (our own, trusted content)
    // useMaxWidth false: a wide diagram keeps its natural size (16 px labels) and its frame scrolls
    // sideways, instead of shrinking to the column until its labels are too small to read
    window.mermaid.initialize({ startOnLoad: false, securityLevel: "loose", theme: theme,
                                flowchart: { useMaxWidth: false } });
    window.mermaid.run({ querySelector: "pre.mermaid" });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
