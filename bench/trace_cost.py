"""Benchmark 6: the cost of the trace's parameter fingerprints as a function of their interval N
(`ReproCB(trace_every=N)`; the default is TRACE_EVERY). N=0 keeps the per-iteration losses only ('off') and is
the reference; each round fits one learner per N, in rotating order, so all variants see the same machine.
A fingerprint is one `torch._foreach_norm` over the parameters plus a stack, kept on the device until the epoch ends;
its cost on its own is measured too, against one training step."""
from __future__ import annotations
from ._common import *

INTERVALS = (1, 10, 100)   # and 0 (off)


def run(cfg:Config) -> list:
    import torch
    from fastrepro.callback.repro import ReproCB, TRACE_EVERY
    from fastrepro.demo.ulmfit import lm_learner
    lm, _ = text_data(cfg.prof)
    learners = {}
    for n in (0,) + INTERVALS:
        t0, t1 = timing_cbs()
        learners[n] = (lm_learner(lm, cfg.prof, cbs=[t0, t1, ReproCB(seed=SEED, allow_dirty=True, trace_every=n)]),
                       t0, t1)
    n_iter = len(lm.train)
    def epoch(n):
        learn, t0, t1 = learners[n]
        quiet_fit(learn)
        t = fit_times(t0, t1)
        return dict(wall=t['train'], cpu=t['train_cpu'])
    res = interleave({n: (lambda n=n: epoch(n)) for n in learners}, cfg.reps, cfg.warmup)
    rows = []
    for n in INTERVALS:
        (a, b), (ca, cb) = pair(res, 0, n, 'wall'), pair(res, 0, n, 'cpu')
        r = compare_row('6 trace', f'LM, trace_every={n}{" (default)" if n == TRACE_EVERY else ""} vs off: '
                        f'training time per epoch ({n_iter} iterations, {n_iter // n + (n_iter % n > 0)} fingerprints)',
                        's', a, b, quick=cfg.quick, cpu_base=ca, cpu_repro=cb)
        r.note = 'fastai column: trace_every=0 (losses only)'
        rows.append(r)
    # one fingerprint on its own, as ReproCB.after_batch computes it
    model = learners[0][0].model
    def fingerprint():
        names, params = zip(*[(k, p) for k, p in model.named_parameters()])
        torch.stack(torch._foreach_norm([p.detach() for p in params])).float()
    fp = interleave({'fp': lambda: (fingerprint(), None)[1]}, 200, 10)['fp']
    step = median([o['wall'] for o in res[0]]) / n_iter
    rows.append(Row('6 trace', f'one fingerprint ({len(list(model.parameters()))} parameter tensors, '
                    f'{sum(p.numel() for p in model.parameters())} values)', 'us', median(fp)*1e6,
                    note=f'{median(fp)/step*100:.2f}% of one training step ({step*1e3:.1f} ms)'))
    return rows


if __name__ == '__main__': bench_main(run)
