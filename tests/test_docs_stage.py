"""docs/stage.py, the glue between nbdev's processed notebooks and Sphinx + myst-nb: page names, directives, links,
show_doc's entries and the sidebar, on small notebooks made here (no nbdev processing, no Sphinx: milliseconds)."""
import json, os, sys
from pathlib import Path
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]/'docs'))
from stage import directives, page_path, pandoc_slug, relink, sidebar_toctrees, stage, stage_nb, unprocessed
from stage import ROOT, scrub, with_outputs

SITE = 'https://example.github.io/lib'


def nb(*cells, fm=None) -> dict:
    "A processed notebook: nbdev's front matter cell, then `cells` (markdown strings, or (source, markdown output))"
    cs = [{'cell_type': 'raw', 'metadata': {}, 'source': '---\n' + ''.join(f'{k}: {v}\n' for k, v in fm.items()) +
           '\n---\n\n'}] if fm else []
    for c in cells:
        if isinstance(c, str): cs.append({'cell_type': 'markdown', 'metadata': {}, 'source': c})
        else: cs.append({'cell_type': 'code', 'metadata': {}, 'source': c[0], 'execution_count': None, 'outputs': [
            {'output_type': 'execute_result', 'metadata': {}, 'execution_count': None,
             'data': {'text/markdown': c[1], 'text/plain': 'x'}}] if c[1] else []})
    return {'cells': cs, 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}


def test_pandoc_slug():
    "the anchors Quarto gives headings, which nbdev's doclinks use"
    assert pandoc_slug('Learner.fit') == 'learner.fit'
    assert pandoc_slug('in_fit') == 'in_fit'
    assert pandoc_slug("The formats of fastrepro's own callbacks") == 'the-formats-of-fastrepros-own-callbacks'
    assert pandoc_slug('1. Same seed, same bits') == 'same-seed-same-bits'


def test_page_path_and_directives():
    assert page_path(Path('state/00_core.ipynb'), {'output-file': 'core.html'}) == Path('state/core.ipynb')
    assert page_path(Path('index.ipynb'), {}) == Path('index.ipynb')
    opts, src = directives('#| echo: false\n#| output: asis\n#| code-summary: "Exported source"\nshow_doc(f)')
    assert opts == {'echo': False, 'output': 'asis', 'code-summary': 'Exported source'} and src == 'show_doc(f)'


def test_relink():
    pages = {'state/core.html': Path('state/core.ipynb'), 'state/00_core.ipynb': Path('state/core.ipynb'),
             'callback.html': Path('callback.ipynb'), 'index.html': Path('index.ipynb')}
    here = Path('state/01_rng.ipynb')
    md = (f'[`fit`]({SITE}/state/core.html#learner.fit){{target="_blank" style="float:right"}} '
          f'[core](00_core.ipynb) [cb](../callback.html#x) [home]({SITE}/) [out](https://docs.fast.ai/x.html) '
          '[up](../STACKS.md) [here](#a)')
    assert relink(md, here, SITE, pages, {Path('callback.ipynb'): 'x'}) == (
        '[`fit`](/state/core.ipynb#learner.fit){.sourcelink} [core](/state/core.ipynb) [cb](/callback.ipynb#x-1) '
        '[home](/index.ipynb) [out](https://docs.fast.ai/x.html) [up](../STACKS.md) [here](#a)')


def test_stage_nb():
    "front matter -> title; show_doc's markdown -> a markdown cell; exported-source folds; `include: false` dropped"
    src = nb('Some text', ('#| echo: false\n#| output: asis\nshow_doc(f)', f'---\n\n### f\n\n[g]({SITE}/a.html#g)'),
             ('#| code-fold: show\n#| code-summary: "Exported source"\ndef f(): pass', None),
             ('#| include: false\nsecret()', None), fm={'title': 'Core', 'description': 'The hooks.'})
    cells = stage_nb(src, Path('a.ipynb'), SITE, {'a.html': Path('a.ipynb')})['cells']
    assert [c['cell_type'] for c in cells] == ['markdown', 'markdown', 'markdown', 'code']
    assert cells[0]['source'].startswith('# Core') and 'The hooks.' in cells[0]['source']
    assert cells[2]['source'] == '### f\n\n[g](/a.ipynb#g)'
    assert cells[3]['source'] == 'def f(): pass' and cells[3]['metadata']['tags'] == ['hide-input']
    assert cells[3]['metadata']['mystnb']['code_prompt_show'] == 'Exported source'
    assert all(c['id'] for c in cells) and len({c['id'] for c in cells}) == len(cells)  # nbformat wants unique ids


