"""Benchmark 2: data-loading throughput of the deterministic loaders (`make_deterministic(dl, seed, per_item=...)`)
against fastai's own, for the LM and the classifier training loaders, with `num_workers` 0 and 2, in two modes:
- per_item=None, ReproCB's default: streams per item only where items can draw random numbers (`items_draw`);
  fastai's text loaders without a per-item `RandTransform` get one stream per batch;
- per_item=True: a stream per item whatever the loader (the most expensive mode).
One round is one full pass over each loader (copies of fastai's loader via `dl.new`), alternating which goes
first; the ratio is of pass times (throughput is its inverse)."""
from __future__ import annotations
from ._common import *

TARGET = 1.05
WORKERS = (0, 2)


def _pass_items(dl) -> int:
    n = 0
    for b in dl: n += len(b[0])
    return n


MODES = {None: 'per_item=None (ReproCB default)', True: 'per_item=True'}


def run(cfg:Config) -> list:
    from fastrepro.state.data import make_deterministic, data_streams
    lm, clas = text_data(cfg.larger)
    rows, reps = [], max(cfg.reps, 3 if cfg.quick else 15)  # passes are short: more rounds are cheap
    for task, dls in [('LM', lm), ('classifier', clas)]:
        for nw in WORKERS:
            plain = dls.train.new(num_workers=nw)
            det = {m: make_deterministic(dls.train.new(num_workers=nw), SEED, per_item=m) for m in MODES}
            n_items = _pass_items(plain)
            fns = {'fastai': lambda: timed(lambda: _pass_items(plain))}
            fns.update({m: (lambda m=m: timed(lambda: _pass_items(det[m]))) for m in MODES})
            res = interleave(fns, reps, cfg.warmup)
            for m, kind in MODES.items():
                st = data_streams(det[m])
                got = ('for the order only (its steps draw nothing)' if not st.steps_draw
                       else 'per item' if st.per_item else 'per batch')
                (a, b), (ca, cb) = pair(res, 'fastai', m, 'wall'), pair(res, 'fastai', m, 'cpu')
                r = compare_row('2 data', f'{task} train loader, num_workers={nw}, {kind}: pass time ({n_items} items; '
                                f'streams {got})', 's', a, b, f'<= {TARGET}x', TARGET, quick=cfg.quick,
                                cpu_base=ca, cpu_repro=cb)
                r.note = (f"throughput fastai {n_items/r.fastai:.0f} items/s, "
                          f"fastrepro {n_items/r.fastrepro:.0f} items/s")
                rows.append(r)
    return rows


if __name__ == '__main__': bench_main(run)
