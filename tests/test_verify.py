"""`VerifyCB` (issue 60) in fresh processes, on real training scripts committed in real git repositories: a clean
tabular run and a ULMFiT-sized language model verified (the first step run twice, the first segment replayed in another
process), the verdict in the output, the ledger and the checkpoint; layers no seed reaches (the OS's entropy, the clock)
caught at the first step and in the segment, the layer named; a segment that parts only across processes (Python's
hash seed, replayed on a Dask worker) said so; a replay killed with SIGKILL, a process with one CPU core and a requeued
run each said in one line, the run going on; and every run with `VerifyCB` bit for bit the run without it."""
import json, os, re, subprocess, sys, time
from pathlib import Path
import pytest
import torch
from conftest import ROOT, hang_limit, fastrepro_here

from fastrepro.checkpoint.file import Checkpoint, checkpoint_info
from fastrepro.experiments.ledger import Ledger
from fastrepro.check.reproduce import reproduce_segments, segment_plan, segments_verdict

pytestmark = pytest.mark.slow  # trains and replays in fresh processes: the inner loop (-m "not slow") skips it

RUN_TIMEOUT_S = hang_limit(90)  # one training process and its replay: two fastai imports, a few tiny fits

TABULAR = '''"A tabular run as a fastai user writes it, with switches the tests set through the environment"
import os, time, signal
import numpy as np, pandas as pd
from fastai.tabular.all import *
from fastrepro.all import ReproCB, CheckpointCB, VerifyCB, FitRecord, Ledger, seed_everything

class Jitter(Module):
    "Noise from a generator no seed reaches: seeded from the OS's entropy, or from the clock, at every call"
    def __init__(self, source): self.source = source
    def forward(self, x):
        seed = int.from_bytes(os.urandom(4), 'little') if self.source == 'os' else time.time_ns() % 2**32
        return x + 1e-3*torch.randn(tuple(int(n) for n in x.shape), generator=torch.Generator().manual_seed(seed))

class Hashed(Module):
    "A scale from Python's `hash()` of a string, which PYTHONHASHSEED sets per process"
    def forward(self, x): return x * (1 + (hash('fastrepro') % 1_000_003) / 1e7)

class Model(Module):
    def __init__(self, body, noise): self.body, self.noise = body, noise
    def forward(self, x_cat, x_cont): return self.noise(self.body(x_cat, x_cont))

class KillReplay(Callback):
    "SIGKILL the replay's process once it runs"
    def after_batch(self):
        if (r := self.learn.verify_cb.running) is not None: os.kill(r.proc.pid, signal.SIGKILL); r.proc.wait()

class Requeued(Callback):
    "At iteration 12, once the verdict is in, a checkpoint, then the process dies (a preempted job)"
    order = 95
    def after_batch(self):
        if self.train_iter != 12 or os.environ.get('DIE') != '1': return
        self.learn.verify_cb._poll(300); self.learn.checkpoint_cb.save(); os.kill(os.getpid(), signal.SIGKILL)

if __name__ == '__main__':  # Dask's worker processes import this file: they train nothing
    seed_everything(0)
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'a': rng.normal(size=256), 'b': rng.normal(size=256), 'c': rng.choice(list('xyz'), 256)})
    df['y'] = 2*df.a + df.b + (df.c == 'x')
    dls = TabularDataLoaders.from_df(df, y_names='y', cat_names=['c'], cont_names=['a', 'b'], bs=32,
                                     procs=[Categorify, Normalize], valid_idx=list(range(200, 256)))
    executor = None
    if os.environ.get('DASK') and not os.environ.get('FASTREPRO_VERIFYING'):  # a replay's re-run needs no cluster
        from dask.distributed import Client, LocalCluster
        client = Client(LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None))
        executor = client.get_executor()
    layers = os.environ['LAYERS'].split(',') if os.environ.get('LAYERS') else ['']
    for seed, layer in enumerate(layers):  # a learner for each layer: each its own seed, checkpoints and verdicts
        seed_everything(seed)
        cbs = [ReproCB(seed=seed, ledger=FitRecord(Ledger('runs.db'), 'tabular')),
               CheckpointCB(f'checkpoint{layer}', every_iters=4, autoresume=os.environ.get('DIE') is not None),
               Requeued()]
        if os.environ.get('VERIFY', '1') == '1':
            cbs.append(VerifyCB(wait=float(os.environ.get('WAIT', 300)), executor=executor,
                                every=int(os.environ.get('EVERY', 0)) or None, device=os.environ.get('DEVICE', 'wait')))
        if os.environ.get('KILL_REPLAY'): cbs.append(KillReplay())
        if os.environ.get('TENSORBOARD'):
            from fastai.callback.tensorboard import TensorBoardCallback
            cbs.append(TensorBoardCallback(trace_model=False, log_preds=False))
        learn = tabular_learner(dls, layers=[16, 8], n_out=1, cbs=cbs)
        if layer: learn.model = Model(learn.model, Hashed() if layer == 'hash' else Jitter(layer))
        with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
        learn.save(f'final{layer}')
'''

