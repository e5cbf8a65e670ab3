"""Stage nbdev's processed notebooks (`_proc/`) for Sphinx + myst-nb: the few things Quarto does with them that myst-nb
does not, done to a copy of each notebook, nothing rendered here.

- each page keeps Quarto's name: `nbs/state/00_core.ipynb`, whose front matter says `output-file: core.html`, becomes
  `state/core.ipynb`, so the site's pages are where nbdev's doclinks and `_modidx.py` say they are (`state/core.html`);
- the front matter (a raw cell) becomes the page's title and description;
- `#| ` directives leave the code and become myst-nb's tags: `echo: false` hides the input, `code-fold` (nbdev's
  exported-source folds) folds it under its `code-summary`, `include: false` drops the cell; the markdown of an
  `output: asis` cell (show_doc's entries) becomes a markdown cell, as Quarto makes it part of the page: its heading
  is a section of the page, in its table of contents and in the search's index;
- doclinks into this site (`{doc_host}{doc_baseurl}/x.html#anchor`) become links between pages that Sphinx resolves
  and checks; Quarto's link attributes (`{target="_blank" ...}`) become a class;
- the outputs of each code cell come from its notebook's executed copy (`docs/execute.py`, which the notebook test
  writes and this staging reuses, or runs what it lacks), matched by cell id: what the reader would see in Jupyter,
  made stable and anonymous (`scrub`): no temporary, home or site-packages paths, user or host names, clock times,
  progress bars or Python's warnings on stderr;
- the sidebar of `sidebar.yml` (a flat list, or quarto's `section:`/`contents:` nesting) becomes the root page's hidden
  toctrees, one per top-level section, in the file's order.

Run: `python docs/stage.py` (`.ci/docs` does, then Sphinx): nbdev's `proc_nbs` first (Quarto's part of `nbdev-docs`,
without Quarto), which fails naming every notebook it could not process, then the staging into `_sphinx/src`."""
import getpass, json, os, posixpath, re, shutil, socket, sys, sysconfig, tempfile
from pathlib import Path
import yaml

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r'^#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')
QUARTO_ATTRS = re.compile(r'\{target="_blank"[^}]*\}')  # what nbdev puts after a show_doc's [source] link
SOURCE_LINK_CLASS = '{.sourcelink}'


def pandoc_slug(title:str) -> str:
    "The anchor Quarto (pandoc) gives a heading, which nbdev's doclinks use: `Learner.fit` -> `learner.fit`"
    s = re.sub(r'[^\w\s.-]', '', title.strip().lower())
    s = re.sub(r'\s+', '-', s)
    return re.sub(r'^[^a-z]+', '', s) or 'section'


def front_matter(nb:dict) -> dict:
    "The YAML front matter of a processed notebook (nbdev's raw first cell), {} if none"
    c = nb['cells'][0] if nb['cells'] else {}
    src = ''.join(c.get('source', ''))
    if c.get('cell_type') != 'raw' or not src.startswith('---'): return {}
    return yaml.safe_load(src.split('---')[1]) or {}


def page_path(rel:Path, fm:dict) -> Path:
    "Where Quarto puts a notebook's page, as a notebook path: `state/00_core.ipynb` + `output-file: core.html` -> "
    "`state/core.ipynb`"
    name = fm.get('output-file')
    return rel.parent/Path(name).with_suffix('.ipynb').name if name else rel


def directives(src:str) -> tuple[dict, str]:
    "A code cell's `#| ` directives (Quarto's options) and its source without them"
    opts, lines = {}, []
    for line in src.splitlines():
        m = DIRECTIVE.match(line)
        if m: opts[m[1]] = yaml.safe_load(m[2]) if m[2] else True
        else: lines.append(line)
    return opts, '\n'.join(lines).strip('\n')


