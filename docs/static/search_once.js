// Each name once in the search's results: a page whose title is also the heading of its entry (the ReproCB page's
// `ReproCB`) comes back from Sphinx's search as the page and as the entry; keep the entry (its anchor), else the best.
(() => {
  const wrap = () => {
    if (typeof Search === 'undefined' || Search._onceWrapped) return;
    const perform = Search._performSearch;
    Search._performSearch = (...args) => {
      const results = perform(...args), best = new Map();  // ordered worst first: the last one is shown first
      results.forEach((r, i) => {
        const key = r[0] + '\u0000' + String(r[1]).split(' > ').pop(), j = best.get(key);
        if (j === undefined || (r[2] || !results[j][2])) best.set(key, i);
      });
      const keep = new Set(best.values());
      return results.filter((r, i) => keep.has(i));
    };
    Search._onceWrapped = true;
  };
  wrap();
  document.addEventListener('DOMContentLoaded', wrap);
})();
