"""One execution of the notebooks for the tests and the site: each notebook runs as `nbdev-test` runs it (nbdev's
processing, its `slow` cells skipped, execnb's `CaptureShell`, the notebook's folder as working directory, `IN_TEST`
set) and its executed copy, outputs included, goes to `_exec/` (git-ignored), keyed by a digest of the notebook's code
cells, the library's source (`fastrepro/**/*.py`) and the versions it ran on. A copy whose key matches is not run
again: `tests/test_notebooks.py` and `docs/stage.py` (the site's outputs) both call `execute()`, so whichever comes
first runs the notebooks and the other reuses what it wrote.

The notebooks run in `WORKERS` processes, forked as nbdev-test's are (their DataLoader workers fork too), each a fixed,
contiguous part of the notebooks in file order (never scheduled by timing), so a notebook always shares its process
with the same ones before it; `--workers 1` runs them all in one process, as `nbdev-test --n-workers 1` does. A
notebook that fails leaves no copy and fails the run, its traceback on stderr.

Run: `python docs/execute.py [--workers N] [--force] [NOTEBOOK ...]`."""
import argparse, hashlib, json, multiprocessing, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NBS, LIB, EXEC = ROOT/'nbs', ROOT/'fastrepro', ROOT/'_exec'
WORKERS = 2  # fixed, whatever the machine: which notebooks share a process never changes
VERSIONS = ('torch', 'fastai', 'fastcore', 'nbdev', 'execnb', 'numpy', 'pandas', 'matplotlib')


def notebooks() -> list[Path]:
    "The notebooks `nbdev-test` runs, in its (file) order"
    from nbdev.config import get_config
    from nbdev.doclinks import nbglob
    cfg = get_config(str(ROOT))
    return [Path(f).absolute() for f in sorted(nbglob(str(cfg.nbs_path), as_path=True))
            if not (Path(f).parent/'.notest').exists()]


def lib_digest() -> str:
    "The library's source and the versions it runs on"
    h = hashlib.sha256(sys.version.encode())
    for name in VERSIONS: h.update(f'{name}={version(name)}'.encode())
    for p in sorted(LIB.rglob('*.py')): h.update(p.relative_to(ROOT).as_posix().encode() + b'\0' + p.read_bytes())
    return h.hexdigest()


def key(nb:Path, lib:str|None=None) -> str:
    "What an executed copy of `nb` must have been run from: its code cells (and their directives), the library"
    cells = [''.join(c['source']) for c in json.loads(nb.read_text())['cells'] if c['cell_type'] == 'code']
    return hashlib.sha256(((lib or lib_digest()) + json.dumps(cells)).encode()).hexdigest()


def copy_path(nb:Path) -> Path: return EXEC/nb.resolve().relative_to(NBS)


def cached(nb:Path, lib:str|None=None) -> dict|None:
    "The executed copy of `nb` whose key matches, None if there is none"
    p = copy_path(nb)
    if not p.exists(): return None
    ex = json.loads(p.read_text())
    return ex if ex.get('metadata', {}).get('fastrepro_exec', {}).get('key') == key(nb, lib) else None


def run_one(nb:Path, lib:str) -> tuple[bool, float]:
    "Run `nb` as `nbdev.test.test_nb` does, its executed copy into `_exec/` on success"
    from execnb.shell import CaptureShell
    from fastcore.xtras import working_directory
    from fastcore.nbio import write_nb
    from nbdev.config import get_config
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell
    cfg = get_config(str(ROOT))
    flags = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else cfg.tst_flags
    start, out = time.time(), copy_path(nb)
    out.unlink(missing_ok=True)
    prev = os.environ.get('IN_TEST')
    os.environ['IN_TEST'] = '1'
    try:
        k = key(nb, lib)
        book = NBProcessor(nb, rm_directives=False, process=True).nb
        shell = CaptureShell(nb, profile=bool(cfg.exec_profile))
        try:
            with working_directory(nb.parent):
                shell.run_all(book, exc_stop=True, preproc=_skip_cell(book, flags),
                              cell_timeout=cfg.cell_timeout or None)
        except BaseException:
            import traceback
            tb = shell.prettytb(fname=nb) or traceback.format_exc()
            sys.stderr.write(f'\n### {nb.relative_to(ROOT)}\n{tb}\n')
            return False, time.time() - start
        finally:
            slow = [(c.metadata['execution']['total'], i) for i, c in enumerate(book.cells)
                    if 'total' in c.get('metadata', {}).get('execution', {})]
            if slow: print(f"{nb.relative_to(ROOT)}: slowest cells (s, index): {sorted(slow, reverse=True)[:3]}")
        secs = time.time() - start
        book.metadata['fastrepro_exec'] = {'key': k, 'seconds': round(secs, 1)}
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix('.ipynb.tmp')
        write_nb(book, tmp)
        tmp.replace(out)
        return True, secs
    finally:
        if prev is None: os.environ.pop('IN_TEST', None)
        else: os.environ['IN_TEST'] = prev


