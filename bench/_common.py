"""Shared pieces of the fastrepro benchmarks: configuration, fixed threads, the IMDB-sample data, an interleaved
A/B timer, timing callbacks, the machine description and the result rows every benchmark returns."""
from __future__ import annotations
import os, time, resource, datetime, functools, warnings, statistics
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_CSV = ROOT.parent/'shared'/'data'/'imdb_sample'/'texts.csv'

# torch intra-op threads for every benchmark: fixed so that A and B get the same CPU (2-core machine)
BENCH_THREADS = 1
SEED = 42           # ReproCB seed in every benchmark
WARMUP = 1          # untimed rounds before the timed ones
# timed rounds of a full run (the issue asks for at least 5): tiny models, so many rounds are affordable
FULL_REPS = 10
QUICK_REPS = 2      # timed rounds of a --quick smoke run (not enough to judge a target)
FULL_PROFILE = 'test'  # fastrepro.demo.ulmfit profile of the full run's text models: the tiny ULMFiT of the issue
# a larger one, where a full run also measures epochs (fewer rounds), data loading and checkpoints
LARGER_PROFILE = 'fast'
QUICK_PROFILE = 'smoke' # --quick's: smaller than fastrepro.demo.ulmfit's 'test', so the smoke run stays short
SMOKE = dict(name='smoke', n_texts=48, max_chars=300, lm_bs=8, seq_len=16, clas_bs=8, emb_sz=16, n_hid=32, n_layers=2,
              lm_epochs=1, clas_epochs=1)


@dataclass
class Config:
    "What one `python -m bench.run` invocation asks of the benchmarks"
    quick: bool = False
    reps: int = FULL_REPS
    warmup: int = WARMUP
    profile: str = FULL_PROFILE
    threads: int = BENCH_THREADS
    out: Path = ROOT/'bench'/'out'   # scratch folder for checkpoints and ledgers

    @property
    def prof(self):
        "The `fastrepro.demo.ulmfit.Profile` named `profile`"
        return profile(self.profile)

    @property
    def larger(self):
        "`LARGER_PROFILE` in a full run; the smoke profile in a quick one"
        return self.prof if self.quick else profile(LARGER_PROFILE)

    @classmethod
    def make(cls, quick=False, reps=None, threads=BENCH_THREADS, out=None, profile=None):
        cfg = cls(quick=quick, reps=reps or (QUICK_REPS if quick else FULL_REPS), threads=threads,
                  warmup=0 if quick else WARMUP,  # a smoke run judges nothing: its one round needs no warm-up
                  profile=profile or (QUICK_PROFILE if quick else FULL_PROFILE))
        if out is not None: cfg.out = Path(out)
        cfg.out.mkdir(parents=True, exist_ok=True)
        return cfg


def profile(name:str):
    "The `fastrepro.demo.ulmfit.Profile` called `name`, or the benchmarks' own 'smoke'"
    from fastrepro.demo.ulmfit import Profile, get_profile
    return Profile(**SMOKE) if name == 'smoke' else get_profile(name)


@dataclass
class Row:
    "One measured comparison (or one absolute measurement when `fastai` is None)"
    bench: str            # benchmark number and name, e.g. '1 epoch'
    case: str             # what was measured, e.g. 'LM, epoch time'
    unit: str             # unit of `fastai` and `fastrepro`
    fastrepro: float      # median of the fastrepro side
    fastai: float|None = None  # median of the plain-fastai side (None: no baseline)
    ratio: float|None = None   # median of the per-round ratios fastrepro/fastai (cost: > 1 is slower/bigger)
    ratio_lo: float|None = None  # smallest and largest per-round ratio
    ratio_hi: float|None = None
    target: str = ''      # the target, in words
    met: bool|None = None # judged on wall time; None: no target, or too few rounds to judge
    note: str = ''
    samples: dict = field(default_factory=dict)  # raw per-round values
    # the same ratio in CPU time (process and its finished children): robust to a busy machine
    cpu_ratio: float|None = None
    cpu_lo: float|None = None
    cpu_hi: float|None = None
    met_cpu: bool|None = None     # the target judged on CPU time
    best_ratio: float|None = None  # fastest fastrepro round / fastest fastai round: what is left without the spikes
    basis: str = 'wall'           # what the verdict in the report uses: 'wall', or 'cpu' when the machine was busy

    def line(self) -> str:
        v = f"{self.fastrepro:.4g} {self.unit}"
        if self.fastai is not None: v = f"fastai {self.fastai:.4g} {self.unit}, fastrepro {v}"
        r = '' if self.ratio is None else f", ratio {self.ratio:.3f}x [{self.ratio_lo:.3f}-{self.ratio_hi:.3f}]"
        if self.cpu_ratio is not None: r += f", CPU time {self.cpu_ratio:.3f}x"
        if self.best_ratio is not None: r += f", fastest rounds {self.best_ratio:.3f}x"
        verdict = lambda m: 'met' if m else 'MISSED' if m is False else 'not judged'
        t = '' if not self.target else f" (target {self.target}: {verdict(self.met)}" + \
            (f"; on CPU time {verdict(self.met_cpu)})" if self.cpu_ratio is not None else ')')
        return f"[{self.bench}] {self.case}: {v}{r}{t}"