TEXT = '''"A ULMFiT language model (AWD-LSTM, fastai's text pipeline) fine-tuned on the IMDB sample, verified"
from fastai.text.all import *
from fastrepro.all import ReproCB, CheckpointCB, VerifyCB, seed_everything
from fastrepro.demo.ulmfit import imdb_sample_df, subsample, lm_dls, lm_learner
seed_everything(1)
dls = lm_dls(subsample(imdb_sample_df('test'), 60, 600))
learn = lm_learner(dls, cbs=[ReproCB(seed=1), CheckpointCB(every_iters=3), VerifyCB(wait=600)])
with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
learn.save('final')
'''


DISTRIB = '''"Two processes under torchrun and `distrib_ctx`: rank 0 replays the first segment (a torchrun of its own)"
from fastai.basics import *
from fastai.distributed import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, CheckpointCB, VerifyCB, seed_everything
seed_everything(3)
learn = synth_learner(n_trn=8, path='.', cbs=[ReproCB(seed=3), CheckpointCB(every_iters=2), VerifyCB(wait=300)])
with learn.distrib_ctx(), learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
'''


def _git(root, *args):
    return subprocess.run(['git', *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope='module')
def repo(tmp_path_factory):
    "A git repository with both scripts committed"
    root = tmp_path_factory.mktemp('verify')/'proj'
    root.mkdir()
    for name, script in (('tabular.py', TABULAR), ('text.py', TEXT), ('distrib.py', DISTRIB)):
        (root/name).write_text(script)
    (root/'.gitignore').write_text('__pycache__/\n/models/\n/runs.db\n/runs/\n')
    _git(root, 'init', '-q', '-b', 'main')
    _git(root, 'config', 'user.name', 'tests'); _git(root, 'config', 'user.email', 'tests@fastrepro.invalid')
    _git(root, 'add', '-A'); _git(root, 'commit', '-qm', 'the scripts')
    return root


def run(repo, where:Path, script='tabular.py', launch=(sys.executable,), **env) -> subprocess.CompletedProcess:
    "The script run (by `launch`) in a clone of `repo` at `where`, with `env` on top of this process's environment"
    if not where.exists(): _git(repo.parent, 'clone', '-q', str(repo), str(where))
    base = {k: v for k, v in os.environ.items() if k != 'PYTHONHASHSEED'}  # each process its own hash seed
    return subprocess.run([*launch, script], cwd=where, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env={**base, 'PYTHONPATH': str(ROOT), 'MPLBACKEND': 'Agg', **env})


def lines(p:subprocess.CompletedProcess) -> list:
    "VerifyCB's lines (on stderr, where a run's diagnostics go) of a process that ended normally"
    assert p.returncode == 0, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return [l for l in p.stderr.splitlines() if l.startswith('VerifyCB: ')]


def weights(folder:Path) -> tuple:
    "The final checkpoint's every parameter and buffer, and the digest of every trace row (each loss, each norm)"
    ck = folder/'models'/'final.pth'
    return Checkpoint(ck).model, checkpoint_info(ck)['rows_sha256']


def same_bits(a:tuple, b:tuple) -> bool:
    (ma, ta), (mb, tb) = a, b
    return ta == tb and ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


@pytest.fixture(scope='module')
def unverified(repo, tmp_path_factory):
    "The run without VerifyCB: what every run with it must equal bit for bit"
    where = tmp_path_factory.mktemp('plain')/'proj'
    assert lines(run(repo, where, VERIFY='0')) == []
    return weights(where)


def test_a_clean_run_is_verified_and_unchanged(repo, tmp_path, unverified, capsys):
    "Verified: one line each, in the ledger, the checkpoint, `fastrepro show` and TensorBoard; the bits unchanged"
    out = lines(run(repo, tmp_path/'proj', TENSORBOARD='1', EVERY='2'))  # segments 0 and 2: 0-4 and 8-12
    assert out[0].startswith('VerifyCB: first step: the ') and 'bit-identical between two runs' in out[0], out
    assert out[1].startswith('VerifyCB: segment fit 0, iterations 0-4: bit-identical in '), out
    assert out[2].startswith('VerifyCB: segment fit 0, iterations 8-12: bit-identical in '), out  # from checkpoint 8
    assert len(out) == 3, out
    assert same_bits(weights(tmp_path/'proj'), unverified)
    info = checkpoint_info(tmp_path/'proj'/'models'/'final.pth')
    assert info['first_step']['same'] and [(s['name'], s['status']) for s in info['verified']] == [
        ('fit 0, iterations 0-4', 'same'), ('fit 0, iterations 8-12', 'same')]
    notes = Ledger(tmp_path/'proj'/'runs.db').runs().notes.iloc[0]
    assert 'verify: segment fit 0, iterations 0-4: bit-identical' in notes and 'verify: first step' in notes
    shown = fastrepro_here(capsys, 'show', str(tmp_path/'proj'/'models'/'final.pth')).stdout
    listed = r'first step +bit-identical, run twice\n +segment fit 0, iterations 0-4 +same \(\d+ s\)'
    assert re.search(listed, shown), shown
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(next((tmp_path/'proj'/'runs').iterdir()))); ea.Reload()
    logged = [e.tensor_proto.string_val[0].decode() for e in ea.Tensors('fastrepro/verify/text_summary')]
    assert [l.split(':')[0] for l in logged] == ['first step', 'segment fit 0, iterations 0-4',
                                                 'segment fit 0, iterations 8-12'], logged
    seg = tmp_path/'proj'/'models'/'verify'/'checkpoint'/'segment-0'
    assert (seg/'report.md').is_file() and not list(seg.rglob('*.pth'))  # the replay's files gone, its report kept


