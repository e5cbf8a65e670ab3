"""GPU benchmarks: what reproducibility costs on CUDA, measured against plain fastai in the same process.

The GPU variant of `python -m bench.run` (benchmarks 1, 4 and 7), for a machine with an NVIDIA GPU. On the IMDB sample
with the AWD-LSTM of the `full` profile (not pretrained), each comparison alternates its variants in one process
(A B, B A, ...), a warm-up round first, and reports the median over rounds of the ratio B/A:

  G1  deterministic switches: `seed_everything(seed, deterministic=True)` (cuDNN deterministic, benchmark off,
      `torch.use_deterministic_algorithms(True, warn_only=True)`, the cuBLAS workspace) against
      `deterministic=False`; and deterministic=True with `torch.utils.deterministic.fill_uninitialized_memory`
      off, against deterministic=False. Plain fastai learners, epoch time.
  G2  `ReproCB` with its defaults against no ReproCB: epoch time (the trace keeps its tensors on the GPU).
  G3  float16: `ReproMixedPrecision` (`learn.to_repro_fp16()`) against fastai's `MixedPrecision`
      (`learn.to_fp16()`), training step time; and stock fp16 against float32, for scale.

CUBLAS_WORKSPACE_CONFIG is set (by `seed_everything`) before CUDA starts, so every variant runs with it: cuBLAS
reads it when it starts. Results go to GPU_RESULTS.md and gpu_results.json in --out.

    python -m bench.gpu_bench [--out DIR] [--reps 5] [--profile full] [--csv texts.csv] [--only G1,G2,G3]
    python -m bench.gpu_bench --cpu      # smoke-test this script on the CPU with tiny models (numbers mean nothing)

Without CUDA (and without --cpu) it says so and exits 0. Tokenization uses spaCy when it is installed, else fastai's
`BaseTokenizer` (split on spaces), which changes the vocabulary but not what is measured.
"""
import argparse, json, os, sys, time, warnings
from pathlib import Path
from ._common import (Config, interleave, compare_row, timing_cbs, fit_times, quiet_fit, machine_info, SEED, SHARED_CSV,
                      ROOT)

COMPARISONS = ('G1', 'G2', 'G3')
# The `full` profile's AWD-LSTM (emb 400, hidden 1152, 3 layers, batch 64) on the whole sample, reviews cut to
# GPU_MAX_CHARS characters so that the classifier's epoch stays around a second and a 5-round run fits in minutes
GPU_MAX_CHARS = 2000
BUDGET_S = 420  # comparisons not started after this many seconds are skipped (and reported as skipped)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', default=str(ROOT/'bench'), help='folder for GPU_RESULTS.md and gpu_results.json')
    p.add_argument('--reps', type=int, default=5, help='timed rounds per comparison (after one warm-up round)')
    p.add_argument('--profile', default=None,
                   help="fastrepro.demo.ulmfit profile (default: 'full' with reviews cut to GPU_MAX_CHARS on "
                   "CUDA, a tiny one with --cpu)")
    p.add_argument('--budget-s', type=float, default=BUDGET_S,
                   help='skip comparisons that would start after this many seconds')
    p.add_argument('--csv', default=None,
                   help="a copy of fastai's imdb_sample/texts.csv (default: installed sample or ../shared)")
    p.add_argument('--only', default='', help=f'comma-separated subset of {",".join(COMPARISONS)}')
    p.add_argument('--cpu', action='store_true', help='smoke-test on the CPU (tiny models, 1 round)')
    return p.parse_args(argv)