def setup(threads:int=BENCH_THREADS):
    "Fix the thread counts, silence known warnings, make the IMDB sample available offline"
    os.environ.setdefault('OMP_NUM_THREADS', str(threads))
    import torch
    torch.set_num_threads(threads)
    try: torch.set_num_interop_threads(1)
    except RuntimeError: pass  # already set, or parallel work already started
    warnings.filterwarnings('ignore')
    from fastrepro.demo.ulmfit import install_imdb_sample
    install_imdb_sample(SHARED_CSV if SHARED_CSV.exists() else None)


@functools.lru_cache(maxsize=None)
def text_data(profile):
    "(LM DataLoaders, classifier DataLoaders) of the IMDB sample for `profile` (a `Profile`), built once per process"
    from fastrepro.demo.ulmfit import imdb_sample_df, lm_dls, clas_dls
    try: import spacy; kw = {}  # noqa: F401  (fastai's default tokenizer)
    except ImportError:
        from fastai.text.core import BaseTokenizer
        kw = dict(tok_tfm=BaseTokenizer())  # machines without spaCy (the GPU image): split on spaces
    df = imdb_sample_df(profile)
    lm = lm_dls(df, profile, **kw)
    return lm, clas_dls(df, lm.vocab, profile, **kw)


def interleave(fns:dict, reps:int, warmup:int=WARMUP, timer=time.perf_counter) -> dict:
    """Call each of `fns` (name -> callable) once per round, `warmup` untimed rounds then `reps` timed ones.
    The order rotates every round (A B, B A, ... or A B C, B C A, ...) so that neither side always runs first.
    A callable may return its own measurement (a number); otherwise its wall time is recorded."""
    names, res = list(fns), {n: [] for n in fns}
    for r in range(warmup + reps):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t = timer(); v = fns[n](); el = timer() - t
            if r >= warmup: res[n].append(el if v is None else v)
    return res


def median(xs): return statistics.median(xs)

def compare_row(bench, case, unit, base:list, repro:list, target='', limit=None, hard_limit=None, quick=False, note='',
                scale=1.0, cpu_base:list|None=None, cpu_repro:list|None=None) -> Row:
    """A `Row` from paired samples: ratio = median over rounds of repro[i]/base[i] (both are costs).
    `limit`: the target ratio; `hard_limit`: a ceiling that is a miss even when the median meets `limit`.
    `cpu_base`, `cpu_repro`: the same rounds in CPU seconds, for the CPU-time ratio."""
    def judge(r): return None if limit is None or quick else (r <= limit and (hard_limit is None or r <= hard_limit))
    ratios = [b/a for a, b in zip(base, repro)]
    r = median(ratios)
    row = Row(bench, case, unit, median(repro)*scale, median(base)*scale, r, min(ratios), max(ratios), target, judge(r),
              note, samples={'fastai': [x*scale for x in base], 'fastrepro': [x*scale for x in repro]})
    row.best_ratio = min(repro)/min(base)
    if cpu_base is not None:
        cr = [b/a for a, b in zip(cpu_base, cpu_repro)]
        row.cpu_ratio, row.cpu_lo, row.cpu_hi, row.met_cpu = median(cr), min(cr), max(cr), judge(median(cr))
        row.samples.update(cpu_fastai=list(cpu_base), cpu_fastrepro=list(cpu_repro))
    return row


