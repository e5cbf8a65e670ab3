"""Benchmark 4: `ReproMixedPrecision` (`learn.to_repro_fp16()`) against fastai's `MixedPrecision` made to run on the
CPU, training step time in float16.

fastai's `MixedPrecision.before_fit` builds `autocast('cuda')` and `GradScaler('cuda')`; the stock variant here is
a subclass that builds the same two objects for 'cpu' and changes nothing else. Two models:
- an MLP on random data, where stock fastai runs unchanged;
- the tiny ULMFiT classifier (AWD-LSTM). oneDNN has no float16 LSTM, so stock fastai fails there ("could not
  create a primitive descriptor for the LSTM forward propagation primitive"); ReproMixedPrecision switches oneDNN
  off inside autocast. The stock variant gets the same switch, in the same events, so that both run the same kernels
  and the ratio is the price of recording the loss scale.
Step time: the training phase of a one-epoch fit divided by its iterations (validation excluded)."""
from __future__ import annotations
from ._common import *

TARGET = 1.01
MLP_N, MLP_BS, MLP_WIDTH = 4096, 64, 256   # random regression data and MLP width (full run; --quick uses 1/4 of N)
# the AWD-LSTM case's profile in a full run: a CPU float16 step of the `fast` classifier takes ~0.7 s
LSTM_PROFILE = 'test'


def stock_cpu_mp(onednn_off:bool=False):
    "fastai's `MixedPrecision` building its autocast and GradScaler for 'cpu' instead of 'cuda'"
    import torch
    from torch.amp import autocast, GradScaler
    from fastai.callback.fp16 import MixedPrecision
    from fastrepro.callback.fp16 import onednn_enabled, set_onednn
    class CPUMixedPrecision(MixedPrecision):
        def before_fit(self):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')  # fastai builds CUDA objects first, which warn without CUDA
                super().before_fit()
            dtype = self.autocast.fast_dtype
            self.autocast, self.learn.scaler = autocast('cpu', dtype=dtype), GradScaler('cpu', **self.kwargs)
        if onednn_off:
            def before_batch(self): self._before = onednn_enabled(); set_onednn(False); super().before_batch()
            def after_loss(self): super().after_loss(); set_onednn(self._before)
    return CPUMixedPrecision()


def _mlp_learner(n, cbs):
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    from fastai.basics import Learner, DataLoaders, MSELossFlat
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(n, MLP_WIDTH, generator=g); y = x[:, :1] * 2 + 0.1 * torch.randn(n, 1, generator=g)
    dls = DataLoaders.from_dsets(TensorDataset(x[:n*7//8], y[:n*7//8]), TensorDataset(x[n*7//8:], y[n*7//8:]),
                                 bs=MLP_BS, num_workers=0)
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU(), nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU(),
                          nn.Linear(MLP_WIDTH, 1))
    return Learner(dls, model, loss_func=MSELossFlat(), cbs=cbs)


def run(cfg:Config) -> list:
    from fastrepro.callback.fp16 import ReproMixedPrecision
    from fastrepro.demo.ulmfit import clas_learner
    from fastrepro.demo.ulmfit import get_profile
    prof = cfg.prof if cfg.quick else get_profile(LSTM_PROFILE)  # CPU float16 LSTMs are slow: the small profile
    _, clas = text_data(prof)
    n = MLP_N // 4 if cfg.quick else MLP_N
    cases = [('MLP on random data', lambda cbs: _mlp_learner(n, cbs), False),
             (f'ULMFiT classifier (AWD-LSTM, {prof.name} profile)', lambda cbs: clas_learner(clas, prof, cbs=cbs),
              True)]
    rows = []
    for name, mk, lstm in cases:
        learners = {}
        for side, mp in (('fastai', stock_cpu_mp(onednn_off=lstm)), ('fastrepro', ReproMixedPrecision())):
            t0, t1 = timing_cbs()
            learners[side] = (mk([t0, t1, mp]), t0, t1)
        n_iter = len(learners['fastai'][0].dls.train)
        def step(side):
            learn, t0, t1 = learners[side]
            quiet_fit(learn)
            t = fit_times(t0, t1)
            return dict(wall=t['train'] / n_iter, cpu=t['train_cpu'] / n_iter)
        reps = cfg.reps if cfg.quick else max(cfg.reps, 7)
        res = interleave({s: (lambda s=s: step(s)) for s in learners}, reps, cfg.warmup)
        (a, b), (ca, cb) = pair(res, 'fastai', 'fastrepro', 'wall'), pair(res, 'fastai', 'fastrepro', 'cpu')
        rows.append(compare_row('4 fp16', f'{name}: float16 step time ({n_iter} steps per round)', 'ms', a, b,
                                f'<= {TARGET}x', TARGET, quick=cfg.quick, scale=1e3, cpu_base=ca, cpu_repro=cb,
                                note='stock: fastai MixedPrecision on cpu'
                                     + (' with oneDNN off in autocast, as ReproMixedPrecision does' if lstm else '')))
    return rows


if __name__ == '__main__': bench_main(run)
