"""What ruff cannot check. `ruff check` (in `.ci/run`; configured in pyproject.toml) checks line lengths in the
notebooks, tests, benchmarks and examples, and undefined names everywhere, except the names a benchmark script gets from
`from ._common import *`: ruff does not follow a star import, so this test resolves them against `bench._common`
(the benchmarks run by hand and not in CI, so a name a script lost with an edit of `_common` would surface only in a
run)."""
import builtins, symtable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
