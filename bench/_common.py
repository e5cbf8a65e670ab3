"""Shared pieces of the fastrepro benchmarks: configuration, fixed threads, the IMDB-sample data, an interleaved
A/B timer, timing callbacks, the machine description and the result rows every benchmark returns."""
from __future__ import annotations
import os, sys, time, json, random, platform, datetime, functools, warnings, statistics, subprocess
from dataclasses import dataclass, field, asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_CSV = ROOT.parent/'shared'/'data'/'imdb_sample'/'texts.csv'

BENCH_THREADS = 1   # torch intra-op threads for every benchmark: fixed so that A and B get the same CPU (2-core machine)
SEED = 42           # ReproCB seed in every benchmark
WARMUP = 1          # untimed rounds before the timed ones
FULL_REPS = 7       # timed rounds of a full run (the issue asks for at least 5)
QUICK_REPS = 2      # timed rounds of a --quick smoke run (not enough to judge a target)
FULL_PROFILE = 'fast'  # fastrepro.ulmfit profile of the full run's text models
QUICK_PROFILE = 'smoke' # --quick's: smaller than fastrepro.ulmfit's 'test', so the smoke run stays short
_SMOKE = dict(name='smoke', n_texts=48, max_chars=300, lm_bs=8, seq_len=16, clas_bs=8, emb_sz=16, n_hid=32, n_layers=2,
              lm_epochs=1, clas_epochs=1)


@dataclass
class Config:
    "What one `bench/run.py` invocation asks of the benchmarks"
    quick: bool = False
    reps: int = FULL_REPS
    warmup: int = WARMUP
    profile: str = FULL_PROFILE
    threads: int = BENCH_THREADS
    out: Path = ROOT/'bench'/'out'   # scratch folder for checkpoints and ledgers

    @property
    def prof(self):
        "The `fastrepro.ulmfit.Profile` named `profile`"
        from fastrepro.ulmfit import Profile, get_profile
        return Profile(**_SMOKE) if self.profile == 'smoke' else get_profile(self.profile)

    @classmethod
    def make(cls, quick=False, reps=None, threads=BENCH_THREADS, out=None, profile=None):
        cfg = cls(quick=quick, reps=reps or (QUICK_REPS if quick else FULL_REPS),
                  profile=profile or (QUICK_PROFILE if quick else FULL_PROFILE), threads=threads)
        if out is not None: cfg.out = Path(out)
        cfg.out.mkdir(parents=True, exist_ok=True)
        return cfg


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
    met: bool|None = None # None: no target, or too few rounds to judge
    note: str = ''
    samples: dict = field(default_factory=dict)  # raw per-round values

    def line(self) -> str:
        v = f"{self.fastrepro:.4g} {self.unit}"
        if self.fastai is not None: v = f"fastai {self.fastai:.4g} {self.unit}, fastrepro {v}"
        r = '' if self.ratio is None else f", ratio {self.ratio:.3f}x [{self.ratio_lo:.3f}-{self.ratio_hi:.3f}]"
        t = '' if not self.target else f" (target {self.target}: {'met' if self.met else 'MISSED' if self.met is False else 'not judged'})"
        return f"[{self.bench}] {self.case}: {v}{r}{t}"


def setup(threads:int=BENCH_THREADS):
    "Fix the thread counts, silence known warnings, make the IMDB sample available offline"
    os.environ.setdefault('OMP_NUM_THREADS', str(threads))
    import torch
    torch.set_num_threads(threads)
    try: torch.set_num_interop_threads(1)
    except RuntimeError: pass  # already set, or parallel work already started
    warnings.filterwarnings('ignore')
    from fastrepro.ulmfit import install_imdb_sample
    install_imdb_sample(SHARED_CSV if SHARED_CSV.exists() else None)


@functools.lru_cache(maxsize=None)
def text_data(profile):
    "(LM DataLoaders, classifier DataLoaders) of the IMDB sample for `profile` (a `Profile`), built once per process"
    from fastrepro.ulmfit import imdb_sample_df, lm_dls, clas_dls
    df = imdb_sample_df(profile)
    lm = lm_dls(df, profile)
    return lm, clas_dls(df, lm.vocab, profile)


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

def compare_row(bench, case, unit, base:list, repro:list, target='', limit=None, hard_limit=None, quick=False, note='', scale=1.0) -> Row:
    """A `Row` from paired samples: ratio = median over rounds of repro[i]/base[i] (both are costs).
    `limit`: the target ratio; `hard_limit`: a ceiling that is a miss even when the median meets `limit`."""
    ratios = [b/a for a, b in zip(base, repro)]
    r = median(ratios)
    met = None
    if limit is not None and not quick:
        met = r <= limit and (hard_limit is None or r <= hard_limit)
    return Row(bench, case, unit, median(repro)*scale, median(base)*scale, r, min(ratios), max(ratios), target, met, note,
               samples={'fastai': [x*scale for x in base], 'fastrepro': [x*scale for x in repro]})


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
            self.stamps.setdefault(e, []).append(time.perf_counter())
    start = _Stamp(-1000, ['before_fit', 'before_epoch', 'before_train'])
    end = _Stamp(1000, ['after_train', 'after_epoch', 'after_fit'])
    return start, end

def fit_times(start, end) -> dict:
    "Seconds of the last fit measured by `timing_cbs`: whole fit, setup (before_fit), epochs, training phases"
    s, e = start.stamps, end.stamps
    res = dict(fit=e['after_fit'][-1] - s['before_fit'][-1], setup=s['before_epoch'][0] - s['before_fit'][-1],
               epoch=median([b - a for a, b in zip(s['before_epoch'], e['after_epoch'])]),
               train=median([b - a for a, b in zip(s['before_train'], e['after_train'])]))
    for d in (s, e):
        for v in d.values(): v.clear()
    return res


# -- the machine -----------------------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'): return line.split(':', 1)[1].strip()
    except OSError: pass
    return platform.processor() or platform.machine()

def _git_commit() -> str:
    try:
        c = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        d = subprocess.run(['git', 'status', '--porcelain'], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return c + (' (dirty working tree)' if d else '')
    except OSError: return 'unknown'

def machine_info(threads:int) -> dict:
    import torch, numpy, fastai, fastcore, fastrepro
    return dict(date=datetime.datetime.now().astimezone().isoformat(timespec='seconds'), cpu=_cpu_model(),
                logical_cpus=os.cpu_count(), torch_threads=torch.get_num_threads(), bench_threads=threads,
                interop_threads=torch.get_num_interop_threads(), python=platform.python_version(), torch=torch.__version__,
                fastai=fastai.__version__, fastcore=fastcore.__version__, fastrepro=fastrepro.__version__,
                numpy=numpy.__version__, platform=platform.platform(), commit=_git_commit(),
                load_avg_start=os.getloadavg())


def quiet_fit(learn, n_epoch=1, lr=1e-3):
    "`fit_one_cycle(n_epoch)` without progress bar and printed table (both sides alike)"
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(n_epoch, lr)