def relink(md:str, here:Path, site:str, pages:dict, titles:dict|None=None) -> str:
    "Links in markdown `md` of the page from notebook `here` to pages of this site (doclinks to `site`, Quarto's "
    "`x.html` and notebooks' `x.ipynb`, relative to `here`'s folder) turned into links to the staged pages that Sphinx "
    "resolves and checks (`pages`: html or notebook path -> staged path); Quarto's link attributes into a class. "
    "`titles` (staged path -> its title's anchor): Quarto's title is no heading, the staged page's is, and takes the "
    "anchor first: a heading named like the page (the ReproCB page's `ReproCB` entry) answers to `anchor-1`"
    def repl(m):
        url, frag = m[1].partition('#')[::2]
        if url.startswith(site + '/') or url == site: url = url[len(site) + 1:] or 'index.html'
        elif url == '' or re.match(r'[\w+.-]+:|/', url): return m[0]  # an anchor on this page, another site, a file
        else: url = posixpath.normpath(posixpath.join(here.parent.as_posix(), url))
        if url not in pages: return m[0]  # left as it is: Sphinx reports it if it is broken
        if frag and frag == (titles or {}).get(pages[url]): frag += '-1'
        return f"](/{pages[url].as_posix()}{'#' + frag if frag else ''})"
    md = re.sub(r'\]\(<?([^)\s>]+)>?\)', repl, md)
    return QUARTO_ATTRS.sub(SOURCE_LINK_CLASS, md)


def _scrubs() -> list:
    "(pattern, replacement) pairs that take this machine out of an output's text"
    home, user, host = str(Path.home()), getpass.getuser(), socket.gethostname()
    sp = sysconfig.get_paths()
    libs = {sp['purelib']: '<site-packages>', sp['platlib']: '<site-packages>', sp['stdlib']: '<python>'}
    subs = [(re.escape(p.rstrip('/')), r) for p, r in sorted(libs.items(), key=lambda pr: -len(pr[0]))]
    subs += [(re.escape(str(ROOT)) + '/?', ''),  # the repository: paths relative to it
             (re.escape(sys.prefix.rstrip('/')), '<python>'),
             (r'(?:/private)?' + re.escape(tempfile.gettempdir().rstrip('/')) + r'/[^/\s\'"]+', '<tmp>'),
             (r'/tmp/[^/\s\'"]+', '<tmp>'),
             (re.escape(home) + r'(?=/|\b)', '~'),
             (r'\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:[+-]\d\d:?\d\d|Z)?', 'YYYY-MM-DD hh:mm'),
             (rf"(?<=['\"@ ]){re.escape(host)}(?=['\":, ]|$)", '<host>'),
             (rf"(?<=['\"/]){re.escape(user)}(?=['\"@/])", '<user>'),
             (rf"\b{re.escape(user)}@", '<user>@')]
    return [(re.compile(p, re.M), r) for p, r in subs]


PROGRESS = re.compile(r'^.*\|[█-]+\|.*$\n?|^.*\d+\.\d+% \[\d+/\d+ [\d:<?]+.*$\n?', re.M)  # fastprogress
FIT_HEADER = re.compile(r'^(epoch[ \t].*?)[ \t]*\btime[ \t]*$', re.M)  # fastai's table of a fit: its time column goes
FIT_ROW_TIME = re.compile(r'^(\d+[ \t].*?)[ \t]*\b\d\d:\d\d[ \t]*$', re.M)
WARNING = re.compile(r'^\S*:\d+: \w*Warning: ', re.M)  # Python's warnings, with the path of what raised them
FIT_TABLE = re.compile(r'^epoch[ \t][^\n]*\n(?:\d+[ \t][^\n]*(?:\n|$))+', re.M)  # fastai's table of one fit


def one_fit_table(t:str) -> str:
    "`t` with the first of fastai's tables of a fit only: a cell that runs many fits (a test's) prints one each"
    tables = FIT_TABLE.findall(t)
    if len(tables) < 2: return t
    first, n = FIT_TABLE.search(t), len(tables) - 1
    rest = FIT_TABLE.sub('', t[first.end():])
    note = f"[{n} more table{'s' if n > 1 else ''} of fits like this one left out]\n"
    return t[:first.end()] + note + rest


def scrub_text(t:str, subs:list) -> str:
    "`t` without this machine: its paths, user and host; a terminal's carriage returns applied; no progress bars, "
    "no time column in fastai's tables of a fit, the first of them only (`one_fit_table`)"
    if '\r' in t: t = '\n'.join(line.split('\r')[-1] if line.strip('\r') else '' for line in t.split('\n'))
    t = PROGRESS.sub('', t)
    if FIT_HEADER.search(t): t = FIT_ROW_TIME.sub(r'\1', FIT_HEADER.sub(r'\1', t))  # run to run, it changes
    t = one_fit_table(t)
    for p, r in subs: t = p.sub(r, t)
    return t


