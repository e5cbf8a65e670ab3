"""The documentation site, as a reader gets it: `bash .ci/docs` builds it into `_docs/` (nbdev's processing, then
Sphinx + myst-nb, warnings as errors), a local HTTP server serves it, and headless Chromium (selenium) opens every page:
no console error, every image decoded, every internal link and `#fragment` resolves, the sidebar lists the pages in the
order of `nbs/sidebar.yml`, the guides first, every public name of `fastrepro.all` has its own entry that the site's
search finds, the demo page shows its plots, math renders, and no page loads anything from another host. The outputs
of the executed notebooks are on the pages: on at least `MIN_OUTPUT_PAGES` reference pages, the plots of `PLOTS`
decoded, and no page shows this machine's temporary paths. What a reader meets (issue 61): classes shown as
`class`, the callbacks before the internals in the sidebar, search results with snippets and each name once, no output
that shows a function object, an address or `None` for a number, at most `MAX_TEST_CELLS` visible test-only cells on
the site and no page over `MAX_PAGE_CHARS` characters of text. Screenshots for a person to look at go to
/tmp/fastrepro_docs/.

Skipped, with the reason, where Debian's `chromium` and `chromedriver` are missing (`apt-get install -y chromium
chromium-driver`; `.ci/run` installs them) or the docs extra is (`pip install -e ".[dev]"`)."""
import functools, http.server, json, re, shutil, subprocess, sys, threading, urllib.parse
from importlib.util import find_spec
from pathlib import Path
import pytest, yaml
from conftest import hang_limit

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT/'_docs'
SHOTS = Path('/tmp/fastrepro_docs')
CHROMIUM, CHROMEDRIVER = shutil.which('chromium') or shutil.which('chromium-browser'), shutil.which('chromedriver')
# .ci/docs: nbdev's processing of every notebook, the notebooks `_exec/` lacks executed (all: about 5 minutes), Sphinx
BUILD_TIMEOUT_S = hang_limit(180 + 300)
PAGE_TIMEOUT_S = hang_limit(10)
DEMO_PAGE, DEMO_PLOTS = 'demo/run.html', 4  # the demo's plots: same seed, fp16 loss scale, nondeterminism, variants
MATH_PAGE = 'experiments/stats.html'  # a page with TeX (effect sizes, power)
# the plots a reader would rather look at, each on its page: the page -> what it draws
PLOTS = {'callback/fp16.html': 'the loss scale history', 'record/divergence.html': "two runs' losses, where they part",
         'experiments/stats.html': 'a comparison over seeds with its intervals',
         'callback/preempt.html': "a resumed run on top of the uninterrupted one",
         'check/reproduce.html': "reproduce's report",
         'guides/tutorial.html': "the tutorial's loss scale"}
MIN_OUTPUT_PAGES = 30  # reference pages that show at least one output of their executed notebook
GUIDES = ('Start here', 'How-to guides')  # the sidebar's first sections, before the reference
# what a reader meets: the callbacks a user adds before the internals they are built on (the sidebar's order)
USER_FIRST, INTERNALS = ('callback/',), ('checkpoint/', 'record/', 'state/')
MAX_PAGE_CHARS = 25_000  # a reference page's text (its main column): past that, a reader stops reading
MAX_TEST_CELLS = 90  # visible code cells that only test (they run in CI; hidden or folded on the pages)
TEST_CODE = re.compile(r'\b(?:test_eq|test_ne|test_fail|test_close|test_is|test_warns|test_stdout|test_eq_type|'
                       r'test_shuffled|assert)\b')
CLASS_AS_DEF = re.compile(r'\s*(?:async )?def [A-Z]\w*\(')  # fastrepro's functions are snake_case, its classes not
FUNCTION_SHOWN = re.compile(r'<function |<bound method | at 0x[0-9a-f]{6,}>')  # an object's repr, not its value
# `None` where a number belongs (a fit, epoch, iteration... whose number was lost on the way)
NONE_NUMBER = re.compile(r'\b(?:[Ff]it|[Ee]poch|[Ii]teration|[Bb]atch|[Ff]ormat|[Ss]tep|[Ss]eed) None\b')
ITERATION_PAGE = 'guides/howto_preemption.html'  # its prose says where the run was killed, its output where it stopped

