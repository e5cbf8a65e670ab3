"""A fault never costs a training run (issue 24), on real servers and real file systems: a PostgreSQL ledger server
stopped during a fit (the record spooled beside the run, synced once, also when the sync is killed halfway), a server
that hangs (SIGSTOP) in the middle of a write, spooled records that reach their ledger from any process, a full
or read-only disk under a SQLite ledger, periodic checkpoints on a full tmpfs, a save at SIGTERM on a full disk, and
the one-line errors of wrong server addresses. A tmpfs needs root (`mount -t tmpfs`); its tests skip without it."""
import os, sys, signal, shutil, sqlite3, subprocess, tempfile, warnings, contextlib, urllib.parse
from pathlib import Path
import pytest, torch
from fastai.basics import Callback, CancelFitException
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, CheckpointCB, Ledger, LedgerError, checkpoint_info, seed_everything
from fastrepro.experiments.store import postgres_bin, local_postgres
from fastrepro.experiments.spool import Spool, SpoolIndex, SPOOL_NAME, SPOOLS_ENV, LedgerWarning
from fastrepro.checkpoint.file import CheckpointWriteError
from fastrepro.callback.preempt import SAVE_FAILED_EXIT
from fastrepro.checkpoint.manifest import read_manifest
from conftest import hang_limit

ROOT = Path(__file__).parent.parent
N_ITER = 10  # training iterations per epoch of `learner` (synth_learner: 10 batches)

@pytest.fixture(autouse=True)
def spool_index(tmp_path, monkeypatch):
    "The spools of each test are noted in a `SpoolIndex` of its own, not in the user's cache"
    monkeypatch.setenv(SPOOLS_ENV, str(tmp_path/'spools'))
    return SpoolIndex()

def learner(path, *cbs, ledger=None, seed=1):
    seed_everything(0)
    return synth_learner(path=path, cbs=[ReproCB(seed=seed, allow_dirty=True, ledger=ledger), *cbs])

def fit(learn, n=2, **kwargs):
    with learn.no_bar(), learn.no_logging(): learn.fit(n, 1e-2, **kwargs)
    return learn

def ledger_warnings(ws) -> list: return [str(w.message) for w in ws if issubclass(w.category, LedgerWarning)]

class At(Callback):
    "Call `f(learn)` after training iteration `it` (1-based), or after epoch `epoch`"
    order = 95  # after CheckpointCB (90): a checkpoint due at the same iteration is written first
    def __init__(self, f, it=None, epoch=None): self.f, self.it, self.epoch_at = f, it, epoch
    def after_batch(self):
        if self.training and self.it == self.learn.train_iter: self.f(self.learn)
    def after_epoch(self):
        if self.epoch_at == self.epoch: self.f(self.learn)

# --- a ledger server stopped during a fit ---

def _pg(*args):
    run_as = ['runuser', '-u', 'postgres', '--'] if os.geteuid() == 0 else []
    subprocess.run(run_as + [str(postgres_bin()/args[0]), *map(str, args[1:])], check=True, capture_output=True,
                   timeout=hang_limit(2))

@contextlib.contextmanager
def server_stopped(url:str):
    "Stop the server of `url` (`local_postgres`'s) at once; start it again on the same port when the block ends"
    import psycopg
    with psycopg.connect(url) as con: data = Path(con.execute('SHOW data_directory').fetchone()[0])
    _pg('pg_ctl', '-D', data, '-m', 'immediate', '-w', 'stop')
    try: yield
    finally:
        port = urllib.parse.urlparse(url).port
        _pg('pg_ctl', '-D', data, '-l', data.parent/'log', '-w', '-o', f'-p {port} -h 127.0.0.1 -k {data.parent}',
            'start')

@pytest.fixture(scope='module')
def pg():
    if postgres_bin() is None: pytest.skip("PostgreSQL's server binaries are missing (apt-get install postgresql)")
    pytest.importorskip('psycopg', reason="the PostgreSQL driver is missing: pip install -e '.[dev]'")
    with local_postgres(fsync='off') as url: yield url

KILL_AFTER_PUT = """import os, signal, sys
from fastrepro.experiments.ledger import Ledger
put = Ledger._put
def put_then_die(self, *args):
    put(self, *args); os.kill(os.getpid(), signal.SIGKILL)  # killed after the first record's commit
Ledger._put = put_then_die
from fastrepro.cli import main
main(sys.argv[1:])"""

