"""The ledger on both backends: the same tests against an SQLite file and a PostgreSQL server started for the session
(tests/conftest.py), the same numbers from both, concurrent writers (processes and Dask workers), the command line
on a server, and the server's bad inputs: each a one-line error within a bounded time."""
import io, json, time, socket, sqlite3, contextlib, multiprocessing
from pathlib import Path
import numpy as np, pandas as pd, pytest
from concurrent.futures import ThreadPoolExecutor
import fastrepro.experiments.store as store_module
from fastrepro.experiments.ledger import Ledger
from fastrepro.experiments.store import LedgerError, SCHEMA_VERSION
from fastrepro.cli import main
import sweep_jobs
from conftest import hang_limit

TIMEOUT_S = hang_limit(10)  # stops a hang of the processes that share a ledger


@pytest.fixture(scope='module')
def processes():
    "A multiprocessing context whose processes start fast: forked from a server that imported the writers once"
    ctx = multiprocessing.get_context('forkserver')
    ctx.set_forkserver_preload(['fastrepro.experiments.ledger', 'sweep_jobs'])
    return ctx


@pytest.fixture(scope='module')
def dask_client():
    "A Dask cluster of 2 worker processes x 4 threads on 127.0.0.1, ready to write to a ledger"
    pytest.importorskip('distributed')
    from dask.distributed import Client, LocalCluster
    cluster = dict(n_workers=2, threads_per_worker=4, processes=True, host='127.0.0.1', dashboard_address=None)
    with LocalCluster(**cluster) as c, Client(c) as client:
        client.run(__import__, 'fastrepro.experiments.ledger')
        yield client


@pytest.fixture(params=['sqlite', 'postgresql'])
def address(request, tmp_path):
    "Where a new, empty ledger goes, on each backend"
    return tmp_path/'ledger.db' if request.param == 'sqlite' else request.getfixturevalue('pg_url')


def execute(address, sql:str):
    "Run `sql` on the database at `address` directly, outside `Ledger`"
    if isinstance(address, Path):
        with contextlib.closing(sqlite3.connect(address)) as con: con.execute(sql); con.commit()
    else:
        import psycopg
        with psycopg.connect(address, autocommit=True) as con: con.execute(sql)


def fill(ledger:Ledger):
    "Runs with every kind of field: 5 seeds of a baseline and a better variant, a failed run, a new metric version"
    rng = np.random.default_rng(0)
    env = {'torch': '2.4', 'num_threads': 1, 'env_hash': 'e1'}
    for variant, mean in (('baseline', 0.90), ('mixup', 0.91)):
        for s in range(5):
            rid = ledger.add(dict(experiment='imdb', variant=variant, seed=np.int64(s), status='running',
                                  commit='c0ffee', dirty=s == 4, patch='+lr = 3e-3\n' if s == 4 else None, env=env,
                                  env_hash='e1', hyperparameters={'lr': np.float32(1e-3), 'layers': np.arange(2)},
                                  tags={'who': 'ci'},
                                  metric_version=1, data_fingerprint='d1', started=1.7e9 + s))
            acc = mean + rng.normal(0, 0.003)
            ledger.update(rid, status='completed', finished=1.7e9 + s + 61.25, duration=61.25,
                          metrics={'final': {'accuracy': acc, 'valid_loss': 1 - acc}, 'best': {'accuracy': acc}})
    ledger.add(dict(experiment='imdb', variant='mixup', seed=5, status='failed', notes='KilledWorker: worker died',
                    started=1.7e9 + 100))
    ledger.add(dict(experiment='imdb', variant='v2', seed=0, metric_version='1', metrics={'final': {'accuracy': 0.5}},
                    started=1.7e9 + 200))