def tokenizer():
    "spaCy's tokenizer when spaCy is installed (fastai's default), else `BaseTokenizer`"
    try:
        import spacy  # noqa: F401
        return None, 'spaCy (fastai default)'
    except ImportError:
        from fastai.text.core import BaseTokenizer
        return BaseTokenizer(), 'BaseTokenizer (spaCy not installed)'


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    if not (torch.cuda.is_available() or a.cpu):
        print("gpu_bench: no CUDA device here, nothing was measured. Run this script on a machine with an NVIDIA GPU "
              "(or with --cpu to smoke-test it).")
        return 0
    only = [o.strip() for o in a.only.split(',') if o.strip()] or list(COMPARISONS)
    warnings.filterwarnings('ignore')
    from fastrepro.state.rng import seed_everything
    from fastrepro.state.kernels import deterministic_switches, set_switches
    seed_everything(SEED, deterministic=False)  # sets CUBLAS_WORKSPACE_CONFIG before any CUDA work
    import pandas as pd
    from fastai.callback.fp16 import MixedPrecision
    from fastrepro.callback.repro import ReproCB
    from fastrepro.callback.fp16 import ReproMixedPrecision
    from fastrepro.demo.ulmfit import (install_imdb_sample, imdb_sample_path, subsample, lm_dls, clas_dls, lm_learner,
                                  clas_learner)
    cuda = torch.cuda.is_available() and not a.cpu
    device = 'cuda' if cuda else 'cpu'
    cfg = Config.make(quick=a.cpu, reps=1 if a.cpu else a.reps, profile=a.profile or ('full' if cuda else 'smoke'))
    prof = cfg.prof
    if cuda and a.profile is None:
        import dataclasses
        prof = dataclasses.replace(prof, name='full-2000', max_chars=GPU_MAX_CHARS); cfg.profile = prof.name
    csv = a.csv or (SHARED_CSV if SHARED_CSV.exists() else None)
    install_imdb_sample(csv) if csv else install_imdb_sample()
    tok, tok_name = tokenizer()
    t0 = time.perf_counter()
    df = subsample(pd.read_csv(imdb_sample_path()/'texts.csv'), prof.n_texts, prof.max_chars)
    lm = lm_dls(df, prof, device=device, tok_tfm=tok)
    clas = clas_dls(df, lm.vocab, prof, device=device, tok_tfm=tok)
    machine = machine_info(torch.get_num_threads())
    machine.update(gpu=machine['gpus'][0] if cuda else None, device=device, tokenizer=tok_name,
                   data_s=round(time.perf_counter() - t0, 1))
    print(f"gpu_bench on {machine['gpu'] or 'CPU (smoke test)'}: torch {machine['torch']}, "
          f"CUDA {machine['cuda']}, cuDNN {machine['cudnn']}, profile {cfg.profile}, tokenizer {tok_name}, "
          f"data built in {machine['data_s']} s", flush=True)
    tasks = [('LM', lambda cbs: lm_learner(lm, prof, pretrained=False, cbs=cbs), len(lm.train)),
             ('classifier', lambda cbs: clas_learner(clas, prof, cbs=cbs), len(clas.train))]
    rows, errors = [], {}

    def learners(mk, variants:dict):
        "variant -> (learner, start stamp, end stamp); variants: name -> extra callbacks"
        res = {}
        for v, cbs in variants.items():
            s, e = timing_cbs(sync=cuda)
            res[v] = (mk([s, e] + cbs), s, e)
        return res

    def report(r):
        print(r.line() + (f' | {r.note}' if r.note else ''), flush=True)
        rows.append(r.__dict__)

    def g1():
        for task, mk, n in tasks:
            L = learners(mk, {'off': [], 'on': [], 'on-nofill': []})
            def fit(v):
                learn, s, e = L[v]
                before, fill = deterministic_switches(), torch.utils.deterministic.fill_uninitialized_memory
                seed_everything(SEED, deterministic=v != 'off', warn_only=True)
                torch.utils.deterministic.fill_uninitialized_memory = v != 'on-nofill'
                try: quiet_fit(learn)
                finally: set_switches(before); torch.utils.deterministic.fill_uninitialized_memory = fill
                return fit_times(s, e)['epoch']
            res = interleave({v: (lambda v=v: fit(v)) for v in L}, cfg.reps, cfg.warmup)
            r = compare_row('G1 deterministic', f'{task} ({n} it.), epoch time, deterministic=True vs False', 's',
                            res['off'], res['on'])
            r.note = 'A: deterministic=False; B: seed_everything(deterministic=True, warn_only=True)'; report(r)
            r = compare_row('G1 deterministic',
                            f'{task}, epoch time, deterministic=True without fill_uninitialized_memory vs False',
                            's', res['off'], res['on-nofill'])
            r.note = 'B: as above with torch.utils.deterministic.fill_uninitialized_memory=False'; report(r)

    def g2():
        for task, mk, n in tasks:
            L = learners(mk, {'fastai': [], 'fastrepro': [ReproCB(seed=SEED, allow_dirty=True, warn_only=True)]})
            def fit(v):
                learn, s, e = L[v]; quiet_fit(learn); return fit_times(s, e)
            res = interleave({v: (lambda v=v: fit(v)) for v in L}, cfg.reps, cfg.warmup)
            for k, what in (('epoch', 'epoch time'), ('fit', 'one-epoch fit incl. per-fit setup')):
                r = compare_row('G2 ReproCB', f'{task} ({n} it.), {what}, ReproCB defaults vs none', 's',
                                [t[k] for t in res['fastai']], [t[k] for t in res['fastrepro']],
                                '<= 1.02x (never > 1.05x)', 1.02, 1.05, a.cpu)
                r.note = 'ReproCB(warn_only=True): ops without a deterministic CUDA kernel warn instead of raising'
                report(r)

    def g3():
        for task, mk, n in tasks:
            L = learners(mk, {'fp32': [], 'fastai fp16': [MixedPrecision()], 'fastrepro fp16': [ReproMixedPrecision()]})
            def step(v):
                learn, s, e = L[v]; quiet_fit(learn); return fit_times(s, e)['train'] / n
            res = interleave({v: (lambda v=v: step(v)) for v in L}, cfg.reps, cfg.warmup)
            r = compare_row('G3 fp16', f'{task} ({n} it.), float16 step time, ReproMixedPrecision vs MixedPrecision',
                            'ms', res['fastai fp16'], res['fastrepro fp16'], '<= 1.01x', 1.01, quick=a.cpu, scale=1e3)
            report(r)
            r = compare_row('G3 fp16', f'{task}, step time, fastai MixedPrecision vs float32 (for scale)', 'ms',
                            res['fp32'], res['fastai fp16'], quick=a.cpu, scale=1e3)
            r.note = 'A: float32, B: fastai fp16'; report(r)

    t_start = time.perf_counter()
    for name, fn in (('G1', g1), ('G2', g2), ('G3', g3)):
        if name not in only: continue
        if time.perf_counter() - t_start > a.budget_s:
            errors[name] = f'skipped: the run passed its budget of {a.budget_s:.0f} s'
            print(f'[{name}] {errors[name]}'); continue
        t = time.perf_counter()
        try: fn()
        except Exception as e:
            import traceback; errors[name] = traceback.format_exc()
            print(f'[{name}] FAILED: {type(e).__name__}: {e}', file=sys.stderr, flush=True)
        print(f'  ({name}: {time.perf_counter() - t:.1f} s)', flush=True)
    machine['load_avg_end'] = os.getloadavg()
    write(Path(a.out), machine, cfg, rows, errors, time.perf_counter() - t_start)
    return 1 if errors else 0


