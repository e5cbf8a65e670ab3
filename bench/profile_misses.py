"""Where fastrepro's time goes: the evidence behind the misses in RESULTS.md (not part of `run.py`).

    python -m bench.profile_misses [--only step,data,setup,checkpoint,spy] [--profile fast]
                                   [--out bench/out/profiles.txt]

- epoch: ReproCB with one part switched off at a time (and the NaN fill off), against no ReproCB: epoch CPU time.
- step: one training step (forward, backward, optimizer) with the deterministic switches off, on, and on with
  `torch.utils.deterministic.fill_uninitialized_memory` off; process CPU time, alternating blocks of steps.
- data: cProfile of full passes over a deterministic loader; the time of fastrepro's own functions per batch.
- setup: cProfile of `ReproCB.before_fit` (the once-per-fit work) over several fits.
- checkpoint: the parts of `learn.save` and `learn.load` timed one by one, against fastai's.
- spy: py-spy (if installed) samples an LM epoch with ReproCB; the share of samples whose innermost fastrepro
  frame is each function (frames of fastai or torch called from there count for it).
"""
from __future__ import annotations
import io, os, sys, shutil, subprocess, tempfile, argparse, cProfile, pstats
from collections import Counter
from ._common import *

SECTIONS = ('epoch', 'step', 'data', 'setup', 'checkpoint', 'spy')
OUT = []

def say(*a):
    s = ' '.join(str(o) for o in a); print(s, flush=True); OUT.append(s)


def section_epoch(cfg):
    import torch
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import lm_learner, clas_learner
    prof = profile('test')
    lm, clas = text_data(prof)
    variants = {'fastai (no ReproCB)': None, 'ReproCB defaults': {}, 'deterministic=False': dict(deterministic=False),
                'deterministic_data=False': dict(deterministic_data=False), 'trace_every=0': dict(trace_every=0),
                'all three off': dict(deterministic=False, deterministic_data=False, trace_every=0),
                'defaults, NaN fill off': 'nofill'}
    reps = max(cfg.reps, 10)
    say(f'\n## epoch: which part of ReproCB costs what '
        f'(test profile, epoch CPU time incl. finished workers, {reps} rounds)')
    for task, mk, dls in [('LM', lm_learner, lm), ('classifier', clas_learner, clas)]:
        L = {}
        for v, kw in variants.items():
            s, e = timing_cbs()
            cb = [] if kw is None else [ReproCB(seed=SEED, allow_dirty=True, **(kw if isinstance(kw, dict) else {}))]
            L[v] = (mk(dls, prof, cbs=[s, e] + cb), s, e, kw)
        def fit(v):
            learn, s, e, kw = L[v]
            torch.utils.deterministic.fill_uninitialized_memory = kw != 'nofill'
            try: quiet_fit(learn)
            finally: torch.utils.deterministic.fill_uninitialized_memory = True
            t = fit_times(s, e); return dict(wall=t['epoch'], cpu=t['epoch_cpu'])
        res = interleave({v: (lambda v=v: fit(v)) for v in L}, reps, 1)
        base = 'fastai (no ReproCB)'
        for v in L:
            cr = median([b['cpu']/a['cpu'] for a, b in zip(res[base], res[v])])
            wr = median([b['wall']/a['wall'] for a, b in zip(res[base], res[v])])
            say(f'  {task:10s} {v:26s} CPU {median([o["cpu"] for o in res[v]]):6.3f} s  '
                f'ratio {cr:.3f}   (wall ratio {wr:.3f})')


def section_step(cfg):
    import torch
    from fastrepro.state.kernels import set_deterministic, set_switches
    from fastrepro.demo.ulmfit import lm_learner, clas_learner
    lm, clas = text_data(cfg.prof)
    say('\n## step: one training step, CPU time, deterministic switches off / on / on without the NaN fill')
    for task, mk, dls in [('LM', lm_learner, lm), ('classifier', clas_learner, clas)]:
        learn = mk(dls, cfg.prof); learn.create_opt(); learn.model.train()
        xb, yb = dls.one_batch()
        def step():
            learn.model.reset()
            out = learn.model(xb); out = out[0] if isinstance(out, tuple) else out
            learn.loss_func(out, yb).backward(); learn.opt.step(); learn.opt.zero_grad()
        def block(mode, n=4):
            before = set_deterministic(True) if mode != 'off' else None
            torch.utils.deterministic.fill_uninitialized_memory = mode != 'on-nofill'
            t = time.process_time()
            for _ in range(n): step()
            el = (time.process_time() - t) / n
            if before: set_switches(before)
            torch.utils.deterministic.fill_uninitialized_memory = True
            return el
        res = interleave({m: (lambda m=m: block(m)) for m in ('off', 'on', 'on-nofill')}, max(cfg.reps, 8), 1)
        for m, v in res.items():
            say(f'  {task:10s} batch {tuple(xb.shape)}  {m:9s} {median(v)*1e3:8.2f} ms/step  ratio to off '
                f'{median([b/a for a, b in zip(res["off"], v)]):.3f}')


