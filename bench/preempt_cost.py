"""Benchmark 8: what preemption-proof training costs (`CheckpointCB`), on the tiny ULMFiT language model.

- Training with `CheckpointCB` attached but not saving (`every_iters` beyond the fit): epoch time against ReproCB
  alone, the issue's target. ReproCB alone against plain fastai is given for context, and an A/A control (a second
  ReproCB-alone learner in the same rounds) shows how far from 1 noise alone moves a ratio. Since a busy machine moves
  epoch ratios by more than the 1% at stake, the time CheckpointCB's own events take is also clocked directly.
- Resume latency: from `learn.load(checkpoint)` through the resumed fit's setup to the end of its first trained batch,
  for checkpoints written at 10%, 50% and 90% of an epoch, each round in a new learner (as in a rerun script). The epoch
  has many batches (the `lm_bs=RESUME_BS` variant of the profile), so a replay of the skipped batches would show: the
  latency must stay flat. A fresh fit's time to its first batch (no load) is the reference.
- A periodic save (`CheckpointCB` writing at an iteration) against `learn.save` of the same learner, in the same fit,
  half-way between two periodic saves: a periodic checkpoint is a `learn.save`, nothing more.
"""
from __future__ import annotations
import dataclasses
from ._common import *

OVERHEAD_TARGET = 1.01   # CheckpointCB on iterations that do not save: no measurable cost
FLAT_TARGET = 1.10       # resume latency at 50% and 90% of an epoch over the one at 10%: flat, not growing
SAVE_TARGET = 1.05       # a periodic save over `learn.save`
NEVER = 10**9            # `every_iters` of a CheckpointCB that does not save during the benchmark's fits
OVERHEAD_REPS = 20       # the tiny LM's epochs take half a second and vary by a few percent: a median needs many
RESUME_REPS = 20         # resumes to the first batch take a tenth of a second: many rounds are cheap
RESUME_BS = 2            # LM batch size of the resume-latency epoch: four times the `test` profile's batches
POSITIONS = (0.1, 0.5, 0.9)  # where in the epoch the resumed checkpoints were written


def run(cfg:Config) -> list:
    return overhead(cfg) + resume_latency(cfg) + periodic_save(cfg)


def _row(cfg:Config, res:dict, a, b, case:str, unit:str='s', scale:float=1.0, **kwargs) -> Row:
    "A row comparing side `b` of `res` (per-round dicts of wall and CPU seconds) with side `a`"
    (wall_a, wall_b), (cpu_a, cpu_b) = pair(res, a, b, 'wall'), pair(res, a, b, 'cpu')
    return compare_row('8 preempt', case, unit, wall_a, wall_b, quick=cfg.quick, scale=scale, cpu_base=cpu_a,
                       cpu_repro=cpu_b, **kwargs)


def overhead(cfg:Config) -> list:
    "Epoch times of plain fastai, ReproCB alone (twice: the A/A control), ReproCB with a CheckpointCB that never saves"
    from fastrepro.callback.repro import ReproCB
    from fastrepro.callback.preempt import CheckpointCB
    from fastrepro.demo.ulmfit import lm_learner
    lm, _ = text_data(cfg.prof)
    repro = lambda: ReproCB(seed=SEED, allow_dirty=True)
    extra = {'fastai': lambda: [], 'ReproCB': lambda: [repro()], 'ReproCB twin': lambda: [repro()],
             'ReproCB + CheckpointCB': lambda: [repro(), CheckpointCB(every_iters=NEVER)]}
    learners = {}
    for side, cbs in extra.items():
        start, end = timing_cbs()
        learners[side] = (lm_learner(lm, cfg.prof, path=cfg.out/'preempt', cbs=[start, end, *cbs()]), start, end)
    def epoch(side):
        learn, start, end = learners[side]
        quiet_fit(learn)
        t = fit_times(start, end)
        return dict(wall=t['epoch'], cpu=t['epoch_cpu'])
    reps = cfg.reps if cfg.quick else max(cfg.reps, OVERHEAD_REPS)
    res = interleave({s: (lambda s=s: epoch(s)) for s in learners}, reps, cfg.warmup)
    what = f'LM, epoch time ({len(lm.train)} iterations, {cfg.prof.name} profile)'
    return [_row(cfg, res, 'ReproCB', 'ReproCB + CheckpointCB',
                 f'{what}, CheckpointCB attached, not saving, vs ReproCB alone', target=f'<= {OVERHEAD_TARGET}x',
                 limit=OVERHEAD_TARGET, note=f'A: ReproCB alone; B: ReproCB + CheckpointCB(every_iters={NEVER})'),
            _row(cfg, res, 'ReproCB', 'ReproCB twin', f'{what}, A/A control: a second ReproCB-alone learner',
                 note='both sides ReproCB alone, same rounds: how far from 1 noise alone moves a ratio'),
            _row(cfg, res, 'fastai', 'ReproCB', f'{what}, ReproCB alone vs plain fastai (context: benchmark 1 judges)'),
            own_events(cfg, lm, median([o['wall'] for o in res['ReproCB + CheckpointCB']]))]


