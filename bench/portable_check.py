"""Portable mode on this machine (issue 12): the weight digests of the tiny ULMFiT run
(`fastrepro demo --profile test`'s reference run A: the language model, then the classifier on its encoder; seed 42,
one thread) with this CPU's own kernels, under emulated other instruction sets, and in portable mode. Each variant is a
fresh process, since the libraries pick their kernels when they start. What the docs promise: the native digests may
change with the instruction set; the portable digests do not change with anything the environment of the machine says.

    python -m bench.portable_check            # every variant, a table on stdout and bench/out/portable_check.json
    python -m bench.portable_check --worker   # one run in this process: a JSON line (what each variant runs)
"""
from __future__ import annotations
import os, sys, json, argparse, tempfile, subprocess
from ._common import *

# An AVX2 machine, as far as the environment can make this one look like it
AVX2_HOST = dict(ATEN_CPU_CAPABILITY='avx2', ONEDNN_MAX_CPU_ISA='AVX2', MKL_ENABLE_INSTRUCTIONS='AVX2')
# name -> (environment, launcher, `set_portable()` in the process)
VARIANTS = {
    'native': ({}, False, False),
    'native MKL_CBWR= (CNR off: before issue 12)': (dict(MKL_CBWR=''), False, False),
    'native ATEN_CPU_CAPABILITY=avx2': (dict(ATEN_CPU_CAPABILITY='avx2'), False, False),
    'native ATEN_CPU_CAPABILITY=default': (dict(ATEN_CPU_CAPABILITY='default'), False, False),
    'native ONEDNN_MAX_CPU_ISA=SSE41': (dict(ONEDNN_MAX_CPU_ISA='SSE41'), False, False),
    'native MKL_ENABLE_INSTRUCTIONS=SSE4_2': (dict(MKL_ENABLE_INSTRUCTIONS='SSE4_2'), False, False),
    'native MKL_CBWR=AUTO (deterministic)': (dict(MKL_CBWR='AUTO'), False, False),
    'native MKL_CBWR=COMPATIBLE': (dict(MKL_CBWR='COMPATIBLE'), False, False),
    'native, emulated AVX2 host': (AVX2_HOST, False, False),
    'portable (launcher + set_portable)': ({}, True, True),
    'portable, emulated AVX2 host': (AVX2_HOST, True, True),
    'portable, launcher only': ({}, True, False),
    'portable, set_portable only (no launcher)': ({}, False, True),
}


def worker(inprocess:bool):
    "Train run A of the demo's 'test' profile here; print one JSON line"
    if inprocess:
        from fastrepro.state.kernels import set_portable
        set_portable()  # first, before any tensor work: what `seed_everything(seed, portable=True)` at the top does
    from fastrepro.demo.shared import Demo
    from fastrepro.state.environment import cpu_kernels
    from fastrepro.state.kernels import portable_problems
    import torch
    t0, c0 = time.perf_counter(), time.process_time()  # the training, not the imports
    demo = Demo('test', out=tempfile.mkdtemp(prefix='portable_check_'), progress=False)
    ref = demo.reference
    print('RESULT ' + json.dumps(dict(lm=ref.lm.digest[:12], clas=ref.clas.digest[:12], kernels=cpu_kernels(),
                                      threads=torch.get_num_threads(), not_pinned=sorted(portable_problems()),
                                      wall=time.perf_counter() - t0, cpu=time.process_time() - c0)), flush=True)


def run_variant(env:dict, launcher:bool, inprocess:bool, threads:int=1) -> dict:
    "One variant in a fresh process; its JSON result"
    cmd = [sys.executable] + (['-m', 'fastrepro.portable', '--threads', str(threads)] if launcher else [])
    cmd += ['-m', 'bench.portable_check', '--worker'] + (['--inprocess'] if inprocess else [])
    e = {**{k: v for k, v in os.environ.items() if k not in ('MKL_CBWR', 'ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA')},
         'PYTHONPATH': str(ROOT), 'PYTHONWARNINGS': 'ignore', **env}
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, cwd=ROOT)
    lines = [l for l in p.stdout.splitlines() if l.startswith('RESULT ')]
    if p.returncode or not lines: raise RuntimeError(f"{cmd} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(lines[-1][len('RESULT '):])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--worker', action='store_true', help='train here and print a JSON line')
    p.add_argument('--inprocess', action='store_true', help='with --worker: call set_portable() first')
    p.add_argument('--only', default='', help='comma-separated variant names (default: all)')
    p.add_argument('--out', default=str(ROOT/'bench'/'out'/'portable_check.json'))
    a = p.parse_args(argv)
    if a.worker: return worker(a.inprocess)
    names = [n for n in a.only.split(',') if n] or list(VARIANTS)
    res = {}
    for n in names:
        res[n] = run_variant(*VARIANTS[n])
        r = res[n]
        print(f"{n:45s} LM {r['lm']}  classifier {r['clas']}  {r['kernels']}  "
              f"not pinned: {r['not_pinned']}", flush=True)
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine_info(1), variants=res), indent=1, default=str))
    portable = {(r['lm'], r['clas']) for n, r in res.items() if n.startswith('portable') and 'only' not in n}
    if portable: print(f"portable digests {'agree' if len(portable) == 1 else 'DIFFER'}: {sorted(portable)}")

if __name__ == '__main__': main()