def scrub(outputs:list, subs:list|None=None) -> list:
    "Executed outputs as the page shows them: the machine scrubbed from their text, progress bars and stderr's "
    "warnings dropped, no execution counts"
    subs, res = _scrubs() if subs is None else subs, []
    for o in outputs:
        o = json.loads(json.dumps(o))
        if o['output_type'] == 'stream':
            txt = ''.join(o['text'])
            if o['name'] == 'stderr' and WARNING.search(txt): continue
            o['text'] = scrub_text(txt, subs)
            if not o['text'].strip(): continue
        elif o['output_type'] in ('execute_result', 'display_data'):
            data = o.get('data', {})
            if '<progress' in ''.join(data.get('text/html', '')): continue
            for k, v in list(data.items()):
                if k.startswith('text/') or k.endswith(('json', 'javascript')):
                    data[k] = scrub_text(''.join(v) if isinstance(v, list) else v, subs) if isinstance(v, (str, list)) \
                        else v
            if o['output_type'] == 'execute_result': o['execution_count'] = None
        elif o['output_type'] == 'error':
            o['traceback'] = [scrub_text(t, subs) for t in o.get('traceback', [])]
        res.append(o)
    return res


def with_outputs(nb:dict, executed:dict|None) -> dict:
    "`nb` (processed) with the outputs of its executed copy, cell by cell (by id), where nbdev's processing gave "
    "the cell none (show_doc's entries keep nbdev's); every output scrubbed (`scrub`), nbdev's own included"
    outs, subs = {c.get('id'): c.get('outputs', []) for c in (executed or {}).get('cells', [])
                  if c['cell_type'] == 'code'}, _scrubs()
    for c in nb['cells']:
        if c['cell_type'] != 'code': continue
        if not c.get('outputs') and outs.get(c.get('id')): c['outputs'] = outs[c['id']]
        if c.get('outputs'): c['outputs'] = scrub(c['outputs'], subs)
    return nb


# show_doc's [source] link: the module's file
SOURCE_URL = re.compile(r'\]\([^)\s]*/blob/[^/)]+/([\w/]+)\.py(?:#L\d+)?\)')
NO_LINE = re.compile(r'(\]\([^)\s]*\.py)#LNone\)')  # nbdev's link for a name it found no line of (imported first)
ENTRY = re.compile(r'^(#+) (\S+)\s*$', re.M)  # show_doc's heading: the entry's qualified name
SIG = re.compile(r'^(```python\n)(?:async )?def ([\w.]+)\(', re.M)  # fastcore renders every callable as a `def`
ENUM_DEFAULT = re.compile(r'=<([\w.]+): [^>\n]*>')  # an Enum member's repr as a default: `=<AMPMode.FP16: 'fp16'>`
NONE_TYPE = re.compile(r':NoneType(?==None\b)')  # the annotation fastcore infers from a default of None


def documented(md:str):
    "The object a show_doc entry's markdown `md` documents (its [source] link names the module, its heading the "
    "qualified name); None where that cannot be told"
    import importlib
    src, head = SOURCE_URL.search(md), ENTRY.search(md)
    if not (src and head): return None
    try: o = importlib.import_module(src[1].replace('/', '.'))
    except Exception: return None
    for part in head[2].split('.'):
        o = getattr(o, part, None)
        if o is None: return None
    return o


def entry_md(md:str, anchors:frozenset=frozenset()) -> str:
    "show_doc's markdown as a reader should see it: a class's signature as `class Name(...)` followed by its public "
    "methods (linked where the page has their entries: `anchors`), defaults as they are written (`AMPMode.FP16`, "
    "`ax=None`), not their reprs"
    md = NO_LINE.sub(r'\1)', NONE_TYPE.sub('', ENUM_DEFAULT.sub(r'=\1', md)))
    o = documented(md)
    if not isinstance(o, type): return md
    md = SIG.sub(lambda m: f'{m[1]}class {m[2]}(', md, count=1)
    from fastai.callback.core import _events
    from fastrepro.state.core import ReproEvents
    name, events = ENTRY.search(md)[2], {*_events, *vars(ReproEvents), 'name', 'order'}  # fastai calls those
    own = [k for k, v in vars(o).items() if not k.startswith('_') and (callable(v) or isinstance(v, property))
           and (k not in events or pandoc_slug(f'{name}.{k}') in anchors)]
    if not own: return md
    def link(m): return f'[`{m}`](#{a})' if (a := pandoc_slug(f'{name}.{m}')) in anchors else f'`{m}`'
    return md.rstrip() + '\n\nMethods: ' + ', '.join(link(m) for m in own) + '\n'