def threads(processes:int) -> int:
    ("torch threads per notebook process: the machine's cores shared between the processes. Two processes of two "
     "threads on two cores wait on each other's spinning threads: one epoch of the test profile's language model took "
     "10.3 s on two threads and 2.9 s on one on a busy 2-core AMD EPYC (callback/01_repro took 418 s in CI)")
    return max(1, (os.cpu_count() or 1) // processes)


def run_part(nbs:list[Path], lib:str, n_threads:int) -> list[tuple[Path, bool, float]]:
    "Notebooks `nbs` in this process, in order (nbdev-test's `basepath` on the path), on `n_threads` torch threads"
    if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))
    os.environ.setdefault('MPLBACKEND', 'Agg')
    import torch
    torch.set_num_threads(n_threads)  # this process's share of the cores; the processes the notebooks start keep theirs
    res = []
    for nb in nbs:
        ok, secs = run_one(nb, lib)
        print(f"{'ran' if ok else 'FAILED'} {nb.relative_to(ROOT)}: {secs:.0f} s", flush=True)
        res.append((nb, ok, secs))
    return res


def parts(nbs:list[Path], n:int) -> list[list[Path]]:
    "`nbs` cut into `n` contiguous parts of (nearly) equal length"
    size, extra = divmod(len(nbs), n)
    bounds = [0]
    for i in range(n): bounds.append(bounds[-1] + size + (i < extra))
    return [nbs[a:b] for a, b in zip(bounds, bounds[1:])]


def execute(paths:list|None=None, workers:int=WORKERS, force:bool=False) -> dict:
    "Executed copies in `_exec/` for every notebook (or `paths`), running those that have none that matches; "
    "raises SystemExit naming the notebooks that failed. Returns notebook -> its copy. One at a time: a second caller "
    "(the notebook test beside the browser test's docs build) waits for the first, then reuses what it wrote"
    import fcntl
    EXEC.mkdir(exist_ok=True)
    with open(EXEC/'.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _execute(paths, workers, force)


def _execute(paths:list|None, workers:int, force:bool) -> dict:
    lib, every = lib_digest(), notebooks()
    wanted = {Path(p).absolute() for p in paths} if paths else set(every)
    todo = [[nb for nb in part if nb in wanted and (force or cached(nb, lib) is None)]
            for part in parts(every, max(1, min(workers, len(every))))]
    todo = [t for t in todo if t]
    start = time.time()
    if len(todo) == 1: results = run_part(todo[0], lib, threads(1))
    elif todo:
        with ProcessPoolExecutor(len(todo), mp_context=multiprocessing.get_context('fork')) as ex:
            results = [r for rs in ex.map(run_part, todo, [lib]*len(todo), [threads(len(todo))]*len(todo)) for r in rs]
    else: results = []
    failed = [nb for nb, ok, _ in results if not ok]
    n = sum(map(len, todo))
    print(f'executed {n} notebook(s) in {time.time() - start:.0f} s ({len(todo)} process(es)), '
          f'{len(wanted) - n} reused from {EXEC.relative_to(ROOT)}/', flush=True)
    if failed:
        raise SystemExit(f'{len(failed)} notebook(s) failed: ' + ', '.join(str(f.relative_to(ROOT)) for f in failed))
    return {nb: copy_path(nb) for nb in wanted}


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('paths', nargs='*')
    ap.add_argument('--workers', type=int, default=WORKERS)
    ap.add_argument('--force', action='store_true')
    a = ap.parse_args()
    execute(a.paths or None, a.workers, a.force)
