"""Benchmark 3b: what checking a checkpoint's bytes costs a load (`fastrepro.checkpoint.integrity`), beside benchmark 3.

Every fastrepro read checks the zip structure, then lets torch read the file while one CRC-32 pass (zlib-ng's) over
every record runs beside it in a thread; what was read is handed on once the pass found every record intact. Measured
on the small LM and the classifier (the `fast` profile, 3.7 MB files) and on the full-size AWD-LSTM LM (the
`full` profile's sizes, ~250 MB), each built without training (only load time matters here: an optimizer state is made
by one step on zero gradients, so the file holds one as a trained learner's does). Four loads, interleaved:
fastai's own `load` (no check: `Learner._orig_load`), fastrepro's `learn.load` with the check, the same with the CRC
pass switched off (the zip's structure still read), and a learner without fastrepro's callbacks, whose fastai `load`
runs inside the same check. `python -m bench.integrity_cost [--quick]`."""
from __future__ import annotations
import os, time
from unittest import mock
from ._common import *

TIME_TARGET = 1.2


def _with_opt_state(learn):
    "Give `learn` an optimizer state without training: one step on zero gradients"
    import torch
    learn.create_opt()
    for p in learn.model.parameters():
        if p.requires_grad: p.grad = torch.zeros_like(p)
    learn.opt.step()
    learn.opt.zero_grad()
    return learn


def _check_alone(f) -> float:
    "Seconds of `check_records` over file `f`"
    from fastrepro.checkpoint.integrity import check_records
    t = time.perf_counter()
    with open(f, 'rb') as h: check_records(h)
    return time.perf_counter() - t


def run(cfg:Config) -> list:
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import lm_learner, clas_learner, PROFILES
    import fastrepro.checkpoint.file as ck
    lm, clas = text_data(cfg.larger)
    path = cfg.out/'integrity'
    cases = [('LM', lambda cbs: lm_learner(lm, cfg.larger, path=path, cbs=cbs)),
             ('classifier', lambda cbs: clas_learner(clas, cfg.larger, path=path, cbs=cbs))]
    if not cfg.quick:
        cases.append(('full-size LM',
                      lambda cbs: lm_learner(lm, PROFILES['full'], pretrained=False, path=path, cbs=cbs)))
    rows = []
    for task, mk in cases:
        plain, repro = _with_opt_state(mk([])), _with_opt_state(mk([ReproCB(seed=SEED, allow_dirty=True)]))
        name = task.replace(' ', '_')
        files = {'fastai': plain.save(f'{name}_fastai'), 'fastrepro': repro.save(f'{name}_fastrepro')}
        def _unchecked():
            with mock.patch.object(ck, 'check_crcs', lambda f, records: None):  # the zip's structure only
                repro.load(files['fastrepro'].stem)
        loads = interleave({'fastai': lambda: type(plain)._orig_load(plain, files['fastai'].stem) and None,
                            'checked': lambda: repro.load(files['fastrepro'].stem) and None,
                            'unchecked': _unchecked,
                            'plain checked': lambda: plain.load(files['fastai'].stem) and None,
                            'checked, weights_only=False':
                                lambda: repro.load(files['fastrepro'].stem, weights_only=False) and None},
                           cfg.reps, cfg.warmup)
        mb = os.path.getsize(files['fastrepro'])/2**20
        check = [_check_alone(files['fastrepro']) for _ in range(cfg.reps)]
        note = f"{mb:.1f} MB file; the check alone {median(check)*1e3:.1f} ms ({mb/1024/median(check):.2f} GB/s)"
        rows += [compare_row('3b integrity', f"{task}, learn.load with the check vs fastai's own load", 'ms',
                             loads['fastai'], loads['checked'], f'<= {TIME_TARGET}x', TIME_TARGET, quick=cfg.quick,
                             scale=1e3, note=note + "; fastrepro loads with weights_only=True, fastai's text "
                             "learners with weights_only=False"),
                 compare_row('3b integrity', f"{task}, learn.load with the check vs fastai's own, both "
                             "weights_only=False", 'ms', loads['fastai'], loads['checked, weights_only=False'],
                             f'<= {TIME_TARGET}x', TIME_TARGET, quick=cfg.quick, scale=1e3, note=note),
                 compare_row('3b integrity', f'{task}, learn.load: the check on vs off', 'ms', loads['unchecked'],
                             loads['checked'], '', quick=cfg.quick, scale=1e3,
                             note="off: the zip's structure read, no CRC-32 pass (what the load cost before)"),
                 compare_row('3b integrity', f"{task}, a learner without fastrepro's callbacks: its load (fastai's, "
                             "after the check) vs fastai's own", 'ms', loads['fastai'], loads['plain checked'], '',
                             quick=cfg.quick, scale=1e3, note="a plain fastai checkpoint, checked the same way")]
        for f in files.values(): f.unlink(missing_ok=True)
    return rows


if __name__ == '__main__': bench_main(run)
