"""The trackers, real and in fresh processes (`tests/tracker_job.py`): a small tabular run with fastrepro's fp16,
fastai's `CSVLogger`, `TensorBoardCallback` and `WandbCallback` (offline), and an MLflow run on a real `mlflow
server` (SQLite, on 127.0.0.1), trained straight once; and once killed by SIGKILL inside an epoch, two iterations
after its last periodic checkpoint, then run again (`CheckpointCB(autoresume=True)` continues it). Read back with
each tracker's own reader: `history.csv` is the uninterrupted run's; TensorBoard's `EventAccumulator` shows every
scalar at the uninterrupted run's steps with its values, each once, and the provenance; the W&B run's offline files
hold the provenance in its config and summary, and the resumed process continued the same run id at the checkpoint's
step, with the uninterrupted run's values; MLflow's run holds the provenance tags and artifacts, the resumed fit
continued it, no step twice. The ledger names the tracker runs. A `reproduce` verdict is logged in the uninterrupted
run's three tracker runs, read back with their readers. Without the trackers importable, fastrepro imports none and a
fit runs as before."""
import glob, json, os, signal, socket, struct, subprocess, sys
from pathlib import Path
import pytest
from conftest import ROOT, run_py, hang_limit

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

JOB = ROOT/'tests'/'tracker_job.py'
N_EPOCH, EVERY, N_ITER = 3, 3, 4  # as in tracker_job.py: 4 training batches an epoch, a checkpoint every 3
KILL = 2*EVERY + 2  # inside epoch 1 (iterations 5-8), two iterations after the checkpoint of iteration 6
JOB_TIMEOUT_S = hang_limit(30)  # one process of the job (about 20 s on a loaded 2-core machine)
TRACKERS = ('--csv', '--tensorboard', '--wandb', '--mlflow', '--fp16')
# no tracker's telemetry or network look-ups: the tests run offline, and MLflow's wait at exit for a blocked network
QUIET = dict(WANDB_MODE='offline', WANDB_SILENT='true', MLFLOW_DISABLE_TELEMETRY='true', DO_NOT_TRACK='true',
             MLFLOW_SERVER_ENABLE_JOB_EXECUTION='false')  # the server's job runners (7 processes): none is used
os.environ.setdefault('MLFLOW_DISABLE_TELEMETRY', 'true')  # this process reads the MLflow run back, offline too
WANDB_HEADER, WANDB_BLOCK, WANDB_RECORD_HEADER = b':W&B', 32768, 7  # the layout of W&B's offline `.wandb` files
WANDB_FULL, WANDB_LAST = 1, 4  # a record's kind: whole, or the last piece of one split over blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.fixture(scope='module')
def mlflow_server(tmp_path_factory):
    "The URL of an MLflow tracking server (SQLite backend, artifacts served) on 127.0.0.1, for this module"
    pytest.importorskip('mlflow', reason="MLflow is missing: pip install -e '.[dev]'")
    folder, port = tmp_path_factory.mktemp('mlflow'), free_port()
    log = open(folder/'server.log', 'w')
    p = subprocess.Popen([sys.executable, '-m', 'mlflow', 'server', '--host', '127.0.0.1', '--port', str(port),
                          '--backend-store-uri', f'sqlite:///{folder}/mlflow.db', '--artifacts-destination',
                          str(folder/'artifacts'), '--workers', '1'], cwd=folder, stdout=log, stderr=subprocess.STDOUT,
                         env={**os.environ, **QUIET}, start_new_session=True)
    try: yield f'http://127.0.0.1:{port}'  # the job waits for it to answer (`tracker_job.py`): it starts meanwhile
    finally:
        os.killpg(p.pid, signal.SIGKILL)  # its data is thrown away: no need to wait for a clean shutdown
        p.wait(timeout=hang_limit(3))
        log.close()


def job(folder:Path, *args, env=None, status=0):
    "Run one process of the job in `folder`; check how it ended (0, or killed by SIGKILL)"
    folder.mkdir(exist_ok=True)
    e = {**os.environ, **QUIET, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]),
         **(env or {})}
    p = subprocess.run([sys.executable, str(JOB), *args], cwd=folder, env=e, capture_output=True, text=True,
                       timeout=JOB_TIMEOUT_S)
    assert p.returncode == status, f"exit {p.returncode}: {p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p


