"""Benchmark 2: data-loading throughput of the deterministic loaders (`make_deterministic(dl, seed)`, per-item
streams: the ReproCB default) against fastai's own, for the LM and the classifier training loaders, with
`num_workers` 0 and 2. One round is one full pass over each loader (a fresh copy of fastai's loader via `dl.new`),
alternating which goes first; the ratio is of pass times (throughput is its inverse)."""
from __future__ import annotations
from _common import *

TARGET = 1.05
WORKERS = (0, 2)


def _pass_items(dl) -> int:
    n = 0
    for b in dl: n += len(b[0])
    return n


def run(cfg:Config, per_item:bool=True) -> list:
    from fastrepro.data import make_deterministic
    lm, clas = text_data(cfg.prof)
    rows = []
    for task, dls in [('LM', lm), ('classifier', clas)]:
        for nw in WORKERS:
            plain = dls.train.new(num_workers=nw)
            det = make_deterministic(dls.train.new(num_workers=nw), SEED, per_item=per_item)
            n_items = _pass_items(plain)
            res = interleave({'fastai': lambda: _pass_items(plain) and None, 'fastrepro': lambda: _pass_items(det) and None},
                             cfg.reps, cfg.warmup)
            kind = 'per-item streams' if per_item else 'per-batch streams'
            r = compare_row('2 data', f'{task} train loader, num_workers={nw}, {kind}: pass time ({n_items} items)', 's',
                            res['fastai'], res['fastrepro'], f'<= {TARGET}x', TARGET if per_item else None, quick=cfg.quick)
            r.note = f"throughput fastai {n_items/r.fastai:.0f} items/s, fastrepro {n_items/r.fastrepro:.0f} items/s"
            rows.append(r)
    return rows


if __name__ == '__main__':
    import argparse
    p = argparse.ArgumentParser(); p.add_argument('--quick', action='store_true'); p.add_argument('--per-batch', action='store_true')
    a = p.parse_args()
    cfg = Config.make(a.quick); setup(cfg.threads)
    for r in run(cfg, per_item=not a.per_batch): print(r.line(), '|', r.note)
