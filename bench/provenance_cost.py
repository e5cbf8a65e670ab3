"""What recording provenance costs per fit (issue 22), against a plain fastai fit in the same process.

    python -m bench.provenance_cost [--rounds 20]                    # this checkout
    PYTHONPATH=/tmp/old python -m bench.provenance_cost --rounds 20  # another checkout's fastrepro, for before/after

A fit calls `run_provenance` once (`ReproCB`'s `FitProvenance.take_code`). It is timed in a temporary repository that
looks like real work: 30 committed modules and a committed notebook; then the outputs of 20 runs (a model and a
checkpoint each in `models/`, an export and a ledger at the root), a modified module and the notebook saved with
outputs. Each call is timed cold (the patch cache emptied: the first fit of a process) and warm (a later fit on an
unchanged tree). The ratio divides by one plain fastai fit of `synth_learner` (one epoch), timed in the same process.
Prints one JSON object."""
from __future__ import annotations
import argparse, inspect, json, statistics, subprocess, tempfile, time
from pathlib import Path

N_MODULES, N_RUNS = 30, 20  # a small project, run 20 times


def _git(root, *args): subprocess.run(['git', *args], cwd=root, check=True, capture_output=True)


def _notebook(ran: bool) -> str:
    cell = dict(cell_type='code', id='c0', metadata={}, source=['import math'], execution_count=1 if ran else None,
                outputs=[dict(output_type='display_data', data={'image/png': 'iVBORw0KGgo' * 2000}, metadata={})]
                if ran else [])
    return json.dumps(dict(nbformat=4, nbformat_minor=5, metadata={}, cells=[cell]), sort_keys=True, indent=1) + '\n'


def make_repo(root: Path) -> Path:
    "The repository described above"
    root.mkdir(parents=True)
    _git(root, 'init', '-q', '-b', 'main')
    for i in range(N_MODULES): (root/f'mod{i}.py').write_text(f'VALUE = {i}\n' * 50)
    (root/'explore.ipynb').write_text(_notebook(False))
    _git(root, 'add', '-A')
    _git(root, '-c', 'user.name=b', '-c', 'user.email=b@b.invalid', 'commit', '-qm', 'project')
    (root/'models').mkdir()
    for r in range(N_RUNS):
        (root/'models'/f'model{r}.pth').write_bytes(bytes(200_000))
        (root/'models'/f'checkpoint{r}.pth').write_bytes(bytes(200_000))
    (root/'export.pkl').write_bytes(bytes(200_000)); (root/'runs.db').write_bytes(bytes(50_000))
    (root/'mod0.py').write_text('VALUE = -1\n')
    (root/'explore.ipynb').write_text(_notebook(True))
    return root


def main(rounds: int):
    import torch
    from fastai.test_utils import synth_learner
    from fastrepro.record import provenance
    torch.set_num_threads(1)
    root = make_repo(Path(tempfile.mkdtemp())/'proj')
    takes_outputs = 'outputs' in inspect.signature(provenance.run_provenance).parameters
    kwargs = dict(outputs=[root/'models']) if takes_outputs else {}
    time.sleep(provenance.RACY_SECONDS + 0.1)  # files older than the racy window, as between two fits
    cold, warm, fits = [], [], []
    for _ in range(rounds):
        provenance._patch_cache.clear()
        for cache in ('_notebook_cache', '_imported_cache'): getattr(provenance, cache, {}).clear()
        t = time.perf_counter(); prov = provenance.run_provenance(root, allow_dirty=True, **kwargs)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter(); provenance.run_provenance(root, allow_dirty=True, **kwargs)
        warm.append(time.perf_counter() - t)
        learn = synth_learner()
        t = time.perf_counter()
        with learn.no_bar(), learn.no_logging(): learn.fit(1)
        fits.append(time.perf_counter() - t)
    fit = statistics.median(fits)
    print(json.dumps(dict(fastrepro=str(Path(provenance.__file__).parent), patch_bytes=len(prov['patch'] or ''),
                          changed_listed=len(prov['git']['modified']) + len(prov['git']['untracked']),
                          cold_ms=round(1000*statistics.median(cold), 1),
                          warm_ms=round(1000*statistics.median(warm), 1),
                          fit_ms=round(1000*fit, 1), cold_ratio=round(statistics.median(cold)/fit, 3),
                          warm_ratio=round(statistics.median(warm)/fit, 3)), indent=1))


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--rounds', type=int, default=20)
    main(p.parse_args().rounds)
