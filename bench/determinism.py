"""Benchmark 7: `seed_everything(seed, deterministic=True)` against `deterministic=False` on the CPU, plain fastai
learners otherwise (no ReproCB): what flipping every deterministic switch (`torch.use_deterministic_algorithms`,
cuDNN flags, the cuBLAS workspace) costs by itself. Each round seeds, fits one epoch, and puts the switches back.
On a CPU cuDNN and cuBLAS play no part; `use_deterministic_algorithms` can still select slower kernels (for
example for index_add/scatter in backward passes), and it makes `torch.empty` and friends fill new memory with NaN
(`torch.utils.deterministic.fill_uninitialized_memory`, on by default), which costs memory bandwidth on every
allocation. A third variant keeps deterministic=True with that fill off. `bench/gpu_bench.py` measures the GPU
variant."""
from __future__ import annotations
from ._common import *


def run(cfg:Config) -> list:
    import torch
    from fastrepro.state.rng import seed_everything
    from fastrepro.state.kernels import deterministic_switches, set_switches
    from fastrepro.demo.ulmfit import lm_learner, clas_learner
    lm, clas = text_data(cfg.prof)
    rows = []
    for task, mk, dls in [('LM', lm_learner, lm), ('classifier', clas_learner, clas)]:
        learners = {}
        for side in ('off', 'on', 'on-nofill'):
            t0, t1 = timing_cbs()
            learners[side] = (mk(dls, cfg.prof, cbs=[t0, t1]), t0, t1)
        def fit(side):
            learn, t0, t1 = learners[side]
            before, fill = deterministic_switches(), torch.utils.deterministic.fill_uninitialized_memory
            seed_everything(SEED, deterministic=side != 'off')
            torch.utils.deterministic.fill_uninitialized_memory = side != 'on-nofill'
            try: quiet_fit(learn)
            finally: set_switches(before); torch.utils.deterministic.fill_uninitialized_memory = fill
            t = fit_times(t0, t1)
            return dict(wall=t['epoch'], cpu=t['epoch_cpu'])
        res = interleave({s: (lambda s=s: fit(s)) for s in learners}, cfg.reps, cfg.warmup)
        (a, b), (ca, cb) = pair(res, 'off', 'on', 'wall'), pair(res, 'off', 'on', 'cpu')
        r = compare_row('7 deterministic', f'{task}, epoch time, deterministic=True vs False (CPU)', 's', a, b,
                        quick=cfg.quick, cpu_base=ca, cpu_repro=cb)
        r.note = 'A: seed_everything(deterministic=False); B: deterministic=True'
        rows.append(r)
        (a, b), (ca, cb) = pair(res, 'off', 'on-nofill', 'wall'), pair(res, 'off', 'on-nofill', 'cpu')
        r = compare_row('7 deterministic',
                        f'{task}, epoch time, deterministic=True with fill_uninitialized_memory off vs False',
                        's', a, b, quick=cfg.quick, cpu_base=ca, cpu_repro=cb)
        r.note = 'B: deterministic=True and torch.utils.deterministic.fill_uninitialized_memory=False'
        rows.append(r)
    return rows


if __name__ == '__main__': bench_main(run)
