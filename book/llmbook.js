// The web book's own script (tools/website.py copies it into the site).
(() => {
  // A displayed formula wider than the text column is scaled down to fit it (to no less
  // than half its size; past that it scrolls, as the theme lets it).
  const fitFormulas = () => {
    for (const el of document.querySelectorAll('article mjx-container[display="true"]')) {
      if (!el.dataset.llmbookSize) el.dataset.llmbookSize = getComputedStyle(el).fontSize;
      el.style.fontSize = el.dataset.llmbookSize;
      const over = el.scrollWidth / Math.max(el.clientWidth, 1);
      if (over > 1.001) {
        const size = parseFloat(el.dataset.llmbookSize) * Math.max(0.5, 0.99 / over);
        el.style.fontSize = `${size}px`;
      }
    }
  };
  // A figure opens at full size on a click or tap: on a phone it can then be zoomed.
  const linkFigures = () => {
    for (const img of document.querySelectorAll('article .cell_output img')) {
      if (img.closest('a')) continue;
      const a = document.createElement('a');
      a.href = img.src;
      a.className = 'llmbook-zoom';
      a.title = 'open the figure at full size';
      img.replaceWith(a);
      a.appendChild(img);
    }
  };
  window.addEventListener('load', () => {
    linkFigures();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise)
      MathJax.startup.promise.then(fitFormulas);
    window.addEventListener('resize', () => {
      if (window.MathJax && MathJax.startup) fitFormulas();
    });
  });
})();
