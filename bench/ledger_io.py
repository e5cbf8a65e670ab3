"""Benchmark 5: the run ledger, on both backends: an SQLite file and a PostgreSQL server on 127.0.0.1 (a throwaway
one, `fastrepro.experiments.store.local_postgres`, with the server's durable defaults). Absolute numbers (fastai has
no ledger):
- one writer: `Ledger.add` of N run records like the ones ReproCB writes (environment, hyperparameters, metrics);
- 4 concurrent writers: 4 processes adding N/4 records each to one ledger, started together;
- one fit's bookkeeping: `add` (status 'running') then `update` (metrics, 'completed'), as ReproCB does per fit;
- `Ledger.runs()` of all runs, `Ledger.compare` of 500 baseline against 500 experiment runs (1,000 runs), and
  `fastrepro.experiments.stats.compare` on the same two arrays of numbers.
Every commit is durable (SQLite: WAL, synchronous=FULL; PostgreSQL: fsync and synchronous_commit on), so the insert
rate is bounded by the disk's fsync time; a server ledger also opens a connection per operation (no pool: a Ledger is
its address, so it pickles to worker processes)."""
from __future__ import annotations
import multiprocessing as mp
from contextlib import ExitStack
from ._common import *

N_RUNS, QUICK_RUNS = 1000, 100  # runs in the compared ledger (half baseline, half experiment)
WRITERS = 4


def _record(i:int, env:dict) -> dict:
    variant = 'baseline' if i % 2 == 0 else 'mixup'
    acc = 0.80 + 0.01 * ((i * 7919) % 100) / 100 + (0.005 if variant == 'mixup' else 0)
    return dict(experiment='bench', variant=variant, seed=i, commit='0123456789abcdef0123456789abcdef01234567',
                dirty=False, env_hash=env['env_hash'], env=env, metric_version='v1', data_fingerprint='feedfacecafe',
                hyperparameters=dict(lr=1e-2, epochs=3, bs=16, arch='SequentialRNN', loss_func='CrossEntropyLossFlat'),
                metrics={'final': {'accuracy': acc, 'valid_loss': 1 - acc},
                         'best': {'accuracy': acc, 'valid_loss': 1 - acc}})


def _writer(address, first:int, n:int, env:dict, barrier, q):
    "Process body: wait for the others, then add `n` records; report the elapsed time"
    from fastrepro.experiments.ledger import Ledger
    led = Ledger(address)
    recs = [_record(i, env) for i in range(first, first + n)]
    barrier.wait()
    t = time.perf_counter()
    for r in recs: led.add(r)
    q.put((t, time.perf_counter()))


def _addresses(folder:Path, stack:ExitStack) -> dict:
    "Backend name -> a function giving the address of a new, empty ledger of that name"
    from fastrepro.experiments.store import local_postgres, postgres_bin
    res = {'sqlite': lambda name: folder/f'{name}.db'}
    if postgres_bin() is None: return res
    url = stack.enter_context(local_postgres())
    def _database(name):
        import psycopg
        with psycopg.connect(url, autocommit=True) as con: con.execute(f'CREATE DATABASE {name}')
        return f"{url.rsplit('/', 1)[0]}/{name}"
    res['postgresql'] = _database
    return res


def _backend(name:str, new, n:int, env:dict, cfg:Config) -> list:
    "The rows of one backend; `new(name)` gives the address of a new ledger"
    import numpy as np
    from fastrepro.experiments.ledger import Ledger
    from fastrepro.experiments.stats import compare
    bench, rows = f'5 ledger ({name})', []

    # one writer: the ledger that `compare` reads afterwards
    led = Ledger(new('one'))
    recs = [_record(i, env) for i in range(n)]
    t = time.perf_counter()
    for r in recs: led.add(r)
    el = time.perf_counter() - t
    rows.append(Row(bench, f'one writer, {n} Ledger.add', 'inserts/s', n/el, note=f'{el/n*1e3:.2f} ms per insert'))

    # concurrent writers (forked: they touch only the database driver and JSON)
    ctx = mp.get_context('fork')
    barrier, q = ctx.Barrier(WRITERS), ctx.Queue()
    per, many = n // WRITERS, new('many')
    Ledger(many)  # created once, before the writers race
    procs = [ctx.Process(target=_writer, args=(many, k*per, per, env, barrier, q)) for k in range(WRITERS)]
    for p in procs: p.start()
    spans = [q.get(timeout=600) for _ in procs]
    for p in procs: p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"a ledger writer failed: exit codes {[p.exitcode for p in procs]}")
    el = max(b for a, b in spans) - min(a for a, b in spans)
    total = len(Ledger(many))
    rows.append(Row(bench, f'{WRITERS} concurrent writers, {per} Ledger.add each', 'inserts/s', per*WRITERS/el,
                    note=f'{total} runs in the ledger afterwards (expected {per*WRITERS})'))

    # one fit's bookkeeping (what ReproCB adds to every fit with a ledger)
    fl = Ledger(new('fits'))
    def one_fit():
        rid = fl.add(dict(_record(0, env), status='running', metrics=None))
        fl.update(rid, status='completed', metrics=_record(0, env)['metrics'], finished=time.time())
    fit_reps = cfg.reps if cfg.quick else max(cfg.reps, 10)
    res = interleave({'fit': one_fit}, fit_reps, cfg.warmup)
    rows.append(Row(bench, 'one fit recorded (add + update)', 'ms', median(res['fit'])*1e3))

    # reading and comparing 1,000 runs
    reps = cfg.reps if cfg.quick else max(cfg.reps, 5)
    res = interleave({'runs': lambda: (led.runs(), None)[1],
                      'compare': lambda: (led.compare('accuracy', dict(experiment='bench', variant='baseline'),
                                                      dict(experiment='bench', variant='mixup')), None)[1]},
                     reps, cfg.warmup)
    df = led.runs()
    acc = np.array([m['final']['accuracy'] for m in df.metrics])
    b, e = acc[df.variant.values == 'baseline'], acc[df.variant.values == 'mixup']
    res2 = interleave({'stats': lambda: (compare(b, e), None)[1]}, reps, cfg.warmup)
    rows.append(Row(bench, f'Ledger.runs() of {n} runs', 'ms', median(res['runs'])*1e3))
    rows.append(Row(bench, f'Ledger.compare over {n} runs ({len(b)} vs {len(e)})', 'ms', median(res['compare'])*1e3,
                    note='selects both sides, checks metric version, data, environment, seeds, then the t-test'))
    rows.append(Row(bench, f'stats.compare on {len(b)} vs {len(e)} values', 'ms', median(res2['stats'])*1e3))
    return rows


def run(cfg:Config) -> list:
    from fastrepro.state.environment import environment_info
    n = QUICK_RUNS if cfg.quick else N_RUNS
    env = environment_info()
    folder = cfg.out/'ledgers'; folder.mkdir(parents=True, exist_ok=True)
    for f in folder.glob('*.db*'): f.unlink()
    rows = []
    with ExitStack() as stack:
        backends = _addresses(folder, stack)
        for name, new in backends.items(): rows += _backend(name, new, n, env, cfg)
    if 'postgresql' not in backends:
        print("bench ledger: no PostgreSQL server binaries here (apt-get install postgresql): SQLite only")
    return rows


if __name__ == '__main__': bench_main(run)
