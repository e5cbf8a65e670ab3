"""Preemption-proof training, each stage a fresh process (`fastrepro.demo.jobs`): a run killed inside an epoch (SIGKILL
right after a periodic checkpoint of `CheckpointCB(every_iters=3)`, \
or SIGTERM, after which the callback writes a checkpoint and
exits with status 143) and resumed in another process (another \
global seed, stray draws, `one_batch` and `lr_find` before
the fit, `learn.load` and the `start_epoch` that `checkpoint_info` reports) ends bit-identical to the uninterrupted run:
the sha256 of every parameter and buffer, every per-batch loss and parameter norm, the Recorder's values, and in fp16
every loss-scale row (`same_run`). Also: one run stopped four times (twice in one epoch), 2 DataLoader workers, fastai's
trackers, and a three-fit ULMFiT script killed inside its second fit and rerun with `autoresume=True`."""
import signal
import pytest, torch
from fastrepro.demo.jobs import Job, job_process, job_error, BEST
from fastrepro.record.divergence import RunRecord, same_run
from fastrepro.checkpoint.file import checkpoint_info
from fastrepro.demo.ulmfit import Stage, imdb_sample_df, lm_dls, subsample, ENCODER

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

N_EPOCH, LR, EVERY = 3, 1e-2, 3
FP16_TEXTS, FP16_CHARS = 40, 300  # fp16 matrix products are slow on a CPU: a smaller corpus for those runs
SIGTERM_STATUS = 128 + signal.SIGTERM


@pytest.fixture(scope='module')
def texts(fastai_home):
    df = imdb_sample_df('test')
    return df, lm_dls(df).vocab


def run(spec, mode, status=0, **kwargs):
    "Run one stage; check how it ended (0, SIGTERM's 143, or killed by SIGKILL)"
    p = job_process(spec, mode, **kwargs)
    assert p.returncode == status, job_error(p)
    return p


def stopped(status_of): return -signal.SIGKILL if status_of == signal.SIGKILL else SIGTERM_STATUS


def record(job, name): return RunRecord.load(job.path/name)


def check_same(job, ref, name):
    ok, why = same_run(ref, record(job, name))
    assert ok, f"{name}: {why}"


