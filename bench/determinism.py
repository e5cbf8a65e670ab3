"""Benchmark 7: `seed_everything(seed, deterministic=True)` against `deterministic=False` on the CPU, plain fastai
learners otherwise (no ReproCB): what flipping every deterministic switch (`torch.use_deterministic_algorithms`,
cuDNN flags, the cuBLAS workspace) costs by itself. Each round seeds, fits one epoch, and puts the switches back.
On a CPU cuDNN and cuBLAS play no part; `use_deterministic_algorithms` can still select slower kernels (for
example for index_add/scatter in backward passes). `scripts/gpu_bench.py` measures the GPU variant."""
from __future__ import annotations
from _common import *


def run(cfg:Config) -> list:
    from fastrepro.rng import seed_everything, deterministic_switches, set_switches
    from fastrepro.ulmfit import lm_learner, clas_learner
    lm, clas = text_data(cfg.prof)
    rows = []
    for task, mk, dls in [('LM', lm_learner, lm), ('classifier', clas_learner, clas)]:
        learners = {}
        for side in ('fastai', 'fastrepro'):
            t0, t1 = timing_cbs()
            learners[side] = (mk(dls, cfg.prof, cbs=[t0, t1]), t0, t1)
        def fit(side):
            learn, t0, t1 = learners[side]
            before = deterministic_switches()
            seed_everything(SEED, deterministic=side == 'fastrepro')
            try: quiet_fit(learn)
            finally: set_switches(before)
            return fit_times(t0, t1)['epoch']
        res = interleave({s: (lambda s=s: fit(s)) for s in learners}, cfg.reps, cfg.warmup)
        r = compare_row('7 deterministic', f'{task}, epoch time, deterministic=True vs False (CPU)', 's', res['fastai'], res['fastrepro'],
                        quick=cfg.quick)
        r.note = 'fastai column: deterministic=False; fastrepro column: deterministic=True'
        rows.append(r)
    return rows


if __name__ == '__main__':
    import argparse
    p = argparse.ArgumentParser(); p.add_argument('--quick', action='store_true'); a = p.parse_args()
    cfg = Config.make(a.quick); setup(cfg.threads)
    for r in run(cfg): print(r.line(), '|', r.note)
