// Draw every <pre class="mermaid"> with the local mermaid.min.js (no module, no CDN).
// A diagram wider than the column is first shown whole (fitted to the width); a click zooms it
// to its natural size (16 px labels), scrolling sideways in its frame, and a second click fits it again.
(function () {
  function zoomable() {
    document.querySelectorAll("pre.mermaid").forEach(function (pre) {
      var svg = pre.querySelector("svg");
      var box = svg && svg.viewBox && svg.viewBox.baseVal;
      if (!box || !box.width || svg.getBoundingClientRect().width >= 0.95 * box.width) { return; }
      pre.classList.add("inferlab-zoomable");
      pre.title = "Click to zoom in (and again to fit the page)";
      var hint = document.createElement("p");
      hint.className = "inferlab-zoom-hint";
      hint.textContent = "The diagram is scaled to fit: click it to zoom in to full size.";
      pre.parentNode.insertBefore(hint, pre.nextSibling);
      pre.addEventListener("click", function (event) {
        if (event.target.closest && event.target.closest("a")) { return; }  // links in nodes still work
        var zoomed = pre.classList.toggle("inferlab-zoomed");
        svg.style.setProperty("width", zoomed ? box.width + "px" : "", zoomed ? "important" : "");
        svg.style.setProperty("max-width", zoomed ? "none" : box.width + "px");
      });
    });
  }
  function draw() {
    if (!window.mermaid) { return; }
    var theme = document.documentElement.dataset.theme === "dark" ? "dark" : "default";
    // "loose" lets diagram nodes link to other pages of the book (our own, trusted content)
    window.mermaid.initialize({ startOnLoad: false, securityLevel: "loose", theme: theme });
    var done = window.mermaid.run({ querySelector: "pre.mermaid" });
    if (done && done.then) { done.then(zoomable); }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