def test_server_stopped_during_fit(pg, tmp_path):
    stop = contextlib.ExitStack()
    learn = learner(tmp_path, At(lambda l: stop.enter_context(server_stopped(pg)), epoch=0), ledger=pg)
    with stop:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter('always')
            fit(learn)  # completes
            learn.save('after')  # the script goes on
            fit(learner(tmp_path, ledger=pg), 1)  # a second fit, while the server is still down: spooled too
        msgs = ledger_warnings(ws)
        assert len(msgs) == 2, msgs  # one per fit
        spool = tmp_path/'models'/SPOOL_NAME
        assert 'postgresql://fastrepro:***@127.0.0.1' in msgs[0] and str(spool) in msgs[0], msgs[0]
        assert 'fastrepro runs --sync' in msgs[0] and 'Training goes on' in msgs[0]
        assert len(Spool(spool)) == 2
    # the server is back: a sync killed after its first record's commit, then run again
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, '-c', KILL_AFTER_PUT, 'runs', '--sync', str(spool), '--ledger', pg],
                       env=env, capture_output=True, text=True, timeout=hang_limit(10))
    assert r.returncode == -signal.SIGKILL, r.stderr
    # the first fit's record (added when the fit started) completed, the spool untouched: it will be sent again
    assert Ledger(pg, send_spooled=False).runs().status.tolist() == ['completed'] and len(Spool(spool)) == 2
    from fastrepro.cli import main
    assert main(['runs', '--sync', str(spool), '--ledger', pg]) == 0
    runs = Ledger(pg).runs()
    assert len(runs) == 2 and len(Spool(spool)) == 0  # exactly one record per fit
    assert runs.status.tolist() == ['completed', 'completed']
    assert runs.metrics.iloc[0]['final']['valid_loss'] == float(learn.recorder.values[-1][1])
    assert runs.hyperparameters.iloc[0]['epochs'] == 2 and runs.duration.iloc[0] > 0

def test_server_errors_in_one_line(pg):
    no_password = pg.replace(':fastrepro@', '@')
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv('PGPASSWORD', raising=False)
        with pytest.raises(LedgerError, match='Give the password in the URL') as e: Ledger(no_password)
    assert '\n' not in str(e.value)
    port = urllib.parse.urlparse(pg).port
    with socket_closed_port() as free:
        with pytest.raises(LedgerError, match='Check the host and port in the URL') as e:
            Ledger(pg.replace(f':{port}/', f':{free}/'))
    assert '\n' not in str(e.value)
    with pytest.raises(LedgerError, match='Check the database and user names') as e:
        Ledger(pg.replace('/postgres', '/nosuchdb'))

@contextlib.contextmanager
def socket_closed_port():
    "A port on 127.0.0.1 where nothing listens"
    import socket
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
    yield port

# --- a ledger server that hangs in the middle of a write ---

def postmaster(url:str) -> int:
    "The process id of `local_postgres`'s server"
    import psycopg
    with psycopg.connect(url) as con: data = Path(con.execute('SHOW data_directory').fetchone()[0])
    return int((data/'postmaster.pid').read_text().split()[0])

def server_pids(pm:int) -> list:
    "The postmaster `pm` and its children (each backend is a process group of its own)"
    kids = subprocess.run(['ps', '-o', 'pid=', '--ppid', str(pm)], capture_output=True, text=True).stdout.split()
    return [pm, *map(int, kids)]

# the server stops itself (SIGSTOP, from a program its superuser may run) while it writes a completed record: the
# fit's connection is accepted and its statement sent, and then nothing answers
STOP_IN_WRITE = """CREATE FUNCTION stop_server() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  IF NEW.status = 'completed' THEN EXECUTE format('COPY (SELECT 1) TO PROGRAM %L', 'kill -STOP {pm} '
    || '$(ps -o pid= --ppid {pm})'); END IF;
  RETURN NEW; END $$;
CREATE TRIGGER stop_server BEFORE INSERT OR UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION stop_server()"""

