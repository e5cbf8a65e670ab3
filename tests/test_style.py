"""Lines within 120 characters (fastai's style) in what people read and edit: the notebooks' code cells, the tests, the
benchmarks and the examples. The exported modules follow their notebooks; nbdev itself writes `__all__`, `_modidx.py`
and each module's docstring (from the notebook's description)."""
import json
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
