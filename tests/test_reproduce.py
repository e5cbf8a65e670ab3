"""`fastrepro reproduce` (issue 23) on real training scripts in real git repositories, in temporary folders: a run with
an uncommitted change and an untracked module, two learners and several fits, reproduced bit for bit after the checkout
moved on, the checkout untouched; runs that part (another thread count, a variable the script reads and the record
does not hold) at the right iteration; bad input in one line; a reproduce killed while it re-runs leaves no worktree."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
import torch
from conftest import ROOT, hang_limit

from fastrepro.checkpoint.file import checkpoint_info, read_checkpoint, split_state, Checkpoint
from fastrepro.checkpoint.formats import pack_git
from fastrepro.state.core import digest
from fastrepro.cli import main
from fastrepro.check.reproduce import reproduce, reproduce_segments, segments_verdict, _ledger_run
from fastrepro.check.rebuild import EXIT_PARTS, EXIT_FAILED
from fastrepro.check.rerun import _threads
from fastrepro.checkpoint.manifest import read_manifest, checkpoint_digests
from fastrepro.experiments.ledger import Ledger

pytestmark = pytest.mark.slow  # trains and re-runs in fresh processes: the inner loop (-m "not slow") skips it

RUN_TIMEOUT_S = hang_limit(30)  # stops a hang of one training process: a fastai import (about 5 s), a few tiny fits
POLL_S = 0.2  # how often the kill test looks for the worktree
NUDGE_FIT, NUDGE_ITER = 1, 2  # where TRAIN_NUDGE (read by the script, not recorded) scales the gradient
TWO_THREADS = {'OMP_NUM_THREADS': '2', 'MKL_NUM_THREADS': '2'}  # torch reads the second over the first

TRAIN = '''"Two learners (a language model, then a classifier fitted three times) as a fastai user's script"
import os
from fastai.basics import *
from fastai.test_utils import synth_learner, RegModel
from fastrepro.all import ReproCB, CheckpointCB, FitRecord, Ledger
import helpers  # an untracked module: its constant is in the patch

class Classifier(RegModel):
    "RegModel plus a term whose value depends on the thread count (a parallel mean of a million squares)"
    def __init__(self):
        super().__init__()
        self.c = nn.Parameter(torch.zeros(1))
        self.register_buffer('big', torch.randn(1_000_003, generator=torch.Generator().manual_seed(0)),
                             persistent=False)
    def forward(self, x): return super().forward(x) + self.c * (self.big * helpers.SCALE).pow(2).mean()

class Nudge(Callback):
    "Scales the gradient at one iteration by TRAIN_NUDGE, a variable no record holds"
    def after_loss(self):
        nudge = float(os.environ.get('TRAIN_NUDGE', '0'))
        if (self.repro_cb.position.fit, self.train_iter) == (%d, %d): self.learn.loss_grad = self.loss_grad*(1 + nudge)

lm = synth_learner(n_trn=4, path='.', cbs=ReproCB(seed=1, allow_dirty=True))
with lm.no_bar(), lm.no_logging(): lm.fit(1, 1e-2)
lm.save('lm')
repro = ReproCB(seed=2, allow_dirty=True, ledger=FitRecord(Ledger('runs.db'), 'synth'))
clf = synth_learner(n_trn=4, path='.', model=Classifier(), cbs=[repro, Nudge(), CheckpointCB(every_iters=3, keep=2)])
with clf.no_bar(), clf.no_logging():
    clf.fit(1, 1e-2); clf.fit(1, 1e-3); clf.fit(2, 1e-3)  # the last fit is the third of the classifier
''' % (NUDGE_FIT, NUDGE_ITER)


def _git(root, *args):
    return subprocess.run(['git', *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _repo(root:Path, files:dict) -> Path:
    "A git repository in `root` with `files` committed"
    root.mkdir(parents=True)
    _git(root, 'init', '-q', '-b', 'main')
    _git(root, 'config', 'user.name', 'tests'); _git(root, 'config', 'user.email', 'tests@fastrepro.invalid')
    for name, text in files.items(): (root/name).write_text(text)
    _git(root, 'add', '-A'); _git(root, 'commit', '-qm', 'initial')
    return root


def _env(**more):
    return {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]),
            'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'MPLBACKEND': 'Agg', **more}


def _state(root) -> tuple:
    "What a reproduce must not change in the user's repository"
    return (_git(root, 'status', '--porcelain', '--untracked-files=all'), _git(root, 'rev-parse', 'HEAD'),
            _git(root, 'branch', '--list'), _git(root, 'worktree', 'list', '--porcelain'),
            (root/'.git'/'index').read_bytes(), sorted(p.name for p in (root/'models').iterdir()))


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    "The script run once with an uncommitted change and an untracked module; then the checkout moves on"
    root = _repo(tmp_path_factory.mktemp('reproduce')/'proj', {'train.py': 'raise SystemExit("not yet")\n',
                                                                '.gitignore': '__pycache__/\n/models/\n/runs.db\n'})
    (root/'train.py').write_text(TRAIN); (root/'helpers.py').write_text('SCALE = 2.0\n')
    p = subprocess.run([sys.executable, 'train.py'], cwd=root, env=_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    _git(root, 'add', '-A'); _git(root, 'commit', '-qm', 'the script')  # the checkout moves on: a commit,
    (root/'train.py').write_text('print("rewritten")\n'); (root/'helpers.py').unlink()  # an edit, a deleted file
    return root, root/'models'/'checkpoint.pth'


def test_reproduced_bit_for_bit_after_the_checkout_moved_on(trained, tmp_path, capsys, monkeypatch):
    root, ckpt = trained
    info = checkpoint_info(ckpt)
    assert (info['fit'], info['epoch'], info['batch'], info['iteration']) == (2, 1, 2, 6)
    assert info['git']['dirty'] and info['git']['untracked'] == ['helpers.py']
    before = _state(root)
    monkeypatch.setenv('PYTHONPATH', str(ROOT))
    assert main(['reproduce', str(ckpt), '--out', str(tmp_path/'out'), '--ledger', str(root/'runs.db')]) == 0
    out = capsys.readouterr().out
    assert 'reproduced bit for bit' in out and 'environment: predicted before the re-run: bit-identical\n' in out
    assert _state(root) == before
    report = json.loads((tmp_path/'out'/'report.json').read_text())
    assert report['verdict'] == 'reproduced bit for bit' and set(report['quantities'].values()) == {None}
    assert {'trace', 'weights', 'optimizer state', 'loss-scale history'} <= set(report['quantities'])
    assert report['position'] == dict(fit=2, epoch=1, batch=2, iteration=6)
    for f in ('report.md', 'report.png', 'rerun.log', 'checkpoints/models/lm.pth', 'checkpoints/models/checkpoint.pth'):
        assert (tmp_path/'out'/f).is_file(), f
    assert 'reproduced bit for bit' in (tmp_path/'out'/'report.md').read_text()
    assert report['ledger_run'] == 3  # the classifier's third fit: its third record, named by its key in the checkpoint
    assert _ledger_run(Checkpoint(ckpt)) == Ledger(root/'runs.db').runs(id=3).run_key.iloc[0]
    assert main(['runs', '--ledger', str(root/'runs.db')]) == 0  # the verdict beside the run
    line = next(l for l in capsys.readouterr().out.splitlines() if l.split()[0] == '3')
    assert line.endswith(f"reproduced bit for bit (#{report['record']})"), line


def test_another_thread_count_parts_at_the_first_iteration(trained, tmp_path, monkeypatch):
    root, ckpt = trained
    monkeypatch.setenv('PYTHONPATH', str(ROOT))
    r = reproduce(ckpt, tmp_path/'out', env=TWO_THREADS, show=False)
    if _threads(TWO_THREADS) < 2:  # torch takes no more threads than CPUs: 1 again, as predicted
        assert (r.exit_code, r.prediction) == (0, 'predicted before the re-run: bit-identical'), (r.verdict,
                                                                                                   r.prediction)
        pytest.skip('torch runs one thread here whatever OMP_NUM_THREADS asks: no other thread count to part with')
    # `c` starts at 0: the first loss is the same, the first step of `c` (the gradient holds the mean) is not
    assert r.exit_code == EXIT_PARTS and r.parts == dict(fit=0, epoch=0, iter=0, quantity='the norm of c'), r.verdict
    assert r.verdict.startswith('parts at fit 0, epoch 0, iteration 0, first in the norm of c; explained by the '
                                'environment: num_threads 1 -> 2'), r.verdict
    # predicted, and what the re-run recorded: the prediction held
    assert r.prediction == 'predicted before the re-run: other bits (num_threads 1 -> 2 in a fresh interpreter)'
    assert '| num_threads | 1 | 2 | yes | 2 |\n' in (tmp_path/'out'/'report.md').read_text()
    assert (tmp_path/'out'/'report.png').is_file()


def test_a_variable_the_record_does_not_hold_parts_where_the_script_reads_it(trained, tmp_path, monkeypatch):
    root, ckpt = trained
    monkeypatch.setenv('PYTHONPATH', str(ROOT)); monkeypatch.setenv('TRAIN_NUDGE', '0.5')
    # ledger run 3 (the classifier's third fit), from its newest checkpoint
    r = reproduce(None, tmp_path/'out', ledger=root/'runs.db', run=3, show=False)
    assert r.exit_code == EXIT_PARTS and r.position['fit'] == 2, r.verdict
    rec = Ledger(root/'runs.db').runs(id=r.record).iloc[0]
    assert (rec.status, rec.tags['reproduces'], rec.notes, rec.data_fingerprint) == (
        'reproduction', 3, r.verdict, Ledger(root/'runs.db').runs(id=3).data_fingerprint.iloc[0])
    assert r.data == 'same'
    # the gradient of iteration 2 changes: the loss of iteration 3 is the first that differs
    assert r.parts == dict(fit=NUDGE_FIT, epoch=0, iter=NUDGE_ITER + 1, quantity='loss'), r.verdict
    assert 'no recorded difference of the environment explains it' in r.verdict and r.env_after == []
    if _threads(TWO_THREADS) > 1:  # another thread count is possible here
        with pytest.raises(Exception, match=r'strict: predicted before the re-run: other bits \(num_threads 1 -> 2'):
            reproduce(ckpt, tmp_path/'strict', env=TWO_THREADS, strict=True, show=False)


# the script sets its own thread count before anything else: a fresh interpreter's is not the one it trains with
PINNED = 'import torch\ntorch.set_num_threads(1)  # the script pins its own threads\n' + TRAIN


def test_a_script_that_sets_its_threads_itself_reproduces_against_the_prediction(tmp_path, monkeypatch):
    "Predicted other bits (2 threads in a fresh interpreter); the re-run recorded 1 thread: the report says so (#58)"
    root = _repo(tmp_path/'proj', {'train.py': PINNED, 'helpers.py': 'SCALE = 2.0\n',
                                   '.gitignore': '__pycache__/\n/models/\n/runs.db\n'})
    p = subprocess.run([sys.executable, 'train.py'], cwd=root, env=_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = root/'models'/'checkpoint.pth'
    assert checkpoint_info(ckpt)['env']['num_threads'] == 1
    if _threads(TWO_THREADS) < 2: pytest.skip('torch runs one thread here whatever OMP_NUM_THREADS asks: nothing '
                                              'other to predict')
    monkeypatch.setenv('PYTHONPATH', str(ROOT))
    r = reproduce(ckpt, tmp_path/'out', env=TWO_THREADS, show=False)
    # the model parts with 2 threads (test_another_thread_count_parts_at_the_first_iteration): the re-run ran 1
    assert (r.exit_code, r.verdict) == (0, 'reproduced bit for bit'), r.verdict
    assert [d for d in r.env_after if d['bits']] == [], r.env_after
    assert r.prediction == ('predicted before the re-run: other bits (num_threads 1 -> 2 in a fresh interpreter); it '
                            'did not hold: the re-run ran num_threads 1: no difference that changes bits'), r.prediction
    report = (tmp_path/'out'/'report.md').read_text()
    assert '| num_threads | 1 | 1 | no | 2 |\n' in report, report  # recorded, re-run, changes bits, predicted
    assert f'- environment: {r.prediction}\n' in report and 'expected because' not in report, report
    assert json.loads((tmp_path/'out'/'report.json').read_text())['prediction'] == r.prediction


def test_segments_verified_side_by_side_on_a_process_pool(trained, tmp_path, monkeypatch):
    root, ckpt = trained
    monkeypatch.setenv('PYTHONPATH', str(ROOT))
    # the manifest: every checkpoint CheckpointCB wrote, also the two that keep=2 deleted
    man = read_manifest(ckpt)
    assert [(e['fit'], e['iteration']) for e in man] == [(0, 3), (1, 3), (2, 3), (2, 6)]
    assert [checkpoint_digests(f) for f in (ckpt.with_name('checkpoint.1.pth'), ckpt)] == man[2:]
    # from the start to the first (deleted: by its digests), from checkpoint.1 to the newest (kept: in full)
    res = reproduce_segments(ckpt, tmp_path/'out', workers=2)
    assert [(r.position['fit'], r.position['iteration']) for r in res] == [(0, 3), (2, 6)]
    assert segments_verdict(res) == ('reproduced bit for bit in 2 segments', 0), [r.verdict for r in res]
    assert res[0].checkpoint.endswith("checkpoint.digests.jsonl (a deleted checkpoint's digests)")
    assert res[0].quantities == dict.fromkeys(['trace', 'weights', 'optimizer state', 'generator states'])
    assert (tmp_path/'out'/'segment-1'/'report.json').is_file()
    assert _git(root, 'worktree', 'list').count('\n') == 1


def test_segments_verified_on_a_dask_cluster(trained, tmp_path, monkeypatch):
    dask = pytest.importorskip('dask')
    distributed = pytest.importorskip('distributed')
    root, ckpt = trained
    monkeypatch.setenv('PYTHONPATH', str(ROOT))  # before the cluster starts: its workers start the re-runs
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host='127.0.0.1',
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        res = reproduce_segments(ckpt, tmp_path/'out', executor=client.get_executor())
    assert segments_verdict(res) == ('reproduced bit for bit in 2 segments', 0), [r.verdict for r in res]


def _one_line_error(capsys, *argv) -> str:
    assert main(['reproduce', *map(str, argv)]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('fastrepro reproduce: '), err
    return err


def test_bad_input_exits_2_with_one_line(trained, tmp_path, capsys):
    root, ckpt = trained
    (tmp_path/'truncated.pth').write_bytes(ckpt.read_bytes()[:5000])
    assert 'truncated, corrupt' in _one_line_error(capsys, tmp_path/'truncated.pth')
    other = _repo(tmp_path/'other', {'README': 'another project\n'})
    assert 'is not in the repository' in _one_line_error(capsys, ckpt, '--repo', other, '--out', tmp_path/'o')
    assert 'No git repository at' in _one_line_error(capsys, ckpt, '--repo', tmp_path, '--out', tmp_path/'o')
    state = read_checkpoint(ckpt)  # a checkpoint whose patch, with a matching hash, is not the commit's
    model, opt, extra = split_state(state)
    prov = extra['callbacks']['repro_cb']['provenance']
    git = checkpoint_info(ckpt)['git']
    patch = git['patch'].replace('-raise SystemExit("not yet")', '-raise SystemExit("never")')
    prov['git'] = pack_git({**git, 'patch': patch, 'diff_hash': digest(patch.encode(), None)})
    state['opt']['__fastrepro__'] = extra
    torch.save(state, tmp_path/'altered.pth')
    # altered after it was signed: refused before anything runs (issue 49); trusted, its patch does not apply
    assert 'its signature does not verify' in _one_line_error(capsys, tmp_path/'altered.pth', '--out', tmp_path/'o')
    assert 'does not apply to commit' in _one_line_error(capsys, tmp_path/'altered.pth', '--out', tmp_path/'o',
                                                         '--trust')
    assert _git(root, 'worktree', 'list').count('\n') == 1


def test_a_killed_reproduce_leaves_no_worktree(trained, tmp_path):
    root, ckpt = trained
    before = _state(root)
    p = subprocess.Popen([sys.executable, '-m', 'fastrepro.cli', 'reproduce', str(ckpt), '--out', str(tmp_path/'out')],
                         env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not ((tmp_path/'out'/'rerun.log').exists() and _git(root, 'worktree', 'list').count('\n') == 2):
        assert time.monotonic() < deadline and p.poll() is None, 'the re-run never started'
        time.sleep(POLL_S)
    p.send_signal(signal.SIGTERM)
    assert p.wait(RUN_TIMEOUT_S) == 128 + signal.SIGTERM
    assert _state(root) == before
    assert not (tmp_path/'out'/'reproduced.pth').exists()


NOTEBOOK = ['from fastai.basics import *\nfrom fastai.test_utils import synth_learner',
            'from fastrepro.all import ReproCB, seed_everything',
            'seed_everything(4)  # a kernel starts its generators from the clock: seeded before the model and data',
            "learn = synth_learner(n_trn=3, path='.', cbs=ReproCB(seed=4))",
            'with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)',
            "learn.save('nb')"]


def test_a_notebook_run_replayed_in_a_fresh_kernel(tmp_path, monkeypatch):
    nbformat, nbclient = pytest.importorskip('nbformat'), pytest.importorskip('nbclient')
    pytest.importorskip('ipykernel', reason='a Jupyter kernel (ipykernel, in the dev extras)')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    root = _repo(tmp_path/'proj', {'explore.ipynb': nbformat.writes(nb) + '\n',
                                   '.gitignore': '__pycache__/\n/models/\n'})
    for k, v in _env().items(): monkeypatch.setenv(k, v)
    nbclient.NotebookClient(nb, kernel_name='python3', timeout=RUN_TIMEOUT_S,
                            resources={'metadata': {'path': str(root)}}).execute()
    assert checkpoint_info(root/'models'/'nb.pth')['entry']['kind'] == 'notebook'
    r = reproduce(root/'models'/'nb.pth', tmp_path/'out', show=False)
    assert r.reproduced and r.position == dict(fit=0, epoch=2, batch=0, iteration=6), r.verdict
    assert r.command[-2].endswith('replay.ipynb')


BEFORE_FOLDERS = '824cc03'  # the last commit of the flat package (fastrepro/callback.py, checkpoint.py, rerun.py, ...)
OLD_TRAIN = '''"A user's script, run by the fastrepro of before the folders"
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, CheckpointCB, seed_everything
seed_everything(4)
learn = synth_learner(n_trn=4, path='.', cbs=[ReproCB(seed=4), CheckpointCB(every_iters=3)])
with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
'''


def test_a_checkpoint_written_before_the_folders_is_reproduced(tmp_path, capsys, monkeypatch):
    "Written by the flat package (its runner was `fastrepro.rerun`), reproduced by today's"
    old = tmp_path/'old'
    old.mkdir()
    archive = subprocess.run(['git', 'archive', BEFORE_FOLDERS, 'fastrepro'], cwd=ROOT, capture_output=True)
    if archive.returncode != 0: pytest.skip(f"commit {BEFORE_FOLDERS} is not in this clone (a shallow clone?)")
    subprocess.run(['tar', '-x', '-C', str(old)], input=archive.stdout, check=True)
    assert (old/'fastrepro'/'rerun.py').is_file() and not (old/'fastrepro'/'state').exists()
    root = _repo(tmp_path/'proj', {'train.py': OLD_TRAIN, '.gitignore': '__pycache__/\n/models/\n'})
    env = {**_env(), 'PYTHONPATH': str(old)}
    p = subprocess.run([sys.executable, 'train.py'], cwd=root, env=env, capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = root/'models'/'checkpoint.pth'
    assert checkpoint_info(ckpt)['iteration'] == 6
    monkeypatch.setenv('PYTHONPATH', str(ROOT))
    assert main(['reproduce', str(ckpt), '--out', str(tmp_path/'out')]) == 0
    assert 'reproduced bit for bit' in capsys.readouterr().out
