"""Run the fastrepro benchmarks: what reproducibility costs, measured against plain fastai in the same process.

    python -m bench.run            # full run (about 10 minutes on a 2-core CPU): bench/RESULTS.md, bench/results.json
    python -m bench.run --quick    # smoke run (about a minute); too few rounds to judge targets
    python -m bench.run --quick --out /tmp/b   # write RESULTS.md / results.json elsewhere
    python -m bench.run --only epoch,trace     # some benchmarks only

Run from the root of the checkout (see `bench/__init__.py`).

Each benchmark alternates fastrepro (B) and plain fastai (A) in one process, A B, B A, ..., a warm-up round first,
and reports the median over rounds of the ratio B/A. torch runs with a fixed number of threads (BENCH_THREADS,
`--threads`) so both sides get the same CPU. When RESULTS.md exists, only its part between the
`<!-- bench:begin -->` and `<!-- bench:end -->` markers is replaced: the analysis written around it stays.
"""
from __future__ import annotations
import sys, os, time, json, argparse, traceback, importlib, threading
from pathlib import Path
from ._common import Config, setup, machine_info, code_version, BENCH_THREADS, ROOT

BENCHMARKS = {  # name -> module (each has run(cfg) -> list[Row])
    'epoch': 'epoch_time', 'data': 'data_loading', 'checkpoint': 'checkpoint_io', 'fp16': 'fp16_step',
    'ledger': 'ledger_io', 'trace': 'trace_cost', 'deterministic': 'determinism', 'preempt': 'preempt_cost',
    'resume': 'resume_check', 'integrity': 'integrity_cost', 'growth': 'trace_growth',
}
BEGIN, END = '<!-- bench:begin -->', '<!-- bench:end -->'
QUIET_START = 1.5   # start a full run only below this 1-minute load average (2 cores); run.py warns above it
# ... and judge it on wall time only if the load stays below this (the benchmark itself adds about 1)
QUIET_DURING = 2.0
HEADER = "# fastrepro benchmarks\n\nWritten by `python -m bench.run`; analysis may be added outside the markers.\n\n"


def _fmt(x) -> str:
    if x is None: return ''
    return f'{x:.4g}' if abs(x) < 1e5 else f'{x:.0f}'

def _verdict(r:dict) -> str:
    if not r['target']: return ''
    v = {True: 'met', False: '**missed**', None: 'not judged'}
    if r.get('basis') == 'cpu': return f"{v[r['met_cpu']]} (CPU time; wall: {v[r['met']].strip('*')})"
    return v[r['met']]