def write(out:Path, machine:dict, cfg, rows:list, errors:dict, wall:float):
    out.mkdir(parents=True, exist_ok=True)
    (out/'gpu_results.json').write_text(json.dumps(dict(machine=machine, reps=cfg.reps, profile=cfg.profile,
                                                        wall_s=wall, rows=rows, errors=errors),
                                                   indent=1, default=str))
    m = machine
    lines = ['# fastrepro GPU benchmarks', '', f"Written by `python -m bench.gpu_bench` on {m['date']}.", '',
             f"GPU {m['gpu']}, CUDA {m['cuda']}, cuDNN {m['cudnn']}, torch {m['torch']}, fastai {m['fastai']}, "
             f"Python {m['python']}; "
             f"CPU {m['cpu']} ({m['logical_cpus']} logical CPUs); profile `{cfg.profile}`; tokenizer {m['tokenizer']}; "
             f"{cfg.warmup} warm-up + {cfg.reps} timed rounds per comparison; {wall:.0f} s.", '',
             '| # | case | A | B | unit | ratio B/A [min-max] | target | verdict | notes |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        ratio = '' if r['ratio'] is None else f"{r['ratio']:.3f}x [{r['ratio_lo']:.3f}-{r['ratio_hi']:.3f}]"
        verdict = '' if not r['target'] else {True: 'met', False: '**missed**', None: 'not judged'}[r['met']]
        lines.append(f"| {r['bench']} | {r['case']} | {r['fastai']:.4g} | {r['fastrepro']:.4g} | "
                     f"{r['unit']} | {ratio} | "
                     f"{r['target']} | {verdict} | {r['note']} |")
    if errors: lines += ['', '## Failed', ''] + [f"- {k}: {v.strip().splitlines()[-1]}" for k, v in errors.items()]
    (out/'GPU_RESULTS.md').write_text('\n'.join(lines) + '\n')
    print(f'wrote {out/"GPU_RESULTS.md"} and {out/"gpu_results.json"}')


if __name__ == '__main__':
    sys.exit(main())