def test_server_hangs_during_fit(pg, tmp_path, monkeypatch):
    import time, psycopg, fastrepro.experiments.fit_record
    bound = 2  # seconds: RECORD_TIMEOUT_S made short (psycopg's shortest connect_timeout) to keep the test short
    monkeypatch.setattr(fastrepro.experiments.fit_record, 'RECORD_TIMEOUT_S', bound)
    len(Ledger(pg))
    pm = postmaster(pg)
    with psycopg.connect(pg, autocommit=True) as con: con.execute(STOP_IN_WRITE.format(pm=pm))
    learn = learner(tmp_path, ledger=pg)
    try:
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter('always')
            t = time.monotonic()
            fit(learn, 1)  # its last write (the completed record) hangs in the server
            took = time.monotonic() - t
        msgs = ledger_warnings(ws)
        assert len(msgs) == 1 and f'accepted the connection but did not answer within {bound} s' in msgs[0], msgs
        assert took < bound + 10, took  # the fit ended: the hang cost it the bound, not its run
        assert learn.recorder.values and len(Spool(tmp_path/'models'/SPOOL_NAME)) == 1
        t = time.monotonic()  # a new connection to the stopped server: given up within the bound too
        with pytest.raises(LedgerError, match='timeout'): Ledger(pg, timeout=bound)
        assert time.monotonic() - t < bound + 2
    finally:
        for pid in server_pids(pm): os.kill(pid, signal.SIGCONT)
    with psycopg.connect(pg, autocommit=True) as con:
        con.execute('DROP TRIGGER stop_server ON runs; DROP FUNCTION stop_server()')
    key = learn.repro_cb.record.run_id
    runs = Ledger(pg).runs(run_key=key)  # the next access sends the spool: the hung write was never committed
    assert len(runs) == 1 and runs.status.iloc[0] == 'completed' and len(Spool(tmp_path/'models'/SPOOL_NAME)) == 0
    assert runs.metrics.iloc[0]['final']['valid_loss'] == float(learn.recorder.values[-1][1])

# --- spooled records reach their ledger from any process ---

OPEN_LEDGER = "import sys; from fastrepro.experiments.ledger import Ledger; Ledger(sys.argv[1])"

