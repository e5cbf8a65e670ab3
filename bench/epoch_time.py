"""Benchmark 1: epoch time of the tiny ULMFiT language model and classifier with `ReproCB` (its defaults:
deterministic switches, deterministic data streams, trace with fingerprints every TRACE_EVERY iterations,
provenance) against the same learner without it.

Each round fits both learners for one epoch (`fit_one_cycle(1)`), alternating which goes first. Reported:
- epoch: from the first `before_epoch` to the last `after_epoch` (training and validation), the issue's target;
- fit(1): the whole one-epoch fit, so that the once-per-fit work (git provenance, model audit, data streams set up)
  shows too: ULMFiT's gradual unfreezing is five such one-epoch fits.
The tiny `test` profile gets TEST_REPS rounds (its epochs take half a second and vary by a few percent from one to the
next on a shared machine, so a median needs many); the larger `fast` profile (the demo's CPU loop) gets FAST_REPS.
"""
from __future__ import annotations
from ._common import *

TARGET, CEILING = 1.02, 1.05
TEST_REPS = 20
FAST_REPS = 7


def run(cfg:Config) -> list:
    rows = measure(cfg, cfg.prof, cfg.reps if cfg.quick else max(cfg.reps, TEST_REPS), control=True)
    if not cfg.quick: rows += measure(cfg, cfg.larger, FAST_REPS, control=True)
    return rows


def measure(cfg:Config, prof, reps:int, cb_kwargs:dict|None=None, name='1 epoch', control:bool=False) -> list:
    """Interleaved one-epoch fits of plain fastai and ReproCB learners; `control` adds a second plain fastai learner
    (an A/A comparison: the noise floor of this machine for the same rounds)"""
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import lm_learner, clas_learner
    lm, clas = text_data(prof)
    rows = []
    for task, mk, dls in [('LM', lm_learner, lm), ('classifier', clas_learner, clas)]:
        learners = {}
        for side in ('fastai', 'fastrepro') + (('fastai twin',) if control else ()):
            t0, t1 = timing_cbs()
            cbs = [t0, t1] + ([ReproCB(seed=SEED, allow_dirty=True, **(cb_kwargs or {}))]
                              if side == 'fastrepro' else [])
            learners[side] = (mk(dls, prof, cbs=cbs), t0, t1)
        times = {s: [] for s in learners}
        def fit(side):
            learn, t0, t1 = learners[side]
            quiet_fit(learn)
            times[side].append(fit_times(t0, t1))
        interleave({s: (lambda s=s: fit(s)) for s in learners}, reps, cfg.warmup)
        for s in times: times[s] = times[s][cfg.warmup:]
        get = lambda s, k: [t[k] for t in times[s]]
        n_iter = len(dls.train)
        for k, what in (('epoch', f'epoch time ({n_iter} iterations, {prof.name} profile)'),
                        ('fit', f'one-epoch fit incl. per-fit setup ({prof.name})')):
            rows.append(compare_row(name, f'{task}, {what}', 's', get('fastai', k), get('fastrepro', k),
                                    f'<= {TARGET}x (never > {CEILING}x)', TARGET, CEILING, cfg.quick,
                                    cpu_base=get('fastai', k+'_cpu'), cpu_repro=get('fastrepro', k+'_cpu')))
        if control:
            rows.append(compare_row(name, f'{task} ({prof.name}), A/A control: '
                                          'epoch time of a second plain fastai learner', 's',
                                    get('fastai', 'epoch'), get('fastai twin', 'epoch'), quick=cfg.quick,
                                    cpu_base=get('fastai', 'epoch_cpu'), cpu_repro=get('fastai twin', 'epoch_cpu'),
                                    note='both sides plain fastai, same rounds: '
                                         'how far from 1 noise alone moves a ratio'))
        setup = [b - a for a, b in zip(get('fastai', 'setup'), get('fastrepro', 'setup'))]
        rows.append(Row(name, f'{task} ({prof.name}), extra per-fit setup (before_fit) of ReproCB', 'ms',
                        median(setup)*1e3, note='fastrepro minus fastai, per fit',
                        samples={'extra_ms': [x*1e3 for x in setup]}))
    return rows



if __name__ == '__main__': bench_main(run)
