"""What the numerics switches of issue 12 cost on the tiny ULMFiT models (`fastrepro demo --profile test`'s reference
run: the language model, then the classifier; one thread): MKL's conditional numerical reproducibility `AUTO` (what
`seed_everything(deterministic=True)` and `ReproCB` switch on) against MKL's default (CNR off), and portable mode
(`python -m fastrepro.portable` with `set_portable()`: torch's `default` kernels, MKL `COMPATIBLE`, oneDNN and NNPACK
off) against this CPU's own kernels. Each run is a fresh process (the libraries pick their kernels when they start);
the rounds interleave the variants in rotating order, so all see the same machine. CPU time of the training (the
process, imports excluded) is the basis: the machine is shared. Ratios are medians of the per-round ratios.

    python -m bench.portable_cost --rounds 5
"""
from __future__ import annotations
import json, argparse
from ._common import *
from .portable_check import run_variant

VARIANTS = {  # name -> (environment, launcher, set_portable in the process)
    'native, CNR off': (dict(MKL_CBWR=''), False, False),
    'native, CNR AUTO': (dict(MKL_CBWR='AUTO'), False, False),
    'portable': ({}, True, True),
}
PAIRS = [('CNR AUTO vs off', 'native, CNR off', 'native, CNR AUTO'),
         ('portable vs native (CNR AUTO)', 'native, CNR AUTO', 'portable'),
         ('portable vs native (CNR off)', 'native, CNR off', 'portable')]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--out', default=str(ROOT/'bench'/'out'/'portable_cost.json'))
    a = p.parse_args(argv)
    def variant(n):
        def run():
            r = run_variant(*VARIANTS[n])
            print(f"{n:18s} cpu {r['cpu']:.1f}s wall {r['wall']:.1f}s", flush=True)
            return r
        return run
    res = interleave({n: variant(n) for n in VARIANTS}, a.rounds, warmup=0)  # rotating order, round by round
    rows = {}
    for case, base, other in PAIRS:
        for key in ('cpu', 'wall'):
            ratios = [b[key]/a_[key] for a_, b in zip(res[base], res[other])]
            rows[f'{case} ({key})'] = dict(median=statistics.median(ratios), lo=min(ratios), hi=max(ratios),
                                           base=statistics.median(x[key] for x in res[base]),
                                           other=statistics.median(x[key] for x in res[other]))
    for k, v in rows.items(): print(f"{k:40s} ratio {v['median']:.3f} [{v['lo']:.3f}, {v['hi']:.3f}]  "
                                    f"{v['base']:.1f}s -> {v['other']:.1f}s")
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(machine=machine_info(1), rounds=a.rounds, ratios=rows, samples=res),
                              indent=1, default=str))

if __name__ == '__main__': main()
