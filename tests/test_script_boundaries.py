"""A real two-learner ULMFiT script killed at every boundary of its stages, then run again until it ends
(`fastrepro.demo.jobs`, mode `script`): the language model's fit, `save_encoder`, the classifier built from the
generators the fit left (the script seeds once, at its top, as a user's does), its frozen and its unfrozen fit, each
learner with `CheckpointCB(autoresume=True)`. Each process is stopped at the next boundary (`SCRIPT_STOPS`: inside the
language model's last epoch, during its validation after its last batch, right after its end checkpoint, after
`save_encoder`, while the classifier's `Learner` is built, inside its first fit before its first checkpoint, between
its fits), by SIGTERM and SIGKILL in turn, so every rerun but the last is killed again. The last rerun ends
bit-identical to the uninterrupted script: the language model's record, then the classifier's (the weights, every
per-batch loss and norm), the Recorder, the optimizer's state, fastai's counters, and the next draws of every generator
and of each loader's own. Each process runs one torch thread (`Job.threads`)."""
import signal
import pytest, torch
from fastrepro.demo.jobs import Job, job_process, job_error, SCRIPT_STOPS
from fastrepro.demo.ulmfit import imdb_sample_df, subsample
from fastrepro.record.divergence import RunRecord, same_run

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

TEXTS, CHARS = 40, 300  # a small corpus: 12 language-model iterations, 4 per classifier fit (16 processes in all)
EVERY = 3
# how a process stopped by each signal ends: SIGKILL kills it; SIGTERM inside a fit lets CheckpointCB write a
# checkpoint and exit with 128 + 15, outside one it ends the process as Python's default does
ENDS = {signal.SIGKILL: {-signal.SIGKILL}, signal.SIGTERM: {128 + signal.SIGTERM, -signal.SIGTERM}}


@pytest.fixture(scope='module')
def reference(fastai_home, tmp_path_factory):
    "The uninterrupted script"
    job = Job('lm', subsample(imdb_sample_df('test'), TEXTS, CHARS), tmp_path_factory.mktemp('whole'),
              every_iters=EVERY)
    p = job_process(job.write(), 'script')
    assert p.returncode == 0, job_error(p)
    return job


def fastrepro_lines(p) -> str:
    "What a job process said of its checkpoints (fastrepro's own lines)"
    return ' | '.join(l for l in (p.stdout + p.stderr).splitlines() if l.startswith('fastrepro:')) or '-'


def check_same(ref:Job, job:Job, said:str=''):
    "The language model's record, then the classifier's, then what the process held after the script"
    for name, what in (('script.pt-lm.pt', "the language model"), ('script.pt', "the classifier")):
        ok, why = same_run(RunRecord.load(ref.path/name), RunRecord.load(job.path/name))
        assert ok, f"{what}: {why}\nwhat the processes said:\n{said}"
    after, want = (torch.load(j.path/'script.pt-after.pt', weights_only=True) for j in (job, ref))
    for k, v in want.items(): assert after[k] == v, f"after the script, {k}: {after[k]} vs {v}"


@pytest.mark.parametrize('first', [signal.SIGTERM, signal.SIGKILL], ids=['sigterm-first', 'sigkill-first'])
def test_killed_at_every_boundary(reference, tmp_path, first):
    job = Job('lm', reference.df, tmp_path, every_iters=EVERY)
    spec, sig, said = job.write(), first, []
    for name in SCRIPT_STOPS:
        p = job_process(spec, 'script', stop=(name, sig))
        assert p.returncode in ENDS[sig], f"stopped at {name} by {signal.Signals(sig).name}: {job_error(p)}"
        said.append(f"{name} ({signal.Signals(sig).name}, {p.returncode}): {fastrepro_lines(p)}")
        sig = signal.SIGKILL if sig == signal.SIGTERM else signal.SIGTERM
    p = job_process(spec, 'script')
    assert p.returncode == 0, job_error(p)
    for fit in (0, 1): assert f'fit {fit} (1 epochs) was completed by an earlier run' in p.stdout, p.stdout
    check_same(reference, job, '\n'.join(said + [f"the last rerun: {fastrepro_lines(p)}"]))