def test_layers_no_seed_reaches_are_named_and_a_process_difference_said(repo, tmp_path):
    ("Three learners, their replays on a Dask worker: noise from the OS's entropy and from the clock, each caught at "
     "its first step and in its segment, the layer named; Python's hash seed, which one process agrees with")
    p = run(repo, tmp_path/'proj', LAYERS='os,clock,hash', DASK='1')
    out = lines(p)
    warned = 'NondeterminismWarning: VerifyCB: first step: `noise` (Jitter) forward output 0 differs first'
    assert p.stderr.count(warned) == 2, p.stderr[-3000:]  # the OS's and the clock's; Python's hash agrees with itself
    os_seg, clock_seg, hash_step, hash_seg = out
    for seg in (os_seg, clock_seg):
        assert seg.startswith('VerifyCB: segment fit 0, iterations 0-4: parts in '), seg
        assert 'at fit 0, epoch 0, iteration 0, first in loss' in seg and 'where in the step: `noise` (Jitter)' in seg
    assert 'bit-identical between two runs' in hash_step, hash_step
    assert 'parts in ' in hash_seg and 'first in loss' in hash_seg, hash_seg
    assert 'are bit-identical between two runs of the same step' in hash_seg and 'PYTHONHASHSEED' in hash_seg, hash_seg


def test_a_killed_replay_is_one_line_and_the_run_goes_on(repo, tmp_path, unverified):
    out = lines(run(repo, tmp_path/'proj', KILL_REPLAY='1'))
    assert out[1].startswith('VerifyCB: segment fit 0, iterations 0-4: not checked: the replay process was killed '
                             'by SIGKILL'), out
    assert same_bits(weights(tmp_path/'proj'), unverified)
    info = checkpoint_info(tmp_path/'proj'/'models'/'final.pth')
    assert [s['status'] for s in info['verified']] == ['not checked']


