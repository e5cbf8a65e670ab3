"""`fastrepro selftest` as a user runs it: in its own process, it fails naming the checks when one of fastrepro's
data patches is undone (a `sitecustomize` puts fastai's own `DataLoader.create_batches` back in every process the
selftest starts); through the command line's `main`, it says in one line, exit 2, that it cannot run where it cannot
write its temporary folder (`--tmp`), leaving nothing behind. That it passes on this installation, records its result
in a ledger and writes nothing where it runs is shown on its page (nbs/check/05_proof.ipynb), which the suite runs."""
import os, re
import pytest
from pathlib import Path
from conftest import fastrepro_cli as fastrepro, fastrepro_here, hang_limit

HANG_S = hang_limit(60)  # stops a hang: the selftest takes about 40 s on 2 quiet cores (it bounds each check process)

UNDO_PATCH = '''
from fastai.data.load import DataLoader
# the import guard's probe runs first, on fastrepro's patches: the selftest's own checks must find the undone one
import fastrepro.state.data, fastrepro.state.passes
DataLoader.{0} = fastrepro.state.data._fastai['{0}']  # fastai's method, everywhere
'''
# what each undone patch breaks: fastai's `__iter__` serves a resumed pass whole (and the guard's probe sees it);
# fastai's `create_batches` makes items without their streams, so a worker's draws are not the main process's
# (which checks may fail, what the TfmdDL's failed line says: where the runs part, or the resume refused)
BREAKS = {'__iter__': ('resume', r'the runs part at fit 0, epoch \d+, iteration \d+|after batch \d+'),
          'create_batches': ('DataLoader workers', r'the runs part at fit 0, epoch \d+, iteration \d+')}


def checks(out:str) -> dict:
    "The check lines of the selftest's output: name -> status"
    return {m[2]: m[1] for m in re.finditer(r'^(passed|failed|skipped)  +(.+?)(?:: |$)', out, re.M)}


@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
@pytest.mark.parametrize('patch', list(BREAKS))
def test_selftest_fails_without_a_data_patch(tmp_path, patch):
    (tmp_path/'site').mkdir()
    (tmp_path/'site'/'sitecustomize.py').write_text(UNDO_PATCH.format(patch))
    env = dict(PYTHONPATH=os.pathsep.join([str(tmp_path/'site'), str(Path(__file__).resolve().parents[1])]))
    res = fastrepro('selftest', cwd=tmp_path, timeout=HANG_S, **env)
    assert res.returncode == 1, res.stdout + res.stderr
    found = checks(res.stdout)
    assert len(found) == 19, res.stdout
    failed = [n for n, s in found.items() if s == 'failed']
    checks_hit, where = BREAKS[patch]
    assert failed and all(checks_hit in n or n.startswith("fastai's DataLoader") for n in failed), res.stdout
    assert all(found[n] == 'passed' for n in found if 'same seed twice' in n), res.stdout
    assert re.search(rf"^failed +.*{checks_hit}.*TfmdDL.*\): .*({where})", res.stdout, re.M), res.stdout
    assert 'do NOT all hold' in res.stdout and 'train without checkpoints inside epochs' in res.stdout


def test_selftest_cannot_write_its_folder(tmp_path, capsys):
    res = fastrepro_here(capsys, 'selftest', '--tmp', tmp_path/'missing')  # refused before anything runs
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [l for l in res.stderr.strip().splitlines()
                                               if l.startswith('fastrepro selftest could not run: ')][-1:]
    assert f"cannot write its temporary folder in {tmp_path/'missing'}" in res.stderr, res.stderr
    assert not list(tmp_path.iterdir())
