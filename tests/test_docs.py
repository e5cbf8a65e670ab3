"""The docs, offline: `nbdev-proc-nbs` processes the notebooks \
into `_proc/` (what quarto would render), nbconvert renders
HTML pages from the processed notebooks, and headless Chromium \
loads them: the ReproCB page shows its signature, the demo
page shows its plots. Screenshots go to /tmp/fastrepro_docs_*.png.

Skipped, with the reason, when Debian's `chromium` (`apt-get \
install -y chromium`) or nbconvert (`pip install nbconvert`,
in the dev extras) is missing. `nbdev-docs` builds the full site where quarto is installed; it is not needed here."""
import ast, html, json, re, shutil, subprocess, sys
import yaml
from importlib.util import find_spec
from pathlib import Path
import pytest
from conftest import hang_limit

ROOT = Path(__file__).resolve().parents[1]
PROC = ROOT/'_proc'
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
PAGES = {'callback': '03_callback', 'demo': '16_demo'}  # what the test names each page -> its notebook
DEMO_PLOTS = 4             # the demo page's plots: same seed, fp16 loss scale, nondeterminism, variants
TIMEOUT_S = hang_limit(90)  # nbdev-proc-nbs executes the exported and show_doc cells of the two notebooks
CHROME_TIMEOUT_S = hang_limit(10)
CHROME_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                '--disable-background-networking', '--disable-component-update', '--disable-sync', '--hide-scrollbars',
                '--virtual-time-budget=10000', '--window-size=1280,1400']

if CHROMIUM is None: pytest.skip("Debian's chromium is not installed (apt-get install -y chromium): the rendered docs "
                                 "cannot be checked in a browser", allow_module_level=True)
if find_spec('nbconvert') is None: pytest.skip("nbconvert is not installed (pip install nbconvert, in the dev extras): "
                                               "no HTML preview can be rendered", allow_module_level=True)
if shutil.which('nbdev-proc-nbs') is None:
    pytest.skip('nbdev is not installed (pip install -e ".[dev]")', allow_module_level=True)

