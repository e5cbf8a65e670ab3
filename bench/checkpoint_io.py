"""Benchmark 3: `learn.save` / `learn.load` time and file size with ReproCB attached against plain fastai.

Both learners (LM and classifier) are trained for one epoch first, so the optimizer state and the ReproCB trace
exist. The plain learner goes through fastai's own `save`/`load` (fastrepro hands a learner without stateful
callbacks straight to fastai). Sizes: the fastrepro checkpoint holds RNG states, progress, the Recorder, the
trace (grows with the iterations trained) and the provenance, which for a dirty git tree includes its patch; the
size is also given without the patch, as for a clean tree. The full run adds a full-size AWD-LSTM language model (the
`full` profile's: embeddings 400, hidden 1152, 3 layers; a file of about 250 MB), trained for a few batches only, where
the per-file costs vanish and what is left scales with the file."""
from __future__ import annotations
import io, os
from ._common import *

TIME_TARGET = 1.2
SIZE_TARGET_KB = 8   # "plus a few kilobytes"


def _save_note() -> str:
    import fastrepro.checkpoint.file as ck
    durable = getattr(ck, 'DURABLE', True)
    return ("fastrepro writes atomically (temporary file, atomic swap)"
            f"{', with an fsync before the rename' if durable else '; no fsync (DURABLE=False)'}")


def _state_bytes(obj) -> int:
    import torch
    buf = io.BytesIO(); torch.save(obj, buf); return buf.tell()


def _fastai_unpickles(learn) -> bool:
    "Whether fastai's own `load` of `learn` uses `weights_only=False` (its text learners do)"
    from fastai.text.learner import TextLearner
    return isinstance(learn, TextLearner)


def _load_note(plain) -> str:
    if not _fastai_unpickles(plain): return "both load with weights_only=True"
    return ("fastai's TextLearner.load unpickles with weights_only=False "
            "(Python's C unpickler, runs any code in the file); "
            "fastrepro loads with weights_only=True (torch's checking unpickler)")


def _size_row(task, path, files, plain, repro, cb, cfg) -> Row:
    """File sizes; the dirty tree's patch measured exactly by saving once more without it, as for a clean tree.
    Called after the saves and before any load \
(a loaded checkpoint's state is what `repro` saves until it fits again)"""
    size = {s: os.path.getsize(path/'models'/f'{files[s]}.pth') for s in files}
    patch = cb.provenance.prov['patch']  # the dirty tree's patch, which every checkpoint of the fit records
    cb.provenance.prov['patch'] = None     # the rest measured as for a clean tree
    try:
        clean = os.path.getsize(repro.save(files['fastrepro'] + '_clean')) if patch else size['fastrepro']
        empty = _state_bytes({})
        parts = sorted(((k, (_state_bytes(v) - empty)/1024) for k, v in cb.state_dict().items()), key=lambda o: -o[1])
    finally: cb.provenance.prov['patch'] = patch
    (path/'models'/f"{files['fastrepro']}_clean.pth").unlink(missing_ok=True)
    patch_kb, clean_kb = (size['fastrepro'] - clean)/1024, (clean - size['fastai'])/1024
    return Row('3 checkpoint', f'{task}, file size', 'KB', size['fastrepro']/1024, size['fastai']/1024,
               size['fastrepro']/size['fastai'], size['fastrepro']/size['fastai'], size['fastrepro']/size['fastai'],
               f'+ a few KB (<= {SIZE_TARGET_KB} KB)', None if cfg.quick else clean_kb <= SIZE_TARGET_KB,
               note=f"extra {clean_kb:.1f} KB on a clean tree; ReproCB's largest parts: "
                    + ', '.join(f'{k} {kb:.1f} KB' for k, kb in parts[:3]) +
                    f" (the trace holds {len(cb.trace.iter)} iterations); a dirty tree adds its compressed patch, "
                    f"{patch_kb:.1f} KB here")


def run(cfg:Config) -> list:
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import lm_learner, clas_learner
    lm, clas = text_data(cfg.larger)
    from fastai.callback.training import ShortEpochCallback
    from fastrepro.demo.ulmfit import PROFILES
    rows = []
    path = cfg.out/'checkpoints'
    cases = [('LM', lambda cbs: lm_learner(lm, cfg.larger, path=path, cbs=cbs), 5 if cfg.quick else 15),
             ('classifier', lambda cbs: clas_learner(clas, cfg.larger, path=path, cbs=cbs), 5 if cfg.quick else 15)]
    if not cfg.quick:  # a full-size model: 2% of an epoch, enough for an optimizer state
        cases.append(('full-size LM',
                      lambda cbs: lm_learner(lm, PROFILES['full'], pretrained=False, path=path,
                                             cbs=cbs + [ShortEpochCallback(0.02, short_valid=True)]),
                      cfg.reps))
    for task, mk, n_rounds in cases:
        reps = max(cfg.reps, n_rounds)  # saves of small models take milliseconds: more rounds are cheap
        plain = mk([])
        cb = ReproCB(seed=SEED, allow_dirty=True)
        repro = mk([cb])
        for l in (plain, repro): quiet_fit(l)
        files = {'fastai': f'{task.replace(" ", "_")}_fastai', 'fastrepro': f'{task.replace(" ", "_")}_fastrepro'}
        learn = {'fastai': plain, 'fastrepro': repro}
        save = interleave({s: (lambda s=s: learn[s].save(files[s]) and None) for s in learn}, reps, cfg.warmup)
        size = _size_row(task, path, files, plain, repro, cb, cfg)
        load = interleave({s: (lambda s=s: learn[s].load(files[s]) and None) for s in learn}, reps, cfg.warmup)
        rows.append(compare_row('3 checkpoint', f'{task}, learn.save (with optimizer)', 'ms', save['fastai'],
                                save['fastrepro'], f'<= {TIME_TARGET}x', TIME_TARGET, quick=cfg.quick, scale=1e3,
                                note=_save_note()))
        rows.append(compare_row('3 checkpoint', f'{task}, learn.load (with optimizer)', 'ms', load['fastai'],
                                load['fastrepro'], f'<= {TIME_TARGET}x', TIME_TARGET, quick=cfg.quick, scale=1e3,
                                note=_load_note(plain)))
        if _fastai_unpickles(plain):  # the same unpickler on both sides: what fastrepro costs apart from safe loading
            fast = interleave({'fastai': lambda: plain.load(files['fastai']) and None,
                               'fastrepro': lambda: repro.load(files['fastrepro'], weights_only=False) and None},
                              reps, cfg.warmup)
            rows.append(compare_row('3 checkpoint', f'{task}, learn.load, both with weights_only=False', 'ms',
                                    fast['fastai'], fast['fastrepro'], f'<= {TIME_TARGET}x', TIME_TARGET,
                                    quick=cfg.quick, scale=1e3,
                                    note="fastrepro asked for fastai's unchecked unpickler "
                                         "(`learn.load(..., weights_only=False)`)"))
        rows.append(size)
        for f in files.values(): (path/'models'/f'{f}.pth').unlink(missing_ok=True)
    return rows


if __name__ == '__main__': bench_main(run)
