"""Benchmark 12: a checkpoint's size and save time as the run grows (issue 52).

A model with 160 parameter tensors (80 small linear layers) and `ReproCB`, whose run has trained N iterations: the
N - `SAVE_EVERY` iterations before the last checkpoint are simulated (their rows appended to the run's trace file as
`SAVE_EVERY`-iteration records, norms every `TRACE_EVERY` rows, and fastai's Recorder holding N rows, as it does),
then each round records `SAVE_EVERY` real iterations (`Trace.record` on the model, a Recorder row each) and saves
(`learn.save`: the append to the trace file, then the checkpoint). Measured at each N: the checkpoint's size, the
save's time (median over rounds), `Trace.record`'s time per iteration, and what the trace holds in memory. For
comparison, the same save with the whole trace kept inside the checkpoint, as format 6 did (`Trace.inline`)."""
from __future__ import annotations
import sys, time, tracemalloc
import numpy as np
from ._common import *

SIZES = (10_000, 100_000, 1_000_000)   # simulated iterations behind the checkpoint
QUICK_SIZES = (1_000, 10_000)
SAVE_EVERY = 500                       # iterations between two checkpoints (`CheckpointCB(every_iters=500)`)
N_LAYERS = 80                          # 80 linear layers: 160 parameter tensors
GROWTH_TARGET = 1.10                   # constant within 10% from the smallest N to the largest


def _learner(folder):
    import torch
    from torch import nn
    from fastai.test_utils import synth_learner
    from fastrepro.callback.repro import ReproCB
    from fastrepro.state.rng import seed_everything
    seed_everything(SEED)
    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(*[nn.Linear(1, 1) for _ in range(N_LAYERS)])
        def forward(self, x): return self.layers(x)
    learn = synth_learner(path=folder, model=Deep(), cbs=ReproCB(seed=SEED, allow_dirty=True))
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-3)
    assert len(list(learn.model.parameters())) == 2 * N_LAYERS
    return learn


def _history(learn, n:int):
    "Give the run `n` iterations before now: rows in its trace file, `n` rows in fastai's Recorder"
    import torch
    from fastrepro.record.trace import compact_trace, TRACE_EVERY
    cb, rec = learn.repro_cb, learn.recorder
    names = [k for k, _ in learn.model.named_parameters()]
    rec.losses, rec.lrs = [torch.tensor(0.5)] * n, [1e-3] * n  # fastai keeps them; the trace file gets them once
    learn.save('ckpt')
    rows = np.arange(0, SAVE_EVERY, TRACE_EVERY)
    for start in range(0, n - SAVE_EVERY, SAVE_EVERY):
        it = np.arange(start, start + SAVE_EVERY)
        chunk = compact_trace(np.ones(SAVE_EVERY, dtype=np.int64), it // 1000, it, np.full(SAVE_EVERY, .5), names,
                              rows, np.random.rand(len(rows), len(names)))
        chunk.pop('param_names')  # said once in the file, as `Trace.spool` does
        cb.trace.log.append({'trace': chunk})


def _round(learn, start:int) -> dict:
    "Record `SAVE_EVERY` real iterations, then save: the record's and the save's seconds"
    import torch
    cb, rec, loss = learn.repro_cb, learn.recorder, torch.tensor(0.25)
    t = time.perf_counter()
    for i in range(start, start + SAVE_EVERY): cb.trace.record(1, i // 1000, i, loss, learn.model)
    cb.trace.flush()
    record = (time.perf_counter() - t) / SAVE_EVERY
    rec.losses += [loss] * SAVE_EVERY; rec.lrs += [1e-3] * SAVE_EVERY
    t = time.perf_counter()
    learn.save('ckpt')
    return dict(record=record, save=time.perf_counter() - t)


def _tail_bytes(learn) -> int:
    "What the trace holds in memory after `SAVE_EVERY` recorded iterations (tracemalloc)"
    import torch
    cb = learn.repro_cb
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(SAVE_EVERY): cb.trace.record(1, 0, i, torch.tensor(0.25), learn.model)
    cb.trace.flush()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    learn.save('ckpt')
    return held


def _inside(learn, path) -> dict:
    ("Format 6's checkpoint of the same run: every row of the trace and of the Recorder inside it, written as the "
     "save wrote it then (no trace file); its size, its save's time, and what the trace then held in memory")
    from fastrepro.checkpoint.file import checkpoint_state, atomic_torch_save, STATE_KEY
    cb = learn.repro_cb
    tracemalloc.start()
    cb.trace.inline(); cb._rec_lists = None  # every row in memory and in the state, as format 6 kept them
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    t = time.perf_counter()
    atomic_torch_save({'model': learn.model.state_dict(),
                       'opt': {**learn.opt.state_dict(), STATE_KEY: checkpoint_state(learn)}}, path)
    return dict(inside_size=path.stat().st_size, inside_save=time.perf_counter() - t, inside_held=held)


def run(cfg:Config) -> list:
    import shutil
    sizes, reps = (QUICK_SIZES, 2) if cfg.quick else (SIZES, max(3, cfg.reps // 2))
    res = {}
    for n in sizes:
        folder = cfg.out/f'growth_{n}'
        shutil.rmtree(folder, ignore_errors=True)
        learn = _learner(folder)
        _history(learn, n)
        rounds = [_round(learn, n + k * SAVE_EVERY) for k in range(reps)]
        ckpt = folder/'models'/'ckpt.pth'
        trace_file = ckpt.with_name(learn.repro_cb.trace.log.path.name)
        held = _tail_bytes(learn)
        inside = _inside(learn, folder/'models'/'inside.pth')
        res[n] = dict(size=ckpt.stat().st_size, save=median([r['save'] for r in rounds]),
                      record=median([r['record'] for r in rounds]), trace_file=trace_file.stat().st_size, held=held,
                      **inside)
        shutil.rmtree(folder, ignore_errors=True)
    small, large = sizes[0], sizes[-1]
    rows = []
    for n, r in res.items():
        note = (f"trace file {r['trace_file']/2**20:.1f} MB; the trace holds {r['held']/2**10:.0f} KB in memory "
                f"after {SAVE_EVERY} iterations; inside the checkpoint (format 6): {r['inside_size']/2**20:.2f} MB, "
                f"save {r['inside_save']*1e3:.0f} ms, the trace held {r['inside_held']/2**20:.0f} MB in memory")
        rows.append(Row('12 growth', f'{n:,} iterations, 160 parameter tensors: checkpoint size', 'KB',
                        r['size'] / 2**10, note=note))
        rows.append(Row('12 growth', f'{n:,} iterations: save time (append + checkpoint)', 'ms', r['save'] * 1e3,
                        note=f"Trace.record {r['record']*1e6:.1f} us per iteration"))
    for what, key in (('checkpoint size', 'size'), ('save time', 'save')):
        ratio = res[large][key] / res[small][key]
        rows.append(Row('12 growth', f'{what}, {large:,} vs {small:,} iterations', 'x', ratio, ratio=ratio,
                        ratio_lo=ratio, ratio_hi=ratio,
                        target=f'constant within {GROWTH_TARGET - 1:.0%}', met=None if cfg.quick else
                        ratio <= GROWTH_TARGET))
    return rows


if __name__ == '__main__': bench_main(run)
