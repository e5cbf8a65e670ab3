"""The guard on fastai's internals, in fresh processes (it runs when fastrepro is imported): on the installed fastai
nothing is said; on a fastai whose `DataLoader` keeps a pass's order under another name (as a release that renamed
`self.__idxs` would), importing fastrepro says so once, `CheckpointCB` writes its checkpoints at epoch ends only,
naming the reason, and a checkpoint written inside an epoch (by the real fastai) is refused at resume."""
import os, sys, subprocess, textwrap
from pathlib import Path
import pytest
from conftest import hang_limit

ROOT = Path(__file__).resolve().parents[1]
HANG_S = hang_limit(10)  # stops a hang; each process runs in about 10 s

FOREIGN = '''
import fastai.data.load as fastai_load
from fastai.torch_core import to_device
def __iter__(self):
    "fastai 2.8's `DataLoader.__iter__`, keeping the pass's order as `self.order`"
    self.randomize(); self.before_iter()
    self.order = self.get_idxs()
    for b in fastai_load._loaders[self.fake_l.num_workers==0](self.fake_l):
        if self.device is not None: b = to_device(b, self.device)
        yield self.after_batch(b)
    self.after_iter()
    if hasattr(self, 'it'): del(self.it)
def sample(self): return (b for i, b in enumerate(self.order) if i//(self.bs or 1)%self.num_workers==self.offs)
fastai_load.DataLoader.__iter__, fastai_load.DataLoader.sample = __iter__, sample
'''

TRAIN = '''
import warnings
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter('always')
    from fastrepro.all import *
    from fastrepro.state.passes import FastaiMismatchWarning
    from fastai.test_utils import synth_learner, synth_dbunch
print('MISMATCH', [str(w.message) for w in said if w.category is FastaiMismatchWarning])

def learner():
    seed_everything(0)
    cbs = [ReproCB(seed=1, allow_dirty=True), CheckpointCB(every_iters=3)]
    return synth_learner(data=synth_dbunch(n_train=5), cbs=cbs)  # 5 batches of 16 an epoch

learn = learner()
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter('always')
    with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
print('FIT', [str(w.message) for w in said if 'CheckpointCB' in str(w.message)])
info = checkpoint_info('models/checkpoint.pth')
print('NEWEST', info['epoch'], info['batch'], info['iteration'])
'''

RESUME = '''
learn = learner()
learn.load('inside')
try:
    with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2, start_epoch=1)
    print('RESUMED')
except ResumeError as e: print('REFUSED', ' '.join(str(e).split()))  # fastai adds the event on a line
'''


def run(code:str, cwd:Path) -> subprocess.CompletedProcess:
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=HANG_S)


def said(p, key:str) -> str:
    lines = [l for l in p.stdout.splitlines() if l.startswith(key + ' ')]
    assert len(lines) == 1, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return lines[0][len(key) + 1:]


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "The installed fastai: a fit whose newest checkpoint is inside epoch 1; then a simulated foreign fastai"
    real, foreign = tmp_path_factory.mktemp('real'), tmp_path_factory.mktemp('foreign')
    r = run(TRAIN + "import shutil; shutil.copy('models/checkpoint.pth', 'inside.pth')\n", real)
    (foreign/'models').mkdir()
    assert r.returncode == 0, r.stderr[-3000:]
    (real/'inside.pth').replace(foreign/'models'/'inside.pth')
    return r, run(FOREIGN + TRAIN + RESUME, foreign)


def test_nothing_said_on_the_installed_fastai(runs):
    real, _ = runs
    assert real.returncode == 0, real.stderr[-3000:]
    assert said(real, 'MISMATCH') == '[]'
    assert 'is not the one' not in real.stderr + real.stdout
    assert said(real, 'FIT') == '[]'
    epoch, batch, it = map(int, said(real, 'NEWEST').split())
    assert (epoch, batch, it) == (1, 4, 9)  # inside epoch 1: the mid-epoch checkpoint the foreign process loads


def test_a_foreign_fastai_is_said_once_and_refused_inside_epochs(runs):
    _, p = runs
    assert p.returncode == 0, p.stderr[-3000:]
    import fastai
    mismatch = eval(said(p, 'MISMATCH'))
    assert len(mismatch) == 1, mismatch
    m = mismatch[0]
    assert m.startswith(f"fastai {fastai.__version__}'s `DataLoader` is not the one fastrepro's data streams were "
                        "written against (`__iter__` no longer keeps a pass's order as `self.__idxs`"), m
    assert 'Checkpoints and resumes inside an epoch are refused' in m and '`fastrepro selftest`' in m
    fit = eval(said(p, 'FIT'))
    assert len(fit) == 1 and fit[0].startswith("CheckpointCB writes no checkpoint inside an epoch in this fit: "
                                               f"fastai {fastai.__version__}'s `DataLoader` is not the one"), fit
    assert said(p, 'NEWEST').split() == ['2', '0', '10']  # the last one due, at the fit's end (epoch 2, batch 0)
    refused = said(p, 'REFUSED')
    assert 'written inside epoch 1 (after 4 batches)' in refused and 'is not the one fastrepro' in refused, refused
