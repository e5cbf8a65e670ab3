"""What `VerifyCB` costs the run it verifies (issue 60), on the tiny ULMFiT language model (the `test` profile).

A training script, committed in a temporary git repository, trains the language model for `EPOCHS` epochs on one torch
thread, with a checkpoint every `EVERY` iterations, three ways: without `VerifyCB` (A), with the first-step audit alone
(`VerifyCB(replay=False)`), and with the audit and the first segment replayed in the background (`VerifyCB()`: the
replay rebuilds the commit and re-runs the script to the first checkpoint in a process of its own, on the other core).
Each way is a fresh process; the ways alternate for `ROUNDS` rounds, each round in another order, with a second run
without VerifyCB as an A/A control (how far noise alone moves a ratio between fresh processes). Each process reports
its epochs' wall and CPU times (the training process's own CPU: the replay's process is not counted) and, with the
replay, the seconds from the first checkpoint to the verdict. The ratio is the median over rounds of the fit's time
(all epochs) with VerifyCB over without; the first epoch, where the audit and the replay run, is also given alone.

    python -m bench.verify_cost [--rounds N]
"""
from __future__ import annotations
import os, sys, json, time, argparse, tempfile, subprocess, statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 6           # rounds of the four ways: each is a fresh process of about 20 s
EPOCHS = 16          # epochs of each training process (about 10 s): the replay overlaps the first ones
EVERY = 20           # iterations between checkpoints: the first segment is 0-20
REPLAY_TARGET, AUDIT_TARGET = 1.03, 1.01  # the goals: fit time with VerifyCB over without, 2 cores
WAYS = {'off': 'without VerifyCB', 'again': 'without VerifyCB, a second time (A/A control: what noise alone moves)',
        'audit': 'VerifyCB(replay=False)', 'replay': 'VerifyCB()'}

SCRIPT = '''"The tiny ULMFiT language model, timed per epoch; VerifyCB as WAY says"
import os, sys, json, time
import torch
from fastai.text.all import *
from fastrepro.all import ReproCB, CheckpointCB, VerifyCB, seed_everything
from fastrepro.demo.ulmfit import imdb_sample_df, lm_dls, lm_learner
torch.set_num_threads(1)

class Clock(Callback):
    "Each epoch's seconds; the moment of the first checkpoint, and of the first line VerifyCB prints about a segment"
    order = 100
    def before_fit(self): self.epochs, self.cpu, self.first_ckpt = [], [], None
    def before_epoch(self): self.t, self.c = time.perf_counter(), time.process_time()
    def after_epoch(self):
        self.epochs.append(time.perf_counter() - self.t); self.cpu.append(time.process_time() - self.c)
    def after_batch(self):
        if self.first_ckpt is None and self.learn.checkpoint_cb.path.exists(): self.first_ckpt = time.perf_counter()

class Verdict:
    "stderr that notes when the segment's verdict is printed"
    def __init__(self, out): self.out, self.at = out, None
    def write(self, s):
        if self.at is None and s.startswith('VerifyCB: segment'): self.at = time.perf_counter()
        return self.out.write(s)
    def flush(self): self.out.flush()

way, verdict = sys.argv[1], Verdict(sys.stderr)
sys.stderr = verdict
seed_everything(1)
dls = lm_dls(imdb_sample_df('test'))
clock = Clock()
cbs = [ReproCB(seed=1), CheckpointCB(every_iters=%d), clock]
if way in ('audit', 'replay'): cbs.append(VerifyCB(replay=way == 'replay'))
learn = lm_learner(dls, cbs=cbs)
with learn.no_bar(), learn.no_logging(): learn.fit(%d, 1e-2)
if way == 'replay':  # the verdict, if it came after the fit: the process waits for it here, outside the timing
    learn.verify_cb._poll(600)
res = dict(epochs=clock.epochs, cpu=clock.cpu, to_verdict=None if verdict.at is None else verdict.at - clock.first_ckpt,
           iterations=len(dls.train))
print('BENCH ' + json.dumps(res), file=sys.__stdout__)
''' % (EVERY, EPOCHS)


def _git(root, *args): subprocess.run(['git', *args], cwd=root, check=True, capture_output=True)


def _one(repo:Path, way:str) -> dict:
    "One training process; its epoch times and verdict delay"
    p = subprocess.run([sys.executable, 'train.py', way], cwd=repo, capture_output=True, text=True, timeout=1800,
                       env={**os.environ, 'PYTHONPATH': str(ROOT)})
    found = [l for l in p.stdout.splitlines() if l.startswith('BENCH ')]
    if p.returncode or not found: raise SystemExit(f"{way}: the training process failed: {p.stderr[-2000:]}")
    res = json.loads(found[-1][len('BENCH '):])
    res['lines'] = [l for l in p.stderr.splitlines() if l.startswith('VerifyCB: ')]
    return res


def main(rounds:int=ROUNDS):
    repo = Path(tempfile.mkdtemp())/'proj'; repo.mkdir()
    (repo/'train.py').write_text(SCRIPT); (repo/'.gitignore').write_text('models/\n')
    _git(repo, 'init', '-q', '-b', 'main'); _git(repo, 'config', 'user.name', 'bench')
    _git(repo, 'config', 'user.email', 'bench@fastrepro.invalid')
    _git(repo, 'add', '-A'); _git(repo, 'commit', '-qm', 'the script')
    order, res = list(WAYS), {w: [] for w in WAYS}
    for r in range(rounds):
        for way in order[r % len(order):] + order[:r % len(order)]:  # each way first in some round
            res[way].append(_one(repo, way))
            print(f"round {r}, {way}: fit {sum(res[way][-1]['epochs']):.2f} s", flush=True)
    med = lambda xs: statistics.median(xs)
    total = lambda o, k: sum(o[k])
    ratio = lambda w, f: med([f(a) / f(b) for a, b in zip(res[w], res['off'])])
    print(f"\n{EPOCHS} epochs of {res['off'][0]['iterations']} iterations of the `test` LM, 1 torch thread, 2 cores, "
          f"{rounds} rounds; ratios over the run without VerifyCB, median of rounds [smallest-largest]\n")
    print("| way | fit (wall) | fit ratio, wall | fit ratio, CPU | first epoch ratio, wall | target |")
    print("|---|---|---|---|---|---|")
    for w, target in (('off', None), ('again', None), ('audit', AUDIT_TARGET), ('replay', REPLAY_TARGET)):
        walls = [total(a, 'epochs') / total(b, 'epochs') for a, b in zip(res[w], res['off'])]
        judged = '' if target is None else f"<= {target}x: {'met' if med(walls) <= target else '**missed**'}"
        print(f"| {WAYS[w]} | {med([total(o, 'epochs') for o in res[w]]):.2f} s | {med(walls):.3f}x "
              f"[{min(walls):.3f}-{max(walls):.3f}] | {ratio(w, lambda o: total(o, 'cpu')):.3f}x | "
              f"{ratio(w, lambda o: o['epochs'][0]):.3f}x | {judged} |")
    delays = [o['to_verdict'] for o in res['replay'] if o['to_verdict'] is not None]
    print(f"\nfrom the first checkpoint (iteration {EVERY}) to the verdict: median {med(delays):.1f} s "
          f"(rounds: {', '.join(f'{d:.1f}' for d in delays)}); the verdict: {res['replay'][0]['lines'][-1]}")

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--rounds', type=int, default=ROUNDS)
    main(ap.parse_args().rounds)
