"""Portable mode (issue 12): the same bits on any x86-64 CPU. Each test runs a fresh process, most of them under the
launcher `python -m fastrepro.portable`, since torch, MKL and oneDNN pick their kernels when they start.

The committed digests are those of `fastrepro demo --profile test`'s reference run (the tiny ULMFiT language model,
then the classifier on its encoder; seed 42, one thread) in portable mode. They were made on an AMD EPYC (family 25,
AVX-512; torch 2.14.1+cu130 with MKL 2024.2 and oneDNN 3.12, glibc 2.36). Any machine that runs this test must give the
same: if another CPU does not, that is a finding about portable mode on that CPU (report it with both machines'
`fastrepro env` output), not a test to loosen. Other torch, MKL or oneDNN versions, or another C library, may round
differently: the digests are for these versions."""
import os, sys, json, subprocess
from pathlib import Path
import pytest
from conftest import ROOT, run_py, hang_limit

PORTABLE_LM, PORTABLE_CLAS = '81c393a2986b', '7e896ffa21e0'  # sha256[:12] of the portable run's models (see above)
# An open finding (issue "Portable mode gives other bits on an Intel Xeon with AVX-512"): a 2-core Intel Xeon (AVX-512,
# AMX) gives 57795c262558 / 54a457655f8e in portable mode, with torch 2.14.1 and 2.15.0 and the code that committed the
# digests, from the same data (vocabulary, batch counts and native losses agree with the AMD's to a few ulps). No MKL
# (CBWR, instructions, CPU type), oneDNN, glibc, NumPy or OpenBLAS pin tried there changes it; the computation that
# differs can only be named by comparing single operations on both machines. Those digests, on an Intel CPU, are that
# finding (an expected failure); any other digests, and every other check, fail as on any machine.
INTEL_FINDING = ('57795c262558', '54a457655f8e')
INTEL = Path('/proc/cpuinfo').exists() and 'GenuineIntel' in Path('/proc/cpuinfo').read_text()
RUN_TIMEOUT_S = hang_limit(30)


def launch(*args, timeout=RUN_TIMEOUT_S, **env) -> subprocess.CompletedProcess:
    "`python -m fastrepro.portable args` in a fresh process, this checkout's fastrepro first on its path"
    e = {k: v for k, v in os.environ.items() if not k.startswith(('MKL_', 'ATEN_', 'ONEDNN_', 'OMP_'))}
    e.update(PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]), **env)
    return subprocess.run([sys.executable, '-m', 'fastrepro.portable', *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


def result(p) -> dict:
    "The JSON a process printed on its line starting with RESULT"
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
    return json.loads([l for l in p.stdout.splitlines() if l.startswith('RESULT ')][-1][len('RESULT '):])


DIGESTS = '''
import json, tempfile, warnings
from fastrepro.state.kernels import set_portable, portable_problems
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    set_portable()
    from fastrepro.demo.shared import Demo
    from fastrepro.state.environment import cpu_kernels
    run = Demo('test', out=tempfile.mkdtemp(), progress=False).reference
said = [str(o.message) for o in w if 'Not portable' in str(o.message)]
print('RESULT', json.dumps(dict(lm=run.lm.digest[:12], clas=run.clas.digest[:12], kernels=cpu_kernels(),
                                left=portable_problems(), said=said)))
'''

@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_portable_digests_are_the_committed_ones(fastai_home):
    r = result(launch('-c', DIGESTS))
    assert r['left'] == {} and r['said'] == [], r
    assert r['kernels']['aten'] == 'DEFAULT' and r['kernels']['onednn'] == 'off', r['kernels']
    assert r['kernels']['mkl_cbwr'] in (None, 'COMPATIBLE'), r['kernels']
    if INTEL and (r['lm'], r['clas']) == INTEL_FINDING:
        pytest.xfail(f"portable digests {INTEL_FINDING} on this Intel CPU, not the AMD's: the open finding above")
    assert (r['lm'], r['clas']) == (PORTABLE_LM, PORTABLE_CLAS), (
        f"portable digests {r['lm']} {r['clas']} on this machine, committed {PORTABLE_LM} {PORTABLE_CLAS}: "
        f"{r['kernels']}")


REPRO_CB = '''
import json, warnings, torch
from fastai.test_utils import synth_learner
from fastai.callback.core import Callback
from fastrepro.callback.repro import ReproCB
from fastrepro.state.kernels import deterministic_switches
class Seen(Callback):
    def after_batch(self): self.seen = (deterministic_switches(), torch.get_num_threads())
torch.set_num_threads(2)  # the fit pins the launcher's count and puts this one back
before = deterministic_switches()
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    learn = synth_learner(cbs=ReproCB(seed=1, allow_dirty=True, portable=True))
    learn.fit(1, cbs=(seen := Seen()))
print('RESULT', json.dumps(dict(inside=seen.seen, after=(deterministic_switches(), torch.get_num_threads()),
                                before=before, env=learn.repro_cb.provenance.env['cpu_kernels'],
                                said=[str(o.message) for o in w if 'Not portable' in str(o.message)])))
'''

@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_reprocb_portable_under_the_launcher_pins_and_restores():
    r = result(launch('-c', REPRO_CB))
    inside, n = r['inside']
    assert (inside['mkldnn'], inside['nnpack'], n) == (False, False, 1)
    assert r['after'] == [r['before'], 2], r  # switches and thread count as they were
    assert r['env']['aten'] == 'DEFAULT' and r['env']['onednn'] == 'off' and r['said'] == [], r


def test_portable_problems_in_a_plain_process(tmp_path):
    code = '''
import json, torch
from fastrepro.state.kernels import portable_problems, torch_mkl
x = torch.randn(64, 64); x @ x  # torch's kernels and MKL start with this CPU's own code paths
print('RESULT', json.dumps(dict(left=portable_problems(), mkl=torch_mkl() is not None)))'''
    env = {k: '' for k in ('ATEN_CPU_CAPABILITY', 'MKL_CBWR')}  # as a plain shell: torch's and MKL's defaults
    r = result(subprocess.run([sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, env={**os.environ, 'PYTHONPATH': str(ROOT), **env}))
    assert {'mkldnn', 'nnpack'} <= set(r['left']), r
    if r['mkl']: assert 'MKL_CBWR' in r['left'], r
    import torch
    if torch.backends.cpu.get_cpu_capability() != 'DEFAULT': assert 'ATEN_CPU_CAPABILITY' in r['left'], r


def test_launcher_refuses_no_script_and_prints_the_environment():
    p = launch()
    assert p.returncode != 0 and 'Traceback' not in p.stderr, p.stderr
    assert p.stderr.startswith('python -m fastrepro.portable: error: nothing to run'), p.stderr
    p = launch('--threads', 'two', 'train.py')
    assert p.returncode != 0 and 'whole number' in p.stderr and 'Traceback' not in p.stderr, p.stderr
    p = launch('--threads', '2', '--env')
    assert (p.returncode == 0 and 'export ATEN_CPU_CAPABILITY=default' in p.stdout
            and 'export OMP_NUM_THREADS=2' in p.stdout)