def section_data(cfg):
    from fastrepro.state.data import make_deterministic, data_streams
    lm, clas = text_data(cfg.prof)
    say('\n## data: fastrepro functions during deterministic passes (cProfile; own time per batch)')
    for task, dls in [('LM', lm), ('classifier', clas)]:
        for per_item in (None, True):
            dl = make_deterministic(dls.train.new(num_workers=0), SEED, per_item=per_item)
            for b in dl: pass
            n_b, passes = len(dl), 3
            pr = cProfile.Profile(); pr.enable()
            for _ in range(passes):
                for b in dl: pass
            pr.disable()
            st = pstats.Stats(pr)
            gen = ('getstate', 'setstate', 'get_state', 'set_state', 'seed', 'blake2b')
            rows = sorted(((v[2], v[1], f'{Path(k[0]).name}:{k[1]}({k[2]})') for k, v in st.stats.items()
                           if 'fastrepro' in k[0] or any(g in k[2] for g in gen)), reverse=True)
            tot = sum(r[0] for r in rows)
            say(f'  {task} per_item={per_item} (streams {"per item" if data_streams(dl).per_item else "per batch"}): '
                f'{tot/passes/n_b*1e3:.3f} ms per batch in fastrepro and the generators it seeds/saves, of '
                f'{st.total_tt/passes/n_b*1e3:.2f} ms per batch in all (profiled, so both inflated)')
            for t, n, name in rows[:8]:
                say(f'      {t/passes/n_b*1e6:8.1f} us/batch  {n//passes:6d} calls/pass  {name}')


def section_setup(cfg):
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import clas_learner
    _, clas = text_data(cfg.prof)
    learn = clas_learner(clas, cfg.prof, cbs=ReproCB(seed=SEED, allow_dirty=True))
    quiet_fit(learn)
    pr, orig = cProfile.Profile(), ReproCB.before_fit
    def wrapped(self):
        pr.enable()
        try: return orig(self)
        finally: pr.disable()
    ReproCB.before_fit, n = wrapped, 5
    try:
        for _ in range(n): quiet_fit(learn)
    finally: ReproCB.before_fit = orig
    st = pstats.Stats(pr)
    say(f'\n## setup: ReproCB.before_fit, {st.total_tt/n*1e3:.1f} ms per fit (cProfile, {n} fits); '
        'largest cumulative entries:')
    rows = sorted(((v[3], v[0], f'{Path(k[0]).name}:{k[1]}({k[2]})') for k, v in st.stats.items()), reverse=True)
    for t, calls, name in rows[:14]: say(f'  {t/n*1e3:7.2f} ms/fit  {calls//n:4d} calls/fit  {name}')


