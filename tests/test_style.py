"""Lines within 120 characters (fastai's style) in what people read and edit: the notebooks' code cells, the tests, the
benchmarks and the examples. The exported modules follow their notebooks; nbdev itself writes `__all__`, `_modidx.py`
and each module's docstring (from the notebook's description). Also: every name a benchmark script reads is
defined, since the benchmarks run by hand and not in CI."""
import json, builtins, symtable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINE = 120


def long_lines(name:str, text:str) -> list:
    return [f"{name}:{i}: {len(l)} characters" for i, l in enumerate(text.splitlines(), 1) if len(l) > MAX_LINE]


def test_notebook_code_within_120():
    found = []
    for nb in sorted((ROOT/'nbs').glob('*.ipynb')):
        for k, cell in enumerate(json.loads(nb.read_text())['cells']):
            if cell['cell_type'] == 'code': found += long_lines(f"{nb.name} cell {k}", ''.join(cell['source']))
    assert not found, '\n'.join(found)


def test_scripts_within_120():
    files = [f for d in ('tests', 'bench', 'examples') for f in sorted((ROOT/d).glob('*.py'))]
    assert len(files) > 10  # the folders are there: an empty list would pass anything
    found = [line for f in files for line in long_lines(str(f.relative_to(ROOT)), f.read_text())]
    assert not found, '\n'.join(found)


def undefined_names(path:Path, star:set) -> list:
    "Global names the module at `path` reads but never binds, imports or gets from a star import (`star`)"
    top = symtable.symtable(path.read_text(), str(path), 'exec')
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    bound |= set(dir(builtins)) | {'__file__'} | star
    read = set()
    def visit(table):
        read.update(s.get_name() for s in table.get_symbols()
                    if s.is_referenced() and (table is top or s.is_global()))
        for child in table.get_children(): visit(child)
    visit(top)
    return sorted(read - bound)


def test_bench_scripts_define_what_they_use():
    # the benchmarks run by hand, not in CI: a name a script lost with an edit of `_common` surfaces only in a run
    import bench._common
    star = {n for n in dir(bench._common) if not n.startswith('_')}  # `from ._common import *`
    files = sorted((ROOT/'bench').glob('*.py'))
    found = {f.name: u for f in files if (u := undefined_names(f, star))}
    assert not found, found
    assert undefined_names(ROOT/'bench'/'portable_cost.py', set()), "a script's star-imported names count as unbound"
