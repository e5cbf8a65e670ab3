"""A run stopped after an epoch and resumed in a fresh process is bit-identical to the uninterrupted run.

Each stage runs in its own process (tests/resume_job.py): reference, stop (cancel + learn.save, or SaveModelCallback
and SIGKILL right after the checkpoint), resume (other global seed, learn.load, stray draws, lr_find, start_epoch)."""
import subprocess, sys
from pathlib import Path
import pytest, torch

JOB = Path(__file__).with_name('resume_job.py')

def stage(kind, mode, out, *flags, killed=False):
    r = subprocess.run([sys.executable, str(JOB), kind, mode, str(out), *flags], capture_output=True, text=True, timeout=900)
    if killed: assert r.returncode == -9, (r.returncode, r.stderr[-3000:])
    else: assert r.returncode == 0, r.stderr[-5000:]

def assert_resumed_exactly(ref, res):
    assert ref['state'].keys() == res['state'].keys()
    for k in ref['state']: assert torch.equal(ref['state'][k], res['state'][k]), k
    resumed = [i for i, e in enumerate(res['trace']['epoch']) if e >= 2]
    assert resumed, 'the resumed run recorded no iteration'
    ref_rows = {(f, it): l for f, it, l in zip(ref['trace']['fit'], ref['trace']['iter'], ref['trace']['loss'])}
    for i in resumed:
        key = (res['trace']['fit'][i], res['trace']['iter'][i])
        assert ref_rows[key] == res['trace']['loss'][i], key
    assert ref['values'][2:] == res['values'][2:]     # train loss (smoothed), valid loss, metrics of the resumed epochs
    assert ref['values'] == res['values']             # and the Recorder's history of the epochs before
    assert ref['scale'] == res['scale']               # the loss-scale history (fp16), every step

@pytest.mark.parametrize('kind', ['lm', 'clas'])
def test_resume_is_bit_identical(kind, fastai_home, tmp_path):
    if kind == 'clas': stage('ulmfit-prep', 'prep', tmp_path)
    for mode in ('reference', 'cancel', 'resume-cancel'): stage(kind, mode, tmp_path)
    stage(kind, 'kill', tmp_path, killed=True)
    stage(kind, 'resume-kill', tmp_path)
    ref = torch.load(tmp_path/f'{kind}-reference.pt')
    for src in ('cancel', 'kill'):
        assert_resumed_exactly(ref, torch.load(tmp_path/f'{kind}-resume-{src}.pt'))

def test_fp16_resume_is_bit_identical(fastai_home, tmp_path):
    "fp16 on CPU (GradScaler and loss-scale history in the checkpoint): the same three-process test, LM"
    for mode in ('reference', 'cancel', 'resume-cancel'): stage('lm', mode, tmp_path, '--fp16')
    ref, res = (torch.load(tmp_path/f'lm-{m}-fp16.pt') for m in ('reference', 'resume-cancel'))
    assert ref['scale'] is not None and len(ref['scale']['scale']) == len(res['scale']['scale'])
    assert_resumed_exactly(ref, res)
