"""Reproducing someone else's checkpoint runs nothing it carries without consent (issue 49). One run of a committed
script with an uncommitted change, written with a colleague's secret; copies of its checkpoint rewritten the way
anyone holding the file can (`torch.load`, edit, `torch.save`; a patch made with fastrepro's own
`git_patch`/`git_info`), each refused in a fresh process before anything runs: exit 2, one line, and the marker file
the carried code would write never appears. A ledger row edited in the database (SQLite, a team's PostgreSQL) is
refused the same way. Good paths: `--plan` runs nothing, `--trust` reproduces the colleague's checkpoint, `fastrepro
trust FILE` then reproduces it without a flag."""
import json, shutil, sqlite3, subprocess, sys
from pathlib import Path
import pytest
import torch
from conftest import fastrepro_cli, hang_limit
from test_reproduce import _repo, _git, _env

from fastrepro.checkpoint.file import checkpoint_info, read_checkpoint, split_state
from fastrepro.checkpoint.formats import pack_git, pack_entry
from fastrepro.record.provenance import git_info, git_patch
from fastrepro.record.trust import sign_run, trusted_file
from fastrepro.experiments.ledger import Ledger

pytestmark = pytest.mark.slow  # trains and re-runs in fresh processes: the inner loop (-m "not slow") skips it

RUN_TIMEOUT_S = hang_limit(30)  # a fastai import (about 5 s) and a tiny fit, or a refusal of many files
COLLEAGUE_KEY = 'a colleague secret, not the tests' * 2

TRAIN = '''"A fastai user's script: one tiny fit, its checkpoint, its ledger record"
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, FitRecord, Ledger, seed_everything
LR = 1e-2
seed_everything(5)  # the model and data are built before the fit seeds
repro = ReproCB(seed=5, allow_dirty=True, ledger=FitRecord(Ledger('runs.db'), 'x'))
learn = synth_learner(n_trn=2, path='.', cbs=repro)
with learn.no_bar(), learn.no_logging(): learn.fit(1, LR)
learn.save('ck')
'''


def _marker_code(marker:Path) -> str: return f"open({str(marker)!r}, 'w').write('ran')"


@pytest.fixture(scope='module')
def colleague(tmp_path_factory):
    "A colleague's run: committed script, an uncommitted change (its patch), written with the colleague's secret"
    base = tmp_path_factory.mktemp('trust')
    (base/'colleague').mkdir()
    (base/'colleague'/'secret').write_text(COLLEAGUE_KEY)
    root = _repo(base/'proj', {'train.py': TRAIN, '.gitignore': '__pycache__/\n/models/\n/runs.db\n'})
    (root/'train.py').write_text(TRAIN.replace('LR = 1e-2', 'LR = 2e-2'))  # the uncommitted change
    p = subprocess.run([sys.executable, 'train.py'], cwd=root, timeout=RUN_TIMEOUT_S, capture_output=True, text=True,
                       env=_env(FASTREPRO_SECRET_FILE=str(base/'colleague'/'secret')))
    assert p.returncode == 0, p.stderr[-3000:]
    return root, root/'models'/'ck.pth'


def _craft(ck:Path, dest:Path, git:dict|None=None, entry:dict|None=None, signature:str|None=None) -> Path:
    "A copy of `ck` with its git record and entry point changed, as anyone holding the file can; `signature` stored"
    state = read_checkpoint(ck)
    extra = split_state(state)[2]
    prov, info = extra['callbacks']['repro_cb']['provenance'], checkpoint_info(ck)
    prov['git'] = pack_git({**info['git'], **(git or {})})
    prov['entry'] = pack_entry({**info['entry'], **(entry or {})})
    if signature is not None: prov['signature'] = signature
    state['opt']['__fastrepro__'] = extra
    torch.save(state, dest)
    return dest


DRIVER = '''import sys, io, json, contextlib
from fastrepro.cli import main
res = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()): rc = main(argv)
    res[name] = rc, [l for l in err.getvalue().splitlines() if not l.startswith('fastrepro: warning:')]
print(json.dumps(res))
'''


