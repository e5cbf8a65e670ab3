"""One stage of the resume tests, run in its own process.

    python resume_job.py KIND MODE OUT [--fp16]

KIND: lm (LMDataLoader), clas (SortedDL, encoder from the `prep` stage) or ulmfit-prep.
MODE: reference (fit_one_cycle(N) straight), cancel (stopped after epoch STOP by CancelFitException, then learn.save),
      kill (SaveModelCallback(every_epoch, with_opt) and the process SIGKILLed right after the STOP checkpoint),
      resume-cancel / resume-kill (fresh process, other global seed, learn.load, stray draws, lr_find... then fit_one_cycle(N, start_epoch=STOP+1)).
Writes OUT/<KIND>-<MODE>.pt: every parameter and buffer, the trace, the recorded metrics.
"""
import os, sys, signal, random
from pathlib import Path
import numpy as np, torch
from fastai.text.all import *
from fastrepro.all import *

N_EPOCH, STOP, SEED = 3, 1, 42

class Stop(Callback):
    "Cancel the fit after epoch STOP"
    order = 100
    def after_epoch(self):
        if self.epoch == STOP: raise CancelFitException()

class Kill(Callback):
    "Kill this process right after SaveModelCallback wrote the STOP checkpoint"
    order = 100  # after SaveModelCallback (60)
    def after_epoch(self):
        if self.epoch == STOP: os.kill(os.getpid(), signal.SIGKILL)

FP16_TEXTS, FP16_CHARS = 40, 300   # fp16 matrix products are slow on a CPU: a smaller corpus for those stages

def corpus(fp16):
    df = imdb_sample_df('test')
    return subsample(df, FP16_TEXTS, FP16_CHARS) if fp16 else df

def build(kind, out, fp16):
    df = corpus(fp16)
    vocab = lm_dls(df).vocab
    if kind == 'lm': learn = lm_learner(lm_dls(df), path=out, cbs=ReproCB(seed=SEED, allow_dirty=True))
    else:
        learn = clas_learner(clas_dls(df, vocab=vocab), path=out, cbs=ReproCB(seed=SEED, allow_dirty=True))
        learn.load_encoder(out/'models'/'enc')
    if fp16: learn.to_repro_fp16()
    return learn

def save_result(learn, out, name):
    torch.save({'state': {k: v.clone() for k, v in learn.model.state_dict().items()},
                'trace': {c: learn.repro_trace[c].tolist() for c in ('fit', 'epoch', 'iter', 'loss')},
                'values': [list(map(float, v)) for v in learn.recorder.values],
                'scale': learn.loss_scale_history.to_dict('list') if hasattr(learn, 'mixed_precision') else None}, out/f'{name}.pt')

def main(kind, mode, out, fp16=False):
    out = Path(out); name = f"{kind}-{mode}{'-fp16' if fp16 else ''}"
    if kind == 'ulmfit-prep':   # LM fine-tuning, then the encoder the classifier stages share
        seed_everything(SEED)
        df = imdb_sample_df('test')
        learn = lm_learner(lm_dls(df), path=out, cbs=ReproCB(seed=SEED, allow_dirty=True))
        with learn.no_bar(): learn.fit_one_cycle(1, 1e-2)
        learn.save_encoder('enc')
        return
    seed_everything(SEED if not mode.startswith('resume') else 1234)
    learn = build(kind, out, fp16)
    ck = f'ck-{name}'
    with learn.no_bar():
        if mode == 'reference': learn.fit_one_cycle(N_EPOCH, 1e-2)
        elif mode == 'cancel':
            learn.fit_one_cycle(N_EPOCH, 1e-2, cbs=Stop())
            learn.save(f"ck-{kind}-cancel{'-fp16' if fp16 else ''}", with_opt=True)
            return
        elif mode == 'kill':
            learn.fit_one_cycle(N_EPOCH, 1e-2, cbs=[SaveModelCallback(every_epoch=True, with_opt=True,
                                                 fname=f"ck-{kind}-kill{'-fp16' if fp16 else ''}"), Kill()])
        else:
            src = mode.split('-', 1)[1]
            fname = f"ck-{kind}-{src}{'-fp16' if fp16 else ''}" + ('_1' if src == 'kill' else '')
            learn.load(fname)
            learn.dls.one_batch(); learn.dls.train.show_batch(show=False) if hasattr(learn.dls.train, 'show_batch') else None
            random.random(); np.random.rand(3); torch.rand(3)
            learn.lr_find(num_it=5, show_plot=False)
            learn.fit_one_cycle(N_EPOCH, 1e-2, start_epoch=STOP + 1)
    save_result(learn, out, name)

if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2], sys.argv[3], fp16='--fp16' in sys.argv)
