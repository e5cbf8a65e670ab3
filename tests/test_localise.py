"""Where in the step two runs part (issue 53), through `reproduce`: a script trained on one thread is re-run with
`OMP_NUM_THREADS=2`; the runs part, and the report names the layer whose full reduction the thread count splits, its
pass and its first aten op, from a second re-run to that iteration. With `--no-where` (`where=False`) nothing is
localised. Torch's unvectorised kernels (`ATEN_CPU_CAPABILITY=default`) against this CPU's vectorised ones: a re-run per
side names the softmax. Both differences exist on every x86-64 CPU (issue 58)."""
import json, subprocess, sys
from pathlib import Path
import pytest
from conftest import hang_limit
from test_reproduce import _repo, _env, TWO_THREADS

from fastrepro.check.reproduce import reproduce
from fastrepro.check.rebuild import EXIT_PARTS
from fastrepro.check.rerun import _threads
from fastrepro.check.where import WHERE_NAME
from fastrepro.state.kernels import aten_capability, cpu_runs

pytestmark = pytest.mark.slow  # trains and re-runs in fresh processes: the inner loop (-m "not slow") skips it

RUN_TIMEOUT_S = hang_limit(30)  # stops a hang of one process: a fastai import (about 5 s) and a tiny fit
REPRODUCE_TIMEOUT_S = hang_limit(60)  # each re-run of `reproduce`

