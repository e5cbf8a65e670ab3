"""Benchmark 9: what a resume's own checks cost, on fastai's tabular learner with its default loader (`TabWeightedDL`,
whose own `get_idxs` fastrepro once failed to see: a resume inside an epoch served the whole epoch again).

- Every pass, fastrepro keeps the order the loader serves and counts its batches (`fastrepro.state.data.ServedPass`):
  that is inside every epoch timed here. The epoch of ReproCB + CheckpointCB (not saving) against plain fastai is given
  for context.
- A checkpoint written inside an epoch records the pass (`pass_position`: a digest of its whole order) and draws the
  order again to check that it can be resumed (`pass_problem`); both are computed once per pass, at the first such
  checkpoint. A resumed fit compares the pass it serves with that record before its first batch
  (`resumed_pass_differs`). Each is clocked directly, on the training pass of the same fit, and set against that
  fit's epoch: the ratio is (epoch + check) / epoch, round by round.
"""
from __future__ import annotations
from ._common import *

CHECK_TARGET = 1.01  # a check, once per pass, over the epoch it belongs to: it must not show
N_ROWS, QUICK_ROWS, BS = 40_000, 2_000, 64
NEVER = 10**9        # `every_iters` of a CheckpointCB that does not save


def frame(n:int):
    "A tabular classification problem of `n` rows"
    import numpy as np, pandas as pd
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'a': rng.normal(size=n), 'b': rng.normal(size=n), 'kind': rng.choice(list('xyz'), n)})
    df['y'] = np.where(df.a + df.b + (df.kind == 'x') > 0.5, 'p', 'n')
    return df


def run(cfg:Config) -> list:
    from fastai.tabular.all import TabularDataLoaders, tabular_learner, Categorify, Normalize, accuracy, Callback
    from fastrepro.callback.repro import ReproCB
    from fastrepro.callback.preempt import CheckpointCB
    from fastrepro.state.rng import seed_everything
    from fastrepro.state.data import data_streams
    from fastrepro.state.passes import pass_position, resumed_pass_differs
    n = QUICK_ROWS if cfg.quick else N_ROWS
    df = frame(n)

    class ClockChecks(Callback):
        "At the middle batch of the training pass: the record a checkpoint takes there, and a resume's comparison"
        order = 95
        def __init__(self): self.record = self.compare = None
        def after_batch(self):
            if not self.training or self.iter != len(self.dl)//2: return
            data_streams(self.dl).served.digest = data_streams(self.dl).served.problem = None  # not asked yet
            t = time.perf_counter(); saved = pass_position(self.dl); self.record = time.perf_counter() - t
            t = time.perf_counter(); differs = resumed_pass_differs(self.dl, {**saved, 'batch': 0})
            self.compare = time.perf_counter() - t
            assert not differs and saved['problem'] is None, (differs, saved)

    def learner(cbs):
        seed_everything(0)
        dls = TabularDataLoaders.from_df(df, path=cfg.out/'resume_check', procs=[Categorify, Normalize],
                                         cat_names=['kind'], cont_names=['a', 'b'], y_names='y', bs=BS,
                                         valid_idx=list(range(n - n//5, n)))
        return tabular_learner(dls, layers=[200, 100], metrics=accuracy, cbs=cbs)

    clock = ClockChecks()
    sides = {'fastai': [], 'ReproCB + CheckpointCB': [ReproCB(seed=SEED, allow_dirty=True),
                                                       CheckpointCB(every_iters=NEVER), clock]}
    learners, stamps = {}, {}
    for side, cbs in sides.items():
        stamps[side] = timing_cbs()
        learners[side] = learner(cbs + list(stamps[side]))
    def epoch(side):
        quiet_fit(learners[side])
        t = fit_times(*stamps[side])
        return dict(wall=t['epoch'], cpu=t['epoch_cpu'], record=clock.record, compare=clock.compare)  # repro's
    res = interleave({s: (lambda s=s: epoch(s)) for s in sides}, cfg.reps, cfg.warmup)
    base, repro = pair(res, 'fastai', 'ReproCB + CheckpointCB', 'wall')
    epochs = repro
    record, compare = ([o[k] for o in res['ReproCB + CheckpointCB']] for k in ('record', 'compare'))
    n_batches = len(learners['fastai'].dls.train)
    note = f"{n:,} rows, {n_batches} batches an epoch"
    return [
        compare_row('9 resume check', 'epoch: ReproCB + CheckpointCB (not saving) vs fastai', 's', base, repro,
                    quick=cfg.quick, note=note, cpu_base=pair(res, 'fastai', 'ReproCB + CheckpointCB', 'cpu')[0],
                    cpu_repro=pair(res, 'fastai', 'ReproCB + CheckpointCB', 'cpu')[1]),
        compare_row('9 resume check', "a checkpoint's pass record and order check (once per pass) over the epoch", 's',
                    epochs, [e + r for e, r in zip(epochs, record)], target=f'<= {CHECK_TARGET}x',
                    limit=CHECK_TARGET, quick=cfg.quick,
                    note=f"{median(record)*1e3:.2f} ms for an order of {n - n//5:,} rows"),
        compare_row('9 resume check', "a resume's comparison before its first batch over the epoch", 's', epochs,
                    [e + c for e, c in zip(epochs, compare)], target=f'<= {CHECK_TARGET}x', limit=CHECK_TARGET,
                    quick=cfg.quick, note=f"{median(compare)*1e3:.3f} ms (the record is the pass's own)"),
    ]


if __name__ == '__main__': bench_main(run)