def stage_nb(nb:dict, here:Path, site:str, pages:dict, titles:dict|None=None, executed:dict|None=None) -> dict:
    "One processed notebook as myst-nb should read it (with the outputs of `executed`, its executed copy)"
    nb = with_outputs(nb, executed)
    fm, cells = front_matter(nb), []
    if fm: nb['cells'] = nb['cells'][1:]
    if fm.get('title'):
        head = f"# {fm['title']}" + (f"\n\n```{{rst-class}} lead\n```\n\n{fm['description']}" if fm.get('description')
                                      else '')
        cells.append({'cell_type': 'markdown', 'metadata': {}, 'source': head})
    entries = frozenset(pandoc_slug(m[2]) for c in nb['cells'] for o in c.get('outputs', [])
                        for m in ENTRY.finditer(''.join(o.get('data', {}).get('text/markdown', ''))))
    for c in nb['cells']:
        src = ''.join(c.get('source', ''))
        if c['cell_type'] == 'markdown': c['source'] = relink(src, here, site, pages, titles)
        if c['cell_type'] == 'code':
            opts, c['source'] = directives(src)
            if opts.get('include') is False: continue
            tags = c['metadata'].setdefault('tags', [])
            if opts.get('echo') is False: tags.append('remove-input')
            if opts.get('output') is False: tags.append('remove-output')
            if 'code-fold' in opts:  # nbdev's exported source: folded, under Quarto's summary
                tags.append('hide-input')
                summary = opts.get('code-summary', 'Code')
                c['metadata']['mystnb'] = {'code_prompt_show': summary, 'code_prompt_hide': summary}
            c.get('metadata', {}).pop('execution', None)  # execnb's timings
            if opts.get('output') == 'asis':  # show_doc: its markdown is part of the page, as a markdown cell's is
                md = ''.join(''.join(o.get('data', {}).get('text/markdown', '')) for o in c.pop('outputs', []))
                md = re.sub(r'^\s*---\s*\n', '', md)  # show_doc's rule, which docutils refuses before a heading
                md = entry_md(md, entries)
                if 'remove-input' not in tags: cells.append(dict(c, outputs=[]))
                c = {'cell_type': 'markdown', 'metadata': {}, 'source': relink(md, here, site, pages, titles)}
        cells.append(c)
    taken = {c['id'] for c in cells if c.get('id')}
    for i, c in enumerate(cells):  # the cells nbdev and this staging add have none (nbformat warns for each page)
        if not c.get('id'): c['id'] = next(f'staged-{i}{x}' for x in ('', *'abcdefgh') if f'staged-{i}{x}' not in taken)
    nb['cells'] = cells
    return nb


def sidebar_toctrees(sidebar:list, pages:dict, root:str) -> str:
    "MyST toctrees for quarto's sidebar `contents` (`pages`: notebook path -> staged path; `root`: the root page, "
    "listed as `self`): one per top-level section, nested sections folded into their parent under a `/` caption"
    groups = [(None, [])]  # (caption, entries), in order
    def walk(items, caption):
        for it in items:
            if isinstance(it, dict) and 'section' in it:
                cap = it['section'] if caption is None else f"{caption} / {it['section']}"
                groups.append((cap, []))
                if it.get('href'): groups[-1][1].append(entry(it['href'], it.get('text')))
                walk(it.get('contents', []), cap)
                groups.append((caption, []))  # what follows a section is its parent's again
            elif isinstance(it, dict): groups[-1][1].append(entry(it['href'], it.get('text')))
            else: groups[-1][1].append(entry(it, None))
    def entry(href, text):
        if href not in pages: raise SystemExit(f"sidebar.yml lists {href}, which nbdev did not process into _proc/ "
                                               "(its processing failed, or it does not exist)")
        doc = 'self' if pages[href] == root else pages[href].with_suffix('').as_posix()
        return f'{text} <{doc}>' if text else doc
    walk(sidebar, None)
    return '\n\n'.join('```{toctree}\n:hidden:\n' + (f':caption: {cap}\n' if cap else '') + '\n' + '\n'.join(es) +
                       '\n```' for cap, es in groups if es)