def test_spool_reaches_ledger_from_any_process(tmp_path, spool_index):
    from fastrepro.experiments.spool import spool_address
    from fastrepro.cli import main
    folder, away = tmp_path/'ledgers', tmp_path/'away'
    db = folder/'runs.db'
    spooled = lambda name: Spool(tmp_path/name/'models'/SPOOL_NAME)
    def spooled_fit(name):  # a fit while a file stands where the ledger's folder should be
        folder.mkdir(exist_ok=True); folder.rename(away); folder.write_text('down')
        with pytest.warns(LedgerWarning, match='from any process here, sends it'):
            fit(learner(tmp_path/name, ledger=db), 1)
        folder.unlink(); away.rename(folder)
        assert len(spooled(name)) == 1 and spool_index.spools(spool_address(db))
    spooled_fit('a')  # then another script opens the ledger
    r = subprocess.run([sys.executable, '-c', OPEN_LEDGER, str(db)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=hang_limit(10))
    assert r.returncode == 0, r.stderr
    assert len(Ledger(db)) == 1 and len(spooled('a')) == 0 and not spool_index.spools(spool_address(db))
    spooled_fit('b')  # then `fastrepro runs`
    assert main(['runs', '--ledger', str(db)]) == 0 and len(spooled('b')) == 0
    spooled('c').put(spool_address(db), 'c', dict(experiment='exp', status='completed'))  # then a fit elsewhere
    fit(learner(tmp_path/'d', ledger=db), 1)
    runs = Ledger(db).runs()
    assert len(runs) == 4 and runs.run_key.is_unique and set(runs.status) == {'completed'} and len(spooled('c')) == 0
    assert not list(spool_index.path.glob('*.json'))  # every note dropped

# --- full and read-only disks (tmpfs) ---

@pytest.fixture
def tmpfs(tmp_path):
    "A mount point of a 1 MB tmpfs, unmounted at the end; skipped where mounting is not permitted"
    mnt = tmp_path/'tmpfs'; mnt.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', str(mnt)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try: yield mnt
    finally: subprocess.run(['umount', '-l', str(mnt)], check=True)

def fill(folder:Path) -> Path:
    "Fill the file system of `folder` to the last byte; returns the filler file"
    f = folder/'filler'
    fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (4096, 1):  # pages, then the last bytes
            with contextlib.suppress(OSError):
                while True: os.write(fd, b'\0' * size)
    finally: os.close(fd)
    assert shutil.disk_usage(folder).free == 0
    return f

def test_sqlite_ledger_on_full_disk(tmpfs, tmp_path):
    db, spool = tmpfs/'runs.db', Spool(tmp_path/'models'/SPOOL_NAME)
    learn = learner(tmp_path, At(lambda l: fill(tmpfs), it=3), ledger=db)  # the ledger has the running record
    with pytest.warns(LedgerWarning, match=f'The ledger {db} could not record this fit .*full'): fit(learn, 1)
    assert len(spool) == 1
    (tmpfs/'filler').unlink()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        fit(learner(tmp_path, ledger=db), 1)  # reaches the ledger: sends the spool too
    assert not ledger_warnings(ws) and len(spool) == 0
    assert Ledger(db).runs().status.tolist() == ['completed'] * 2
    fill(tmpfs)
    full = r'cannot be written: (database or disk is full|disk I/O error) \(0 bytes free'
    with pytest.raises(LedgerError, match=full):
        Ledger(db).add(dict(experiment='x'))

@pytest.fixture
def readonly(tmp_path):
    "A folder and a read-only view of it (a bind mount), unmounted at the end; skipped where mount is refused"
    rw, ro = tmp_path/'rw', tmp_path/'ro'
    rw.mkdir(); ro.mkdir()
    r = subprocess.run(['mount', '--bind', str(rw), str(ro)], capture_output=True, text=True)
    if r.returncode: pytest.skip(f"cannot bind-mount a folder here (needs root): {r.stderr.strip()}")
    try: yield rw, ro
    finally: subprocess.run(['umount', '-l', str(ro)], check=True)

def test_sqlite_ledger_on_readonly_disk(readonly, tmp_path):
    rw, ro = readonly
    len(Ledger(ro/'runs.db'))  # created while writable
    subprocess.run(['mount', '-o', 'remount,bind,ro', str(ro)], check=True)
    readonly = 'cannot be written: (unable to open database file|attempt to write a readonly)'
    with pytest.warns(LedgerWarning, match=readonly):
        fit(learner(tmp_path, ledger=ro/'runs.db'), 1)
    subprocess.run(['mount', '-o', 'remount,bind,rw', str(ro)], check=True)
    from fastrepro.cli import main
    assert main(['runs', '--sync', str(tmp_path/'models'), '--ledger', str(ro/'runs.db')]) == 0
    assert Ledger(rw/'runs.db').runs().status.tolist() == ['completed']

def same_model(a, b) -> bool:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)

def test_periodic_checkpoints_on_full_disk(tmpfs, tmp_path):
    ref = fit(learner(tmp_path/'ref'))
    kept = {}
    def full(l): fill(tmpfs)
    def keep_newest(l):  # the newest usable checkpoint while the saves fail
        kept.update(info=checkpoint_info(tmpfs/'models'/'checkpoint.pth'))
        (tmp_path/'models').mkdir()
        for f in (tmpfs/'models').glob('checkpoint.*'):  # with the trace file beside it, as a checkpoint is moved
            if f.suffix in ('.pth', '.trace'): shutil.copy(f, tmp_path/'models')
    def free(l): (tmpfs/'filler').unlink()
    cbs = [CheckpointCB(every_iters=4), At(full, it=5), At(keep_newest, it=11), At(free, it=13)]
    learn = learner(tmpfs, *cbs, ledger=tmp_path/'runs.db')
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        fit(learn)  # saves at 8 and 12 fail, at 16 and 20 succeed
    msgs = [str(w.message) for w in ws if 'CheckpointCB' in str(w.message)]
    assert len(msgs) == 1, msgs
    assert 'No space left on device (errno 28 ENOSPC' in msgs[0] and str(tmpfs/'models'/'checkpoint.pth') in msgs[0]
    assert 'bytes free there' in msgs[0] and 'inline_container' not in msgs[0], msgs[0]
    assert kept['info']['iteration'] == 4  # the previous checkpoint intact and loadable
    assert checkpoint_info(tmpfs/'models'/'checkpoint.pth')['iteration'] == 20  # retried: written again
    # the manifest has the checkpoints that were written, not the two the full disk refused
    assert [e['iteration'] for e in read_manifest(tmpfs/'models'/'checkpoint.pth')] == [4, 16, 20]
    assert same_model(learn, ref)  # training went on, unchanged
    events = learn.repro_cb.trace.events
    assert [it for it, _ in events] == [8, 16] and 'ENOSPC' in events[0][1] and 'written again' in events[1][1]
    notes = Ledger(tmp_path/'runs.db').runs().notes.iloc[0]
    assert 'checkpoint not written at iteration 8' in notes and 'ENOSPC' in notes
    # the newest usable checkpoint at the failure resumes bit-identically
    res = learner(tmp_path).load('checkpoint')
    fit(res, start_epoch=kept['info']['epoch'])
    assert same_model(res, ref) and res.repro_trace.loss.tolist() == ref.repro_trace.loss.tolist()
    # a user's save on the full disk raises in the same plain words
    fill(tmpfs)
    with pytest.raises(CheckpointWriteError, match=r'Could not write the checkpoint .*mine.pth: No space left on '
                       r'device \(errno 28 ENOSPC; 0 bytes free there\); there is no previous mine.pth') as e:
        learn.save('mine')
    assert '\n' not in str(e.value) and not list((tmpfs/'models').glob('.fastrepro-tmp-*'))
    learn.load('checkpoint')  # a checkpoint on a full disk loads

