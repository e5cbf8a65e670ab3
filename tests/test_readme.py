"""The README and the docs' landing pages say the same thing: the landing page (`nbs/index.ipynb`) the same one-line
use, the landing and reference pages (`nbs/reference.ipynb`) the same commands, the reference the same table of what
else fastrepro does; the README's test command is the one `.ci/run` runs; every notebook the table links exists; the
reference's module map has one row per module notebook of the docs' sidebar (`nbs/sidebar.yml`), up the
package's floors from the bottom (a folder's notebooks in the sidebar's order), each naming the module its notebook
exports. The README
stays short: figures and explanations live in the notebooks."""
import json, re
from pathlib import Path
import yaml
from test_structure import FLOORS  # the package's floors, bottom to top

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'
MAX_README_LINES = 80  # a newcomer reads it in two minutes
TABLE = '## What else it does'
MAP = '## Module map'


def readme() -> str: return (ROOT/'README.md').read_text()


def index_cells(kind:str|None=None, page:str='index') -> list:
    "The sources of the cells (of `kind`: 'code' or 'markdown') of the landing page (or `page`: 'reference')"
    cells = json.loads((NBS/f'{page}.ipynb').read_text())['cells']
    return [''.join(c['source']) for c in cells if kind in (None, c['cell_type'])]


def ref_cells(kind:str|None=None) -> list: return index_cells(kind, 'reference')


def fenced(text:str, lang:str) -> list: return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def section(text:str, title:str) -> str:
    "The text under the heading `title`, to the next heading"
    rest = text[text.index(title) + len(title):]
    return rest[:m.start()] if (m := re.search(r'^#+ ', rest, flags=re.M)) else rest


def rows(text:str) -> list: return [l for l in text.splitlines() if l.startswith('| ') and not l.startswith('|---')]


def test_same_use_and_commands():
    md = '\n\n'.join(index_cells('markdown') + ref_cells('markdown'))
    code = [c.removeprefix('#| eval: false\n') for c in index_cells('code')]
    assert fenced(readme(), 'python') == [c + '\n' for c in code], "the README's example is not the landing page's"
    assert fenced(readme(), 'sh') and all(block in md for block in fenced(readme(), 'sh')), (
        "a command block of the README is not on the landing or reference page")
    assert fenced('\n\n'.join(index_cells('markdown')), 'sh'), "the landing page does not say how to install"


def test_same_table_and_notebooks_exist():
    ours, theirs = rows(section(readme(), TABLE)), rows(section('\n\n'.join(ref_cells()), TABLE))
    assert len(ours) > 5 and [r.replace('](nbs/', '](') for r in ours] == theirs, (
        "the README's table differs from the reference page's")
    links = re.findall(r'\]\((nbs/[\w.]+\.ipynb)\)', readme())
    assert links and [l for l in links if not (ROOT/l).is_file()] == []


def test_readme_test_command_is_ci_s():
    cmd = next(l.split('  #')[0].strip() for b in fenced(readme(), 'sh') for l in b.splitlines()
               if l.startswith('python -m pytest'))
    assert cmd == 'python -m pytest -q -n auto --dist loadfile tests'
    assert cmd in (ROOT/'.ci'/'run').read_text().splitlines(), "`.ci/run` runs another test command than the README"


def test_readme_is_short():
    n = len(readme().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines: move details to the notebook of what they describe"


def sidebar() -> list:
    "The notebooks of the docs' sidebar, in its order, sections opened"
    def _flat(items): return [n for i in items for n in (_flat(i['contents']) if isinstance(i, dict) else [i])]
    return _flat(yaml.safe_load((NBS/'sidebar.yml').read_text())['website']['sidebar']['contents'])


def test_module_map_is_every_notebook_in_order():
    text = section('\n\n'.join(ref_cells()), MAP)
    found = [re.match(r"\| \[`(\w+)`\]\(([\w/]+)\.ipynb\) \| `([\w.]+)` \|", r).groups()
             for r in rows(text) if r.startswith('| [')]
    assert all(link.split('/')[-1] == name for name, link, _ in found)
    notebooks = sorted(str(p.relative_to(NBS).with_suffix('')) for p in NBS.rglob('[0-9]*.ipynb')
                       if 'fixtures' not in p.parts)
    ordered = [n.removesuffix('.ipynb') for n in sidebar() if re.match(r'\d', n.split('/')[-1])]  # module notebooks
    assert sorted(ordered) == notebooks, "the sidebar does not list every notebook once"
    # the map goes up the package's floors (a folder's modules in the sidebar's order); the sidebar, the user's way
    floor = lambda n: FLOORS.index(n.split('/')[0]) if '/' in n else len(FLOORS)  # the top of the package last
    assert [link for _, link, _ in found] == sorted(ordered, key=lambda n: (floor(n), ordered.index(n))), \
        "the module map is not one row per notebook, floor by floor from the bottom"
    for _, name, module in found:
        src = (NBS/f'{name}.ipynb').read_text()
        exp = re.search(r'#\| default_exp ([\w.]+)', src)[1]
        assert module == f'fastrepro.{exp}', f"{name} exports fastrepro.{exp}, the map says {module}"


def test_guides_first():
    "The sidebar opens with the landing page and the tutorial, then the how-to guides; the reference after them"
    side = sidebar()
    assert side[:2] == ['index.ipynb', 'guides/tutorial.ipynb'], side[:2]
    guides = [n for n in side if n.startswith('guides/howto_')]
    assert len(guides) >= 6 and side[2:2 + len(guides)] == guides, side[:10]
    assert side[2 + len(guides)] == 'reference.ipynb'
    assert not list(NBS.glob('guides/[0-9]*.ipynb')), "a guide is no module: no number in its name"
