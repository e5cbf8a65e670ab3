"""The declared range and the script that tests it agree: `.ci/stacks`' old end is `pyproject.toml`'s lower bound of
fastai, fastcore and torch, its new end lies inside the upper bounds, this checkout's CI stack lies in the range, and
`STACKS.md` records a result for both ends' exact pins."""
import re, tomllib
from importlib.metadata import version
from pathlib import Path
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RANGED = ('fastai', 'fastcore', 'torch')


def declared() -> dict:
    deps = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['dependencies']
    return {r.name: r.specifier for r in map(Requirement, deps) if r.name in RANGED}


def ends() -> dict:
    "end -> {package: version} from `.ci/stacks`"
    found = re.findall(r'^\s*\[(old|new)\]="([^"]+)"', (ROOT/'.ci'/'stacks').read_text(), re.M)
    return {end: dict(p.split('==') for p in pins.split()) for end, pins in found}


def test_the_ends_are_the_declared_range():
    spec, stack = declared(), ends()
    assert set(spec) == set(RANGED) and set(stack) == {'old', 'new'}
    for name in RANGED:
        lower = min(Version(s.version) for s in spec[name] if s.operator == '>=')
        assert Version(stack['old'][name]) == lower, f"{name}: the old end is not the declared lower bound {lower}"
        assert all(Version(stack[end][name]) in spec[name] for end in stack), f"{name}: an end is outside {spec[name]}"
        assert Version(version(name).split('+')[0]) in spec[name], f"the installed {name} is outside {spec[name]}"


def test_stacks_md_has_both_ends():
    text = (ROOT/'STACKS.md').read_text()
    for end, pins in ends().items():
        row = next((l for l in text.splitlines() if l.startswith(f'| {end} |')), None)
        assert row is not None, f"STACKS.md has no row for the {end} end"
        assert all(f'{p} {v}' in row for p, v in pins.items() if p in RANGED), (end, row)