def test_sigterm_save_on_full_disk(tmpfs, capsys):
    cbs = [CheckpointCB(every_iters=4), At(lambda l: fill(tmpfs), it=6),
           At(lambda l: os.kill(os.getpid(), signal.SIGTERM), it=7)]
    with pytest.raises(SystemExit) as e: fit(learner(tmpfs, *cbs))
    assert e.value.code == SAVE_FAILED_EXIT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith('fastrepro: SIGTERM: the checkpoint at epoch 0, after 8 of')
    assert 'No space left on device' in err and f'Exiting with status {SAVE_FAILED_EXIT}.' in err
    assert f"The newest usable checkpoint is {tmpfs/'models'/'checkpoint.pth'} (epoch 0, after 4 batches)" in err
    assert checkpoint_info(tmpfs/'models'/'checkpoint.pth')['iteration'] == 4  # intact

class Stop0(Callback):
    order = 100
    def after_epoch(self):
        if self.epoch == 0: raise CancelFitException()

def test_resumed_fit_continues_its_spooled_record(tmp_path):
    (tmp_path/'down').write_text('a file where the ledger folder should be: the ledger cannot be reached')
    db, spool = tmp_path/'down'/'runs.db', Spool(tmp_path/'models'/SPOOL_NAME)
    learn = learner(tmp_path, Stop0(), ledger=db)
    with pytest.warns(LedgerWarning): fit(learn)
    learn.save('ck')
    res = learner(tmp_path, ledger=db).load('ck')
    with pytest.warns(LedgerWarning): fit(res, start_epoch=1)
    [(key, _, rec, _)] = spool.records()
    assert (key, rec['status'], rec['notes']) == (learn.repro_cb.record.run_id, 'completed', 'resumed at epoch 1')
    (tmp_path/'down').unlink()
    fit(learner(tmp_path, ledger=db), 1)  # the next fit here that reaches the ledger sends the spool
    runs = Ledger(db).runs(run_key=key)
    assert len(Ledger(db)) == 2 and len(spool) == 0
    assert (runs.status.iloc[0], runs.notes.iloc[0]) == ('completed', 'resumed at epoch 1')
    assert runs.metrics.iloc[0]['final']['valid_loss'] == float(res.recorder.values[-1][1])

def test_format3_checkpoint_names_its_record_by_id(tmp_path):
    "A checkpoint of format 3 names its ledger record by the ledger's id: a resume continues that record, keyed now"
    from fastrepro.all import FitRecord
    ledger = Ledger(tmp_path/'runs.db')
    old = ledger.add(dict(experiment='exp', seed=3, status='interrupted', duration=2.5))
    learn = fit(synth_learner(path=tmp_path), 1)
    rec = FitRecord(ledger, 'exp')
    rec.start(learn, seed=3, fit=0, start_epoch=1, prov={}, resumed=old); rec.end(learn)
    runs = ledger.runs()
    assert len(runs) == 1 and runs.run_key.iloc[0] == rec.run_id
    assert (runs.status.iloc[0], runs.notes.iloc[0]) == ('completed', 'resumed at epoch 1')
    assert runs.duration.iloc[0] > 2.5  # the earlier segment's time and this one's