def _refusals(cases:dict, cwd:Path) -> dict:
    "`fastrepro CASE...` of each case, one after another in one fresh process: name -> (exit code, stderr lines)"
    p = subprocess.run([sys.executable, '-c', DRIVER, json.dumps({k: list(map(str, v)) for k, v in cases.items()})],
                       cwd=cwd, env=_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def _assert_refused(res:dict, name:str, *expected):
    rc, lines = res[name]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith('fastrepro '), (name, rc, lines)
    for e in expected: assert e in lines[0], (name, lines[0])


def test_crafted_files_are_refused_before_anything_runs(colleague, tmp_path):
    root, ck = colleague
    info, m = checkpoint_info(ck), tmp_path/'markers'
    m.mkdir()
    def marker(name): return m/name
    site = tmp_path/'site'
    site.mkdir()
    (site/'sitecustomize.py').write_text(_marker_code(marker('sitecustomize')) + '\n')
    (tmp_path/'x.py').write_text(_marker_code(marker('dotdot')) + '\n')
    # the patch replaced by one that adds the code to the script, made with fastrepro's own functions
    (root/'train.py').write_text(TRAIN.replace('LR = 1e-2', 'LR = 2e-2') + _marker_code(marker('patch')) + '\n')
    outs = [root/'models']
    try: evil = dict(patch=git_patch(root, outs), diff_hash=git_info(root, outs)['diff_hash'])
    finally: (root/'train.py').write_text(TRAIN.replace('LR = 1e-2', 'LR = 2e-2'))
    mine = sign_run(info['git'], info['entry'])  # this user's (the tests') signature of the record as it was
    env = info['entry']['env']
    files = {  # name -> (git, entry, signature, expected in the line)
        'option -c': (None, dict(python_options=['-c', _marker_code(marker('option -c'))]), None,
                      'field entry.python_options holds -c'),
        'PYTHONPATH sitecustomize': (None, dict(env={**env, 'PYTHONPATH': str(site)}), mine,
                                     'field entry.env holds PYTHONPATH'),
        'notebook cells': (None, dict(kind='notebook', command=['-m', 'ipykernel_launcher', '-f', 'k.json'],
                                      cells=[_marker_code(marker('notebook cells'))]), None,
                           '1 recorded notebook cells'),
        'replaced patch': (evil, None, None, 'a patch of 1 file(s) (train.py +2 -1)'),
        **{f'env {v}': (None, dict(env={**env, v: str(tmp_path/'x.py')}), mine, f'field entry.env holds {v}')
           for v in ('LD_PRELOAD', 'PYTHONSTARTUP', 'PYTHONPATH', 'BASH_ENV')},
        'option -m': (None, dict(python_options=['-m', 'pip']), None, 'field entry.python_options holds -m'),
        **{f'option {" ".join(o)}': (None, dict(python_options=o), mine, f'field entry.python_options holds {o[0]}')
           for o in (['-I'], ['-E'], ['-IE'], ['-E', '-I'])},
        'command /usr/bin': (None, dict(command=['/usr/bin/touch', str(marker('usr bin'))]), None,
                             'the command `python /usr/bin/touch'),
        'command ../x.py': (None, dict(command=['../x.py']), None,
                            'the command `python ../x.py` (in .), which is no file'),
        'command -m pip': (None, dict(kind='module', command=['-m', 'pip', 'install', 'x']), None,
                           'the command `python -m pip install x`'),
        'launcher args': (None, dict(launcher=dict(name='torchrun', world_size=1, nproc_per_node=1, nnodes=1,
                                                   rdzv_endpoint='evil:1')), mine, 'field entry.launcher'),
        'signed then changed': (dict(patch=info['git']['patch'] + '+' + _marker_code(marker('changed')) + '\n'), None,
                                mine, 'its signature does not verify with your secret'),
        'dirty without patch': (dict(patch=None), None, mine, 'field git.diff_hash says the tree was dirty'),
        'modified without patch': (dict(patch=None, diff_hash=None, dirty=False), None, mine,
                                   'field git.modified says the tree was dirty'),
    }
    cases = {name: ['reproduce', _craft(ck, tmp_path/f'{i}.pth', g, en, s), '--out', tmp_path/'out']
             for i, (name, (g, en, s, _)) in enumerate(files.items())}
    cases['another secret'] = ['reproduce', ck, '--out', tmp_path/'out']  # the colleague's file as it was written
    isolated = _craft(ck, tmp_path/'isolated.pth', None, dict(python_options=['-I']), mine)
    cases['-I with --command'] = ['reproduce', isolated, '--command', 'python train.py', '--out', tmp_path/'out']
    book = tmp_path/'row.db'  # a ledger row whose entry was edited in the database
    shutil.copy(root/'runs.db', book)
    with sqlite3.connect(book) as db:
        row = json.loads(db.execute('SELECT entry FROM runs WHERE id = 1').fetchone()[0])
        db.execute('UPDATE runs SET entry = ? WHERE id = 1', (json.dumps({**row, 'command': ['../x.py']}),))
    cases['ledger row command'] = ['reproduce', '--ledger', book, '--run', 1, '--trust', '--out', tmp_path/'out']
    shutil.copy(book, tmp_path/'row2.db')
    with sqlite3.connect(tmp_path/'row2.db') as db:
        db.execute('UPDATE runs SET entry = ? WHERE id = 1', (json.dumps({**row, 'env': {'LD_PRELOAD': 'x.so'}}),))
    cases['ledger row env'] = ['reproduce', '--ledger', tmp_path/'row2.db', '--run', 1, '--out', tmp_path/'out']
    res = _refusals(cases, tmp_path)
    for name, (_, _, _, expected) in files.items(): _assert_refused(res, name, expected)
    for name in ('notebook cells', 'replaced patch', 'command /usr/bin', 'command ../x.py', 'command -m pip',
                 'another secret'):  # what it would run, and how to consent
        _assert_refused(res, name, 'would run code it carries', 'fastrepro reproduce --plan', 'fastrepro reproduce '
                        '--trust', 'reproduce(..., trust=True)', 'fastrepro trust')
    _assert_refused(res, 'another secret', 'a patch of 1 file(s) (train.py +1 -1)', 'does not verify with your secret')
    # the user's own command line replaces the recorded options: past them, the patch still asks for consent
    _assert_refused(res, '-I with --command', 'a patch of 1 file(s) (train.py +1 -1);', 'does not verify')
    _assert_refused(res, 'option -I', 're-run with your own command line (command=, --command)')
    _assert_refused(res, 'ledger row command', "Ledger run 1's field entry.command is not what its checkpoint")
    _assert_refused(res, 'ledger row env', 'Ledger run 1: field entry.env holds LD_PRELOAD')
    assert sorted(p.name for p in m.iterdir()) == [], 'the carried code ran'
    assert not (tmp_path/'out').exists()
    assert _git(root, 'worktree', 'list').count('\n') == 1


def test_plan_runs_nothing_trust_reproduces(colleague, tmp_path):
    root, ck = colleague
    before = _git(root, 'worktree', 'list', '--porcelain')
    p = fastrepro_cli('reproduce', '--plan', ck, '--out', tmp_path/'plan', cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr[-3000:]
    for e in (f"commit       {checkpoint_info(ck)['git']['commit']}", 'patch        1 file(s): train.py +1 -1',
              'command      ', '<worktree>/train.py', 'in           <worktree>\n', 'OMP_NUM_THREADS=1',
              'environment  predicted before the re-run: bit-identical',
              'trusted      no: refused without --trust', 'runs nothing'):
        assert e in p.stdout, (e, p.stdout)
    assert not (tmp_path/'plan').exists() and _git(root, 'worktree', 'list', '--porcelain') == before
    p = fastrepro_cli('reproduce', '--trust', ck, '--out', tmp_path/'once', cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0 and 'reproduced bit for bit' in p.stdout, (p.stdout[-2000:], p.stderr[-3000:])
    p = fastrepro_cli('trust', ck, cwd=tmp_path)
    assert p.returncode == 0 and str(trusted_file()) in p.stdout, p.stderr
    p = fastrepro_cli('reproduce', ck, '--out', tmp_path/'later', cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0 and 'reproduced bit for bit' in p.stdout, (p.stdout[-2000:], p.stderr[-3000:])
    assert _git(root, 'worktree', 'list', '--porcelain') == before


def test_an_edited_row_of_a_shared_postgresql_ledger_is_refused(colleague, pg_url, tmp_path):
    "A row of a team's PostgreSQL ledger, which any teammate writes: as written it plans; edited, it is refused"
    root, ck = colleague
    row = Ledger(root/'runs.db').runs(id=1).iloc[0]
    shared = Ledger(pg_url)
    rid = shared.add(dict(experiment=row.experiment, seed=int(row.seed), commit=row.commit, git=row.git,
                          entry=row.entry, run_key=row.run_key))
    p = fastrepro_cli('reproduce', '--ledger', pg_url, '--run', rid, '--plan', cwd=tmp_path, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0 and f'--plan {ck}: runs nothing' in p.stdout, (p.stdout[-2000:], p.stderr[-2000:])
    shared.update(rid, entry={**row.entry, 'cwd': 'models'})  # where the checkpoint is looked for: still found
    p = fastrepro_cli('reproduce', '--ledger', pg_url, '--run', rid, '--trust', '--out', tmp_path/'out', cwd=tmp_path,
                      timeout=RUN_TIMEOUT_S)
    lines = [l for l in p.stderr.splitlines() if not l.startswith('fastrepro: warning:')]
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-3000:])
    assert f"Ledger run {rid}'s field entry.cwd is not what its checkpoint" in lines[0], lines[0]
    assert not (tmp_path/'out').exists() and _git(root, 'worktree', 'list').count('\n') == 1