def own_events(cfg:Config, lm, epoch_s:float) -> Row:
    "The time CheckpointCB's own events (not saving) take in one-epoch fits, per training iteration and in all"
    from fastrepro.callback.repro import ReproCB
    from fastrepro.callback.preempt import CheckpointCB
    from fastrepro.demo.ulmfit import lm_learner
    class ClockedCheckpointCB(CheckpointCB):
        "CheckpointCB that adds up the time its events take"
        def _clocked(self, event):
            t = time.perf_counter(); event(); self.seconds += time.perf_counter() - t
        def before_fit(self): self.seconds = 0.; self._clocked(super().before_fit)
        def after_batch(self): self._clocked(super().after_batch)
        def after_epoch(self): self._clocked(super().after_epoch)
        def after_fit(self): self._clocked(super().after_fit)
    clocked = ClockedCheckpointCB(every_iters=NEVER)
    learn = lm_learner(lm, cfg.prof, path=cfg.out/'preempt', cbs=[ReproCB(seed=SEED, allow_dirty=True), clocked])
    def fit():
        quiet_fit(learn)
        return clocked.seconds
    fits = interleave({'fit': fit}, cfg.reps, cfg.warmup)['fit']
    n_iter = len(lm.train)
    return Row('8 preempt', f'LM ({cfg.prof.name} profile), CheckpointCB not saving: its own events per training '
               'iteration', 'us', median(fits)/n_iter*1e6,
               note=f'{median(fits)*1e3:.3f} ms per one-epoch fit ({n_iter} training and {len(lm.valid)} validation '
                    f'batches, signal handlers installed and restored): {median(fits)/epoch_s*100:.3f}% of the epoch',
               samples={'fit_ms': [s*1e3 for s in fits]})


def _save_at(iters:dict):
    "A callback that saves the learner (`learn.save`, as CheckpointCB does) after training iterations `iters` (-> name)"
    from fastai.callback.core import Callback
    from fastrepro.callback.preempt import CheckpointCB
    class SaveAt(Callback):
        order = CheckpointCB.order
        def after_batch(self):
            if self.training and self.train_iter in iters: self.learn.save(iters[self.train_iter], with_opt=True)
    return SaveAt()


def _first_batch_clock():
    "A callback that notes when (wall and CPU clocks) the fit's first trained batch has ended, and cancels the fit"
    from fastai.callback.core import Callback, CancelFitException
    class FirstBatchClock(Callback):
        order = 1000  # after every other callback's `after_batch`
        def before_fit(self): self.wall, self.cpu, self.iteration = None, None, None
        def after_batch(self):
            if not self.training: return
            self.wall, self.cpu, self.iteration = time.perf_counter(), cpu_time(), self.train_iter
            raise CancelFitException()
    return FirstBatchClock()


