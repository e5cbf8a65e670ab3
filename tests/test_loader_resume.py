"""Every DataLoader type fastai ships resumes exactly inside an epoch: for each, a run sent SIGTERM after batch 6 of
epoch 2 (CheckpointCB writes its checkpoint and ends with `SystemExit(143)`) and run again in another process
(`autoresume`) ends bit-identical to the uninterrupted run: the sha256 of every parameter and buffer and of the
optimizer state, every per-batch loss, the Recorder's values (losses and metrics per epoch), the iteration count.
Each type also serves rank 1's share of a two-process run through fastai's `DistributedDL`, and the tabular one trains
in a real two-process run (`torchrun`, `distrib_ctx`, gloo on CPUs). The cases share processes, one after another, as
a user's script fits several learners: a stopped fit leaves nothing that changes the next learner's bits. The
language-model (`LMDataLoader`) and text classifier (`SortedDL`) loaders are resumed the same way in
tests/test_preempt.py."""
import os, re, sys, subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import pytest, torch
import fastrepro
from fastrepro.state.kernel_env import DETERMINISTIC_ENV
from fastrepro.state.kernels import same_kernels_env

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from loader_jobs import LEARNERS, SIGTERM_STATUS, case_name  # noqa: E402
from conftest import hang_limit

# every kind in the middle of an epoch, alone and as a rank's share; two after an epoch's last batch; one under torchrun
CASES = ([(kind, share, 'middle') for share in (0, 1) for kind in LEARNERS]
         + [('tabular', 0, 'last'), ('partial', 1, 'last'), ('tabular', 'ddp', 'middle')])
TIMEOUT_S = hang_limit(40)


def stage(name, out, cases) -> subprocess.CompletedProcess:
    "Stage `name` of `cases` in one fresh process (two under torchrun), with this process's CPU kernels"
    env = {**DETERMINISTIC_ENV, **os.environ, **same_kernels_env(), 'ACCELERATE_USE_CPU': '1', 'LOADER_STAGE': name}
    env['PYTHONPATH'] = os.pathsep.join([str(Path(fastrepro.__file__).resolve().parents[1]), env.get('PYTHONPATH', '')])
    # torchrun's own free port (`--standalone`): a port picked here could be taken by a launch beside it first
    launch = [sys.executable] + (['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node', '2']
                                 if cases[0][1] == 'ddp' else [])
    return subprocess.run(launch + [str(HERE/'loader_jobs.py'), str(out)] + [case_name(*c) for c in cases],
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def stop_and_resume(cases, root) -> dict:
    "Run the stop stage of `cases` in one process, then their resume stage in another; what each case recorded"
    stopped = stage('stop', root, cases)
    resumed = stage('resume', root, cases) if stopped.returncode == (1 if cases[0][1] == 'ddp' else 0) else None
    res = {}
    for case in cases:
        out = root/case_name(*case)
        load = lambda n: torch.load(out/f'{n}.pt', weights_only=True) if (out/f'{n}.pt').exists() else None
        ranks = ['-rank0', '-rank1'] if case[1] == 'ddp' else ['']
        res[case] = dict(stopped=stopped, resumed=resumed, at=load('stopped'), runs=[
            dict(ref=load('ref' + r), res=load('resumed' + r), unstopped=load('unstopped' + r)) for r in ranks])
    return res


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "Every case: the torchrun one, and the others in two halves, each half's stages in one process; two at a time"
    root = tmp_path_factory.mktemp('loaders')
    alone = [c for c in CASES if c[1] != 'ddp']
    groups = [[c for c in CASES if c[1] == 'ddp'], alone[::2], alone[1::2]]
    with ThreadPoolExecutor(2) as pool: return {k: v for r in pool.map(lambda g: stop_and_resume(g, root), groups)
                                                for k, v in r.items()}


def said(p): return f"exit code {p.returncode}: {(p.stderr or p.stdout)[-8000:]}"


def printed(text:str, case) -> str:
    "What a stage's processes printed for `case`: the lines after the previous case's end, up to its own"
    done, lines = {}, []
    for line in text.splitlines():
        m = re.fullmatch(r'(\S+): (?:stop|resume) done', line)
        if m: done[m[1]], lines = done.get(m[1], '') + '\n'.join(lines) + '\n', []  # each rank ends its own
        else: lines.append(line)
    return done.get(case_name(*case), '\n'.join(lines))  # the torchrun case's stop ends its processes: no end line


@pytest.mark.parametrize('case', CASES, ids=['-'.join(map(str, c)).replace('-0-', '-') for c in CASES])
def test_resumes_inside_an_epoch(runs, case):
    r, where = runs[case], case[2]
    assert r['at'] is not None and all(o['unstopped'] is None for o in r['runs']), said(r['stopped'])
    at = r['at']
    assert at['status'] == SIGTERM_STATUS, at
    assert at['epoch'] == 2 and 0 < at['batch'] <= at['n_batches'], at
    assert (at['batch'] == at['n_batches']) == (where == 'last'), at
    err = printed(r['stopped'].stderr, case)
    assert f"checkpoint written at epoch 2, after {at['batch']} of" in err, err[-2000:]
    assert r['resumed'].returncode == 0, said(r['resumed'])
    said_resume = printed(r['resumed'].stdout, case)
    assert f"continues where an earlier run stopped it: epoch 2, after {at['batch']} batch(es)" in said_resume
    for rank, o in enumerate(r['runs']):
        ref, res = o['ref'], o['res']
        assert ref['digest'] == res['digest'], f"rank {rank}: the weights differ"
        assert ref['opt'] == res['opt'], f"rank {rank}: the optimizer states differ"
        assert torch.equal(ref['iter'], res['iter']) and torch.equal(ref['loss'], res['loss']), \
            f"rank {rank}: the per-batch losses differ"
        assert ref['values'] == res['values'], (rank, ref['values'], res['values'])
        assert ref['train_iter'] == res['train_iter'] == len(ref['loss'])
    if len(r['runs']) == 2: assert not torch.equal(r['runs'][0]['ref']['loss'], r['runs'][1]['ref']['loss'])
