"""Provenance as people really work (issue 22), with real git repositories, real processes and a real Jupyter kernel in
temporary folders: a script run again and again in its repository (its models, exports and ledger are no code), an
untracked module it imports (code) beside a large data file (not), a notebook run in a kernel and saved with outputs,
and how each run was started (`python train.py`, `python -m`, torchrun, a notebook), read back from the checkpoint and
the ledger."""
import json, os, socket, platform, subprocess, sys
from pathlib import Path
import pytest
from conftest import ROOT, hang_limit

from fastrepro.checkpoint.file import checkpoint_info
from fastrepro.experiments.ledger import Ledger
from fastrepro.record.provenance import git_info, git_patch, MAX_CODE_BYTES
from fastrepro.record.trust import record_problem
from fastrepro.check.reproduce import carried_code, commit_files
import fastrepro.callback.repro  # noqa: F401  (ReproCB's part of `checkpoint_info`)

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

RUN_TIMEOUT_S = hang_limit(30)  # one training process: a fastai import (about 4 s) and a tiny fit; a hang is a failure
SIZE_SLACK = 4096  # the checkpoints of three runs of one script differ by their ledger ids and timings, not by KBs

TRAIN = '''"A tiny training script, as a fastai user writes one: it saves its model, an export and a ledger in its repo"
import argparse, pickle
from pathlib import Path
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, FitRecord, Ledger
p = argparse.ArgumentParser()
p.add_argument('--lr', type=float, default=1e-2)
p.add_argument('--allow-dirty', action='store_true')
p.add_argument('--name', default='m')
args = p.parse_args()
try: import helpers  # an untracked module, where a test writes one
except ImportError: pass
learn = synth_learner(path='.', cbs=ReproCB(seed=1, allow_dirty=args.allow_dirty,
                                            ledger=FitRecord(Ledger('runs.db'), 'synth')))
with learn.no_bar(), learn.no_logging(): learn.fit(1, args.lr)
learn.save(args.name)
Path('export.pkl').write_bytes(pickle.dumps(learn.model.state_dict()))
'''

DISTRIB = '''from fastai.basics import *
from fastai.distributed import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, FitRecord, Ledger
import torch.distributed as dist
learn = synth_learner(path='.', cbs=ReproCB(seed=1, ledger=FitRecord(Ledger('runs.db'), 'ddp')))
with learn.distrib_ctx():
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
    learn.save('ddp')
    dist.barrier()
'''


def _runs_unasked(root, entry) -> bool:
    "Is `entry` a record fastrepro writes, whose command is the commit's own (`reproduce` runs it without --trust)?"
    return record_problem(None, entry) is None and not carried_code(dict(commit='0' * 40), entry,
                                                                     commit_files(root, 'HEAD'))


def _git(root, *args): return subprocess.run(['git', *args], cwd=root, check=True, capture_output=True, text=True)


def _repo(root: Path, files: dict) -> Path:
    "A git repository in `root` with `files` committed"
    root.mkdir(parents=True, exist_ok=True)
    _git(root, 'init', '-q', '-b', 'main')
    _git(root, 'config', 'user.name', 'tests'); _git(root, 'config', 'user.email', 'tests@fastrepro.invalid')
    for name, text in files.items():
        (root/name).parent.mkdir(parents=True, exist_ok=True)
        (root/name).write_text(text)
    _git(root, 'add', '-A'); _git(root, 'commit', '-qm', 'initial')
    return root


def _env(**more):
    return {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]),
            'OMP_NUM_THREADS': '1', 'MPLBACKEND': 'Agg', **more}


