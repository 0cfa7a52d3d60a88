// The theme toggle.  The page follows the system's light or dark preference until the
// toggle picks the other one; the choice is kept in the sluice_theme cookie, which the server
// reads to draw <html data-theme="…"> (so the first paint already has it: no flash, and no
// inline script, which the Content-Security-Policy forbids).  Choosing what the system
// prefers anyway forgets the cookie: the page follows the system again.
(function () {
  const button = document.querySelector('[data-theme-toggle]');
  if (!button) return;
  const root = document.documentElement;
  const query = window.matchMedia('(prefers-color-scheme: dark)');
  const system = () => (query.matches ? 'dark' : 'light');
  const shown = () => root.dataset.theme || system();
  const show = () => button.setAttribute('aria-pressed', String(shown() === 'dark'));
  const remember = (value, seconds) => {
    const secure = location.protocol === 'https:' ? '; secure' : '';
    document.cookie = `sluice_theme=${value}; path=${button.dataset.cookiePath || '/'}; max-age=${seconds}; samesite=lax${secure}`;
  };
  button.addEventListener('click', () => {
    const next = shown() === 'dark' ? 'light' : 'dark';
    if (next === system()) {
      delete root.dataset.theme;
      remember('', 0);
    } else {
      root.dataset.theme = next;
      remember(next, 400 * 24 * 3600);
    }
    show();
  });
  query.addEventListener('change', show);
  show();
})();