if CHROMIUM is None or CHROMEDRIVER is None:
    pytest.skip("Debian's chromium and chromedriver are not installed (apt-get install -y chromium chromium-driver): "
                "the site cannot be checked in a browser", allow_module_level=True)
if find_spec('selenium') is None or find_spec('myst_nb') is None:
    pytest.skip('selenium or the docs extra (Sphinx, myst-nb) is not installed: pip install -e ".[dev]"',
                allow_module_level=True)
sys.path.insert(0, str(ROOT/'docs'))
from stage import front_matter, page_path  # noqa: E402  the staging's own naming of pages
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

# Run in each loaded page: what it shows and links to
PROBE = """return {
  images: [...document.images].map(i => ({src: i.currentSrc, ok: i.complete && i.naturalWidth > 0,
                                          w: i.naturalWidth, h: i.naturalHeight})),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id], a[name]')].map(e => e.id || e.name),
  sidebar: [...document.querySelectorAll('nav.bd-docs-nav a.reference.internal')].map(a => a.href),
  captions: [...document.querySelectorAll('nav.bd-docs-nav p.caption')].map(p => p.textContent.trim()),
  math: document.querySelectorAll('mjx-container').length,
  outputs: [...document.querySelectorAll('main div.cell_output')]
             .filter(o => o.innerText.trim() || o.querySelector('img')).map(o => o.innerText),
  plots: [...document.querySelectorAll('main div.cell_output img')].map(i => ({ok: i.complete && i.naturalWidth > 0,
                                                                             w: i.naturalWidth, h: i.naturalHeight})),
  text: document.body.innerText,
  chars: (document.querySelector('main article') || document.querySelector('main')).innerText.length,
  // show_doc's entries (code blocks of the page's markdown, not cells): the first line of each signature
  signatures: [...document.querySelectorAll('main div.highlight-python pre')].filter(p => !p.closest('div.cell'))
    .map(p => p.textContent.split('\\n')[0]),
  // code cells a reader sees (not folded away) that show nothing: their code, to tell the tests among them
  silent_cells: [...document.querySelectorAll('main div.cell')].filter(c => {
    const i = c.querySelector('.cell_input');
    return i && i.offsetParent !== null && !i.closest('details:not([open])') &&
      ![...c.querySelectorAll('.cell_output')].some(o => o.innerText.trim() || o.querySelector('img')); })
    .map(c => c.querySelector('.cell_input').innerText),
  prose: (() => { const m = document.querySelector('main').cloneNode(true);  // the page without its code cells' inputs
                  m.querySelectorAll('.cell_input').forEach(e => e.remove()); return m.textContent; })()};"""


@pytest.fixture(scope='module')
def site():
    "The site built by `bash .ci/docs`, served over HTTP from 127.0.0.1: its base URL"
    r = subprocess.run(['bash', '.ci/docs'], cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, f"bash .ci/docs failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-8000:]}"
    print(r.stdout.strip().splitlines()[-1])  # its pages, size and time
    handler = functools.partial(type('Quiet', (http.server.SimpleHTTPRequestHandler,),
                                     {'log_message': lambda *a: None}), directory=str(SITE))
    with http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler) as srv:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        yield f'http://127.0.0.1:{srv.server_address[1]}/'
        srv.shutdown()


@pytest.fixture(scope='module')
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--window-size=1280,1400',
              '--disable-background-networking', '--disable-component-update', '--no-first-run'):
        opts.add_argument(a)
    opts.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    d = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))  # Debian's driver: nothing downloaded
    d.set_page_load_timeout(PAGE_TIMEOUT_S)
    SHOTS.mkdir(exist_ok=True)
    yield d
    d.quit()


@pytest.fixture(scope='module')
def pages(site, browser):
    "Every HTML page of the site, opened in the browser: its path -> the probe's report and the console's errors"
    res = {}
    for f in sorted(SITE.rglob('*.html')):
        path = f.relative_to(SITE).as_posix()
        if path.startswith('_static/'): continue  # the theme's template fragments, no pages
        browser.get(site + path)
        browser.execute_script('return document.fonts.ready')
        res[path] = dict(browser.execute_script(PROBE),
                         errors=[e['message'] for e in browser.get_log('browser') if e['level'] == 'SEVERE'])
    return res


def test_no_console_errors(pages):
    bad = {p: r['errors'] for p, r in pages.items() if r['errors']}
    assert not bad, f"console errors: {bad}"