def test_a_replay_ends_with_the_run(repo, tmp_path, unverified):
    ("A run that does not wait for its verdict: the replay still running ends with it, said in one line; on the CPU "
     "by choice (`device='cpu'`: no GPU visible to it)")
    out = lines(run(repo, tmp_path/'proj', WAIT='0', DEVICE='cpu'))
    assert out[-1] == ('VerifyCB: segment fit 0, iterations 0-4: not checked: the run ended before its replay did '
                       '(`fastrepro reproduce` checks it later)'), out
    spec = tmp_path/'proj'/'models'/'verify'/'checkpoint'/'segment-0'/'spec.json'
    deadline = time.monotonic() + hang_limit(10)  # SIGTERM sent as the run ended: the replay ends its re-run first
    while (alive := subprocess.run(['pgrep', '-f', str(spec)], capture_output=True, text=True).stdout):
        assert time.monotonic() < deadline, f"the replay outlived the run: {alive}"
        time.sleep(0.2)
    assert spec.is_file() and json.loads(spec.read_text())['env']['CUDA_VISIBLE_DEVICES'] == ''
    assert same_bits(weights(tmp_path/'proj'), unverified)


def test_one_core_audits_the_first_step_and_says_why_no_replay(repo, tmp_path, unverified):
    threads = os.environ.get('OMP_NUM_THREADS', str(os.cpu_count()))  # the unverified run's count, on one core too
    out = lines(run(repo, tmp_path/'proj', launch=('taskset', '-c', '0', sys.executable), OMP_NUM_THREADS=threads))
    assert out[0] == ('VerifyCB: no segment is replayed: this process has one CPU core, which a replay would take '
                      'from the training (pass `executor=`); the first step is audited'), out
    assert 'first step: ' in out[1] and len(out) == 2, out
    assert same_bits(weights(tmp_path/'proj'), unverified)


def test_a_requeued_run_verifies_no_segment_twice(repo, tmp_path, unverified):
    died = run(repo, tmp_path/'proj', DIE='1')
    assert died.returncode == -9, died.stderr[-3000:]
    assert [l.split(':')[1] for l in died.stderr.splitlines() if l.startswith('VerifyCB: ')] == [
        ' first step', ' segment fit 0, iterations 0-4'], died.stderr[-3000:]
    assert lines(run(repo, tmp_path/'proj', DIE='0')) == []  # resumed: nothing verified again, nothing said
    info = checkpoint_info(tmp_path/'proj'/'models'/'final.pth')
    assert info['first_step']['same'] and [s['status'] for s in info['verified']] == ['same']
    assert same_bits(weights(tmp_path/'proj'), unverified)
    plan = segment_plan(tmp_path/'proj'/'models'/'checkpoint.pth')
    res = reproduce_segments(tmp_path/'proj'/'models'/'checkpoint.pth', tmp_path/'segments', where=False)
    assert len(res) == len(plan) and res[0].verdict == 'reproduced bit for bit while the run trained (VerifyCB)'
    assert segments_verdict(res) == (f'reproduced bit for bit in {len(plan)} segments', 0)  # the others re-run


def test_a_ulmfit_language_model_is_verified(repo, tmp_path, fastai_home):
    out = lines(run(repo, tmp_path/'proj', 'text.py', FASTAI_HOME=str(fastai_home)))
    assert 'first step: the ' in out[0] and 'bit-identical between two runs' in out[0], out
    assert out[1].startswith('VerifyCB: segment fit 0, iterations 0-3: bit-identical in '), out


def test_a_distributed_run_is_verified_by_rank_0(repo, tmp_path):
    "torchrun, 2 processes: rank 0 says each verdict once; the first step is not run twice across ranks, and says so"
    torchrun = (sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2')
    out = lines(run(repo, tmp_path/'proj', 'distrib.py', torchrun, ACCELERATE_USE_CPU='1', OMP_NUM_THREADS='1'))
    assert out == ["VerifyCB: first step not checked: a distributed run's ranks would have to run the same extra steps",
                   *out[1:]] and len(out) == 2, out
    assert out[1].startswith('VerifyCB: segment fit 0, iterations 0-2: bit-identical in '), out