def test_round_trip(address):
    "What goes in comes out, typed; filters, the inventory and the schema version are those of the backend-free spec"
    ledger = Ledger(address)
    assert len(ledger) == 0
    fill(ledger)
    runs = ledger.runs()
    assert list(runs.index) == list(range(1, 13))
    r = runs.loc[5]
    assert (r.seed, r.dirty, r.patch, r.commit, r.duration) == (4, True, '+lr = 3e-3\n', 'c0ffee', 61.25)
    assert r.hyperparameters == {'lr': float(np.float32(1e-3)), 'layers': [0, 1]} and r.tags == {'who': 'ci'}
    assert r.started == pd.Timestamp(1.7e9 + 4, unit='s', tz='UTC') and r.finished - r.started == pd.Timedelta('61.25s')
    assert (runs.loc[12].metric_version, runs.loc[1].metric_version) == ('1', 1)
    assert list(ledger.runs(metric_version='1').index) == [12] and len(ledger.runs(metric_version=1)) == 10
    assert list(ledger.runs(status='failed').notes) == ['KilledWorker: worker died']
    assert list(ledger.runs(variant=['mixup', 'v2'], seed=[0, 5]).index) == [6, 11, 12]
    assert list(ledger.runs(patch=None, variant='baseline').seed) == [0, 1, 2, 3]
    assert ledger.experiments()[['variant', 'runs', 'completed']].values.tolist() == [
        ['baseline', 5, 5], ['mixup', 6, 5], ['v2', 1, 1]]
    with pytest.raises(LedgerError, match='no run 99'): ledger.update(99, status='failed')
    with pytest.raises(LedgerError, match="No variant 'cutmix'"): ledger.check_known('imdb', 'cutmix')
    assert len(Ledger(address, create=False)) == 12


def test_same_numbers_from_both_backends(tmp_path, pg_url):
    "The same records give the same frame, inventory and comparison, to the last bit, from either backend"
    lite, server = Ledger(tmp_path/'ledger.db'), Ledger(pg_url)
    fill(lite); fill(server)
    pd.testing.assert_frame_equal(server.runs(), lite.runs())
    pd.testing.assert_frame_equal(server.experiments().drop(columns=['first', 'last']),
                                  lite.experiments().drop(columns=['first', 'last']))
    args = ('accuracy', dict(experiment='imdb', variant='baseline'), dict(experiment='imdb', variant='mixup'))
    assert server.compare(*args).to_dict() == lite.compare(*args).to_dict()
    assert server.compare(*args).verdict == 'progression'
    with pytest.raises(LedgerError, match='metric_version'):
        server.compare('accuracy', dict(experiment='imdb', variant='baseline'), dict(experiment='imdb', variant='v2'))


def test_concurrent_processes(address, processes):
    "4 processes x 25 records, started together, lose nothing"
    Ledger(address)  # created once, as a team's ledger is before its writers start
    barrier = processes.Barrier(4)
    procs = [processes.Process(target=sweep_jobs.write_runs, args=(address, w, 25), kwargs=dict(barrier=barrier))
             for w in range(4)]
    for p in procs: p.start()
    for p in procs: p.join(TIMEOUT_S)
    assert [p.exitcode for p in procs] == [0]*4
    runs = Ledger(address).runs()
    assert len(runs) == 100 and runs.index.is_unique
    assert runs.groupby('variant').seed.apply(sorted).tolist() == [list(range(25))]*4


def test_concurrent_creation(address, processes):
    "Processes opening a new ledger at once create it once"
    procs = [processes.Process(target=sweep_jobs.write_runs, args=(address, w, 1)) for w in range(3)]
    for p in procs: p.start()
    for p in procs: p.join(TIMEOUT_S)
    assert [p.exitcode for p in procs] == [0]*3
    assert len(Ledger(address)) == 3


def test_dask_writers(address, dask_client):
    "8 writers on a Dask cluster (2 worker processes x 4 threads), writing at the same moment, lose nothing"
    Ledger(address)
    n, start = 40, time.time() + 1
    spans = dask_client.gather([dask_client.submit(sweep_jobs.write_runs, address, w, n, start, pure=False)
                                for w in range(8)])
    assert max(t0 for t0, _ in spans) < min(t1 for _, t1 in spans), spans  # all 8 were writing at once
    runs = Ledger(address).runs()
    assert len(runs) == 8*n and runs.index.is_unique
    assert runs.groupby('variant').seed.apply(sorted).tolist() == [list(range(n))]*8


