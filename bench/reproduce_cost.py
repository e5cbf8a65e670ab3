"""What `reproduce` costs beside the training it re-runs (issue 23): a committed training script with an uncommitted
change is trained once in a temporary git repository; then `reproduce` is timed, step by step: rebuilding the code (a
git worktree and the patch), the environment comparison, the re-run (a fresh process: Python, torch and fastai
imports, then the training to the checkpoint's position) and the comparison. Run from the root of the checkout:

    python -m bench.reproduce_cost              # 3 rounds, 40 batches per epoch
    python -m bench.reproduce_cost --batches 200 --rounds 5
    python -m bench.reproduce_cost --segments   # also the two segments (one per epoch) on 1 and on 2 workers

Not part of `bench.run` (each round starts two training processes); the numbers go into bench/RESULTS.md by hand."""
from __future__ import annotations
import os, sys, time, argparse, tempfile, subprocess, statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = '''import sys
from fastai.basics import *
from fastai.test_utils import synth_learner
from fastrepro.all import ReproCB, CheckpointCB, seed_everything
seed_everything(1)  # before the model and data are built
learn = synth_learner(n_trn=int(sys.argv[1]), path='.', cbs=[ReproCB(seed=1, allow_dirty=True),
                                                             CheckpointCB(every_iters=int(sys.argv[1]), keep=2)])
with learn.no_bar(), learn.no_logging(): learn.fit(2, 1e-2)
'''


def _git(root, *args): subprocess.run(['git', *args], cwd=root, check=True, capture_output=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--batches', type=int, default=40, help='batches per epoch of the training (2 epochs)')
    p.add_argument('--rounds', type=int, default=3, help='reproductions timed (median reported)')
    p.add_argument('--segments', action='store_true', help='also time reproduce_segments on 1 and 2 workers')
    args = p.parse_args(argv)
    from fastrepro.check.reproduce import reproduce, reproduce_segments, segments_verdict
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]),
           'OMP_NUM_THREADS': '1'}
    os.environ.update(PYTHONPATH=env['PYTHONPATH'])
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)/'proj'; root.mkdir()
        _git(root, 'init', '-q', '-b', 'main'); _git(root, 'config', 'user.name', 'bench')
        _git(root, 'config', 'user.email', 'bench@fastrepro.invalid')
        (root/'train.py').write_text(TRAIN); (root/'.gitignore').write_text('__pycache__/\n/models/\n')
        _git(root, 'add', '-A'); _git(root, 'commit', '-qm', 'bench')
        (root/'train.py').write_text(TRAIN + '# an uncommitted change\n')
        t = time.perf_counter()
        subprocess.run([sys.executable, 'train.py', str(args.batches)], cwd=root, env=env, check=True,
                       capture_output=True)
        train = time.perf_counter() - t
        runs = []
        for i in range(args.rounds):
            t = time.perf_counter()
            r = reproduce(root/'models'/'checkpoint.pth', Path(d)/f'out{i}', show=False, env={'OMP_NUM_THREADS': '1'})
            assert r.reproduced, r.verdict
            runs.append({**r.timings, 'total': time.perf_counter() - t})
        segments = {}
        for workers in ((1, 2) if args.segments else ()):
            t = time.perf_counter()
            res = reproduce_segments(root/'models'/'checkpoint.pth', Path(d)/f'seg{workers}', workers,
                                     env={'OMP_NUM_THREADS': '1'})
            assert segments_verdict(res)[1] == 0, segments_verdict(res)
            segments[workers] = (len(res), time.perf_counter() - t)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"| step | seconds (median of {args.rounds}) | share of reproduce |\n|---|---|---|")
    for k, v in med.items(): print(f"| {k} | {v:.2f} | {v / med['total']:.0%} |")
    print(f"| the training it re-runs (a fresh process, {2 * args.batches} batches) | {train:.2f} | |")
    for w, (n, secs) in segments.items(): print(f"| {n} segments on {w} worker(s) | {secs:.2f} | |")
    print(f"\nreproduce's own cost (rebuild + environment + compare): "
          f"{med['rebuild'] + med['environment'] + med['compare']:.2f} s")


if __name__ == '__main__': main()