def dirty_repository(folder:Path):
    "`folder`, a git repository whose committed `settings.py` is changed: its runs record a commit, dirty, and a patch"
    folder.mkdir()
    git = lambda *args: subprocess.run(['git', '-C', str(folder), '-c', 'user.email=test@example.com', '-c',
                                        'user.name=test', *args], check=True, capture_output=True)
    (folder/'.gitignore').write_text('*\n!.gitignore\n!settings.py\n')  # what the runs write is not code
    (folder/'settings.py').write_text('LR = 1e-2\n')
    git('init', '-q'); git('add', '-A'); git('commit', '-qm', 'settings')
    (folder/'settings.py').write_text('LR = 2e-2\n')


@pytest.fixture(scope='module')
def runs(mlflow_server, tmp_path_factory, fastai_home):
    "The uninterrupted run (ref), and the run killed at iteration KILL and run again (run); each with every tracker"
    for m in ('tensorboard', 'wandb'): pytest.importorskip(m, reason=f"{m} is missing: pip install -e '.[dev]'")
    top = tmp_path_factory.mktemp('trackers')
    for f in ('ref', 'run'): dirty_repository(top/f)
    env = dict(MLFLOW_TRACKING_URI=mlflow_server)
    job(top/'ref', *TRACKERS, '--ledger', str(top/'ref'/'runs.db'), env=env)
    job(top/'run', *TRACKERS, '--ledger', str(top/'run'/'runs.db'), env={**env, 'TRACKER_KILL': str(KILL)}, status=-9)
    resumed = job(top/'run', *TRACKERS, '--ledger', str(top/'run'/'runs.db'), env=env)
    assert 'fit 0 continues where an earlier run stopped it: epoch 1, after 2 batch(es)' in resumed.stdout
    return top/'ref', top/'run', mlflow_server


def test_same_weights_and_history_csv(runs):
    ref, run, _ = runs
    assert (run/'final.txt').read_text() == (ref/'final.txt').read_text()
    rows = lambda f: [l.rsplit(',', 1)[0] for l in f.read_text().splitlines()]  # without `time`, the epoch's duration
    assert rows(run/'history.csv') == rows(ref/'history.csv')
    assert rows(ref/'history.csv')[0] == 'epoch,train_loss,valid_loss,accuracy'
    assert len(rows(ref/'history.csv')) == N_EPOCH + 1



def tensorboard(folder:Path):
    "TensorBoard's reader of the one log folder fastai's callback made in `folder` (`runs/...`)"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logs = glob.glob(str(folder/'runs'/'*'))
    assert len(logs) == 1, logs
    ea = EventAccumulator(logs[0]); ea.Reload()
    return ea


def test_tensorboard(runs):
    ref, run, _ = runs
    a, b = tensorboard(ref), tensorboard(run)
    tags = a.Tags()['scalars']
    assert {'train_loss', 'valid_loss', 'lr_0', 'fastrepro/loss_scale', 'fastrepro/overflow'} <= set(tags)
    assert sorted(b.Tags()['scalars']) == sorted(tags)
    for t in tags: assert [(e.step, e.value) for e in b.Scalars(t)] == [(e.step, e.value) for e in a.Scalars(t)], t
    assert [e.step for e in b.Scalars('fastrepro/loss_scale')] == list(range(1, N_EPOCH*N_ITER + 1))
    texts = b.Tensors('fastrepro/provenance/text_summary')
    assert [e.step for e in texts] == [0, 2*EVERY]  # the first process's, the resumed one's at its checkpoint
    text = texts[-1].tensor_proto.string_val[0].decode()
    assert '| seed | 5 |' in text and '| env_hash | ' in text, text
    assert '| dirty | True |' in text and '| commit | ' in text and '| commit | None |' not in text, text
    patch, = glob.glob(str(run/'runs'/'*'/'fastrepro-patch-*.diff'))
    assert '+LR = 2e-2' in Path(patch).read_text()


def wandb_records(path):
    "The records of a W&B offline run file (`run-ID.wandb`), as W&B's protobuf messages"
    from wandb.proto import wandb_internal_pb2 as pb
    data = Path(path).read_bytes()
    assert data[:4] == WANDB_HEADER, data[:8]
    pos, buf = WANDB_RECORD_HEADER, b''
    while pos + WANDB_RECORD_HEADER <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < WANDB_RECORD_HEADER: pos += left; continue  # a block's padding
        _, n, kind = struct.unpack('<IHB', data[pos:pos + WANDB_RECORD_HEADER])
        pos += WANDB_RECORD_HEADER
        buf += data[pos:pos + n]; pos += n
        if kind in (WANDB_FULL, WANDB_LAST):
            r = pb.Record(); r.ParseFromString(buf); buf = b''
            yield r


