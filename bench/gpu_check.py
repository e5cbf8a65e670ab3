"""GPU check: is a float16 ULMFiT classifier run reproducible, bit for bit, also when resumed from a checkpoint?

On CUDA, trains a small AWD-LSTM text classifier (IMDB sample via `untar_data(URLs.IMDB_SAMPLE)`, not pretrained) with
`learn.to_repro_fp16()` and `ReproCB(seed=...)`:

  A. straight through, `fit_one_cycle(N)`;
  B. the same again;
  C. the same cancelled after epoch 1 and saved (`learn.save(..., with_opt=True)`), then a new learner built \
the same way,
     `learn.load`, `fit_one_cycle(N, start_epoch=2)`.

It prints whether B and C are bit-identical to A (`torch.equal` on every parameter and buffer, every per-batch loss,
every row of the loss-scale history) and how many loss-scale overflows (skipped steps) each run had.
Exit status: 0 when all three agree or when there is no CUDA device (it says so), 1 when they differ.

    python -m bench.gpu_check [--epochs 3] [--profile fast] [--seed 42] [--growth-interval 20] [--csv texts.csv] [--cpu]
"""
import argparse, os, sys, tempfile, time, warnings
from pathlib import Path

GROWTH_INTERVAL = 20  # short, so that a few epochs see the scale back off *and* grow again (PyTorch's default: 2000)
STOP_EPOCH = 1        # run C is cancelled after this epoch and resumed at the next


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=3, help='epochs of each fit (> STOP_EPOCH+1)')
    p.add_argument('--profile', default='fast', help="fastrepro.ulmfit profile: 'test', 'fast' or 'full'")
    p.add_argument('--seed', type=int, default=42, help='ReproCB seed')
    p.add_argument('--growth-interval', type=int, default=GROWTH_INTERVAL, help='GradScaler growth interval')
    p.add_argument('--csv', default=None,
                   help="a copy of fastai's imdb_sample/texts.csv, used when the sample is not installed")
    p.add_argument('--out', default=None, help='folder for checkpoints (default: a temporary folder)')
    p.add_argument('--cpu', action='store_true',
                   help="smoke-test this script on the CPU (slow: CPUs have no fast float16)")
    return p.parse_args()


def main():
    args = parse_args()
    import torch
    if not (torch.cuda.is_available() or args.cpu):
        print("gpu_check: no CUDA device here, nothing was run. Run this script on a machine with an NVIDIA GPU "
              "to check that fp16 training and resume are bit-identical there.")
        return 0
    if args.epochs < STOP_EPOCH + 2:
        sys.exit(f"--epochs must be at least {STOP_EPOCH + 2} to resume after epoch {STOP_EPOCH}")
    from fastai.text.all import Callback, CancelFitException
    from fastrepro.all import (seed_everything, ReproCB, install_imdb_sample, imdb_sample_path, get_profile,
                               subsample, clas_dls, clas_learner)
    import pandas as pd

    seed_everything(args.seed)  # before any CUDA work: it also sets CUBLAS_WORKSPACE_CONFIG
    install_imdb_sample(args.csv) if args.csv else install_imdb_sample()
    prof = get_profile(args.profile)
    df = subsample(pd.read_csv(imdb_sample_path()/'texts.csv'), prof.n_texts, prof.max_chars)
    out = Path(args.out or tempfile.mkdtemp(prefix='gpu_check'))
    device = 'cpu' if args.cpu else 'cuda'

    class CancelAfter(Callback):
        "Cancel the fit after epoch `STOP_EPOCH` (run C)"
        order = 100
        def after_epoch(self):
            if self.epoch == STOP_EPOCH: raise CancelFitException()

    def build():
        "DataLoaders and learner, built the same way every time"
        seed_everything(args.seed)
        dls = clas_dls(df, vocab=None, profile=prof, device=torch.device(device))
        learn = clas_learner(dls, prof, path=out, cbs=ReproCB(seed=args.seed, allow_dirty=True))
        return learn.to_repro_fp16(growth_interval=args.growth_interval)

    def fit(learn, **kwargs):
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(args.epochs, prof.clas_lr, **kwargs)
        return learn

    runs, t0 = {}, time.time()
    runs['A (straight)'] = fit(build())
    runs['B (straight again)'] = fit(build())
    c = fit(build(), cbs=CancelAfter())
    c.save('gpu_check', with_opt=True)
    c = build()
    torch.rand(3, device=device)  # a stray draw between load and fit changes nothing
    c.load('gpu_check')
    runs['C (resumed at epoch %d)' % (STOP_EPOCH + 1)] = fit(c, start_epoch=STOP_EPOCH + 1)

    a = runs['A (straight)']
    sa = a.model.state_dict()
    print(f"gpu_check on {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'} "
          f"(torch {torch.__version__}, profile {prof.name}, "
          f"{args.epochs} epochs, seed {args.seed}, growth_interval {args.growth_interval}), {time.time() - t0:.0f} s")
    ok = True
    for name, learn in runs.items():
        sb = learn.model.state_dict()
        params = sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
        losses = a.repro_trace.loss.tolist() == learn.repro_trace.loss.tolist()
        scales = a.loss_scale_history.equals(learn.loss_scale_history)
        s = learn.loss_scale_summary()
        same = params and losses and scales
        ok &= same
        print(f"  {name:24s} params+buffers {'equal' if params else 'DIFFER'}, per-batch losses "
              f"{'equal' if losses else 'DIFFER'}, loss-scale history {'equal' if scales else 'DIFFERS'}; "
              f"{s['steps']} steps, {s['overflows']} overflows, final scale {s['scale']}, min {s['min_scale']}")
    print("gpu_check: all three runs are bit-identical." if ok else "gpu_check: the runs are NOT bit-identical.")
    return 0 if ok else 1


if __name__ == '__main__':
    warnings.filterwarnings('ignore', category=FutureWarning)
    sys.exit(main())
