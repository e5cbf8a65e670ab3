"""A run resumes only its own checkpoints (`CheckpointCB(autoresume=True)`, `Autoresume`), each case in fresh processes
of a committed script in its own git repository, with the default `models/` folder: seeds 7 then 8 (the second
refused: the checkpoints are seed 7's), 7 and 8 at once and the same seed twice at once (the second refused while the
first lives, the first ends as a run alone), a SIGKILLed run rerun (it resumes: no stale lock), other arguments,
another number of epochs, another data subset (refused, each naming the difference), an unseeded run stopped by
SIGTERM and rerun (it resumes its own drawn seed, bit for bit), a results file the script writes into the repository
between its fits (not code: the rerun resumes, bit-identical), a settings file edited between runs (refused, naming
it). Every refusal is one line on stderr, no traceback, and leaves the checkpoints as they were."""
import hashlib, json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
from fastrepro.demo.jobs import job_server
from conftest import ROOT, hang_limit

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

RUN_QUIET_S = 20  # one process of the script: fastai's import and a few dozen tiny iterations
WAIT_S = hang_limit(60)  # the bounded wait for a process to reach a point

SCRIPT = '''
import os, sys, json, time
from pathlib import Path
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import *
env = os.environ
settings = Path('config.yaml').read_text()  # a settings file the run reads
seed = int(env['SEED']) if env.get('SEED') else None
lr = float(sys.argv[sys.argv.index('--lr') + 1]) if '--lr' in sys.argv else 1e-2

class Hold(Callback):
    "Tell the test where the run is, wait for it, or kill the process, at a training iteration of one fit"
    order = CheckpointCB.order + 1
    def after_batch(self):
        if not self.training or self.learn.checkpoint_cb.fit_number != int(env.get('AT_FIT', 0)): return
        if self.learn.train_iter == int(env.get('KILL_AT', -1)): os.kill(os.getpid(), int(env['SIG']))
        if self.learn.train_iter == 1 and env.get('READY'):
            Path(env['READY']).touch()
            t0 = time.monotonic()
            while not Path(env['GO']).exists() and time.monotonic() - t0 < float(env['WAIT']): time.sleep(0.05)

seed_everything(0)
learn = synth_learner(n_trn=int(env.get('N', 6)), path='.',
                      cbs=[ReproCB(seed=seed), CheckpointCB(every_iters=2, keep=2, autoresume=True), Hold()])
with learn.no_bar(), learn.no_logging():
    learn.fit(int(env.get('EPOCHS', 2)), lr)
    if env.get('RESULTS'): Path('results.json').write_text(json.dumps({'loss': float(learn.recorder.losses[-1])}))
    learn.fit(1, lr / 10)
print(json.dumps({'weights': state_digest(learn.model), 'seed': learn.repro_cb.seed}))
'''


def _git(repo, *args): subprocess.run(['git', *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    "A committed training script and its settings"
    def make(name='run'):
        d = tmp_path/name
        d.mkdir()
        (d/'train.py').write_text(SCRIPT)
        (d/'config.yaml').write_text('lr: 0.01\n')
        _git(d, 'init', '-q', '-b', 'main')
        _git(d, 'add', '-A')
        _git(d, '-c', 'user.name=t', '-c', 'user.email=t@t.invalid', 'commit', '-qm', 'train')
        return d
    return make


def _env(**kw) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ('SEED', 'N', 'EPOCHS', 'RESULTS', 'KILL_AT', 'READY')}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])
    return {**env, 'WAIT': str(WAIT_S), **{k: str(v) for k, v in kw.items()}}


# `python train.py args` in a process forked from a server that imported fastai and fastrepro and ran nothing else
# (`fastrepro.demo.jobs.job_server`): the script's own command line, folder, variables and `__main__`, without the
# seconds of fastai's import in each of this file's twenty runs. The run that lives beside another
# (`test_two_processes_at_once`) is a process started from nothing.
RUN_SCRIPT = """import os, sys, runpy
os.chdir({d!r}); os.environ.update({env!r}); sys.path[0] = {d!r}
sys.argv, sys.orig_argv = {argv!r}, [sys.executable, *{argv!r}]
runpy.run_path('train.py', run_name='__main__')"""