def section_checkpoint(cfg):
    import torch
    import fastrepro.checkpoint.file as ck
    from fastrepro.callback.repro import ReproCB
    from fastrepro.demo.ulmfit import clas_learner
    _, clas = text_data(cfg.prof)
    path = Path(tempfile.mkdtemp(prefix='bench_ck'))
    repro = clas_learner(clas, cfg.prof, path=path, cbs=ReproCB(seed=SEED, allow_dirty=True)); quiet_fit(repro)
    plain = clas_learner(clas, cfg.prof, path=path); quiet_fit(plain)
    f, fp = repro.save('r'), plain.save('p')
    def to_bytes(learn, extra):
        st = {'model': learn.model.state_dict(), 'opt': learn.opt.state_dict()}
        if extra: st['opt'][ck.STATE_KEY] = ck.checkpoint_state(learn)
        torch.save(st, io.BytesIO(), pickle_protocol=2)
    extra = ck.split_state(ck.read_checkpoint(f))[2]
    blob = os.urandom(os.path.getsize(fp))
    def write(name):
        with open(path/name, 'wb') as fh: fh.write(blob)
    def move_time(move, n=15):
        "Median time of `move` alone (the new file is written before the clock starts)"
        ts = []
        for _ in range(n):
            write('target'); write('tmp')
            t = time.perf_counter(); move(path/'tmp', path/'target'); ts.append(time.perf_counter() - t)
        return median(ts)
    say(f'\n## atomic move of a freshly written {len(blob)/1e6:.1f} MB file over the previous one '
        '(the write not timed)')
    say(f'  {move_time(os.replace)*1e3:8.2f} ms  os.replace '
        '(rename over: ext4 allocates and starts writing the new blocks, auto_da_alloc)')
    say(f'  {move_time(ck._move_into_place)*1e3:8.2f} ms  fastrepro: swap the names '
        '(renameat2 RENAME_EXCHANGE), delete the old file')
    parts = {
        'fastai save': lambda: plain.save('p'), 'fastrepro save': lambda: repro.save('r'),
        'checkpoint_state(learn) alone': lambda: ck.checkpoint_state(repro),
        '  of which the trace state_dict': lambda: repro.repro_cb.trace.state_dict(),
        '  of which rng_states()': lambda: __import__('fastrepro.state.rng', fromlist=['x']).rng_states(),
        'fastai: torch.save to memory': lambda: to_bytes(plain, False),
        'fastrepro: checkpoint_state + torch.save to memory': lambda: to_bytes(repro, True),
        'fastai load': lambda: plain.load('p'), 'fastrepro load': lambda: repro.load('r'),
        'fastrepro load, weights_only=False': lambda: repro.load('r', weights_only=False),
        'torch.load fastai file, weights_only=False (fastai text loader)': lambda: torch.load(fp, weights_only=False),
        'torch.load fastai file, weights_only=True (+ fastai safe globals)': lambda: ck.read_checkpoint(fp),
        'torch.load fastrepro file, weights_only=False': lambda: torch.load(f, weights_only=False),
        'torch.load fastrepro file, weights_only=True (+ fastai safe globals)': lambda: ck.read_checkpoint(f),
        'check_compatible (model and vocab signatures)': lambda: ck.check_compatible(repro, extra, f),
        'ReproCB.trace.load_state_dict':
            lambda: repro.repro_cb.trace.load_state_dict(extra['callbacks']['repro_cb']['trace']),
    }
    res = interleave({k: (lambda v=v: (v(), None)[1]) for k, v in parts.items()}, max(cfg.reps, 15), 2)
    say(f'\n## checkpoint: parts of save and load, median of {max(cfg.reps, 15)} interleaved rounds '
        f'(classifier, {cfg.profile} profile; files {os.path.getsize(fp)/1024:.0f} KB fastai, '
        f'{os.path.getsize(f)/1024:.0f} KB fastrepro)')
    for k, v in res.items(): say(f'  {median(v)*1e3:8.2f} ms  {k}')
    sizes = {k: len(_ser(v)) for k, v in extra['callbacks']['repro_cb'].items()}
    say('  serialized size of ReproCB state parts (KB, each with torch.save framing): ' +
        ', '.join(f'{k} {v/1024:.1f}' for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])))
    rng = extra['callbacks']['repro_cb']['rng']
    say('  rng parts (KB): ' + ', '.join(f'{k} {len(_ser(v))/1024:.1f}' for k, v in rng.items()))
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): ck.checkpoint_state(repro)
    pr.disable(); st = pstats.Stats(pr)
    say('  checkpoint_state, largest cumulative entries (cProfile, per call):')
    rows = sorted(((v[3], f'{Path(k[0]).name}:{k[1]}({k[2]})') for k, v in st.stats.items()), reverse=True)
    for t, name in rows[1:12]: say(f'    {t/20*1e3:6.2f} ms  {name}')
    shutil.rmtree(path, ignore_errors=True)


def _ser(o) -> bytes:
    import torch
    b = io.BytesIO(); torch.save(o, b); return b.getvalue()


def section_spy(cfg):
    spy = shutil.which('py-spy')
    if spy is None: say('\n## spy: py-spy is not installed (pip install py-spy); skipped'); return
    raw = Path(tempfile.mkdtemp(prefix='bench_spy'))/'raw.txt'
    code = ("from bench._common import *; setup(1)\n"  # run in ROOT: `python -c` puts it first on the module path
            f"from fastrepro.callback.repro import ReproCB; from fastrepro.demo.ulmfit import lm_learner, get_profile\n"
            f"p = get_profile({cfg.profile!r}); lm, _ = text_data(p)\n"
            f"l = lm_learner(lm, p, cbs=ReproCB(seed=1, allow_dirty=True)); quiet_fit(l); quiet_fit(l, 2)\n")
    subprocess.run([spy, 'record', '-r', '200', '-f', 'raw', '-o', str(raw), '--', sys.executable, '-c', code],
                   cwd=ROOT, capture_output=True, text=True)
    tot, c = 0, Counter()
    for line in raw.read_text().splitlines():
        stack, n = line.rsplit(' ', 1)
        if '_do_fit' not in stack: continue
        tot += int(n)
        fx = [f for f in stack.split(';') if 'fastrepro/' in f and 'core.py' not in f]
        c[fx[-1].split(' (')[0] if fx else '(outside fastrepro)'] += int(n)
    say(f'\n## spy: LM fits with ReproCB, {tot} samples; innermost fastrepro frame (py-spy, 200 Hz)')
    for k, v in c.most_common(10): say(f'  {v/tot*100:5.1f}%  {k}')


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--only', default='', help=f'comma-separated subset of {",".join(SECTIONS)}')
    p.add_argument('--profile', default='fast')
    p.add_argument('--out', default=str(ROOT/'bench'/'out'/'profiles.txt'))
    a = p.parse_args()
    cfg = Config.make(profile=a.profile); setup(cfg.threads)
    say(f'# fastrepro profiles, {machine_info(cfg.threads)["date"]}, load average {os.getloadavg()[0]:.2f}, '
        f'profile {a.profile}')
    for s in [o for o in a.only.split(',') if o] or SECTIONS: globals()[f'section_{s}'](cfg)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text('\n'.join(OUT) + '\n')


if __name__ == '__main__':
    main()
