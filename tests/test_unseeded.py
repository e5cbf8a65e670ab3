"""The unseeded start, said out loud, in fresh processes as a user's script runs: a tabular learner built without a
seed, with `ReproCB(seed=7)`, warns once (at its first fit, not its second) and gets other initial weights each run;
`first_divergence` and `fastrepro diff` name the initial weights as where two such runs part. Built after
`seed_everything`, nothing is said and two runs are the same run."""
import os, sys, subprocess, textwrap
from pathlib import Path
import pytest
from conftest import ROOT, fastrepro_here, hang_limit

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

HANG_S = hang_limit(15)  # stops a hang; the four processes run in about 30 s

SCRIPT = textwrap.dedent('''
    import sys, warnings
    from pathlib import Path
    import numpy as np, pandas as pd
    from fastai.tabular.all import *
    from fastrepro.all import *
    name, out = sys.argv[1], Path(sys.argv[2])
    if name.startswith('seeded'): seed_everything(0)
    r = np.random.RandomState(0)  # the same data in every run
    df = pd.DataFrame({'c': r.choice(list('abc'), 64), 'x': r.randn(64)})
    df['y'] = df.x * 2 + (df.c == 'a')
    dls = TabularDataLoaders.from_df(df, path=out, cat_names=['c'], cont_names=['x'], y_names='y', bs=16,
                                     procs=[Categorify, Normalize])
    learn = tabular_learner(dls, layers=[8], n_out=1, cbs=ReproCB(seed=7))
    with learn.no_bar(), learn.no_logging():
        learn.fit(1, 1e-2); learn.fit(1, 1e-2)  # the second fit says nothing more
    save_trace(learn.repro_trace, out/f'{name}.trace')
    print('DIGEST', state_digest(learn.model))
''')


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "name -> (stdout, stderr) of the script, run in four fresh processes at once"
    out = tmp_path_factory.mktemp('unseeded')
    (out/'train.py').write_text(SCRIPT)
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    procs = {n: subprocess.Popen([sys.executable, 'train.py', n, str(out)], cwd=out, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for n in ('unseeded_a', 'unseeded_b', 'seeded_a', 'seeded_b')}
    res = {n: p.communicate(timeout=HANG_S) for n, p in procs.items()}
    for n, p in procs.items(): assert p.returncode == 0, (n, res[n][1][-3000:])
    return out, res


def _said(stderr:str) -> int: return stderr.count('this learner was built before any seed was set')

def _digest(stdout:str) -> str: return next(l.split()[1] for l in stdout.splitlines() if l.startswith('DIGEST'))


def test_unseeded_start_warns_once_and_parts_at_the_initial_weights(runs, capsys):
    from fastrepro.record.trace import load_trace
    from fastrepro.record.divergence import first_divergence, BEFORE_TRAINING
    out, res = runs
    for n in ('unseeded_a', 'unseeded_b'):
        assert _said(res[n][1]) == 1, res[n][1][-3000:]
        assert 'UnseededStartWarning' in res[n][1] and 'seed_everything(seed)' in res[n][1]
    assert _digest(res['unseeded_a'][0]) != _digest(res['unseeded_b'][0])
    a, b = load_trace(out/'unseeded_a.trace'), load_trace(out/'unseeded_b.trace')
    assert first_divergence(a, b) == BEFORE_TRAINING
    diff = fastrepro_here(capsys, 'diff', out/'unseeded_a.trace', out/'unseeded_b.trace')
    assert diff.returncode == 1 and 'the initial weights, before fit 0' in diff.stdout, (diff.stdout, diff.stderr)


def test_seeded_start_says_nothing_and_is_the_same_run(runs):
    from fastrepro.record.trace import load_trace
    from fastrepro.record.divergence import first_divergence
    out, res = runs
    for n in ('seeded_a', 'seeded_b'): assert _said(res[n][1]) == 0, res[n][1][-3000:]
    assert _digest(res['seeded_a'][0]) == _digest(res['seeded_b'][0])
    assert first_divergence(load_trace(out/'seeded_a.trace'), load_trace(out/'seeded_b.trace')) is None
