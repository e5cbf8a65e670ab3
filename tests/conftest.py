"""Shared fixtures and helpers: the IMDB sample under a temporary \
FASTAI_HOME (nothing is downloaded), the command line in
a fresh process, and bit-for-bit model comparison."""
import math, os, shutil, subprocess, sys, tempfile
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_CSV = ROOT.parent/'shared'/'data'/'imdb_sample'/'texts.csv'
HANG_FACTOR, HANG_MIN_S = 10, 600  # a test's wall-clock limit: ten times the step's quiet time, at least ten minutes


def hang_limit(quiet_s:float) -> int:
    ("A wall-clock limit in whole seconds that only stops a hang, never a speed assertion: `HANG_FACTOR` times what "
     "the step takes on a quiet 2-core machine (at least `HANG_MIN_S`), times one plus the machine's load per core "
     "when it is asked")
    busy = os.getloadavg()[0] / (os.cpu_count() or 1)
    return math.ceil(max(HANG_MIN_S, HANG_FACTOR * quiet_s) * (1 + busy))


CLI_TIMEOUT_S = hang_limit(10)  # a command refused for bad input answers in seconds; training commands pass their own

sys.path.insert(0, str(ROOT))  # this checkout's fastrepro
from fastrepro.state.kernel_env import DETERMINISTIC_ENV  # imports no torch

STARTED_ENV = dict(os.environ)  # the environment pytest was started in, before the variables below

# MKL and OpenMP read these when they start, in this process and in every process a test starts: MKL's conditional
# numerical reproducibility and no dynamic threading (issue 12), the same in all of them whatever ran MKL first
for k, v in DETERMINISTIC_ENV.items(): os.environ.setdefault(k, v)

# pytest-xdist's workers share the cores: each worker, and every process its tests start, takes its share of torch's
# threads unless a test asks for a count itself. Workers of two threads each on two cores spin against each other (an
# epoch of the demo's tiny language model took 3.6x as long on a busy 2-core machine, docs/execute.py's `threads`)
WORKERS = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if WORKERS > 1:
    share = str(max(1, (os.cpu_count() or 1) // WORKERS))
    for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'): os.environ.setdefault(k, share)

# The processes the tests start run beside each other and beside the workers, more threads than cores: an OpenMP thread
# that waits for work sleeps instead of spinning on a core another process needs (libgomp spins by default; three
# 2-thread trainings at once on 2 cores took 26-29 s each with spinning, 3.5 s without). Which threads wait, and how,
# changes no result: no recorded variable, the same bits
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

# every process a test starts signs and checks checkpoints with the tests' own secret, never the user's (issue 49):
# `fastrepro.record.trust` makes it on first use
TEST_SECRET = Path(tempfile.gettempdir())/f'fastrepro-tests-{os.getuid()}'/'secret'
os.environ['FASTREPRO_SECRET_FILE'] = str(TEST_SECRET)


# pytest-xdist (`--dist loadfile`) starts the test files in this order, the longest first (measured with --durations on
# 2 cores), so that no worker is left alone with a long file at the end; by default it starts the files with the most
# tests first, whatever they take. The others follow in their own order.
LONGEST_FIRST = ('test_notebooks.py', 'test_preempt.py', 'test_distrib.py', 'test_verify.py', 'test_provenance_runs.py',
                 'test_selftest.py', 'test_script_boundaries.py', 'test_run_identity.py', 'test_fastai_habits.py',
                 'test_demo_cli.py', 'test_resume.py', 'test_reproduce.py', 'test_trust.py', 'test_trackers.py',
                 'test_loader_resume.py', 'test_sweep_dask.py', 'test_bench_smoke.py')


def pytest_configure(config):
    if hasattr(config.option, 'loadscopereorder'): config.option.loadscopereorder = False  # keep the order below


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # a stable sort: a file's tests stay in order


@pytest.fixture(scope='session')
def fastai_home(tmp_path_factory):
    "A FASTAI_HOME holding the IMDB sample (from $FASTAI_HOME if it has one, else from ../shared)"
    cur = os.environ.get('FASTAI_HOME')
    if cur and (Path(cur)/'data'/'imdb_sample'/'texts.csv').exists(): return Path(cur)
    home = tmp_path_factory.mktemp('fastai_home')
    dest = home/'data'/'imdb_sample'
    dest.mkdir(parents=True)
    shutil.copy(SHARED_CSV, dest/'texts.csv')
    os.environ['FASTAI_HOME'] = str(home)
    return home


def fastrepro_cli(*args, cwd=ROOT, timeout=CLI_TIMEOUT_S, **env) -> subprocess.CompletedProcess:
    "Run `python -m fastrepro.cli args` in a fresh process (this checkout's fastrepro first on its path)"
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]),
           'MPLBACKEND': 'Agg', **env}
    return subprocess.run([sys.executable, '-m', 'fastrepro.cli', *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def fastrepro_here(capsys, *args) -> subprocess.CompletedProcess:
    ("Run `fastrepro args` in this process (`fastrepro.cli.main`; `capsys` captures its output): the exit code and "
     "output a fresh process gives, without the seconds of its imports")
    from fastrepro.cli import main
    capsys.readouterr()
    try: code = main([str(a) for a in args])
    except SystemExit as e: code = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(['fastrepro', *map(str, args)], code, out.out, out.err)


def assert_user_error(res, *expected):
    "Exit code 2, one clear message on stderr naming the command, no traceback"
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-3000:])
    assert 'Traceback' not in res.stderr + res.stdout, res.stderr
    assert res.stderr.startswith('fastrepro ') and ': error:' in res.stderr.splitlines()[0], res.stderr
    for e in expected: assert e in res.stderr, res.stderr


