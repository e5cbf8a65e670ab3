"""Seeds of the tiny ULMFiT classifier on a Dask cluster (2 worker processes on 127.0.0.1): the final weights are the
bits of the same seeds run one after the other in this process; a worker killed (SIGKILL) while it trains loses its
seed only, recorded as failed, and the rerun of the same call runs that seed alone; a default cluster, whose daemonic
workers cannot start fastai's tokenizer processes, is refused at once with the line to add."""
import re, time, warnings
from functools import partial
from pathlib import Path
import pytest, git
from fastrepro.experiments.ledger import Ledger
from fastrepro.experiments.stats import ComparisonWarning
from fastrepro.experiments.sweep import repeat, SweepError, WorkerError, DASK_NO_DAEMON
import sweep_jobs

dask = pytest.importorskip('dask')
pytest.importorskip('distributed')
from dask.distributed import Client, LocalCluster

SEEDS = range(4)
CLUSTER = dict(n_workers=2, threads_per_worker=1, processes=True, host='127.0.0.1', dashboard_address=None)
RECORD = dict(threads=1, experiment='imdb', metric_version=1)  # one thread per seed: the workers share 2 cores


@pytest.fixture(scope='module')
def client(fastai_home):
    "Non-daemonic workers (fastai tokenizes in a process pool), and a seed lost at the first death of its worker"
    cfg = {'distributed.worker.daemon': False, 'distributed.scheduler.allowed-failures': 0}
    with dask.config.set(cfg), LocalCluster(**CLUSTER) as cluster, Client(cluster) as client: yield client


@pytest.fixture(scope='module')
def repo(tmp_path_factory):
    "A git repository with one commit: the code whose runs the ledger records"
    path = tmp_path_factory.mktemp('repo')
    with git.Repo.init(path, initial_branch='main') as g:
        with g.config_writer() as cw:
            cw.set_value('user', 'name', 'tests'); cw.set_value('user', 'email', 'tests@fastrepro.invalid')
        (path/'train.py').write_text('lr = 1e-2\n'); g.index.add(['train.py']); g.index.commit('initial')
    return path


@pytest.fixture(scope='module')
def ledger(tmp_path_factory): return Ledger(tmp_path_factory.mktemp('ledger')/'ledger.db')


def digests(out:Path) -> dict: return {s: (out/f'{s}.sha256').read_text() for s in SEEDS}


@pytest.fixture(scope='module')
def here(tmp_path_factory, fastai_home, ledger, repo):
    "The 4 seeds one after the other in this process: results and weight digests"
    out = tmp_path_factory.mktemp('here')
    res = repeat(partial(sweep_jobs.train_classifier, out=str(out)), SEEDS, ledger=ledger, repo_path=repo,
                 variant='here', **RECORD)
    return res, digests(out)


@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_same_bits_on_dask(client, here, ledger, repo, tmp_path):
    res = repeat(partial(sweep_jobs.train_classifier, out=str(tmp_path)), SEEDS, executor=client.get_executor(),
                 ledger=ledger, repo_path=repo, variant='dask', **RECORD)
    assert digests(tmp_path) == here[1]
    cols = ['seed', 'train_loss', 'valid_loss', 'accuracy']
    assert res[cols].to_dict() == here[0][cols].to_dict()
    runs = ledger.runs(variant='dask')
    assert (sorted(runs.seed), set(runs.status)) == (list(SEEDS), {'completed'})
    assert {e['num_threads'] for e in runs.env} == {1}
    assert len({e['env_hash'] for e in runs.env} | set(ledger.runs(variant='here').env_hash)) == 1


@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_worker_killed_then_resumed(client, here, ledger, repo, tmp_path, capsys):
    job = partial(sweep_jobs.train_classifier, out=str(tmp_path), kill_seed=0)  # the first: the others must go on
    kw = dict(executor=client.get_executor(), ledger=ledger, repo_path=repo, variant='killed', **RECORD)
    with pytest.raises(SweepError, match=r'Seeds \[0.*\] were lost.*KilledWorker') as e: repeat(job, SEEDS, **kw)
    assert (tmp_path/'killed').exists()
    runs = ledger.runs(variant='killed')
    failed, done = runs[runs.status == 'failed'], runs[runs.status == 'completed']
    lost = sorted(map(int, failed.seed))  # seed 0, and any seed Dask had already handed to the same worker
    assert 0 in lost and len(lost) < len(SEEDS) and failed.notes.str.contains('KilledWorker').all(), failed.notes
    completed = sorted(map(int, done.seed))
    assert sorted(lost + completed) == list(SEEDS)  # every seed has its record: the others went on
    assert sorted(e.value.results.seed) == completed
    capsys.readouterr()
    res = repeat(job, SEEDS, **kw)
    said = capsys.readouterr().out
    assert f'seeds {completed} have completed records' in said and f'running {lost}' in said, said
    assert res.seed.tolist() == list(SEEDS)
    runs = ledger.runs(variant='killed')
    assert sorted(runs[runs.status == 'completed'].seed) == list(SEEDS) and len(runs) == len(SEEDS) + len(lost)
    assert digests(tmp_path) == here[1]
    with warnings.catch_warnings(record=True) as w:  # the comparison sees 4 seeds on each side, in one environment
        warnings.simplefilter('always')
        r = ledger.compare('accuracy', *(dict(experiment='imdb', variant=v) for v in ('here', 'killed')))
    assert not [o for o in w if issubclass(o.category, ComparisonWarning)], [str(o.message) for o in w]
    assert r.n == (4, 4) and r.mean_diff == 0


def test_default_cluster_refused(fastai_home):
    "Dask's default workers are daemonic: refused before anything trains, with the line that fixes it"
    default = dask.config.set({'distributed.worker.daemon': True})  # the module's cluster may have set it off
    with default, LocalCluster(**dict(CLUSTER, n_workers=1)) as cluster, Client(cluster) as client:
        t = time.time()
        with pytest.raises(WorkerError, match=re.escape(DASK_NO_DAEMON)):
            repeat(sweep_jobs.square, SEEDS, executor=client.get_executor())
        assert time.time() - t < 60
