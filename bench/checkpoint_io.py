"""Benchmark 3: `learn.save` / `learn.load` time and file size with ReproCB attached against plain fastai.

Both learners (LM and classifier) are trained for one epoch first, so the optimizer state and the ReproCB trace
exist. The plain learner goes through fastai's own `save`/`load` (fastrepro hands a learner without stateful
callbacks straight to fastai). Sizes: the fastrepro checkpoint holds RNG states, progress, the Recorder, the
trace (grows with the iterations trained) and the provenance, which for a dirty git tree includes its patch; the
size is also given without the patch, as for a clean tree."""
from __future__ import annotations
import io, os
from _common import *

TIME_TARGET = 1.2
SIZE_TARGET_KB = 8   # "plus a few kilobytes"


def _state_bytes(obj) -> int:
    import torch
    buf = io.BytesIO(); torch.save(obj, buf); return buf.tell()


def run(cfg:Config) -> list:
    from fastrepro.callback import ReproCB
    from fastrepro.ulmfit import lm_learner, clas_learner
    lm, clas = text_data(cfg.prof)
    rows, reps = [], max(cfg.reps, 5 if cfg.quick else 15)  # saves take milliseconds: more rounds are cheap
    path = cfg.out/'checkpoints'
    for task, mk, dls in [('LM', lm_learner, lm), ('classifier', clas_learner, clas)]:
        plain = mk(dls, cfg.prof, path=path)
        cb = ReproCB(seed=SEED, allow_dirty=True)
        repro = mk(dls, cfg.prof, path=path, cbs=cb)
        for l in (plain, repro): quiet_fit(l)
        files = {'fastai': f'{task}_fastai', 'fastrepro': f'{task}_fastrepro'}
        learn = {'fastai': plain, 'fastrepro': repro}
        save = interleave({s: (lambda s=s: learn[s].save(files[s]) and None) for s in learn}, reps, cfg.warmup)
        load = interleave({s: (lambda s=s: learn[s].load(files[s]) and None) for s in learn}, reps, cfg.warmup)
        rows.append(compare_row('3 checkpoint', f'{task}, learn.save (with optimizer)', 'ms', save['fastai'], save['fastrepro'],
                                f'<= {TIME_TARGET}x', TIME_TARGET, quick=cfg.quick, scale=1e3,
                                note='fastrepro writes atomically: temporary file, fsync, rename'))
        rows.append(compare_row('3 checkpoint', f'{task}, learn.load (with optimizer)', 'ms', load['fastai'], load['fastrepro'],
                                f'<= {TIME_TARGET}x', TIME_TARGET, quick=cfg.quick, scale=1e3))
        size = {s: os.path.getsize(path/'models'/f'{files[s]}.pth') for s in files}
        extra_kb = (size['fastrepro'] - size['fastai'])/1024
        patch = (cb.git or {}).get('patch') or ''
        trace_kb = _state_bytes(cb.trace.state_dict())/1024
        patch_kb = len(patch.encode())/1024
        clean_kb = extra_kb - patch_kb
        n_iter = len(cb.trace.iter)
        rows.append(Row('3 checkpoint', f'{task}, file size', 'KB', size['fastrepro']/1024, size['fastai']/1024,
                        size['fastrepro']/size['fastai'], size['fastrepro']/size['fastai'], size['fastrepro']/size['fastai'],
                        f'+ a few KB (<= {SIZE_TARGET_KB} KB)', None if cfg.quick else clean_kb <= SIZE_TARGET_KB,
                        note=f"extra {extra_kb:.1f} KB = git patch of the dirty tree {patch_kb:.1f} KB + the rest {clean_kb:.1f} KB "
                             f"(of which the trace of {n_iter} iterations {trace_kb:.1f} KB); judged without the patch, "
                             f"i.e. as for a clean tree"))
    return rows


if __name__ == '__main__':
    import argparse
    p = argparse.ArgumentParser(); p.add_argument('--quick', action='store_true'); a = p.parse_args()
    cfg = Config.make(a.quick); setup(cfg.threads)
    for r in run(cfg): print(r.line(), '|', r.note)