def resume_latency(cfg:Config) -> list:
    "Load and fit to the first trained batch, from checkpoints written at POSITIONS of an epoch; a fresh fit for scale"
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import lm_learner
    prof = dataclasses.replace(cfg.prof, name=f'{cfg.prof.name}, lm_bs={RESUME_BS}', lm_bs=RESUME_BS)
    lm, _ = text_data(prof)
    n_iter, path = len(lm.train), cfg.out/'preempt'
    at = {p: max(1, round(p*n_iter)) for p in POSITIONS}
    names = {p: f'resume_at_{round(p*100)}pct' for p in POSITIONS}
    start, end = timing_cbs()
    writer = lm_learner(lm, prof, path=path, cbs=[start, end, ReproCB(seed=SEED, allow_dirty=True),
                                                 _save_at({at[p]: names[p] for p in POSITIONS})])
    quiet_fit(writer)  # one epoch, writing a checkpoint at each position
    step = fit_times(start, end)['train'] / n_iter
    def first_batch(position):
        "Wall and CPU seconds from `learn.load` (none: a fresh fit) to the end of the first trained batch, new learner"
        clock = _first_batch_clock()
        learn = lm_learner(lm, prof, path=path, cbs=[ReproCB(seed=SEED, allow_dirty=True), clock])
        wall, cpu = time.perf_counter(), cpu_time()
        if position: learn.load(names[position])
        quiet_fit(learn)
        expected = at[position] + 1 if position else 1
        if clock.iteration != expected:
            raise RuntimeError(f"the fit from {position or 0:.0%} trained iteration {clock.iteration} first, "
                               f"not {expected}: the resume did not start where the checkpoint was written")
        return dict(wall=clock.wall - wall, cpu=clock.cpu - cpu)
    sides = {0: lambda: first_batch(None)} | {p: (lambda p=p: first_batch(p)) for p in POSITIONS}
    res = interleave(sides, cfg.reps if cfg.quick else max(cfg.reps, RESUME_REPS), cfg.warmup)
    loader_pass = timed(lambda: [b for b in lm.train.new(shuffle=False)])['wall'] / n_iter  # data only, per batch
    skipped = at[POSITIONS[-1]] - at[POSITIONS[0]]
    base = POSITIONS[0]
    rows = [_row(cfg, res, 0, base, f'LM ({n_iter} iterations per epoch), resume at {base:.0%} ({at[base]} iterations '
                 'done) vs a fresh fit: time to the first trained batch', 'ms', 1e3,
                 note='A: new learner, fit, first batch; B: new learner, learn.load, fit, first batch')]
    replay = (f'replaying the {skipped} batches between {base:.0%} and {POSITIONS[-1]:.0%} would add '
              f'~{skipped*loader_pass*1e3:.0f} ms of data loading alone, ~{skipped*step*1e3:.0f} ms if trained '
              f'({step*1e3:.1f} ms per training step)')
    for p in POSITIONS[1:]:
        rows.append(_row(cfg, res, base, p, f'LM, resume at {p:.0%} ({at[p]} iterations done) vs at {base:.0%}: '
                         'learn.load + fit to the first trained batch', 'ms', 1e3, target=f'flat (<= {FLAT_TARGET}x)',
                         limit=FLAT_TARGET, note=replay))
    return rows


def periodic_save(cfg:Config) -> list:
    "In one fit: CheckpointCB's periodic writes against `learn.save` of the same learner half-way between them"
    from fastai.callback.core import Callback
    from fastrepro.callback.repro import ReproCB
    from fastrepro.callback.preempt import CheckpointCB
    from fastrepro.demo.ulmfit import lm_learner
    lm, _ = text_data(cfg.larger)
    n_iter = len(lm.train)
    every = max(2, n_iter // (cfg.reps + cfg.warmup + 1))
    class TimedCheckpointCB(CheckpointCB):
        "CheckpointCB that notes how long each of its writes takes"
        def before_fit(self): super().before_fit(); self.seconds = []
        def save(self):
            t = time.perf_counter(); super().save(); self.seconds.append(time.perf_counter() - t)
    class SaveHalfway(Callback):
        "`learn.save`, as a user would call it, half-way between two periodic saves"
        order = CheckpointCB.order + 1
        def before_fit(self): self.seconds = []
        def after_batch(self):
            if not (self.training and self.train_iter % every == every // 2): return
            t = time.perf_counter()
            self.learn.save('reference', with_opt=True)
            self.seconds.append(time.perf_counter() - t)
    periodic, halfway = TimedCheckpointCB(every_iters=every), SaveHalfway()
    learn = lm_learner(lm, cfg.larger, path=cfg.out/'preempt',
                       cbs=[ReproCB(seed=SEED, allow_dirty=True), periodic, halfway])
    quiet_fit(learn)
    pairs = min(len(periodic.seconds), len(halfway.seconds))  # each periodic save paired with the plain one before it
    # the warm-up pairs dropped: the first save of each name creates its file, the others replace it
    plain, ckpt = halfway.seconds[cfg.warmup:pairs], periodic.seconds[cfg.warmup:pairs]
    size = (learn.path/learn.model_dir/'checkpoint.pth').stat().st_size
    case = (f'LM ({cfg.larger.name} profile), periodic save of CheckpointCB(every_iters={every}) vs learn.save at the '
            'iteration half-way, in the same fit')
    return [compare_row('8 preempt', case, 'ms', plain, ckpt,
                        f'~1x (<= {SAVE_TARGET}x)', SAVE_TARGET, quick=cfg.quick, scale=1e3,
                        note=f'{len(ckpt)} pairs; files of {size/1e6:.2f} MB with the optimizer state; keep=1')]


if __name__ == '__main__': bench_main(run)