TRAIN = '''"A regression whose input is softmaxed, then centred on group means (full reductions: split by thread)"
from fastai.basics import *
from torch.utils.data import TensorDataset
from fastrepro.all import ReproCB, CheckpointCB, seed_everything

class Centre(nn.Module):
    ("Centres each group of 8 samples on the group's mean: a full reduction of 64,000 numbers, which ATen sums in one "
     "part per thread; one mean rounds alike on 1 and 2 threads about every other time, one of 8 almost never")
    def forward(self, x): return torch.cat([g - g.mean() for g in x.split(8)])

class Wide(nn.Module):
    def __init__(self, width=8000):
        super().__init__()
        self.register_buffer('spread', torch.arange(width) / width)  # exact on every CPU (no vectorised rounding)
        # the softmax: ATen's vectorised exp and sum, other bits than its unvectorised kernels
        self.body = nn.Sequential(nn.Softmax(-1), Centre(), nn.Linear(width, 32), nn.ReLU(), nn.Linear(32, 1))
        with torch.no_grad():  # `uniform_(a, b)`, PyTorch's init, rounds otherwise with ATen's unvectorised kernels
            for p in self.body.parameters(): p.copy_((torch.rand(p.shape) - 0.5) / p.shape[-1] ** 0.5)
    def forward(self, x): return self.body(x[:, None] * self.spread)

def data(bs=64, n_train=4, n_valid=1):
    "Uniform numbers (`torch.randn` draws other numbers with ATen's unvectorised kernels; `torch.rand` does not)"
    def ds(n):
        x = torch.rand(bs*n, 1)
        return TensorDataset(x, 2*x + 3 + 0.1*torch.rand(bs*n, 1))
    return DataLoaders(TfmdDL(ds(n_train), bs=bs, shuffle=True, num_workers=0), TfmdDL(ds(n_valid), bs=bs))

seed_everything(3)  # the data and the initial weights
learn = Learner(data(), Wide(), loss_func=MSELossFlat(), opt_func=partial(SGD, mom=0.9), path='.',
                cbs=[ReproCB(seed=3), CheckpointCB(every_iters=3)])
with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
'''


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    "The script committed and run once on one thread"
    files = {'train.py': TRAIN, '.gitignore': '__pycache__/\n/models/\n'}
    root = _repo(tmp_path_factory.mktemp('localise')/'proj', files)
    p = subprocess.run([sys.executable, 'train.py'], cwd=root, env=_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    return root/'models'/'checkpoint.pth'


def test_two_threads_part_and_the_report_names_the_layer(trained, tmp_path, monkeypatch):
    if _threads(TWO_THREADS) < 2: pytest.skip('torch runs one thread here whatever OMP_NUM_THREADS asks')
    monkeypatch.setenv('PYTHONPATH', str(Path(__file__).resolve().parents[1]))
    r = reproduce(trained, tmp_path/'out', env=TWO_THREADS, show=False, timeout=REPRODUCE_TIMEOUT_S)
    assert r.exit_code == EXIT_PARTS, r.verdict
    w = r.where
    assert (w['event']['module'], w['event']['kind'], w['event']['pass_']) == ('body.1', 'Centre', 'forward'), w
    assert w['sides'] == ['1 thread', '2 threads'] and w['first_op'] == 'aten.mean', w
    assert 0 < w['max_abs'] < 1e-3, w
    assert r.verdict.endswith("; where in the step: `body.1` (Centre) forward output 0 differs first " + w['text'][
        len("`body.1` (Centre) forward output 0 differs first "):]), r.verdict
    assert f"{w['where']} when 1 thread becomes 2 threads: aten.mean" in r.verdict, r.verdict
    report = (tmp_path/'out'/'report.md').read_text()
    assert f"- where in the step: {w['text']}" in report
    assert json.loads((tmp_path/'out'/WHERE_NAME).read_text())['text'] == w['text']


def test_without_where_nothing_is_localised(trained, tmp_path, monkeypatch):
    if _threads(TWO_THREADS) < 2: pytest.skip('torch runs one thread here whatever OMP_NUM_THREADS asks')
    monkeypatch.setenv('PYTHONPATH', str(Path(__file__).resolve().parents[1]))
    r = reproduce(trained, tmp_path/'out', env=TWO_THREADS, show=False, timeout=REPRODUCE_TIMEOUT_S, where=False)
    assert r.exit_code == EXIT_PARTS and r.where is None and 'where in the step' not in r.verdict, r.verdict
    assert not (tmp_path/'out'/WHERE_NAME).exists()


RUNS = '''"Two runs of one regression with other learning rates, each keeping its checkpoints; `where` for the CLI"
import sys
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, CheckpointCB, seed_everything

LRS = {'A': 1e-2, 'B': 2e-2}

def make_learner(folder='replay'):
    seed_everything(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1))
    return synth_learner(path=folder, model=model, cbs=ReproCB(seed=1, allow_dirty=True))

def fit(lr): return lambda learn, start_epoch: learn.fit(1, lr, start_epoch=start_epoch)

def where(): return make_learner, (fit(LRS['A']), fit(LRS['B']))

if __name__ == '__main__':
    for run in sys.argv[1:]:
        learn = make_learner(run)
        learn.add_cb(CheckpointCB(every_iters=2, keep=10))
        learn.checkpoint_cb.save()  # before the fit, where both runs start alike
        with learn.no_bar(), learn.no_logging(): fit(LRS[run])(learn, 0)
'''


def test_diff_names_the_optimizer_step_of_two_runs(tmp_path):
    "`fastrepro diff A B --learner runs:where`: two runs of this machine with other learning rates part in the update"
    root = _repo(tmp_path/'proj', {'runs.py': RUNS, '.gitignore': '__pycache__/\n/A/\n/B/\n/replay/\n'})
    p = subprocess.run([sys.executable, 'runs.py', 'A', 'B'], cwd=root, env=_env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([sys.executable, '-m', 'fastrepro.cli', 'diff', 'A/models/checkpoint.pth',
                        'B/models/checkpoint.pth', '--learner', 'runs:where'], cwd=root, env=_env(),
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 1, p.stderr[-3000:]
    assert p.stdout.startswith('The runs part at fit 0, epoch 0, iteration 0'), p.stdout
    assert ("Where in the step: `0` (Linear) optimizer update of `weight` differs first (shape (16, 1), float32"
            in p.stdout and 'at fit 0, iteration 0 when run A (A/checkpoint.' in p.stdout), p.stdout
    p = subprocess.run([sys.executable, '-m', 'fastrepro.cli', 'diff', 'A/models/checkpoint.pth',
                        'B/models/checkpoint.pth', '--learner', 'runs'], cwd=root, env=_env(),
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 2 and 'takes MODULE:FUNCTION' in p.stderr and 'Traceback' not in p.stderr, p.stderr


def test_other_kernels_part_and_a_process_per_side_names_the_layer(trained, tmp_path, monkeypatch):
    "Other ATen kernels asked of the re-run: a re-run per side, the recorded one with its own, localise the step"
    mine = aten_capability()  # the recorded run's: the fixture's process ran with this process's variables
    other = 'AVX2' if mine == 'DEFAULT' else 'DEFAULT'  # the vectorised kernels against the unvectorised ones
    if other == 'AVX2' and not cpu_runs('avx2'): pytest.skip('this CPU has no vectorised ATen kernels to part with')
    monkeypatch.setenv('PYTHONPATH', str(Path(__file__).resolve().parents[1]))
    r = reproduce(trained, tmp_path/'out', env={'ATEN_CPU_CAPABILITY': other.lower()}, show=False,
                  timeout=REPRODUCE_TIMEOUT_S)
    assert r.exit_code == EXIT_PARTS, r.verdict
    w = r.where
    assert (w['event']['module'], w['event']['kind'], w['event']['pass_']) == ('body.0', 'Softmax', 'forward'), w
    assert w['sides'] == [f'ATEN_CPU_CAPABILITY={mine.lower()}', f'ATEN_CPU_CAPABILITY={other.lower()}'], w
    assert w['first_op'] == 'aten._softmax' and w['where'] == 'at fit 0, iteration 0', w
    assert 'pin them on every machine' in w['text'] and w['text'] in r.verdict, r.verdict
    assert {f'where-{i}.json' for i in (0, 1)} <= {p.name for p in (tmp_path/'out').iterdir()}


HASHED = '''"A model that buckets a word by Python's `hash()`: the process's PYTHONHASHSEED decides its bits"
import sys
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, CheckpointCB, seed_everything

class Bucket(nn.Module):
    "Adds a number chosen by the bucket of a string's `hash()`: another bucket in a process of another hash seed"
    def __init__(self): super().__init__(); self.table = nn.Parameter(torch.linspace(0, 1, 16))
    def forward(self, x): return x + self.table[hash('fastrepro') % 16] * (self.step > 12)

def make_learner(folder='replay'):
    seed_everything(0)
    model = nn.Sequential(nn.Linear(1, 16), nn.ReLU(), nn.Linear(16, 1), Bucket())
    return synth_learner(path=folder, model=model, cbs=[ReproCB(seed=1, allow_dirty=True), Count(model[3])])

class Count(Callback):
    "The model's bucket is only used from iteration 12 on: the runs part there, after checkpoints they share"
    def __init__(self, bucket): self.bucket = bucket
    def before_batch(self): self.bucket.step = self.train_iter

def fit(learn, start_epoch): learn.fit(2, 1e-2, start_epoch=start_epoch)

def where(): return make_learner, fit

if __name__ == '__main__':
    learn = make_learner(sys.argv[1])
    learn.add_cb(CheckpointCB(every_iters=2, keep=20))
    learn.checkpoint_cb.save()  # before the fit, where both runs start alike
    fit(learn, 0)
'''


def test_runs_parted_by_their_processes_are_not_called_bit_identical(tmp_path):
    ("Two processes of other PYTHONHASHSEEDs part at iteration 13; replayed in one process the step is equal: the "
     "processes part them, and their recorded environments say why")
    root = _repo(tmp_path/'proj', {'hashed.py': HASHED, '.gitignore': '__pycache__/\n/A/\n/B/\n/replay/\n'})
    for run, seed in (('A', '1'), ('B', '2')):
        p = subprocess.run([sys.executable, 'hashed.py', run], cwd=root, env=_env(PYTHONHASHSEED=seed),
                           capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([sys.executable, '-m', 'fastrepro.cli', 'diff', 'A/models/checkpoint.pth',
                        'B/models/checkpoint.pth', '--learner', 'hashed:where'], cwd=root, env=_env(),
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 1, (p.stdout, p.stderr[-3000:])
    where = p.stdout.partition('Where in the step: ')[2]
    assert where.startswith('the traces part at fit 0, iteration 13; replayed in one process, the '), p.stdout
    assert where.rstrip().endswith('the difference comes from the processes; their recorded environments differ: '
                                   'switches.pythonhashseed 1 -> 2'), p.stdout