def cpu_time() -> float:
    "CPU seconds of this process and of its children that have ended (DataLoader workers end with each pass)"
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def timed(fn) -> dict:
    "Call `fn()`; its wall and CPU seconds"
    t, c = time.perf_counter(), cpu_time()
    fn()
    return dict(wall=time.perf_counter() - t, cpu=cpu_time() - c)


def pair(res:dict, a:str, b:str, key:str) -> tuple:
    "(A's values, B's values) of `key` in the per-round dicts `res[a]`, `res[b]`"
    return [o[key] for o in res[a]], [o[key] for o in res[b]]


# -- timing callbacks ------------------------------------------------------------------------------------------------
def timing_cbs(sync:bool=False):
    """Two callbacks that bracket every other one: `start` (order -1000) and `end` (order 1000) stamp the events.
    `sync`: wait for the GPU before each stamp (CUDA runs asynchronously)"""
    from fastai.callback.core import Callback
    import torch
    class _Stamp(Callback):
        run_valid = True
        def __init__(self, order, events):
            self.order, self.stamps = order, {}
            for e in events: setattr(self, e, functools.partial(self._stamp, e))
        def _stamp(self, e):
            if sync: torch.cuda.synchronize()
            self.stamps.setdefault(e, []).append((time.perf_counter(), cpu_time()))
    start = _Stamp(-1000, ['before_fit', 'before_epoch', 'before_train'])
    end = _Stamp(1000, ['after_train', 'after_epoch', 'after_fit'])
    return start, end

def fit_times(start, end) -> dict:
    """Seconds of the last fit measured by `timing_cbs`: whole fit, setup (before_fit), epochs, training phases;
    the same in CPU seconds as `fit_cpu`, `setup_cpu`, `epoch_cpu`, `train_cpu`"""
    s, e = start.stamps, end.stamps
    res = {}
    for i, suffix in ((0, ''), (1, '_cpu')):
        res.update({f'fit{suffix}': e['after_fit'][-1][i] - s['before_fit'][-1][i],
                    f'setup{suffix}': s['before_epoch'][0][i] - s['before_fit'][-1][i],
                    f'epoch{suffix}': median([b[i] - a[i] for a, b in zip(s['before_epoch'], e['after_epoch'])]),
                    f'train{suffix}': median([b[i] - a[i] for a, b in zip(s['before_train'], e['after_train'])])})
    for d in (s, e):
        for v in d.values(): v.clear()
    return res


# -- the machine -----------------------------------------------------------------------------------------------------
def machine_info(threads:int) -> dict:
    """What a run of the benchmarks ran on: fastrepro's own `environment_info` (versions, CPU, GPUs, threads, switches)
    and `git_info` of this checkout, plus what timings need (date, logical CPUs, threads, load average)"""
    import torch
    from fastrepro.state.environment import environment_info
    from fastrepro.record.provenance import git_info
    date = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
    return dict(environment_info(), git=git_info(ROOT), date=date, logical_cpus=os.cpu_count(), bench_threads=threads,
                interop_threads=torch.get_num_interop_threads(), load_avg_start=os.getloadavg())

def code_version(machine:dict) -> str:
    "The commit of `machine_info`'s checkout, short, and whether its working tree had uncommitted changes"
    git = machine['git']
    if not git.get('commit'): return 'not a git checkout' if not git['is_repo'] else 'no commit yet'
    return git['commit'][:7] + (' (dirty working tree)' if git['dirty'] else '')


def quiet_fit(learn, n_epoch=1, lr=1e-3):
    "`fit_one_cycle(n_epoch)` without progress bar and printed table (both sides alike)"
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(n_epoch, lr)


def bench_main(run):
    "Command line of one benchmark module: `python -m bench.NAME [--quick]` prints its rows"
    import argparse
    p = argparse.ArgumentParser(); p.add_argument('--quick', action='store_true'); a = p.parse_args()
    cfg = Config.make(a.quick); setup(cfg.threads)
    for r in run(cfg): print(r.line(), '|', r.note)
