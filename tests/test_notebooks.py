"""Every notebook, run as `nbdev-test` runs it, by `docs/execute.py`: in a fixed split of the notebooks in file order
(two processes, each always running the same notebooks in the same order; `nbs/reference.ipynb` says why), as one test
of the suite, so that pytest-xdist runs them on one core while the other test files run on the others. Each notebook's
executed copy goes to `_exec/`, keyed by its code and the library's source: the docs' build (`bash .ci/docs`, which
`tests/test_docs.py` runs) renders those copies' outputs, and a copy whose key matches is not run again, so whichever
of the two comes first executes the notebooks and the other reuses them (one execution for both). The notebooks see
the environment the suite was started with, not the variables `conftest.py` sets for the tests' own processes."""
import subprocess, sys
import pytest
from conftest import ROOT, STARTED_ENV, TEST_SECRET, hang_limit

NOTEBOOKS_QUIET_S = 300  # every notebook, about five minutes on one core of a quiet 2-core machine


@pytest.mark.slow  # the whole book: the inner loop skips it (each notebook also runs alone: `nbdev-test PATH`)
def test_every_notebook(fastai_home):
    env = {**STARTED_ENV, 'FASTAI_HOME': str(fastai_home), 'MPLBACKEND': 'Agg',
           'FASTREPRO_SECRET_FILE': str(TEST_SECRET)}  # the checkpoints they save signed with the tests' secret
    r = subprocess.run([sys.executable, 'docs/execute.py'], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=hang_limit(NOTEBOOKS_QUIET_S))
    assert r.returncode == 0, f"a notebook failed ({r.returncode}):\n{r.stdout[-5000:]}\n{r.stderr[-20000:]}"
    print(r.stdout.strip().splitlines()[-1])  # how many ran, how many were reused