def wandb_run(file) -> dict:
    "A W&B offline run: its id, config and summary updates, and its history rows by step"
    res = dict(id=None, config={}, summary={}, history={}, artifacts=[])
    for r in wandb_records(file):
        kind = r.WhichOneof('record_type')
        if kind == 'run': res['id'] = r.run.run_id
        elif kind == 'artifact':
            res['artifacts'].append((r.artifact.type, [m.path for m in r.artifact.manifest.contents]))
        elif kind == 'config': res['config'].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == 'summary':
            res['summary'].update({i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in r.summary.update})
        elif kind == 'history':
            row = {i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            res['history'].setdefault(r.history.step.num, {}).update(row)
    return res


def wandb_runs(folder:Path) -> list:
    "The W&B offline runs in `folder`, oldest first: (run id, from the run's folder name; its file)"
    files = sorted(glob.glob(str(folder/'wandb'/'offline-run-*'/'run-*.wandb')))
    return [(Path(f).parent.name.rsplit('-', 1)[1], f) for f in files]


def test_wandb(runs):
    ref, run, _ = runs
    from fastrepro.experiments.ledger import Ledger
    # the killed process's run, the one the resumed process started (finished at once, empty), the run continued
    (killed, _), (new, new_file), (resumed_id, resumed_file) = wandb_runs(run)
    resumed = wandb_run(resumed_file)
    assert resumed_id == resumed['id'] == killed != new and not wandb_run(new_file)['history']
    want = wandb_run(wandb_runs(ref)[0][1])  # the run itself (a verdict logged later continues it in a new file)
    for r, folder in ((resumed, run), (want, ref)):
        prov, key = r['config']['fastrepro'], Ledger(folder/'runs.db').runs().iloc[0].run_key
        assert prov['seed'] == 5 and prov['env_hash'] and prov['commit'] and prov['dirty'] and prov['ledger_run'] == key
        assert r['artifacts'] == [('code', ['patch.diff'])]
        assert r['summary']['fastrepro/seed'] == 5 and r['summary']['fastrepro/env_hash'] == prov['env_hash']
    # the resumed run continues at the checkpoint's step (W&B counts from 0) with the uninterrupted run's values; what
    # the killed process logged before is in its file as far as W&B had written it when SIGKILL came (often nothing)
    assert sorted(resumed['history']) == [s for s in sorted(want['history']) if s >= 2*EVERY]
    for s, row in resumed['history'].items():
        for k in ('train_loss', 'raw_loss', 'lr_0', 'epoch', 'valid_loss', 'fastrepro/loss_scale',
                  'fastrepro/overflow'): assert row.get(k) == want['history'][s].get(k), (s, k)
    assert 'fastrepro/loss_scale' in want['history'][0]  # logged with commit=False into WandbCallback's step


def test_mlflow(runs, tmp_path):
    ref, run, url = runs
    import mlflow
    client = mlflow.MlflowClient(url)
    exp = client.get_experiment_by_name('fastrepro-test')
    found = client.search_runs([exp.experiment_id])  # active runs: the one the resumed process began is deleted
    by_folder = {r.info.run_name: r for r in found}  # the job names its run after its folder
    assert sorted(by_folder) == ['ref', 'run'], by_folder.keys()
    want, got = by_folder['ref'], by_folder['run']
    for r in (want, got):
        tags = r.data.tags
        assert tags['fastrepro.seed'] == '5' and tags['fastrepro.env_hash'] and tags['fastrepro.dirty'] == 'True'
        assert [a.path for a in client.list_artifacts(r.info.run_id, 'fastrepro') if not a.is_dir] == [
            f"fastrepro/patch-{tags['fastrepro.patch_hash']}.diff", 'fastrepro/provenance.json']
    name = f"fastrepro/patch-{got.data.tags['fastrepro.patch_hash']}.diff"
    patch = client.download_artifacts(got.info.run_id, name, str(tmp_path))
    assert '+LR = 2e-2' in Path(patch).read_text()
    for key in ('fastrepro/loss_scale', 'fastrepro/overflow'):
        a, b = (client.get_metric_history(r.info.run_id, key) for r in (want, got))
        assert [m.step for m in b] == list(range(N_EPOCH*N_ITER)), [m.step for m in b]  # no step twice
        assert sorted((m.step, m.value) for m in b) == sorted((m.step, m.value) for m in a)
    assert client.search_runs([exp.experiment_id], run_view_type=mlflow.entities.ViewType.DELETED_ONLY)


def test_ledger_names_the_runs(runs):
    ref, run, url = runs
    from fastrepro.experiments.ledger import Ledger
    rec = Ledger(run/'runs.db').runs().iloc[0]
    assert rec.status == 'completed' and len(Ledger(run/'runs.db')) == 1  # the resumed fit continued the record
    tr = rec.trackers
    assert sorted(tr) == ['csv', 'mlflow', 'tensorboard', 'wandb']
    assert tr['csv'] == str(run/'history.csv') and tr['tensorboard'].startswith(str(run/'runs'))
    assert tr['mlflow'].startswith(url) and tr['wandb'].endswith('/' + wandb_runs(run)[0][0])


def test_reproduce_verdict_in_the_runs(runs, tmp_path):
    ("`reproduce` of the uninterrupted run, re-run without trackers, logs its verdict in that run's TensorBoard log "
     "folder at the checkpoint's step, its W&B run's summary (continued by id, offline) and its MLflow run's tags and "
     "artifacts; the report says where")
    ref, _, url = runs
    import mlflow
    from fastrepro.check.reproduce import reproduce
    from fastrepro.checkpoint.file import checkpoint_info
    checkpoint = ref/'models'/'checkpoint.pth'
    saved = checkpoint_info(checkpoint)['trackers']
    res = reproduce(checkpoint, tmp_path, command=f'{sys.executable} {JOB} --csv --fp16', env=QUIET, show=False)
    assert res.verdict == 'reproduced bit for bit', res.verdict  # the tracker runs are not what is compared
    wandb_id, run_id = saved['wandb']['id'], saved['mlflow']['run_id']
    assert res.trackers == [f"logged in the tensorboard run {saved['tensorboard']['log_dir']}",
                            f"logged in the wandb run {saved['wandb']['project']}/{wandb_id}",
                            f"logged in the mlflow run {url}#{run_id}"], res.trackers
    assert f"- trackers: verdict logged in the mlflow run {url}#{run_id}" in (tmp_path/'report.md').read_text()
    texts = tensorboard(ref).Tensors('fastrepro/reproduce/text_summary')
    assert [(e.step, e.tensor_proto.string_val[0].decode()) for e in texts] == [(N_EPOCH*N_ITER, res.verdict)]
    (first, _), (again, file) = wandb_runs(ref)  # the run, and the same run continued to log the verdict
    assert first == again == wandb_id and wandb_run(file)['summary']['fastrepro/reproduce'] == res.verdict
    client = mlflow.MlflowClient(url)
    assert client.get_run(run_id).data.tags['fastrepro.reproduce'] == res.verdict
    assert [a.path for a in client.list_artifacts(run_id, 'fastrepro/reproduce')] == [
        'fastrepro/reproduce/report.json', 'fastrepro/reproduce/report.md']


BLOCKER = """
import sys
class Blocker:
    "No tracker can be imported"
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorboard', 'wandb', 'mlflow'): raise ImportError(f'{name} is hidden')
sys.meta_path.insert(0, Blocker())
"""


def test_no_tracker_installed(tmp_path):
    "With the trackers hidden, fastrepro imports, trains, checkpoints and resumes; no tracker module is loaded"
    out = run_py(BLOCKER + """
import torch
from fastai.test_utils import synth_learner
from fastai.callback.progress import CSVLogger
from fastrepro.all import *
try: import tensorboard
except ImportError: pass
else: raise AssertionError('tensorboard was importable')
learn = synth_learner(path='.', cbs=[ReproCB(seed=1, allow_dirty=True), CheckpointCB(every_iters=3), CSVLogger()])
with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
assert sorted(checkpoint_info('models/checkpoint.pth')['trackers']) == ['csv']
from fastrepro.record.trackers import note_runs
saved = {'tensorboard': {'log_dir': '.', 'step': 0}, 'wandb': {'id': 'w1'}, 'mlflow': {'run_id': 'm1'}}
for line in note_runs(saved, 'reproduce', 'reproduced bit for bit'): print(line)
print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'wandb', 'mlflow')))
""", cwd=tmp_path)
    assert out.strip().splitlines()[-1] == '[]', out
    for run in ('tensorboard run .', 'wandb run w1', 'mlflow run m1'):  # a verdict is not logged, and says why
        assert f"not logged in the {run}: the tracker cannot be imported here" in out, out