def stage(proc:Path, dest:Path, site:str, sidebar:list, root='index.ipynb', executed:dict|None=None) -> list[Path]:
    "Stage every notebook of `proc` into `dest` (emptied first), with `sidebar` on the root page and the outputs of "
    "`executed` (notebook path relative to `proc` -> its executed copy); the staged pages"
    nbs = {p.relative_to(proc): json.loads(p.read_text()) for p in sorted(proc.rglob('*.ipynb'))
           if not any(part.startswith(('.', '_')) for part in p.relative_to(proc).parts)}
    staged = {rel: page_path(rel, front_matter(nb)) for rel, nb in nbs.items()}
    titles = {staged[rel]: pandoc_slug(t) for rel, nb in nbs.items() if (t := front_matter(nb).get('title'))}
    links = {**{p.with_suffix('.html').as_posix(): p for p in staged.values()},  # Quarto's pages
             **{rel.as_posix(): p for rel, p in staged.items()}}  # the notebooks

    if dest.exists(): shutil.rmtree(dest)
    for rel, nb in nbs.items():
        nb = stage_nb(nb, rel, site, links, titles, (executed or {}).get(rel))
        if rel.as_posix() == root:
            toc = sidebar_toctrees(sidebar, {k.as_posix(): v for k, v in staged.items()}, staged[rel])
            nb['cells'].append({'cell_type': 'markdown', 'id': 'sidebar-toctrees', 'metadata': {}, 'source': toc})
        out = dest/staged[rel]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(nb))
    for f in proc.rglob('*'):  # what the pages show or link besides notebooks (images, styles)
        rel = f.relative_to(proc)
        if f.is_file() and f.suffix not in ('.ipynb', '.yml', '.yaml') and not rel.parts[0].startswith(('.', '_')):
            (dest/rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest/rel)
    return [dest/p for p in staged.values()]


def unprocessed(nbs:Path, proc:Path) -> list[Path]:
    "The notebooks of `nbs` (nbdev's: no folder or file starting with `_` or `.`) that have no processed copy in "
    "`proc` as new as themselves"
    def done(p): return (d := proc/p.relative_to(nbs)).exists() and d.stat().st_mtime >= p.stat().st_mtime
    return [p for p in sorted(nbs.rglob('*.ipynb'))
            if not any(s.startswith(('.', '_')) for s in p.relative_to(nbs).parts) and not done(p)]


def proc_one(src_dst) -> str | None:
    "nbdev's processing of one notebook (`nbdev.serve_drv`, what `proc_nbs` runs for each): its error, None if none"
    from nbdev.processors import FilterDefaults
    from nbdev.serve_drv import main
    try: main((*src_dst, FilterDefaults))
    except Exception as e: return f'{type(e).__name__}: {e}'


def process(cfg) -> Path:
    "nbdev's processing of every notebook into `_proc/`; exits naming the notebooks it failed on, each with its error"
    from nbdev.serve import proc_nbs
    nbs, proc = Path(cfg.nbs_path), cfg.config_path/'_proc'
    try: proc_nbs()
    except Exception: pass  # nbdev stops at the first failure: find them all, one notebook at a time
    failed = unprocessed(nbs, proc)
    if not failed: return proc
    import multiprocessing, stage  # by its module's name: spawned workers find it (docs/ is on their path)
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context('spawn')) as ex:
        errors = dict(zip(failed, ex.map(stage.proc_one, [(p, proc/p.relative_to(nbs)) for p in failed])))
    errors = {p: e for p, e in errors.items() if e}
    for p, e in errors.items(): print(f'\n### {p.relative_to(nbs)}\n{e}', file=sys.stderr)
    if errors: raise SystemExit(f"\nnbdev's processing failed on {len(errors)} notebook(s): " +
                                ', '.join(str(p.relative_to(nbs)) for p in errors) +
                                ". nbdev runs every cell that holds an import: one that also uses names other cells "
                                "define fails there (give its imports a cell of their own).")
    return proc


def main(dest=ROOT/'_sphinx'/'src'):
    from nbdev.config import get_config
    cfg = get_config()
    proc = process(cfg)
    import execute  # docs/: every notebook's executed copy, run here where the notebook test has not left one
    nbs = Path(cfg.nbs_path)
    executed = {nb.relative_to(nbs): json.loads(p.read_text()) for nb, p in execute.execute().items()}
    side = yaml.safe_load((Path(cfg.nbs_path)/'sidebar.yml').read_text())['website']['sidebar']['contents']
    pages = stage(proc, Path(dest), cfg.doc_host.rstrip('/') + '/' + cfg.doc_baseurl.strip('/'), side,
                  executed=executed)
    print(f'staged {len(pages)} pages from {proc} into {dest}')


if __name__ == '__main__': main(*sys.argv[1:])
