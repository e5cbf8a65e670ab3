"""One file is what people share (issue 58): a checkpoint copied alone, without the trace file beside it, is read,
reproduced and compared for what it holds (weights, optimizer, generators, counters, its epoch rows, the digest of its
trace's rows): a file that did not travel is never a difference. `fastrepro show` on good and bad input."""
import os, json, shutil, subprocess, sys
from pathlib import Path
import pytest
from conftest import ROOT, hang_limit

from fastrepro.cli import main
from fastrepro.checkpoint.file import checkpoint_info, read_checkpoint, split_state
from fastrepro.checkpoint.trace_file import TraceLog

FIXTURES = ROOT/'nbs'/'fixtures'
RUN_TIMEOUT_S = hang_limit(30)  # a fastai import (about 5 s) and a tiny fit

TRAIN = '''"A committed script: a seeded learner trained with ReproCB, saved on purpose"
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, seed_everything
seed_everything(0)
learn = synth_learner(n_trn=4, path='.', cbs=ReproCB(seed=1))
with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
learn.save('final')
'''


def _git(root, *args):
    return subprocess.run(['git', *args], cwd=root, check=True, capture_output=True, text=True).stdout


def _alone(ckpt:Path, folder:Path) -> Path:
    "`ckpt` copied alone into the empty `folder`, as it is sent"
    folder.mkdir(parents=True)
    return Path(shutil.copy(ckpt, folder))


def _run(capsys, *argv) -> tuple:
    "`fastrepro argv`: exit code, stdout, stderr"
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope='module')
def final(tmp_path_factory):
    "`final.pth` of a clean committed script's run, with its trace file beside it"
    root = tmp_path_factory.mktemp('alone')/'proj'
    root.mkdir()
    _git(root, 'init', '-q', '-b', 'main')
    _git(root, 'config', 'user.name', 'tests'); _git(root, 'config', 'user.email', 'tests@fastrepro.invalid')
    (root/'train.py').write_text(TRAIN); (root/'.gitignore').write_text('__pycache__/\n/models/\n')
    _git(root, 'add', '-A'); _git(root, 'commit', '-qm', 'the script')
    env = {'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1', 'MPLBACKEND': 'Agg'}
    p = subprocess.run([sys.executable, 'train.py'], cwd=root, env={**os.environ, **env},
                       capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    ckpt = root/'models'/'final.pth'
    assert checkpoint_info(ckpt)['trace_file'] == 'intact' and not checkpoint_info(ckpt)['git']['dirty']
    return ckpt


@pytest.mark.slow
def test_reproduce_alone_compares_what_it_has(final, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('PYTHONPATH', str(ROOT)); monkeypatch.setenv('OMP_NUM_THREADS', '1')
    alone = _alone(final, tmp_path/'sent')
    assert checkpoint_info(alone)['trace_file'].startswith('missing: final.pth')
    rc, out, err = _run(capsys, 'reproduce', alone, '--out', tmp_path/'out', '--json')
    assert rc == 0, (out[-2000:], err[-2000:])
    report = json.loads(out)
    assert report['verdict'].startswith("reproduced: weights, optimizer and generators bit-identical; the "
                                        "per-iteration trace was not beside final.pth"), report['verdict']
    assert report['verdict'].endswith('its digest matches') and 'seed_everything' not in report['verdict']
    assert set(report['quantities'].values()) == {None}
    # with its trace file, the same comparison sees every row
    rc, out, err = _run(capsys, 'reproduce', final, '--out', tmp_path/'with', '--json')
    assert (rc, json.loads(out)['verdict']) == (0, 'reproduced bit for bit')


@pytest.mark.slow
def test_diff_of_two_copies_one_without_its_trace_file(final, tmp_path, capsys):
    alone = _alone(final, tmp_path/'sent')
    for a, b in ((final, alone), (alone, final), (alone, alone)):
        rc, out, err = _run(capsys, 'diff', a, b)
        assert (rc, err) == (0, ''), (out, err)
        assert out.startswith('The runs are identical') and 'its digest matches' in out, out
    rc, out, err = _run(capsys, 'show', alone)
    assert rc == 0 and 'missing; the digest of its rows is in the checkpoint' in out, out


@pytest.mark.slow
def test_a_trace_file_that_is_not_its_own_is_refused_in_one_line(final, tmp_path, capsys):
    pin = split_state(read_checkpoint(final))[2]['callbacks']['repro_cb']['beside']
    other = _alone(final, tmp_path/'other')  # another run's trace file under its name
    TraceLog.create(other.with_name(pin['file']), 'f'*32, [{'trace': {}}])
    cut = _alone(final, tmp_path/'cut')  # its own, truncated
    shutil.copy(final.with_name(pin['file']), cut.with_name(pin['file']))
    with open(cut.with_name(pin['file']), 'r+b') as f: f.truncate(pin['bytes'] - 10)
    for ckpt, why in ((other, 'is not the trace file of the run'), (cut, 'is cut')):
        for argv in (('reproduce', ckpt, '--out', tmp_path/'out'), ('show', ckpt), ('diff', final, ckpt)):
            rc, out, err = _run(capsys, *argv)
            assert (rc, out, err.count('\n')) == (2, '', 1), (argv, out, err)
            assert why in err, (argv, err)


def test_older_formats_alone_and_inside(tmp_path, capsys):
    "Format 6 kept the trace inside; format 7 beside, without a digest: alone, its rows could not be compared"
    rc, out, err = _run(capsys, 'show', FIXTURES/'v6_end.pth')
    assert rc == 0 and 'format       6' in out and 'trace file   inside the checkpoint' in out, out
    six = _alone(FIXTURES/'v6_end.pth', tmp_path/'six')
    rc, out, err = _run(capsys, 'diff', FIXTURES/'v6_end.pth', six)
    assert rc == 0 and 'not beside' not in out, out
    seven = _alone(FIXTURES/'v7_end.pth', tmp_path/'seven')
    rc, out, err = _run(capsys, 'show', seven)
    assert rc == 0 and 'format       7' in out and 'missing (the checkpoint holds no digest of its rows)' in out, out
    rc, out, err = _run(capsys, 'diff', FIXTURES/'v7_end.pth', seven)
    assert (rc, err) == (0, '') and 'its rows could not be compared' in out, out


def test_show_bad_input_in_one_line(tmp_path, capsys):
    good = FIXTURES/'v7_mid.pth'
    bad = bytearray(good.read_bytes()); bad[len(bad)//2] ^= 1
    (tmp_path/'flipped.pth').write_bytes(bytes(bad))
    (tmp_path/'notes.txt').write_text('not a checkpoint')
    (tmp_path/'folder').mkdir()
    for f, why in ((tmp_path/'flipped.pth', 'flipped.pth'), (tmp_path/'notes.txt', 'notes.txt'),
                   (tmp_path/'folder', 'is a folder'), (tmp_path/'nothing.pth', 'no such file')):
        rc, out, err = _run(capsys, 'show', f)
        assert (rc, out, err.count('\n')) == (2, '', 1), (f, out, err)
        assert err.startswith('fastrepro show: error: ') and why in err, err
