"""Every notebook, as `nbdev-test --n-workers 1` runs them: in one process, in file order (`nbs/index.ipynb` says why),
as one test of the suite, so that pytest-xdist runs them on one core while the other test files run on the others,
instead of before them all. The notebooks see the environment the suite was started with, not the variables
`conftest.py` sets for the tests' own processes."""
import os, shutil, subprocess, sys
from pathlib import Path
import pytest
from conftest import ROOT, STARTED_ENV, TEST_SECRET, hang_limit

NOTEBOOKS_QUIET_S = 300  # every notebook in one process, about five minutes on one core of a quiet 2-core machine


@pytest.mark.slow  # the whole book: the inner loop skips it (each notebook also runs alone: `nbdev-test PATH`)
def test_every_notebook_in_one_process(fastai_home):
    here = os.pathsep.join([str(Path(sys.executable).parent), os.environ['PATH']])  # this Python's scripts first
    nbdev_test = shutil.which('nbdev-test', path=here)
    env = {**STARTED_ENV, 'FASTAI_HOME': str(fastai_home), 'MPLBACKEND': 'Agg',
           'FASTREPRO_SECRET_FILE': str(TEST_SECRET)}  # the checkpoints they save signed with the tests' secret
    r = subprocess.run([nbdev_test, '--n-workers', '1'], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=hang_limit(NOTEBOOKS_QUIET_S))
    assert r.returncode == 0, f"nbdev-test failed ({r.returncode}):\n{r.stdout[-5000:]}\n{r.stderr[-20000:]}"
