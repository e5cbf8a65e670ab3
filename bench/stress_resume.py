"""Stress the resume test's stages (issue 12): the reference, a run killed after its first epoch and its resume, each
in a fresh process through `fastrepro.demo.jobs` (the one harness), many times, beside background load, with 1 and 2
threads.
Each round runs a kill and a resume and compares the resumed run with the condition's reference (`same_run`: final
weights, every per-batch loss and parameter norm, the Recorder); a difference is recorded with `first_divergence`'s
iteration and columns. Not a CI test: a round takes 15 s (no load) to 45 s (beside a CPU hog) on two shared cores.

`--setting recommended` starts every process with `DETERMINISTIC_ENV` (MKL CNR `AUTO`, no dynamic threading), as the
test suite does; `--setting off` starts them with MKL's defaults (`MKL_CBWR=` empty: CNR off, `MKL_DYNAMIC=TRUE`);
ReproCB leaves variables the environment sets alone, so `off` is what fastrepro did before issue 12.

    python -m bench.stress_resume --rounds 10 --loads none,hog,burst,mem --threads 1,2 --setting recommended
"""
from __future__ import annotations
import os, sys, json, argparse, signal, subprocess, tempfile, itertools
from ._common import *

LOADS = ('none', 'hog', 'burst', 'mem')
SMALL = dict(SMOKE, name='stress', lm_epochs=3)  # the test's LM, smaller: one round (two processes) in ~15 s
N_EPOCH, LR = 3, 1e-2  # as tests/test_resume.py
MEM_MB = 1500          # the memory-pressure load touches this much, page by page, again and again
SETTINGS = {'recommended': {}, 'off': dict(MKL_CBWR='', MKL_DYNAMIC='TRUE', OMP_DYNAMIC='FALSE')}

HOG = "while True: pass"
BURST = "import subprocess, sys\nwhile True: subprocess.run([sys.executable, '-c', 'import torch, fastai'])"
MEM = f"""import numpy as np
while True:
    a = np.ones({MEM_MB} * 2**20 // 8); a += 1; del a"""


def start_load(kind:str) -> list:
    "Background processes for load `kind`; stop them with `stop_load`"
    codes = {'none': [], 'hog': [HOG], 'burst': [BURST], 'mem': [MEM]}[kind]
    return [subprocess.Popen([sys.executable, '-c', c], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True) for c in codes]

def stop_load(procs:list):
    for p in procs:
        try: os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError: pass
        p.wait()


def condition(path:Path, df, prof, threads:int, env:dict):
    "A written job for one thread count, its reference run"
    from fastrepro.demo.jobs import Job, job_process, job_error
    from fastrepro.demo.ulmfit import Stage
    from fastrepro.record.divergence import RunRecord
    job = Job('lm', df, path, profile=prof, threads=threads, stages=[Stage(0, N_EPOCH, LR)])
    spec = job.write()
    p = job_process(spec, 'reference', env=env)
    assert p.returncode == 0, job_error(p)
    return spec, RunRecord.load(path/'reference.pt')


def one_round(spec, ref, env:dict) -> dict:
    "Kill after epoch 0, resume in a fresh process, compare with `ref`"
    from fastrepro.demo.jobs import job_process, job_error, STOP_EPOCH
    from fastrepro.record.divergence import RunRecord, same_run, first_divergence
    p = job_process(spec, 'kill', env=env)
    assert p.returncode == -signal.SIGKILL, job_error(p)
    ck = f'kill_{STOP_EPOCH}'
    p = job_process(spec, 'resume', env=env, checkpoint=ck)
    assert p.returncode == 0, job_error(p)
    res = RunRecord.load(Path(spec).parent/f'resumed-{ck}.pt')
    ok, why = same_run(ref, res)
    d = None if ok else first_divergence(ref.trace, res.trace, detail=True)
    return dict(same=ok, why='' if ok else why[:300], first_divergence=None if d is None else
                dict(fit=d.fit, epoch=d.epoch, iter=d.iter, columns=list(d.columns or [])[:6]))


def summary(out:Path):
    "Rounds and differing rounds by setting, load and thread count, from the JSON lines in `out`"
    import pandas as pd
    rows = pd.DataFrame([json.loads(l) for l in out.read_text().splitlines()])
    return rows.groupby(['setting', 'load', 'threads']).agg(runs=('same', 'size'),
                                                            differ=('same', lambda s: int((~s).sum())),
                                                           median_secs=('secs', 'median'))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=5, help='kill-and-resume rounds per load kind and thread count')
    p.add_argument('--loads', default=','.join(LOADS), help=f'comma-separated subset of {",".join(LOADS)}')
    p.add_argument('--threads', default='1,2', help='comma-separated torch thread counts')
    p.add_argument('--setting', default='recommended', choices=list(SETTINGS))
    p.add_argument('--profile', default='stress',
                   help="'stress' (small, default) or a fastrepro.demo.ulmfit profile ('test')")
    p.add_argument('--out', default=str(ROOT/'bench'/'out'/'stress_resume.jsonl'), help='one JSON line per round')
    p.add_argument('--summary', action='store_true', help="only print the table of --out's rounds")
    a = p.parse_args(argv)
    if a.summary: return print(summary(Path(a.out)).to_string())
    from fastrepro.demo.ulmfit import Profile, get_profile, imdb_sample_df, subsample
    import pandas as pd
    prof = Profile(**SMALL) if a.profile == 'stress' else get_profile(a.profile)
    df = subsample(imdb_sample_df('test'), prof.n_texts, prof.max_chars)
    env, out = SETTINGS[a.setting], Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    threads = [int(t) for t in a.threads.split(',')]
    refs = {t: condition(Path(tempfile.mkdtemp(prefix=f'stress{t}_')), df, prof, t, env) for t in threads}
    for i in range(a.rounds):  # round by round over every condition: a run stopped early has them all alike
        for load, t in itertools.product(a.loads.split(','), threads):
            spec, ref = refs[t]
            procs = start_load(load)
            try: t0 = time.perf_counter(); r = one_round(spec, ref, env)
            finally: stop_load(procs)
            row = dict(load=load, threads=t, setting=a.setting, profile=prof.name, round=i,
                       secs=round(time.perf_counter() - t0, 1), **r)
            with open(out, 'a') as f: f.write(json.dumps(row) + '\n')
            print(json.dumps(row), flush=True)
    print(summary(out).to_string())

if __name__ == '__main__': main()