def _run(root, *args, status=0, env=None):
    p = subprocess.run([sys.executable, *args], cwd=root, env=env or _env(), capture_output=True, text=True,
                       timeout=RUN_TIMEOUT_S)
    assert (p.returncode == 0) == (status == 0), (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    return p


def _last_entry(root, experiment='synth'):
    return Ledger(root/'runs.db').runs(experiment=experiment).entry.iloc[-1]


def test_a_script_run_again_in_its_repository(tmp_path):
    root = _repo(tmp_path/'proj', {'train.py': TRAIN, 'config.yaml': 'lr: 0.01\n', '.gitignore': '__pycache__/\n'})
    for i in range(3): _run(root, 'train.py')  # runs 2 and 3 see run 1's model, export and ledger: not code
    info = checkpoint_info(root/'models'/'m.pth')
    assert (info['git']['dirty'], info['git']['untracked']) == (False, [])
    assert len(Ledger(root/'runs.db').runs(experiment='synth')) == 3

    (root/'config.yaml').write_text('lr: 0.02\n')  # a change of the code: the patch holds it, and only it
    sizes, patches = [], []
    for i in range(3):
        _run(root, 'train.py', '--allow-dirty', '--name', f'dirty{i}')
        info = checkpoint_info(root/'models'/f'dirty{i}.pth')
        sizes.append((root/'models'/f'dirty{i}.pth').stat().st_size); patches.append(info['git']['patch'])
    assert max(sizes) - min(sizes) <= SIZE_SLACK, sizes
    assert patches[0] == patches[1] == patches[2] and '+lr: 0.02' in patches[0]
    for name in ('.pth', '.pkl', 'runs.db', 'models/'): assert name not in patches[0], name
    assert info['git']['modified'] == ['config.yaml']


def test_an_untracked_module_is_code_and_a_large_data_file_is_not(tmp_path):
    root = _repo(tmp_path/'proj', {'train.py': TRAIN})
    (root/'helpers.py').write_text('SCALE = 2\n')  # imported by train.py, never committed
    (root/'data').mkdir()
    (root/'data'/'big.csv').write_bytes(b'1,2\n' * (MAX_CODE_BYTES // 4 + 1))
    (root/'data'/'big.json').write_text('[' + '0,' * (MAX_CODE_BYTES // 2) + '0]')
    p = _run(root, 'train.py', status=1)
    assert 'DirtyTreeError' in p.stderr and 'untracked: helpers.py' in p.stderr, p.stderr[-3000:]
    assert 'big.csv' not in p.stderr and 'big.json' not in p.stderr
    _run(root, 'train.py', '--allow-dirty')
    info = checkpoint_info(root/'models'/'m.pth')
    assert info['git']['untracked'] == ['helpers.py'] and info['git']['imported'] == ['helpers.py']
    assert '+SCALE = 2' in info['git']['patch'] and 'big.' not in info['git']['patch']
    assert _last_entry(root)['command'] == ['train.py', '--allow-dirty']
    assert git_info(root)['untracked'] == ['helpers.py']  # this process imported nothing from it: a source file still


def test_entry_points_of_a_script_and_a_module(tmp_path):
    root = _repo(tmp_path/'proj', {'train.py': TRAIN, 'pkg/__init__.py': '', 'pkg/train.py': TRAIN,
                                   '.gitignore': '__pycache__/\n'})
    (root/'sub').mkdir()
    _run(root/'sub', '-X', 'faulthandler', '../train.py', '--lr', '1e-3', env=_env(PYTHONHASHSEED='0'))
    entry = checkpoint_info(root/'sub'/'models'/'m.pth')['entry']
    assert (entry['kind'], entry['command'], entry['python_options'], entry['cwd']) == \
        ('script', ['train.py', '--lr', '1e-3'], ['-X', 'faulthandler'], 'sub')
    assert entry['env']['PYTHONHASHSEED'] == '0' and entry['env']['OMP_NUM_THREADS'] == '1'
    assert (entry['launcher'], entry['cells'], entry['python']) == (None, None, platform.python_version())
    assert Ledger(root/'sub'/'runs.db').runs().entry.iloc[-1] == entry
    assert _runs_unasked(root, entry)  # issue 49: a committed script with -X faulthandler, from a folder

    _run(root, '-m', 'pkg.train', '--name', 'module')
    entry = checkpoint_info(root/'models'/'module.pth')['entry']
    assert (entry['kind'], entry['command'], entry['cwd']) == ('module', ['-m', 'pkg.train', '--name', 'module'], '.')
    assert _last_entry(root) == entry
    assert _runs_unasked(root, entry)


def test_entry_point_of_a_torchrun_launch(tmp_path):
    pytest.importorskip('accelerate', reason="fastai's distrib_ctx needs Accelerate (in the dev extras)")
    root = _repo(tmp_path/'proj', {'ddp.py': DISTRIB, '.gitignore': '__pycache__/\n'})
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
    _run(root, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--master_addr', '127.0.0.1', '--master_port',
         str(port), 'ddp.py', env=_env(ACCELERATE_USE_CPU='1'))
    entry = checkpoint_info(root/'models'/'ddp.pth')['entry']
    assert (entry['kind'], entry['command'], entry['python_options']) == ('script', ['ddp.py'], ['-u'])
    assert entry['launcher'] == dict(name='torchrun', world_size=2, nproc_per_node=2, nnodes=1)
    assert (entry['env']['WORLD_SIZE'], entry['env']['ACCELERATE_USE_CPU']) == ('2', '1')
    assert _last_entry(root, 'ddp') == entry
    assert _runs_unasked(root, entry)  # issue 49: torchrun's own launch, re-run as it was


# IPython keeps no last newline
NOTEBOOK_CELLS = ['x = 1', TRAIN.split('args = p.parse_args()\n')[1].replace('args.allow_dirty', 'False')
                  .replace('args.lr', '1e-2').replace('args.name', "'nb'").rstrip('\n')]


def test_a_notebook_run_in_a_kernel(tmp_path, monkeypatch):
    nbformat, nbclient = pytest.importorskip('nbformat'), pytest.importorskip('nbclient')
    pytest.importorskip('ipykernel', reason='a Jupyter kernel (ipykernel, in the dev extras)')
    imports = TRAIN.split('p = argparse')[0].rstrip('\n')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(imports), *map(nbformat.v4.new_code_cell,
                                                                                  NOTEBOOK_CELLS)])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    root = _repo(tmp_path/'proj', {'explore.ipynb': nbformat.writes(nb) + '\n', '.gitignore': '__pycache__/\n'})
    monkeypatch.setenv('JPY_SESSION_NAME', str(root/'explore.ipynb'))  # as Jupyter Server tells its kernels
    for k, v in _env().items(): monkeypatch.setenv(k, v)

    def _execute(nb, edit_first=None):
        "Run `nb`'s cells in a fresh kernel; with `edit_first`, the first cell is run, edited, and run again"
        client = nbclient.NotebookClient(nb, kernel_name='python3', timeout=RUN_TIMEOUT_S,
                                         resources={'metadata': {'path': str(root)}})
        with client.setup_kernel():
            client.execute_cell(nb.cells[0], 0)
            client.execute_cell(nb.cells[1], 1)
            if edit_first is not None:
                nb.cells[1].source = edit_first
                client.execute_cell(nb.cells[1], 1)
            client.execute_cell(nb.cells[2], 2)
        return nb

    ran = _execute(nbformat.read(root/'explore.ipynb', as_version=4))
    nbformat.write(ran, root/'explore.ipynb')  # saved with outputs and execution counts: the code is the commit's
    saved = json.loads((root/'explore.ipynb').read_text())['cells']
    assert all(c['execution_count'] for c in saved) and any(c['outputs'] for c in saved)
    info = checkpoint_info(root/'models'/'nb.pth')
    assert (info['git']['dirty'], git_info(root)['dirty']) == (False, False)
    entry = info['entry']
    assert (entry['kind'], entry['notebook']) == ('notebook', 'explore.ipynb')
    assert entry['cells'] == [nb.cells[0].source, *NOTEBOOK_CELLS]

    ran = _execute(nbformat.read(root/'explore.ipynb', as_version=4), edit_first='x = 2')  # edited and re-run
    entry = checkpoint_info(root/'models'/'nb.pth')['entry']
    assert entry['cells'] == [nb.cells[0].source, 'x = 1', 'x = 2', NOTEBOOK_CELLS[1]]  # in execution order
    assert _last_entry(root) == entry

    nbformat.write(ran, root/'explore.ipynb')  # the edited cell saved, with outputs
    info = git_info(root)
    assert (info['dirty'], info['modified']) == (True, ['explore.ipynb'])
    patch = git_patch(root)
    changed = [l for l in patch.splitlines() if l[:1] in '+-' and l[:3] not in ('+++', '---')]
    assert changed == ['-    "x = 1"', '+    "x = 2"'], changed  # the cell's source, no outputs