def same_bits(a, b) -> bool:
    "Do learners `a` and `b` hold the same parameters and buffers, bit for bit?"
    import torch
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def run_py(code, cwd, env=None, timeout=None):
    "Run `code` in a fresh Python process; return its stdout (raise with its stderr on failure)"
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([sys.executable, '-c', code], cwd=cwd, env=e, capture_output=True, text=True,
                       timeout=timeout or hang_limit(60))
    if r.returncode != 0:
        raise AssertionError(f"subprocess failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r.stdout


# A throwaway PostgreSQL server for the ledger tests (tests/test_ledger_backends.py): started once per session on
# 127.0.0.1, one new database per test.
@pytest.fixture(scope='session')
def pg_server():
    "URL of a PostgreSQL server started for this session (fsync off: nothing here needs to survive a crash)"
    from fastrepro.experiments.store import local_postgres, postgres_bin
    if postgres_bin() is None:
        if shutil.which('apt-get'):
            pytest.fail("PostgreSQL's server binaries are missing: apt-get install -y postgresql (.ci/run does)")
        pytest.skip("PostgreSQL's server binaries are missing and there is no apt-get to install them")
    pytest.importorskip('psycopg', reason="the PostgreSQL driver is missing: pip install -e '.[dev]'")
    with local_postgres(fsync='off') as url: yield url

@pytest.fixture
def pg_url(pg_server):
    "URL of a new, empty database on the session's PostgreSQL server"
    import uuid, psycopg
    name = f'test_{uuid.uuid4().hex[:12]}'
    with psycopg.connect(pg_server, autocommit=True) as con: con.execute(f'CREATE DATABASE {name}')
    return f"{pg_server.rsplit('/', 1)[0]}/{name}"


# One uninterrupted reference run per recipe, shared by every test that compares against it (test_resume.py and
# test_preempt.py train the same language model, classifier and fp16 runs), also across pytest-xdist's workers: the
# first test that asks trains it, in its own process as before, under a file lock; the others wait for it and read it.
@pytest.fixture(scope='session')
def reference_runs(tmp_path_factory):
    ("`reference(job, encoder=None)`: `job` in a folder that holds its 'reference' run (`reference.pt`; an LM's "
     "encoder too), trained once per pytest run; `encoder`: the file a classifier's job starts from")
    import dataclasses, fcntl, hashlib, shutil, pandas as pd
    from fastrepro.demo.jobs import Job, job_process, job_error
    from fastrepro.demo.ulmfit import ENCODER
    # one folder for all workers of this pytest run: under pytest-xdist, the folder above each worker's own
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if 'PYTEST_XDIST_WORKER' in os.environ else base)/'reference-runs'
    shared.mkdir(exist_ok=True)

    def reference(job:Job, encoder:Path|None=None) -> Job:
        spec = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name not in ('path', 'df')}
        key = hashlib.sha256(repr((spec, pd.util.hash_pandas_object(job.df).tolist(),
                                   encoder and Path(encoder).read_bytes())).encode()).hexdigest()[:16]
        ref = dataclasses.replace(job, path=shared/key)
        with open(shared/f'{key}.lock', 'w') as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker training it: wait for it (its own time limit bounds it)
            if not (ref.path/'reference.pt').is_file():
                spec_file = ref.write()
                if encoder is not None: shutil.copy(encoder, ref.path/'models'/f'{ENCODER}.pth')
                p = job_process(spec_file, 'reference')
                assert p.returncode == 0, job_error(p)
        return ref
    return reference
