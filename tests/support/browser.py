"""A page opened in headless Chromium, with a probe that reports what the page showed."""

import re

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PROBE = """<script>
window.__errs = [];
window.addEventListener('error', e => window.__errs.push(String(e.message || e.target && e.target.src)), true);
const __ce = console.error; console.error = (...a) => { window.__errs.push(a.join(' ')); __ce(...a); };
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const r = {images: imgs.length, broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
             scroll_width: document.documentElement.scrollWidth, width: window.innerWidth, errors: window.__errs,
             ids: [...document.querySelectorAll('h2[id]')].map(h => h.id),
             trust: (document.querySelector('p.trust') || {className: ''}).className};
  // the report's group selector: which groups' blocks show, before and after switching to window.__switch
  const shown = () => [...new Set([...document.querySelectorAll('[data-group]')]
                       .filter(e => e.offsetParent !== null).map(e => e.getAttribute('data-group')))];
  r.shown_before = shown();
  const sel = document.getElementById('group');
  if (sel && window.__switch) { sel.value = window.__switch; sel.dispatchEvent(new Event('change')); }
  r.shown_after = shown();
  const out = document.createElement('pre'); out.id = '__probe'; out.textContent = JSON.stringify(r);
  document.body.appendChild(out);
});
</script>"""


def open_in_browser(page, width: int = 1400, switch_to: str | None = None) -> dict:
    """``page`` opened in headless Chromium at ``width`` px: what a probe script injected ahead
    of the page's own content saw once it loaded (images, console errors, sections, scroll, and
    the groups shown before and after choosing ``switch_to`` in the group selector)."""
    import json
    import shutil
    import subprocess

    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium; .ci/run installs it)")
    probed = page.with_name("probed.html")
    switch = f"<script>window.__switch = {json.dumps(switch_to)};</script>" if switch_to else ""
    probed.write_text(page.read_text().replace("<head>", "<head>" + switch + PROBE, 1))
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom",
                           probed.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="__probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))