def test_schema_refusals(address):
    "A ledger of a newer schema, a database with other tables, and no ledger with create=False: one line each"
    with pytest.raises(LedgerError, match='No ledger at') as e: Ledger(address, create=False)
    assert '\n' not in str(e.value)
    execute(address, 'CREATE TABLE notes (x TEXT)')
    with pytest.raises(LedgerError, match='holds tables but no fastrepro ledger'): Ledger(address)
    execute(address, 'DROP TABLE notes')
    Ledger(address).add(dict(experiment='x'))
    execute(address, f'UPDATE ledger_schema SET version = {SCHEMA_VERSION + 1}')
    t = time.time()
    with pytest.raises(LedgerError, match=f'schema version {SCHEMA_VERSION + 1}, written by a newer fastrepro') as e:
        Ledger(address)
    assert '\n' not in str(e.value) and time.time() - t < 5



def test_migration_from_version_3(address):
    "A version-3 ledger's fit positions get the keys of a checkpoint's position, by SQL both backends run"
    Ledger(address).put('r', dict(experiment='x', hyperparameters=dict(lr=0.1, fit_idx=1, start_epoch=2)))
    execute(address, 'UPDATE ledger_schema SET version = 3')
    assert Ledger(address).record('r')['hyperparameters'] == dict(lr=0.1, fit=1, epoch=2)

def _server_error(url:str, bound_s:float) -> str:
    "The one-line `LedgerError` of opening `url`, checked to come within `bound_s` (a hang fails the test, bounded)"
    ex = ThreadPoolExecutor(1)
    try:
        t, fut = time.time(), ex.submit(Ledger, url)
        with pytest.raises(LedgerError) as e: fut.result(timeout=bound_s)
    finally: ex.shutdown(wait=False)
    msg = str(e.value)
    assert time.time() - t < bound_s and '\n' not in msg and 'sekret' not in msg, msg
    return msg


def test_server_bad_input(pg_server, monkeypatch):
    "An unreachable server, wrong credentials, a missing database, a server that never answers: one line each, no hang"
    base = pg_server.rsplit('@', 1)[1]
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]  # nothing listens there once closed
    assert 'Connection refused' in _server_error(f'postgresql://fastrepro:sekret@127.0.0.1:{port}/x', 5)
    assert 'password authentication failed for user "fastrepro"' in _server_error(
        f'postgresql://fastrepro:sekret@{base}', 5)
    assert 'database "nowhere" does not exist' in _server_error(pg_server.rsplit('/', 1)[0] + '/nowhere', 5)
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never says a word
        silent.bind(('127.0.0.1', 0)); silent.listen(8)
        url = f'postgresql://fastrepro:sekret@127.0.0.1:{silent.getsockname()[1]}/x'
        monkeypatch.setattr(store_module, 'CONNECT_TIMEOUT_S', 1)  # the default bound, shortened for the test
        assert 'timeout' in _server_error(url, 8)
        monkeypatch.setattr(store_module, 'CONNECT_TIMEOUT_S', 60)  # a URL's own connect_timeout wins
        assert 'timeout' in _server_error(url + '?connect_timeout=1', 8)


def fastrepro(*args) -> tuple:
    "Exit code, stdout and stderr of `fastrepro args` (`tests/test_cli.py` runs the command line in its own process)"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(list(map(str, args)))
    return rc, out.getvalue(), err.getvalue()


def test_cli_on_server(tmp_path, pg_url):
    "`fastrepro runs` and `fastrepro compare` print the same from a server as from a file"
    rc, out, err = fastrepro('runs', '--ledger', pg_url)  # a database without a ledger: the command line makes none
    assert rc == 2 and err.startswith('fastrepro runs: error: No ledger at') and len(err.splitlines()) == 1, err
    lite = tmp_path/'ledger.db'
    fill(Ledger(lite)); fill(Ledger(pg_url))
    for cmd in (('runs', '--json'), ('runs', '--variant', 'mixup'),
                ('compare', '--experiment', 'imdb', '--baseline', 'baseline', '--variant', 'mixup',
                 '--metric', 'accuracy', '--json')):
        a, b = fastrepro(*cmd, '--ledger', lite), fastrepro(*cmd, '--ledger', pg_url)
        assert a[0] == b[0] == 0 and a[2] == b[2] == '', (a, b)
        assert a[1] == b[1]
    assert json.loads(b[1])['verdict'] == 'progression'