# Run in each page once it has loaded: report the page's PNG images (how many, how many the browser decoded, their
# sizes) in a `data-check` attribute of <body>, and bring the element the URL's #fragment names to the top for the
# screenshot (#sig-NAME: the signature block of NAME; #img-N: the N-th image) by hiding the cells above it but the
# first.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.querySelectorAll('img')].filter(i => i.src.startsWith('data:image/png;base64,'));
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0);
  const h = decodeURIComponent(location.hash.slice(1));
  let target = null;
  if (h.startsWith('img-')) target = imgs[+h.slice(4)];
  if (h.startsWith('sig-')) target = [...document.querySelectorAll('pre')].find(p => \
new RegExp(h.slice(4) + '\\\\(\\\\s*seed').test(p.textContent));
  if (target) {  // bring it to the top of the screenshot: hide \
the cells between the page's first cell and the one before it
    const cells = [...document.querySelectorAll('.jp-Cell')], i = cells.indexOf(target.closest('.jp-Cell'));
    cells.forEach((c, j) => { if (j > 0 && j < i - 1) c.style.display = 'none'; });
  }
  document.body.setAttribute('data-check', JSON.stringify({images: imgs.length, decoded: ok.length,
    sizes: ok.map(i => [i.naturalWidth, i.naturalHeight]), target: !!target}));
});
</script>"""


def _run(cmd, timeout, cwd=ROOT, hint=''):
    "Run `cmd`; fail with its output (and `hint`) when it fails"
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, (f"{' '.join(map(str, cmd))} failed ({r.returncode}){hint}:\n{r.stdout[-3000:]}\n"
                               f"{r.stderr[-5000:]}")
    return r

PROC_HINT = (". nbdev-proc-nbs runs the exported cells, the show_doc cells and every cell that contains an import: "
             "a cell that mixes an import with training runs the training there (nbdev warns 'Found cells containing "
             "imports and other code'). Put such imports in a cell of their own")


# nbformat's; nbdev adds others
CELL_KEYS = {'cell_type', 'id', 'metadata', 'source', 'outputs', 'execution_count', 'attachments'}

def preview_nb(proc:Path, dest:Path) -> Path:
    "A processed notebook as nbconvert takes it, rendered as quarto would: nbdev's own cell keys and metadata dropped, "
    "`#| ` directives removed from the sources, the input of `echo: false` cells (show_doc) hidden"
    nb = json.loads(proc.read_text())
    for i, c in enumerate(nb['cells']):
        src = ''.join(c['source'])
        # execnb's timing metadata is not nbformat's
        keep = dict({k: v for k, v in c.items() if k in CELL_KEYS}, metadata={})
        if c['cell_type'] == 'raw' and src.startswith('---'):  # the frontmatter: quarto's title and description
            fm = yaml.safe_load(src.split('---')[1])
            keep.update(cell_type='markdown', source=f"# {fm.get('title', '')}\n\n> {fm.get('description', '')}")
        if c['cell_type'] == 'code':
            if re.search(r'^#\|\s*echo:\s*false', src, flags=re.M): keep['metadata'] = {'tags': ['remove_input']}
            keep['source'] = re.sub(r'^#\|.*\n?', '', src, flags=re.M)
            for o in keep.get('outputs', []):  # quarto's link attributes, which plain Markdown would print
                md = o.get('data', {}).get('text/markdown')
                if md is not None: o['data']['text/markdown'] = re.sub(r'\{target="_blank"[^}]*\}', '', ''.join(md))
        keep.setdefault('id', f'cell{i}')
        nb['cells'][i] = keep
    dest.write_text(json.dumps(nb))
    return dest


@pytest.fixture(scope='module')
def pages(tmp_path_factory):
    "HTML pages rendered from the processed notebooks, each with the probe script: page name -> path"
    out = tmp_path_factory.mktemp('docs')
    # a filtered nbdev-proc-nbs rewrites it with only the pages it processed: put it back
    sidebar = ROOT/'nbs'/'sidebar.yml'
    before = sidebar.read_bytes() if sidebar.exists() else None
    try: _run(['nbdev-proc-nbs', '--file-re', '^(' + '|'.join(PAGES.values()) + r')\.ipynb$'], TIMEOUT_S,
              hint=PROC_HINT)
    finally:
        if before is not None: sidebar.write_bytes(before)
    res = {}
    for name, nb in PAGES.items():
        proc = PROC/f'{nb}.ipynb'
        assert proc.is_file(), f"nbdev-proc-nbs wrote no {proc}"
        src = preview_nb(proc, out/f'{nb}.ipynb')
        _run([sys.executable, '-m', 'nbconvert', '--to', 'html', '--no-prompt',
              '--TagRemovePreprocessor.remove_input_tags=remove_input', '--output-dir', str(out), str(src)],
             CHROME_TIMEOUT_S)
        page = out/f'{nb}.html'
        page.write_text(page.read_text().replace('</body>', PROBE + '\n</body>'))
        res[name] = page
    return res


def chromium(url:str, *args, tmp:Path) -> str:
    "Load `url` in headless Chromium with `args` (--dump-dom, --screenshot=...); its stdout"
    return _run([CHROMIUM, *CHROME_FLAGS, f'--user-data-dir={tmp/"chromium-profile"}', *args, url],
                CHROME_TIMEOUT_S).stdout


def dom_check(dom:str) -> dict:
    "The probe's report from a dumped DOM"
    m = re.search(r'<body[^>]*data-check="([^"]*)"', dom)
    assert m, 'the probe script did not run: no data-check attribute on <body>'
    return json.loads(html.unescape(m[1]))


def page_text(dom:str) -> str:
    "The visible text of a dumped DOM, whitespace removed"
    text = re.sub(r'<(script|style)\b.*?</\1>', '', dom, flags=re.S)
    return re.sub(r'\s+', '', html.unescape(re.sub(r'<[^>]+>', '', text)))


def assigned(src:str) -> set:
    "Names a cell assigns at its top level"
    targets = [t for n in ast.parse(src).body if isinstance(n, ast.Assign) for t in n.targets]
    return {e.id for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)}


def test_proc_output(pages):
    ("nbdev-proc-nbs turns export cells into rendered docs: every public symbol of the demo has show_doc output "
     "or shown source")
    cells = [''.join(c['source']) for c in json.loads((PROC/'16_demo.ipynb').read_text())['cells']]
    docs = [c for c in cells if 'show_doc(' in c]
    assert docs and all('#| output: asis' in d for d in docs)
    shown = {re.search(r'show_doc\(([\w.]+)\)', d)[1] for d in docs}
    shown |= {n for c in cells if re.search(r'^#\| exports', c, flags=re.M) for n in assigned(c)}
    import fastrepro.demo.run as demo
    missing = [n for n in demo.__all__ if n not in shown]
    assert not missing, f"public symbols of fastrepro.demo.run without docs: {missing}"


def test_callback_page_signature(pages, tmp_path):
    url = pages['callback'].as_uri() + '#sig-ReproCB'
    dom = chromium(url, '--dump-dom', tmp=tmp_path)
    assert 'ReproCB(seed' in page_text(dom), "the ReproCB page does not show `ReproCB(seed...` (its show_doc signature)"
    assert dom_check(dom)['target'], "no <pre> block holds the ReproCB signature"
    shot = Path('/tmp/fastrepro_docs_callback.png')
    chromium(url, f'--screenshot={shot}', tmp=tmp_path)
    assert shot.is_file() and shot.stat().st_size > 10_000, shot


def test_demo_page_plots(pages, tmp_path):
    url = pages['demo'].as_uri()
    dom = chromium(url, '--dump-dom', tmp=tmp_path)
    assert dom.count('src="data:image/png;base64,') >= DEMO_PLOTS, (
        "the demo page has fewer plots than the demo makes: are the notebook's outputs saved? "
        "(nbdev-test --path-glob '*16_demo*' --save, then nbdev-clean)")
    c = dom_check(dom)
    assert c['images'] >= DEMO_PLOTS and c['decoded'] == c['images'], c
    assert all(w >= 300 and h >= 150 for w, h in c['sizes']), c['sizes']
    assert 'sameseed,samebits:passed' in page_text(dom), "the demo page does not show check 1's result"
    for i, name in enumerate(('same_seed', 'fp16')):
        shot = Path(f'/tmp/fastrepro_docs_demo_{name}.png')
        chromium(f'{url}#img-{i}', f'--screenshot={shot}', tmp=tmp_path)
        assert shot.is_file() and shot.stat().st_size > 10_000, shot
