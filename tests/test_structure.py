"""The library's shape, read from its code: its folders are layers (a module imports from its own folder and the
folders below it, never above: `FLOORS`), imports run one way (no circle among fastrepro's modules, counting every
import in a file, also those inside functions), at most `MAX_TOP_ENTRIES` entries at the top of the package, no
module-level statement imports or registers something because of an environment variable, and no module over
`MAX_MODULE_LINES` lines. `python tests/test_structure.py` prints the map: each folder's modules, the arrows between
folders, and each module's lines and the modules it imports."""
import ast, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT/'fastrepro'
MAX_MODULE_LINES = 450  # a module a reader takes in as one concern
GENERATED = {'fastrepro._modidx'}  # nbdev's index of the symbols, written by `nbdev-export`
# the package's folders, bottom to top; the modules at the top of the package (the command line, the launcher, `all`)
# stand above them all
FLOORS = ('state', 'checkpoint', 'record', 'experiments', 'callback', 'check', 'demo')
MAX_TOP_ENTRIES = 9  # folders and modules at the top of the package besides `__init__`, `all` and `_modidx`


def modules() -> dict:
    "Dotted name -> path of every module of the library"
    res = {}
    for p in sorted(PACKAGE.rglob('*.py')):
        parts = p.relative_to(ROOT).with_suffix('').parts
        res['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = p
    return res


def _resolve(name:str, node:ast.ImportFrom|ast.Import, mods:dict) -> set:
    ("The library modules an import statement in module `name` names; not the packages that hold `name`, which Python "
     "imports before it anyway (`import fastrepro` for its version)")
    if isinstance(node, ast.Import): targets = [a.name for a in node.names]
    else:
        base = node.module
        if node.level:
            pkg = name.split('.') if mods[name].name == '__init__.py' else name.split('.')[:-1]
            base = '.'.join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
        targets = [base] + [f'{base}.{a.name}' for a in node.names]
    return {t for t in targets if t in mods and t != name and not name.startswith(f'{t}.')}


def _imported_by_name(name:str, node:ast.Call, mods:dict) -> set:
    ("The library module a call `importlib.import_module('fastrepro....')` (or `import_module(...)`) names with a "
     "literal: an import as any other")
    f, args = node.func, node.args
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if called != 'import_module' or not args or not isinstance(args[0], ast.Constant): return set()
    target = args[0].value
    return {target} if target in mods and target != name and not name.startswith(f'{target}.') else set()


def imports() -> dict:
    ("Module -> the library modules it imports anywhere in its file (functions included), by statement or by "
     "`import_module` with a literal name")
    mods = modules()
    def _arrows(m, n):
        if isinstance(n, (ast.Import, ast.ImportFrom)): return _resolve(m, n, mods)
        return _imported_by_name(m, n, mods) if isinstance(n, ast.Call) else set()
    return {m: set().union(*(_arrows(m, n) for n in ast.walk(ast.parse(p.read_text()))))
            for m, p in mods.items() if m not in GENERATED}


def circles(graph:dict) -> list:
    "The strongly connected components of more than one module (Tarjan)"
    index, low, stack, on, res = {}, {}, [], set(), []
    def visit(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop(); on.discard(w); comp.add(w)
                if w == v: break
            if len(comp) > 1: res.append(sorted(comp))
    for v in graph:
        if v not in index: visit(v)
    return res


def floor(module:str) -> int:
    "The floor of a dotted module name: its folder's place in `FLOORS`, or the top for the package's own modules"
    parts = module.split('.')
    return FLOORS.index(parts[1]) if len(parts) > 2 else len(FLOORS)


def upward(graph:dict) -> list:
    "The arrows `module -> module` that run from a floor to one above it"
    return sorted(f'{m} -> {t}' for m, ts in graph.items() for t in ts if floor(t) > floor(m))


def folder_arrows(graph:dict) -> dict:
    "(folder, folder) -> how many module arrows run from the first folder to another one"
    res = {}
    for m, ts in graph.items():
        for t in ts:
            a, b = (FLOORS[floor(x)] if floor(x) < len(FLOORS) else 'top' for x in (m, t))
            if a != b: res[a, b] = res.get((a, b), 0) + 1
    return res


def top_entries() -> list:
    "The folders and modules at the top of the package, but `__init__`, `all` and `_modidx`"
    return sorted(p.stem for p in PACKAGE.iterdir() if (p.is_dir() and (p/'__init__.py').exists())
                  or (p.suffix == '.py' and p.stem not in ('__init__', 'all', '_modidx')))


def _reads_environment(node:ast.AST) -> bool:
    "Does the expression read an environment variable (`os.environ`, `os.getenv`)?"
    return any(isinstance(n, ast.Attribute) and n.attr in ('environ', 'getenv') for n in ast.walk(node))


def environment_hooks() -> list:
    "`module:line` of each module-level `if` on an environment variable whose body imports or registers something"
    res = []
    for m, p in modules().items():
        for node in ast.parse(p.read_text()).body:
            if not (isinstance(node, ast.If) and _reads_environment(node.test)): continue
            body = [n for b in node.body for n in ast.walk(b)]
            if any(isinstance(n, (ast.Import, ast.ImportFrom, ast.Call)) for n in body):
                res.append(f'{m}:{node.lineno}')
    return res


def test_imports_run_one_way():
    assert circles(imports()) == [], "an import circle: a module imports one that imports it back"


def test_folders_are_layers():
    folders = [e for e in top_entries() if (PACKAGE/e).is_dir()]
    assert sorted(folders) == sorted(FLOORS), "every folder of the package has its floor in FLOORS"
    assert upward(imports()) == [], "a module imports from a folder above its own"


def test_few_entries_at_the_top():
    assert len(top_entries()) <= MAX_TOP_ENTRIES, top_entries()


def test_no_import_or_registration_because_of_an_environment_variable():
    assert environment_hooks() == []


def test_no_module_over_the_limit():
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items() if m not in GENERATED}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


if __name__ == '__main__':
    graph, mods = imports(), modules()
    lines = {m: len(mods[m].read_text().splitlines()) for m in graph}
    print(f"top: {', '.join(top_entries())} ({len(top_entries())} entries besides __init__, all, _modidx)")
    for i, f in reversed(list(enumerate(FLOORS))):
        inside = sorted(m.split('.')[2] for m in graph if floor(m) == i and m.count('.') == 2)
        print(f"floor {i} {f + '/':13} {sum(lines[m] for m in graph if floor(m) == i):5} lines  {', '.join(inside)}")
    arrows = sorted(folder_arrows(graph).items())
    print('arrows between folders: ' + ', '.join(f'{a} -> {b} ({n})' for (a, b), n in arrows))
    print(f"running up: {upward(graph) or 'none'}\n")
    for m in sorted(graph): print(f"{m:32} {lines[m]:4}  -> {', '.join(sorted(graph[m])) or '-'}")
    print(f"{len(graph)} modules, {sum(lines.values())} lines, {sum(map(len, graph.values()))} arrows, "
          f"circles: {circles(graph) or 'none'}, environment hooks: {environment_hooks() or 'none'}")
    sys.exit(0)


CHECKPOINT_CB_MAX_LINES = 150  # CheckpointCB stays small: whose run a checkpoint is lives with the resume plan


def test_checkpoint_callback_stays_small():
    tree = ast.parse((PACKAGE/'callback'/'preempt.py').read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == 'CheckpointCB')
    assert cls.end_lineno - cls.lineno + 1 <= CHECKPOINT_CB_MAX_LINES