def test_sidebar_toctrees():
    "quarto's sidebar, flat or in sections (nested ones too), as hidden toctrees in its order"
    pages = {p: Path(p.replace('00_', '')) for p in ('index.ipynb', 'habits.ipynb', 'state/00_core.ipynb',
                                                     'state/rng.ipynb', 'demo.ipynb')}
    flat = sidebar_toctrees(['index.ipynb', 'habits.ipynb'], pages, Path('index.ipynb'))
    assert flat == '```{toctree}\n:hidden:\n\nself\nhabits\n```'
    side = ['index.ipynb', {'section': 'State', 'contents': ['state/00_core.ipynb', {'section': 'RNG', 'contents': [
        {'href': 'state/rng.ipynb', 'text': 'Generators'}]}]}, 'demo.ipynb']
    assert sidebar_toctrees(side, pages, Path('index.ipynb')) == '\n\n'.join([
        '```{toctree}\n:hidden:\n\nself\n```', '```{toctree}\n:hidden:\n:caption: State\n\nstate/core\n```',
        '```{toctree}\n:hidden:\n:caption: State / RNG\n\nGenerators <state/rng>\n```',
        '```{toctree}\n:hidden:\n\ndemo\n```'])
    with pytest.raises(SystemExit, match='sidebar.yml lists gone.ipynb'): sidebar_toctrees(['gone.ipynb'], pages, None)


def test_stage_folders(tmp_path):
    "notebooks in subfolders keep their folders under Quarto's names; the root page carries the sidebar"
    proc, dest = tmp_path/'_proc', tmp_path/'src'
    (proc/'state').mkdir(parents=True)
    (proc/'index.ipynb').write_text(json.dumps(nb(f'See [core]({SITE}/state/core.html)', fm={'title': 'lib'})))
    (proc/'state'/'00_core.ipynb').write_text(json.dumps(nb('Text', fm={'title': 'Core', 'output-file': 'core.html'})))
    (proc/'styles.css').write_text('')
    pages = stage(proc, dest, SITE, ['index.ipynb', {'section': 'state', 'contents': ['state/00_core.ipynb']}])
    assert sorted(p.relative_to(dest).as_posix() for p in pages) == ['index.ipynb', 'state/core.ipynb']
    index = json.loads((dest/'index.ipynb').read_text())['cells']
    assert '[core](/state/core.ipynb)' in index[1]['source'] and ':caption: state\n\nstate/core' in index[-1]['source']
    assert (dest/'styles.css').is_file()


def test_unprocessed(tmp_path):
    "a notebook with no processed copy, or an older one, is named; nbdev's skipped folders are not"
    nbs, proc = tmp_path/'nbs', tmp_path/'_proc'
    for d in (nbs/'state', nbs/'_skip', proc/'state'): d.mkdir(parents=True)
    for p in ('a.ipynb', 'state/b.ipynb', 'state/c.ipynb', '_skip/d.ipynb'): (nbs/p).write_text('{}')
    for p in ('a.ipynb', 'state/b.ipynb'): (proc/p).write_text('{}')
    os.utime(proc/'state'/'b.ipynb', (0, 0))
    assert [p.relative_to(nbs).as_posix() for p in unprocessed(nbs, proc)] == ['state/b.ipynb', 'state/c.ipynb']


def _stream(text, name='stdout') -> dict: return {'output_type': 'stream', 'name': name, 'text': text}


def test_scrub():
    "what an executed cell printed, as a page shows it: no path of this machine, no warning, no progress bar or time"
    import getpass, socket, sysconfig, tempfile
    tmp, sp = tempfile.mkdtemp(), sysconfig.get_paths()['purelib']
    outs = scrub([_stream(f"saved {tmp}/models/a.pth by {getpass.getuser()}@{socket.gethostname()} at "
                          f"2026-01-02 03:04:05\n{ROOT}/fastrepro/cli.py\n"),
                  _stream(f"{sp}/torch/jit/_script.py:1491: FutureWarning: deprecated\n  warnings.warn(\n", 'stderr'),
                  _stream(' |███-----| 50.00% [1/2 00:01<00:01]\r |████████| 100.00% [2/2 00:02<00:00]\r'),
                  _stream('epoch     train_loss  time    \n0         1.5         00:03     \n'),
                  {'output_type': 'execute_result', 'execution_count': 7, 'metadata': {},
                   'data': {'text/plain': f"PosixPath('{tmp}/x')"}}])
    text = json.dumps(outs)
    assert tmp not in text and sp not in text and str(ROOT) not in text and 'Warning' not in text
    assert outs[0]['text'] == 'saved <tmp>/models/a.pth by <user>@<host> at YYYY-MM-DD hh:mm\nfastrepro/cli.py\n'
    assert [o.get('name') for o in outs] == ['stdout', 'stdout', None], "the warning and the progress bar are dropped"
    assert outs[1]['text'] == 'epoch     train_loss\n0         1.5\n'
    assert outs[2]['data']['text/plain'] == "PosixPath('<tmp>/x')" and outs[2]['execution_count'] is None


def test_with_outputs():
    "each code cell takes its executed copy's outputs by id, unless nbdev's processing gave it some (show_doc)"
    proc = nb(('show_doc(f)', '### f'), 'text')
    proc['cells'].append({'cell_type': 'code', 'id': 'c2', 'metadata': {}, 'source': 'x', 'outputs': []})
    proc['cells'][0]['id'] = 'c1'
    ex = {'cells': [{'cell_type': 'code', 'id': 'c1', 'source': '', 'outputs': [_stream('no')]},
                    {'cell_type': 'code', 'id': 'c2', 'source': 'x', 'outputs': [_stream('1\n')]}]}
    res = with_outputs(proc, ex)
    assert res['cells'][0]['outputs'][0]['data']['text/markdown'] == '### f'
    assert res['cells'][2]['outputs'] == [_stream('1\n')]