def position(it:int, n_iter:int) -> tuple:
    "(epoch, batches done, iteration) of a stop after training iteration `it` (an epoch's last: before its validation)"
    epoch, batch = divmod(it, n_iter) if it % n_iter else (it//n_iter - 1, n_iter)
    return epoch, batch, it


def preempt_and_resume(job, ref, it, sig, name):
    "Stop the job at training iteration `it` with `sig`, resume it in a fresh process, compare with `ref`"
    spec = job.write()
    run(spec, 'preempt', stopped(sig), kill=(it, sig))
    info = checkpoint_info(job.path/'models'/'checkpoint.pth')
    assert (info['epoch'], info['batch'], info['iteration']) == position(it, len(ref.trace)//N_EPOCH), (info, it)
    run(spec, 'resume', checkpoint='checkpoint', record=name)
    check_same(job, ref, name)


@pytest.fixture(scope='module')
def lm_ref(texts, tmp_path_factory, reference_runs):
    "The uninterrupted language model (test_resume's too; its encoder also serves the classifier tests)"
    job = reference_runs(Job('lm', texts[0], tmp_path_factory.mktemp('lm'), stages=[Stage(0, N_EPOCH, LR)],
                             every_iters=EVERY))
    return job, record(job, 'reference.pt')


def test_lm_resumes_inside_an_epoch(lm_ref, tmp_path):
    ("The language model carries AWD-LSTM's hidden state from batch to batch: it travels in the checkpoint. One run "
     "stopped four times, each time continued by a fresh process that the next stop ends: after the first batch, after "
     "an epoch's last batch (before its validation), and twice inside epoch 1, by SIGTERM and then by SIGKILL right "
     "after a later periodic checkpoint; the last process ends the run, bit-identical to the uninterrupted one")
    job, ref = lm_ref
    n_iter = len(ref.trace)//N_EPOCH
    job = Job('lm', job.df, tmp_path, stages=job.stages, every_iters=EVERY)
    spec, middle = job.write(), n_iter + n_iter//2
    stops = [(1, signal.SIGTERM), (n_iter, signal.SIGTERM), (middle, signal.SIGTERM),
             (EVERY*(middle//EVERY + 1), signal.SIGKILL)]  # the periodic checkpoint after the middle one's
    assert stops[-1][0] < 2*n_iter  # still in epoch 1
    for k, (it, sig) in enumerate(stops):
        if k == 0: run(spec, 'preempt', stopped(sig), kill=(it, sig))
        else: run(spec, 'resume', stopped(sig), checkpoint='checkpoint', kill=(it, sig))
        info = checkpoint_info(job.path/'models'/'checkpoint.pth')
        assert (info['epoch'], info['batch'], info['iteration']) == position(it, n_iter), (info, it)
    run(spec, 'resume', checkpoint='checkpoint', record='lm.pt')
    check_same(job, ref, 'lm.pt')


def test_with_two_workers(lm_ref, tmp_path):
    "Two DataLoader workers serve the same batches: the resumed run is the 0-worker reference"
    ref_job, ref = lm_ref
    job = Job('lm', ref_job.df, tmp_path, stages=ref_job.stages, every_iters=EVERY, num_workers=2)
    preempt_and_resume(job, ref, len(ref.trace)//N_EPOCH + 2, signal.SIGTERM, 'workers.pt')


def test_classifier_resumes_inside_an_epoch(lm_ref, texts, tmp_path, reference_runs):
    encoder = lm_ref[0].path/'models'/f'{ENCODER}.pth'
    (tmp_path/'models').mkdir()
    (tmp_path/'models'/f'{ENCODER}.pth').write_bytes(encoder.read_bytes())
    job = Job('clas', texts[0], tmp_path, texts[1], stages=[Stage(0, N_EPOCH, LR)], every_iters=EVERY)
    ref = record(reference_runs(job, encoder), 'reference.pt')  # test_resume's too
    n_iter = len(ref.trace)//N_EPOCH
    for it, sig in ((n_iter//2, signal.SIGTERM), (EVERY*((2*n_iter - 1)//EVERY), signal.SIGKILL)):
        preempt_and_resume(job, ref, it, sig, f'clas-{it}-{sig}.pt')


def test_fp16_resumes_inside_an_epoch(texts, tmp_path, reference_runs):
    "The GradScaler and the loss-scale history, as they stood at the batch"
    job = Job('lm', subsample(texts[0], FP16_TEXTS, FP16_CHARS), tmp_path, fp16=True, stages=[Stage(0, N_EPOCH, LR)],
              every_iters=EVERY)
    ref = record(reference_runs(job), 'reference.pt')  # test_resume's too
    assert ref.loss_scale is not None and len(ref.loss_scale) == len(ref.trace)
    preempt_and_resume(job, ref, len(ref.trace)//N_EPOCH + 1, signal.SIGTERM, 'fp16.pt')


def test_trackers_take_the_same_decisions(texts, tmp_path):
    """`SaveModelCallback(monitor='valid_loss')` and `ReduceLROnPlateau` (which lowers the rate after every epoch here):
    stopped after epoch 1 and resumed at 2, and killed inside epoch 2, the best value, the saved best model, the final
    weights and the final learning rates are the uninterrupted run's"""
    job = Job('lm', texts[0], tmp_path, stages=[Stage(0, 4, LR)], every_iters=EVERY, trackers=True, method='fit')
    spec = job.write()
    run(spec, 'reference')
    ref, ref_tr = record(job, 'reference.pt'), torch.load(job.path/'reference.pt-trackers.pt')
    assert ref_tr['lrs'][-1] < LR/50  # lowered twice or more: also at or after epoch 2, where the resumed fits start
    run(spec, 'cancel', stop_epoch=1)
    run(spec, 'resume', checkpoint='cancel', record='epoch.pt')
    n_iter = len(ref.trace)//4
    run(spec, 'preempt', stopped(signal.SIGKILL), kill=(EVERY*((2*n_iter + n_iter//2)//EVERY), signal.SIGKILL))
    run(spec, 'resume', checkpoint='checkpoint', record='inside.pt')
    for name in ('epoch.pt', 'inside.pt'):
        check_same(job, ref, name)
        assert torch.load(job.path/f'{name}-trackers.pt') == ref_tr, name


def test_script_reruns_to_continue(texts, tmp_path):
    "A three-fit ULMFiT script (LM, classifier frozen to -2, unfrozen) killed inside its second fit, then run again"
    ref_job = Job('lm', texts[0], tmp_path/'ref', every_iters=EVERY)
    run(ref_job.write(), 'script')
    job = Job('lm', texts[0], tmp_path/'run', every_iters=EVERY)
    spec = job.write()
    run(spec, 'script', stopped(signal.SIGKILL), kill=(2*EVERY, signal.SIGKILL, 1))
    p = run(spec, 'script')
    assert 'fit 0 (1 epochs) was completed by an earlier run' in p.stdout and 'fit 1 continues' in p.stdout, p.stdout
    ok, why = same_run(record(ref_job, 'script.pt'), record(job, 'script.pt'))
    assert ok, why
