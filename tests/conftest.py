"Shared fixtures: the IMDB sample under a temporary FASTAI_HOME, so nothing is downloaded."
import os, shutil, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_CSV = ROOT.parent/'shared'/'data'/'imdb_sample'/'texts.csv'

@pytest.fixture(scope='session')
def fastai_home(tmp_path_factory):
    "A FASTAI_HOME holding the IMDB sample (from $FASTAI_HOME if it has one, else from ../shared)"
    cur = os.environ.get('FASTAI_HOME')
    if cur and (Path(cur)/'data'/'imdb_sample'/'texts.csv').exists(): return Path(cur)
    home = tmp_path_factory.mktemp('fastai_home')
    dest = home/'data'/'imdb_sample'
    dest.mkdir(parents=True)
    shutil.copy(SHARED_CSV, dest/'texts.csv')
    os.environ['FASTAI_HOME'] = str(home)
    return home

def run_py(code, cwd, env=None, timeout=600):
    "Run `code` in a fresh Python process; return its stdout (raise with its stderr on failure)"
    import subprocess
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([sys.executable, '-c', code], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0: raise AssertionError(f"subprocess failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r.stdout