def markdown(machine:dict, cfg:Config, rows:list, errors:dict, wall:float) -> str:
    m = machine
    out = [BEGIN, '',
           f"## Run of {m['date']}{' (--quick: too few rounds to judge the targets)' if cfg.quick else ''}", '',
           '| machine | |', '|---|---|',
           f"| CPU | {m['cpu']} ({m['logical_cpus']} logical CPUs) |",
           f"| torch threads | {m['num_threads']} intra-op (fixed by the benchmark), {m['interop_threads']} inter-op |",
           f"| versions | Python {m['python']}, torch {m['torch']}, fastai {m['fastai']}, fastcore {m['fastcore']}, "
           f"fastrepro {m['fastrepro']}, NumPy {m['numpy']} |",
           f"| platform | {m['os']} |", f"| code | {code_version(m)} |",
           f"| load average (1, 5, 15 min) | start {', '.join(f'{x:.2f}' for x in m['load_avg_start'])}; "
           f"end {', '.join(f'{x:.2f}' for x in m['load_avg_end'])}; highest 1-minute value seen "
           f"""{m['load_max']:.2f} ({'quiet: verdicts on wall time' if m['quiet']
               else (f'busy (>= {QUIET_DURING} while running, or >= {QUIET_START} at the start): '
                     'verdicts on CPU time where measured')}) |""",
           f"| rounds | {cfg.warmup} warm-up + {cfg.reps} timed per comparison unless a row says otherwise; "
           f"text models: `{cfg.profile}` profile, and `{cfg.larger.name}` where a row says so |",
           f"| wall time | {wall:.0f} s |", '',
           'A is plain fastai (or the reference named in the notes), B is fastrepro; A and B are medians of wall time. '
           'Ratio: median over rounds of B/A, with the smallest and largest round in brackets; above 1 means fastrepro '
           'costs more. CPU-time ratio: the same in CPU seconds of the process and its finished DataLoader workers, '
           'which other processes on the machine disturb far less than wall time. Fastest rounds: the fastest B round '
           'over the fastest A round (wall time), which leaves out the rounds that another job on the machine slowed '
           'down; the verdict uses the median ratio, as the issue asks.', '',
           '| # | case | A | B | unit | ratio B/A [min-max] | CPU-time ratio [min-max] | '
           'fastest rounds | target | verdict | notes |',
           '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        ratio = '' if r['ratio'] is None else f"{r['ratio']:.3f}x [{r['ratio_lo']:.3f}-{r['ratio_hi']:.3f}]"
        cpu = '' if r.get('cpu_ratio') is None else f"{r['cpu_ratio']:.3f}x [{r['cpu_lo']:.3f}-{r['cpu_hi']:.3f}]"
        best = '' if r.get('best_ratio') is None else f"{r['best_ratio']:.3f}x"
        out.append(f"| {r['bench']} | {r['case']} | {_fmt(r['fastai'])} | {_fmt(r['fastrepro'])} | "
                   f"{r['unit']} | {ratio} | {cpu} | {best} | {r['target']} | {_verdict(r)} | {r['note']} |")
    if errors:
        out += ['', '### Benchmarks that failed', '']
        out += [f"- `{k}`: {v.strip().splitlines()[-1]}" for k, v in errors.items()]
    out += ['', END]
    return '\n'.join(out)


class LoadSampler(threading.Thread):
    "Samples the 1-minute load average every `every` seconds while the benchmarks run"
    def __init__(self, every=5.0):
        super().__init__(daemon=True)
        self.every, self.samples, self._stop_ev = every, [os.getloadavg()[0]], threading.Event()
    def run(self):
        while not self._stop_ev.wait(self.every): self.samples.append(os.getloadavg()[0])
    def stop(self): self._stop_ev.set(); self.samples.append(os.getloadavg()[0]); return self.samples


def write_results(out:Path, machine, cfg, rows, errors, wall):
    out.mkdir(parents=True, exist_ok=True)
    data = dict(machine=machine, config=dict(quick=cfg.quick, reps=cfg.reps, warmup=cfg.warmup, profile=cfg.profile,
                                             threads=cfg.threads), wall_s=wall, rows=rows, errors=errors)
    (out/'results.json').write_text(json.dumps(data, indent=1, default=str))
    md, block = out/'RESULTS.md', markdown(machine, cfg, rows, errors, wall)
    text = md.read_text() if md.exists() else HEADER + BEGIN + '\n' + END + '\n'
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else: text = text.rstrip() + '\n\n' + block + '\n'
    md.write_text(text)
    return md


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--quick', action='store_true', help='smoke run: tiny models, 2 rounds')
    p.add_argument('--out', default=str(ROOT/'bench'), help='folder for RESULTS.md and results.json (default: bench/)')
    p.add_argument('--only', default='', help=f'comma-separated subset of {",".join(BENCHMARKS)}')
    p.add_argument('--reps', type=int, default=None, help='timed rounds per comparison')
    p.add_argument('--threads', type=int, default=BENCH_THREADS, help='torch intra-op threads')
    a = p.parse_args(argv)
    names = [n.strip() for n in a.only.split(',') if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown: p.error(f'unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}')
    t_start = time.perf_counter()
    out = Path(a.out)
    cfg = Config.make(a.quick, a.reps, a.threads, out=out/'out' if a.out != str(ROOT/'bench') else None)
    setup(cfg.threads)
    machine = machine_info(cfg.threads)
    print(f"fastrepro benchmarks{' (quick)' if cfg.quick else ''}: {machine['cpu']}, "
          f"{machine['num_threads']} torch thread(s), "
          f"torch {machine['torch']}, fastai {machine['fastai']}, "
          f"load average {machine['load_avg_start'][0]:.2f}", flush=True)
    rows, errors, loads = [], {}, [machine['load_avg_start'][0]]
    sampler = LoadSampler(); sampler.start()
    if loads[0] >= QUIET_START and not cfg.quick:
        print(f"warning: the 1-minute load average is {loads[0]:.2f} (>= {QUIET_START}): "
              "other work on this machine will disturb the timings; "
              "wall-time verdicts need a quiet machine, so CPU-time ones will be used.", flush=True)
    for n in names:
        t = time.perf_counter()
        try:
            mod = importlib.import_module(f'.{BENCHMARKS[n]}', __package__)
            for r in mod.run(cfg):
                print(r.line() + (f' | {r.note}' if r.note else ''), flush=True)
                rows.append(r.__dict__)
        except Exception:
            errors[n] = traceback.format_exc()
            print(f'[{n}] FAILED:\n{errors[n]}', file=sys.stderr, flush=True)
        loads.append(os.getloadavg()[0])
        print(f'  ({n}: {time.perf_counter() - t:.1f} s, load average {loads[-1]:.2f})', flush=True)
    machine['load_avg_end'] = os.getloadavg()
    loads += sampler.stop()
    machine['load_max'] = max(loads)
    machine['quiet'] = loads[0] < QUIET_START and max(loads) < QUIET_DURING
    for r in rows: r['basis'] = 'cpu' if not machine['quiet'] and r.get('cpu_ratio') is not None else 'wall'
    if not machine['quiet']:
        print(f"The machine was busy (1-minute load average up to {machine['load_max']:.2f}): "
              "targets are judged on CPU time where it was measured.")
    wall = time.perf_counter() - t_start
    md = write_results(out, machine, cfg, rows, errors, wall)
    print(f'wrote {md} and {out/"results.json"} in {wall:.1f} s')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
