"""`repeat` on submitit's executor, whose jobs are not `concurrent.futures` futures: its local backend runs each seed
in a process of its own through the job API that SLURM's backend has. A job killed (SIGKILL) is recorded failed, the
other seeds complete, and the rerun of the same call runs the killed seed alone."""
import os
from functools import partial
from pathlib import Path
import pytest
from fastrepro.experiments.ledger import Ledger
from fastrepro.experiments.sweep import repeat, SweepError
import sweep_jobs

pytestmark = pytest.mark.slow  # trains in submitit jobs: the inner loop (-m "not slow") skips it

submitit = pytest.importorskip('submitit')
ROOT = Path(__file__).resolve().parents[1]
SEEDS = [0, 1]  # each runs in a process of its own: a new interpreter that imports torch


def test_submitit_local(tmp_path, monkeypatch, capsys):
    paths = [str(ROOT/'tests'), str(ROOT), os.environ.get('PYTHONPATH', '')]  # the jobs load `sweep_jobs` by name
    monkeypatch.setenv('PYTHONPATH', os.pathsep.join(paths))
    executor = submitit.AutoExecutor(folder=tmp_path/'jobs', cluster='local')
    executor.update_parameters(timeout_min=10)
    ledger = Ledger(tmp_path/'ledger.db')
    job = partial(sweep_jobs.square_killed_once, str(tmp_path/'killed'))
    kw = dict(executor=executor, ledger=ledger, repo_path=ROOT, allow_dirty=True, threads=1, experiment='squares')
    with pytest.raises(SweepError, match=r'Seeds \[1\] were lost.*UncompletedJobError') as e: repeat(job, SEEDS, **kw)
    assert e.value.results.seed.tolist() == [0]
    runs = ledger.runs()
    assert dict(zip(runs.seed, runs.status)) == {0: 'completed', 1: 'failed'} and len(runs) == 2
    capsys.readouterr()
    res = repeat(job, SEEDS, **kw)
    assert 'running [1]' in capsys.readouterr().out
    assert res.square.tolist() == [0, 1] and sorted(ledger.runs(status='completed').seed) == [0, 1]
