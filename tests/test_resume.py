"""A run stopped after an epoch and resumed in a fresh process is bit-identical to the uninterrupted run.

Each stage runs in its own process (`fastrepro.demo.jobs`): the reference; a stop (cancelled and `learn.save`d, or
killed by SIGKILL right after `SaveModelCallback`'s checkpoint); the resume (another global seed, stray draws,
`lr_find`, `learn.load`, the `start_epoch` that `checkpoint_info` reports). Every process starts with
`DETERMINISTIC_ENV` (MKL's conditional numerical reproducibility, no dynamic threading: issue 12), which MKL and OpenMP
read when they start, so no process depends on the machine's load or on memory alignment; each comparison runs once,
nothing retries.
`same_run` compares the final model's sha256 over every parameter and buffer, every per-batch loss and parameter norm,
the Recorder's values and, in fp16, every loss-scale row."""
import signal, shutil
import pytest
from fastrepro.demo.jobs import Job, job_process, job_error, STOP_EPOCH
from fastrepro.record.divergence import RunRecord, same_run
from fastrepro.demo.ulmfit import Stage, imdb_sample_df, lm_dls, subsample, ENCODER

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

N_EPOCH, LR = 3, 1e-2
FP16_TEXTS, FP16_CHARS = 40, 300  # fp16 matrix products are slow on a CPU: a smaller corpus for those runs


@pytest.fixture(scope='module')
def texts(fastai_home):
    df = imdb_sample_df('test')
    return df, lm_dls(df).vocab


def run(spec, mode, killed=False, **kwargs):
    p = job_process(spec, mode, **kwargs)
    assert p.returncode == (-signal.SIGKILL if killed else 0), job_error(p)


def check_resumes(job, reference_runs, stops=('cancel', 'kill'), encoder=None):
    ("The reference (trained once for every test that compares with it), then for each way of stopping: stop, resume, "
     "and compare with the reference")
    spec = job.write()
    ref = RunRecord.load(reference_runs(job, encoder).path/'reference.pt')
    for stop in stops:
        run(spec, stop, killed=stop == 'kill')
        ck = 'cancel' if stop == 'cancel' else f'kill_{STOP_EPOCH}'
        run(spec, 'resume', checkpoint=ck)
        res = RunRecord.load(job.path/f'resumed-{ck}.pt')
        assert res.trace.epoch.max() == N_EPOCH - 1 and (res.trace.epoch > STOP_EPOCH).any()
        ok, why = same_run(ref, res)
        assert ok, f"{stop}: {why}"
    return ref


@pytest.mark.parametrize('kind', ['lm', 'clas'])
def test_resume_is_bit_identical(kind, texts, tmp_path, reference_runs):
    df, vocab = texts
    encoder = None
    if kind == 'clas':  # on the encoder of the language model's reference (test_preempt's too)
        lm = reference_runs(Job('lm', df, tmp_path, stages=[Stage(0, N_EPOCH, LR)]))
        encoder = lm.path/'models'/f'{ENCODER}.pth'
        (tmp_path/'models').mkdir()
        shutil.copy(encoder, tmp_path/'models'/f'{ENCODER}.pth')
    job = Job(kind, df, tmp_path, vocab if kind == 'clas' else None, stages=[Stage(0, N_EPOCH, LR)])
    check_resumes(job, reference_runs, encoder=encoder)


def test_fp16_resume_is_bit_identical(texts, tmp_path, reference_runs):
    "fp16 on CPU: the GradScaler and the loss-scale history travel in the checkpoint"
    job = Job('lm', subsample(texts[0], FP16_TEXTS, FP16_CHARS), tmp_path, fp16=True, stages=[Stage(0, N_EPOCH, LR)])
    ref = check_resumes(job, reference_runs, stops=('cancel',))
    assert ref.loss_scale is not None and len(ref.loss_scale) == len(ref.trace)