def test_images_decoded(pages):
    bad = {p: [i['src'][:80] for i in r['images'] if not i['ok']] for p, r in pages.items()}
    assert not any(bad.values()), f"images the browser could not decode: { {p: b for p, b in bad.items() if b} }"


def test_links_resolve(pages, site):
    "Every link into the site reaches a page, and the element its #fragment names"
    broken = []
    for p, r in pages.items():
        for href in r['links']:
            if not href.startswith(site): continue
            u = urllib.parse.urlsplit(href[len(site):])
            target = urllib.parse.unquote(u.path) or 'index.html'
            if target.endswith('/'): target += 'index.html'
            if target not in pages and not (SITE/target).is_file(): broken.append((p, href))
            elif u.fragment and target in pages and urllib.parse.unquote(u.fragment) not in pages[target]['ids']:
                broken.append((p, href))
    assert not broken, f"{len(broken)} broken links (page, link): {broken}"


def test_offline(pages):
    "Nothing a page loads comes from another host: scripts, styles, images, fonts, MathJax"
    remote = [(f.name, tag) for f in SITE.rglob('*.html') for tag in
              re.findall(r'<(?:script|link|img)\b[^>]*?(?:src|href)="(?:https?:)?//[^"]*"[^>]*>',
                                       f.read_text()) if 'rel="canonical"' not in tag]
    assert not remote, remote[:5]
    assert pages[MATH_PAGE]['math'] > 0, f"MathJax rendered no math on {MATH_PAGE}"


def sidebar_pages() -> tuple[list, list]:
    "The pages `nbs/sidebar.yml` lists, in its order, as the site names them; its section captions"
    from nbdev.config import get_config
    cfg = get_config(str(ROOT))
    proc = cfg.config_path/'_proc'
    hrefs, captions = [], []
    def walk(items):
        for it in items:
            if isinstance(it, dict) and 'section' in it:
                captions.append(it['section'])
                walk(([it['href']] if it.get('href') else []) + it.get('contents', []))
            else:
                rel = Path(it['href'] if isinstance(it, dict) else it)
                hrefs.append(page_path(rel, front_matter(json.loads((proc/rel).read_text()))).with_suffix('.html'))
    walk(yaml.safe_load((Path(cfg.nbs_path)/'sidebar.yml').read_text())['website']['sidebar']['contents'])
    return [h.as_posix() for h in hrefs], captions


