"""Distributed data-parallel training with fastai's `distrib_ctx`: real 2-process jobs started by `torchrun` on loopback
(gloo, CPUs), each launch a fresh set of processes (`tests/distrib_job.py`)."""
import os, shutil, socket, subprocess, sys, time
from pathlib import Path
import pytest, torch
from conftest import ROOT, hang_limit
from fastrepro.checkpoint.file import checkpoint_info

pytestmark = pytest.mark.slow  # torchrun and accelerate launches: the inner loop (-m "not slow") skips them

JOB = Path(__file__).with_name('distrib_job.py')
LAUNCH_TIMEOUT_S = hang_limit(20)  # a launch takes 10-20 s here; this stops a hung collective
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run']
pytest.importorskip('accelerate',
                    reason="fastai's distrib_ctx needs Accelerate (pip install accelerate; in the dev extras)")


def _free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]


def _env(): return {**os.environ, 'ACCELERATE_USE_CPU': '1', 'OMP_NUM_THREADS': '1',
                    'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}


def _torchrun(nproc=2) -> list:
    "torchrun on a free port of its own (`--standalone`): a port picked here could be taken by a launch beside it"
    return TORCHRUN + ['--standalone', '--nproc_per_node', str(nproc)]


def _check(p, status):
    assert (p.returncode == 0) == (status == 0), (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    return p


def launch(mode, out, arg=None, nproc=2, status=0):
    "Run one launch of `distrib_job.py`; check its exit status; the completed process"
    cmd = _torchrun(nproc) + [str(JOB), mode, str(out)] + ([str(arg)] if arg is not None else [])
    return _check(subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S), status)


def rank(out, name, r): return torch.load(Path(out)/f'{name}-rank{r}.pt')


def same(a, b) -> bool: return a['digest'] == b['digest'] and a['loss'] == b['loss'] and a['values'] == b['values']


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp('ddp_ref')
    launch('reference', out)
    return out


def test_two_launches_same_bits_and_decorrelated_ranks(reference, tmp_path):
    launch('reference', tmp_path)
    for r in (0, 1): assert same(rank(reference, 'reference', r), rank(tmp_path, 'reference', r)), r
    a0, a1, b0 = rank(reference, 'reference', 0), rank(reference, 'reference', 1), rank(tmp_path, 'reference', 0)
    assert a0['digest'] == a1['digest']  # DDP keeps the ranks' models equal
    assert all(torch.equal(m, n) for m, n in zip(a0['masks'], b0['masks']))  # a rank's dropout repeats across launches
    assert not any(torch.equal(m, n) for m, n in zip(a0['masks'], a1['masks']))  # and differs from the other rank's


@pytest.fixture(scope='module')
def after_epoch(tmp_path_factory):
    "A launch stopped after its first epoch (its checkpoint `epoch1`): what the resume tests start from"
    out = tmp_path_factory.mktemp('ddp_epoch')
    launch('epoch', out)
    return out


def _copy(run, to):
    shutil.copytree(run, to, dirs_exist_ok=True)
    return to


def test_resume_after_an_epoch_and_inside_one(reference, after_epoch, tmp_path):
    launch('resume', _copy(after_epoch, tmp_path), 'epoch1')
    launch('preempt', tmp_path, 7, status=143)  # SIGTERM to rank 0 alone: both ranks checkpoint at the same batch
    info = checkpoint_info(tmp_path/'models'/'checkpoint.pth')
    assert (info['iteration'], info['world_size']) == (7, 2)
    launch('resume', tmp_path, 'checkpoint')
    for ck in ('epoch1', 'checkpoint'):
        for r in (0, 1): assert same(rank(reference, 'reference', r), rank(tmp_path, f'resume-{ck}', r)), (ck, r)


def test_a_killed_rank_ends_the_job_and_the_last_checkpoint_resumes(reference, tmp_path):
    t0 = time.monotonic()
    launch('kill', tmp_path, 6, status=1)  # rank 1 dies by SIGKILL right after the checkpoint of iteration 6
    assert time.monotonic() - t0 < LAUNCH_TIMEOUT_S
    launch('resume', tmp_path, 'checkpoint')
    for r in (0, 1): assert same(rank(reference, 'reference', r), rank(tmp_path, 'resume-checkpoint', r)), r


def test_other_world_size_is_refused(after_epoch, tmp_path):
    p = launch('resume', _copy(after_epoch, tmp_path), 'epoch1', nproc=1, status=1)
    assert 'run of 2 process(es) and this run has 1' in p.stderr, p.stderr[-3000:]


def test_ranks_with_other_environments_are_refused(tmp_path):
    p = launch('mismatch', tmp_path, status=1)
    assert 'RankMismatchError' in p.stderr and 'rank 1: torch 0.0.0' in p.stderr, p.stderr[-3000:]


# The example script (examples/ulmfit_ddp.py), started with the commands its docstring and nbs/07_distrib give
EXAMPLE = ROOT/'examples'/'ulmfit_ddp.py'
EXAMPLE_ARGS = ['--allow-dirty', '--every-iters', '5']  # the checkout under test may have uncommitted changes


def _digests(p) -> str:
    "The example's last line: the language model's and the classifier's digests"
    return [l for l in p.stdout.splitlines() if l.startswith('language model ')][-1]


@pytest.fixture(scope='module')
def example_digests(fastai_home, tmp_path_factory):
    out = tmp_path_factory.mktemp('example')
    p = subprocess.run(_torchrun() + [str(EXAMPLE), '--out', str(out), *EXAMPLE_ARGS], env=_env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    return _digests(_check(p, 0))


def test_example_under_accelerate_launch(example_digests, tmp_path):
    "`accelerate launch` (the example's documented command) runs both processes and gives torchrun's bits"
    cmd = [sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu', '--num_processes', '2',
           '--main_process_port', str(_free_port()), str(EXAMPLE), '--out', str(tmp_path), *EXAMPLE_ARGS]
    p = _check(subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S), 0)
    assert _digests(p) == example_digests and example_digests.endswith('2 process(es)'), (_digests(p), example_digests)


def test_example_stopped_and_rerun(example_digests, tmp_path):
    "SIGTERM to torchrun once the first checkpoint is written, then the same command again: the uninterrupted bits"
    cmd = _torchrun() + [str(EXAMPLE), '--out', str(tmp_path), *EXAMPLE_ARGS]
    job, ck, t0 = subprocess.Popen(cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), \
        tmp_path/'models'/'lm.pth', time.monotonic()
    while not ck.exists() and job.poll() is None and time.monotonic() - t0 < LAUNCH_TIMEOUT_S: time.sleep(0.05)
    job.terminate()  # what a scheduler does; torchrun passes it on to its processes
    out = job.communicate(timeout=LAUNCH_TIMEOUT_S)[0].decode()
    assert job.returncode != 0 and ck.exists(), (job.returncode, out[-3000:])
    p = _check(subprocess.run(cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S), 0)
    assert 'continues where an earlier run stopped it' in p.stdout, p.stdout[-2000:]
    assert _digests(p) == example_digests
    held = (tmp_path/'models'/'lm.lock').read_text()  # rank 0 held the run's lock for both ranks
    assert held.count('pid ') == 1, held