def train(d, *args, status=0, **kw) -> subprocess.CompletedProcess:
    "Run the script in `d` with variables `kw`; check how it ended"
    env = {k: str(v) for k, v in _env(**kw).items() if os.environ.get(k) != str(v)}
    code = RUN_SCRIPT.format(d=str(d), env=env, argv=['train.py', *args])
    p = job_server({**os.environ, 'PYTHONPATH': _env()['PYTHONPATH']}).run(code, hang_limit(RUN_QUIET_S))
    assert p.returncode == status, f"exit {p.returncode}, not {status}: {p.stderr[-3000:]}"
    return p


def result(p) -> dict: return json.loads(p.stdout.strip().splitlines()[-1])


def checkpoints(d) -> dict:
    "Each checkpoint file of `d/models` (not the lock) and its sha256"
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted((d/'models').glob('*'))
            if not f.name.endswith('.lock')}


def refused(d, *args, said:str, **kw):
    "The run is refused: one line on stderr, no traceback, the checkpoints as they were"
    before = checkpoints(d)
    p = train(d, *args, status=1, **kw)
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith('fastrepro: ') and said in line and 'Traceback' not in p.stderr, p.stderr[-3000:]
    assert checkpoints(d) == before
    return line


def test_another_seed_arguments_epochs_or_data_are_refused(repo):
    d = repo()
    train(d, SEED=7)
    line = refused(d, SEED=8, said='seed 7 in ')
    assert '8 in this run' in line and "CheckpointCB(fname=" in line, line
    refused(d, '--lr', '0.1', SEED=7, said='command line train.py in ')
    refused(d, SEED=7, EPOCHS=3, said='number of epochs 2 in ')
    refused(d, SEED=7, N=5, said='data (items and vocabulary)')
    assert 'completed by an earlier run' in train(d, SEED=7).stdout  # its own: skipped


def test_two_processes_at_once(repo, tmp_path):
    "While a run lives, another seed and the same seed are refused, naming it; it ends as a run alone"
    alone, d = result(train(repo('alone'), SEED=7)), repo()
    ready, go = tmp_path/'ready', tmp_path/'go'
    first = subprocess.Popen([sys.executable, 'train.py'], cwd=d, env=_env(SEED=7, READY=ready, GO=go),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not ready.exists() and first.poll() is None and time.monotonic() - t0 < WAIT_S: time.sleep(0.05)
        assert ready.exists(), first.communicate(timeout=WAIT_S)
        for seed in (8, 7):
            line = refused(d, SEED=seed, said='belongs to a run that is still running (host ')
            assert f'pid {first.pid},' in line, line
    finally:
        go.touch()
        out, err = first.communicate(timeout=hang_limit(RUN_QUIET_S))
    assert first.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == alone


def test_killed_runs_resume_their_own(repo):
    "SIGKILL (no stale lock) and, unseeded, SIGTERM: the rerun continues the run's own checkpoints, bit for bit"
    alone = result(train(repo('alone'), SEED=7))
    d = repo('killed')
    train(d, SEED=7, KILL_AT=5, SIG=int(signal.SIGKILL), status=-signal.SIGKILL)
    p = train(d, SEED=7)
    assert 'continues where an earlier run stopped it' in p.stdout and result(p) == alone, p.stdout
    d = repo('unseeded')
    train(d, KILL_AT=5, SIG=int(signal.SIGTERM), status=128 + signal.SIGTERM)
    drawn = result(train(d))
    assert result(train(repo('replay'), SEED=drawn['seed'])) == drawn


def test_outputs_are_not_code_settings_are(repo):
    "results.json written between the fits is the run's output; an edited config.yaml is other code, named"
    alone = result(train(repo('alone'), SEED=7, RESULTS=1))
    d = repo()
    train(d, SEED=7, RESULTS=1, AT_FIT=1, KILL_AT=3, SIG=int(signal.SIGKILL), status=-signal.SIGKILL)
    assert (d/'results.json').exists()
    p = train(d, SEED=7, RESULTS=1)
    assert 'fit 1 continues' in p.stdout and result(p) == alone, p.stdout
    d = repo('edited')
    train(d, SEED=7, KILL_AT=3, SIG=int(signal.SIGKILL), status=-signal.SIGKILL)
    (d/'config.yaml').write_text('lr: 0.02\n')
    refused(d, SEED=7, said='written by other code than this run')
    assert 'config.yaml' in refused(d, SEED=7, said='changed since: config.yaml')