def test_sidebar_order(pages, site, browser):
    "The sidebar of every page lists the pages of sidebar.yml in its order, under its sections"
    hrefs, captions = sidebar_pages()
    r = pages['index.html']
    shown = [urllib.parse.urlsplit(h).path.lstrip('/') for h in r['sidebar']]
    shown = [s or 'index.html' for s in shown]
    want = [h for h in hrefs if h != 'index.html']  # the root page heads the sidebar as the site's title
    assert [s for s in shown if s != 'index.html'] == want, (shown, want)
    assert all(c.split(' / ')[-1] in ' '.join(r['captions']) for c in captions), (r['captions'], captions)
    assert all(len(pages[p]['sidebar']) == len(r['sidebar']) for p in want), "a page shows another sidebar"
    browser.get(site + want[len(want)//2])
    browser.save_screenshot(str(SHOTS/'sidebar.png'))


def test_public_names_found(pages, site, browser):
    "Every public name of `fastrepro.all` has its own entry (show_doc's heading), which the site's search finds"
    import fastrepro.all as fa
    browser.get(site + 'search.html')
    browser.execute_script('return document.fonts.ready')
    browser.set_script_timeout(PAGE_TIMEOUT_S)
    found = browser.execute_async_script("""const names = arguments[0], done = arguments[arguments.length - 1];
      const go = () => Search.hasIndex() ? done(Object.fromEntries(names.map(n =>
        [n, Search._performSearch(...Search._parseQuery(n)).map(r => [r[0], r[1], r[2]])]))) : setTimeout(go, 50);
      go();""", list(fa.__all__))
    missing = []
    for name in fa.__all__:
        hits = [(doc, anchor) for doc, title, anchor in found[name] if title.split(' > ')[-1] == name and anchor]
        if not any(anchor[1:] in pages[f'{doc}.html']['ids'] for doc, anchor in hits): missing.append(name)
    assert not missing, f"public names with no entry the search finds: {missing}"
    browser.get(site + 'search.html?q=ReproCB')
    browser.execute_script('return document.fonts.ready')
    browser.save_screenshot(str(SHOTS/'search_ReproCB.png'))


def test_demo_page_plots(pages, site, browser):
    r = pages[DEMO_PAGE]
    plots = [i for i in r['images'] if i['ok'] and i['w'] >= 300 and i['h'] >= 150]
    assert len(plots) >= DEMO_PLOTS, f"the demo page shows {len(plots)} plots, not {DEMO_PLOTS}: {r['images']}"
    assert 'sameseed,samebits:passed' in ''.join(r['text'].split()), "the demo page does not show check 1's result"
    browser.get(site + DEMO_PAGE)
    browser.execute_script("document.querySelector('main img').scrollIntoView()")
    browser.save_screenshot(str(SHOTS/'demo_plot.png'))


def test_signature_shown(site, browser):
    "show_doc's entry for ReproCB: its heading, then its signature with docments"
    browser.get(site + 'callback/repro.html')
    sig = browser.execute_script("""const h = [...document.querySelectorAll('h3')].find(h => h.textContent.trim() ===
        'ReproCB#' || h.firstChild.textContent.trim() === 'ReproCB');
      if (!h) return null;
      h.scrollIntoView();
      const pre = h.closest('section').querySelector('pre');
      return pre && pre.textContent;""")
    browser.save_screenshot(str(SHOTS/'callback_ReproCB.png'))
    assert sig and 'ReproCB(' in sig and '# the run seed' in sig, f"ReproCB's entry shows no signature: {sig}"


def test_plots_on_their_pages(pages, site, browser):
    "Each plot of `PLOTS` is an output of its page's notebook, decoded by the browser"
    bad = {p: (what, pages[p]['plots']) for p, what in PLOTS.items()
           if not any(i['ok'] and i['w'] >= 300 and i['h'] >= 150 for i in pages[p]['plots'])}
    assert not bad, f"pages without their plot: {bad}"
    for page, shot in (('callback/fp16.html', 'fp16_plot.png'), ('guides/tutorial.html', 'tutorial_plot.png')):
        browser.get(site + page)
        browser.execute_script('return document.fonts.ready')
        browser.execute_script("const i = document.querySelector('main div.cell_output img'); i.scrollIntoView();"
                               "window.scrollBy(0, -200)")
        browser.save_screenshot(str(SHOTS/shot))


def test_outputs_on_reference_pages(pages):
    "At least `MIN_OUTPUT_PAGES` pages of the reference show what their cells return"
    hrefs, _ = sidebar_pages()
    ref = hrefs[hrefs.index('reference.html') + 1:]
    ref = [p for p in ref if p != 'habits.html']
    shown = [p for p in ref if pages[p]['outputs']]
    assert len(shown) >= MIN_OUTPUT_PAGES, (f"{len(shown)} of {len(ref)} reference pages show outputs; none on "
                                            f"{sorted(set(ref) - set(shown))}")


def test_no_machine_on_pages(pages):
    "No page shows this machine's temporary folders (outside the code a cell runs: a path written in a test), the "
    "Python installation's path or the repository's, and no output is a warning"
    import sysconfig
    site_packages = sysconfig.get_paths()['purelib']
    bad = {p: [m for m in ('/tmp/', site_packages, str(ROOT)) if m in r['prose']] +
              [m for m in (site_packages, str(ROOT)) if m in r['text']] for p, r in pages.items()}
    assert not any(bad.values()), {p: b for p, b in bad.items() if b}
    warned = {p: [o[:200] for o in r['outputs'] if 'Warning:' in o] for p, r in pages.items()}
    assert not any(warned.values()), {p: w for p, w in warned.items() if w}


def test_guides_first(pages, site, browser):
    "The sidebar opens with the guides: the landing page and the tutorial, then the how-to guides, then the reference"
    r = pages['index.html']
    assert r['captions'][:len(GUIDES)] == list(GUIDES), r['captions']
    shown = [urllib.parse.urlsplit(h).path.lstrip('/') or 'index.html' for h in r['sidebar']]
    shown = [s for s in shown if s != 'index.html']
    assert shown[0] == 'guides/tutorial.html' and all(s.startswith('guides/howto_') for s in shown[1:7]), shown[:8]
    browser.get(site + 'guides/tutorial.html')
    browser.execute_script('return document.fonts.ready')
    browser.save_screenshot(str(SHOTS/'tutorial.png'))


def test_classes_render_as_classes(pages):
    "show_doc's entry of a class reads `class Name(...)`, never `def Name(`"
    bad = {p: [s for s in r['signatures'] if CLASS_AS_DEF.match(s)] for p, r in pages.items()}
    assert not any(bad.values()), {p: b for p, b in bad.items() if b}
    assert any(s.startswith('class ReproCB(') for s in pages['callback/repro.html']['signatures']), \
        pages['callback/repro.html']['signatures'][:5]


def test_sidebar_follows_the_user(pages):
    "The reference opens with the callbacks a user adds; the internals (checkpoint, record, state) come last"
    shown = [urllib.parse.urlsplit(h).path.lstrip('/') for h in pages['index.html']['sidebar']]
    first = lambda prefixes: min(i for i, s in enumerate(shown) if s.startswith(prefixes))
    assert first(USER_FIRST) < first(INTERNALS), shown
    assert all(not s.startswith(INTERNALS) for s in shown[:first(INTERNALS)]), shown
    last_other = max(i for i, s in enumerate(shown) if not s.startswith(INTERNALS))
    assert last_other < first(INTERNALS), f"a page after the internals: {shown[last_other]}"


def test_search_snippets_each_name_once(site, browser):
    "The search shows a snippet of each result (the pages' sources are shipped) and each name once"
    assert (SITE/'_sources').is_dir(), "no _sources/ in the site: html_copy_source is off"
    browser.get(site + 'search.html?q=ReproCB')
    browser.set_script_timeout(PAGE_TIMEOUT_S)
    res = browser.execute_async_script("""const done = arguments[arguments.length - 1], t0 = Date.now();
      const go = () => { const items = [...document.querySelectorAll('#search-results li')];
        if ((items.length && items.every(li => li.querySelector('p.context'))) || Date.now() - t0 > 8000)
          done({has_source: DOCUMENTATION_OPTIONS.HAS_SOURCE, items: items.map(li => ({
                title: li.querySelector('a').textContent, href: li.querySelector('a').getAttribute('href'),
                snippet: (li.querySelector('p.context') || {}).textContent || ''}))});
        else setTimeout(go, 100); };
      go();""")
    browser.save_screenshot(str(SHOTS/'search_snippets.png'))
    assert res['has_source'], "DOCUMENTATION_OPTIONS.HAS_SOURCE is false: the search shows no snippets"
    items = res['items']
    assert items and all(i['snippet'].strip() for i in items[:5]), items[:5]
    named = [i['href'].partition('#')[0] for i in items if i['title'].split(' > ')[-1] == 'ReproCB']
    assert named[:1] == ['callback/repro.html'], items[:3]  # its own entry first
    assert len(named) == len(set(named)), f"ReproCB listed more than once for a page: {named}"


def test_outputs_true(pages):
    "No output shows a function object or a memory address, nor `None` where a number belongs; the preemption "
    "how-to's prose says the iteration its output shows"
    bad = {p: [o[:160] for o in r['outputs'] if FUNCTION_SHOWN.search(o) or NONE_NUMBER.search(o)]
           for p, r in pages.items()}
    bad = {p: b + [m[0] for m in NONE_NUMBER.finditer(pages[p]['prose'])] for p, b in bad.items()}
    assert not any(bad.values()), {p: b for p, b in bad.items() if b}
    r = pages[ITERATION_PAGE]
    said = re.findall(r'killed after iteration (\d+)', r['prose'])
    shown = [m for o in r['outputs'] for m in re.findall(r"'iteration': (\d+)", o)]
    assert said and shown and set(said) == set(shown), (said, shown)


def test_reference_pages_readable(pages):
    "No page's text is longer than `MAX_PAGE_CHARS`; at most `MAX_TEST_CELLS` code cells that only test are shown"
    long = {p: r['chars'] for p, r in pages.items() if r['chars'] > MAX_PAGE_CHARS}
    assert not long, f"pages over {MAX_PAGE_CHARS} characters of text: {long}"
    tests = {p: [c for c in r['silent_cells'] if TEST_CODE.search(c)] for p, r in pages.items()}
    n = sum(len(t) for t in tests.values())
    assert n <= MAX_TEST_CELLS, (f"{n} visible test-only cells (at most {MAX_TEST_CELLS}): "
                                 f"{ {p: len(t) for p, t in tests.items() if t} }")
