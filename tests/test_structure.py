"""The library's shape, read from its code: imports run one way (no circle among fastrepro's modules, counting every
import in a file, also those inside functions), no module-level statement imports or registers something because of
an environment variable, and no module over `MAX_MODULE_LINES` lines. `python tests/test_structure.py` prints the
module map: each module's lines and the modules it imports."""
import ast, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT/'fastrepro'
MAX_MODULE_LINES = 450  # a module a reader takes in as one concern
GENERATED = {'fastrepro._modidx'}  # nbdev's index of the symbols, written by `nbdev-export`


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


def test_no_import_or_registration_because_of_an_environment_variable():
    assert environment_hooks() == []


def test_no_module_over_the_limit():
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items() if m not in GENERATED}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES} == {}


if __name__ == '__main__':
    graph, mods = imports(), modules()
    lines = {m: len(mods[m].read_text().splitlines()) for m in graph}
    for m in sorted(graph): print(f"{m:32} {lines[m]:4}  -> {', '.join(sorted(graph[m])) or '-'}")
    print(f"{len(graph)} modules, {sum(lines.values())} lines, {sum(map(len, graph.values()))} arrows, "
          f"circles: {circles(graph) or 'none'}, environment hooks: {environment_hooks() or 'none'}")
    sys.exit(0)
