"""GPU check: fp16 training, resume, cuDNN RNN dropout and the deterministic switches, bit for bit, in one prepared run.

Made for one call on a machine with an NVIDIA GPU (`python -m bench.gpu_check`); each check prints a PASS/FAIL line:

  1. fp16 ULMFiT classifier (`to_repro_fp16()`, AWD-LSTM, not pretrained, IMDB sample), each run in its own process
     through the project's kill-and-resume harness `fastrepro.demo.jobs`: A straight, B straight again, C cancelled
     after epoch `STOP_EPOCH` (0-based) and resumed in a fresh process. Every parameter and buffer (sha256), per-batch
     loss, metric and loss-scale row must equal A's (`same_run`); it prints the overflows (skipped steps) and final
     scale.
  2. The same stopped inside an epoch: D is sent SIGTERM in the middle of epoch 1 (harness mode 'preempt',
     `CheckpointCB` writes its checkpoint and the process exits with 143), then resumed in a fresh process.
  3. cuDNN RNN dropout (CUDA only): `audit_model` refuses a plain `nn.LSTM(dropout=...)`, accepts it with
     `allow_cudnn_rnn_dropout=True` (a warning and findings), and after `fix_rnn_dropout` two runs are bit-identical.
  4. Deterministic switches (CUDA only): backward through `nn.AdaptiveAvgPool2d` (no deterministic CUDA kernel) raises
     under `set_deterministic(True)` and warns with `warn_only=True`; a fresh process without CUBLAS_WORKSPACE_CONFIG
     gets it from `seed_everything` before CUDA initialises, and cuBLAS then runs under deterministic algorithms.
  5. Cost: not measured here; it prints the `bench.gpu_bench` command that measures it.
  6. `VerifyCB` on the GPU: a tabular script committed in a git repository trains on the device with periodic
     checkpoints; with `device='wait'` its first segment is replayed on the GPU once the fit is over (one line says so
     at the start) and is bit-identical; with `device='cpu'` it is replayed at once on the CPU and a verdict arrives.
     (In the --cpu dry run both train on the CPU: both bit-identical.)

Tokenization: `fastrepro.demo.ulmfit` uses fastai's default word tokenizer, spaCy, which the device machine lacks; this
script makes fastai's `BaseTokenizer` (split on spaces) the word tokenizer here and in every job process (through a
`sitecustomize` on the job processes' path), on every machine, and says so. Another vocabulary, the same computation.

Exit status: 0 when every check passes, or when there is no CUDA device and no --cpu (it says so); 1 when one fails.

    python -m bench.gpu_check [--epochs 3] [--profile fast] [--seed 42] [--csv texts.csv] [--out DIR] [--cpu]
    python -m bench.gpu_check --cpu --profile test --epochs 3   # dry run on the CPU (checks 3 and 4 skipped)
"""
import argparse, os, signal, subprocess, sys, tempfile, time, warnings, json
from pathlib import Path

STOP_EPOCH = 1        # run C is cancelled after this epoch (0-based) and resumed at the next
EVERY_ITERS = 3       # `CheckpointCB`'s interval in the mid-epoch run
SIGTERM_STATUS = 128 + signal.SIGTERM
ROOT = Path(__file__).resolve().parents[1]  # the checkout: its fastrepro first on the probe processes' path
BENCH_CMD = 'python -m bench.gpu_bench --profile full --reps 5'
TOKENIZER = ("fastai BaseTokenizer (split on spaces), here and in every job process: fastrepro.demo.ulmfit tokenizes "
             "with fastai's default, spaCy, which the device machine does not have")

# Put on the job processes' path: fastai.text.core's `WordTokenizer` becomes `BaseTokenizer` when it is imported
SITECUSTOMIZE = '''\
"bench.gpu_check: fastai's word tokenizer is BaseTokenizer in this process (the device machine has no spaCy)"
import sys, importlib.abc, importlib.util

class _BaseTokenizerPatch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != 'fastai.text.core': return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            module.WordTokenizer = module.BaseTokenizer
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _BaseTokenizerPatch())
'''


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--epochs', type=int, default=3, help='epochs of the classifier fit (> STOP_EPOCH+1)')
    p.add_argument('--profile', default='fast', help="fastrepro.demo.ulmfit profile: 'test', 'fast' or 'full'")
    p.add_argument('--seed', type=int, default=42, help='run seed')
    p.add_argument('--csv', default=None,
                   help="a copy of fastai's imdb_sample/texts.csv, used when the sample is not installed")
    p.add_argument('--out', default=None, help='folder for the jobs, checkpoints and records (default: temporary)')
    p.add_argument('--cpu', action='store_true',
                   help="dry-run this script on the CPU (slow: CPUs have no fast float16; checks 3-4 skipped)")
    return p.parse_args()


def verdict(ok): return 'PASS' if ok else 'FAIL'


def use_base_tokenizer(folder:Path) -> str:
    "BaseTokenizer as fastai's word tokenizer in this process and, through `folder/sitecustomize.py`, in its children"
    import fastai.text.core as core
    core.WordTokenizer = core.BaseTokenizer
    folder.mkdir(parents=True, exist_ok=True)
    (folder/'sitecustomize.py').write_text(SITECUSTOMIZE)
    os.environ['PYTHONPATH'] = os.pathsep.join([str(folder)] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    code = 'from fastrepro.demo.jobs import *; import fastai.text.core as c; print(c.WordTokenizer.__name__)'
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    return (p.stdout.strip().splitlines() or ['(failed: ' + p.stderr[-300:] + ')'])[-1]


def scale_text(rec) -> str:
    h = rec.loss_scale
    if h is None: return 'no loss-scale history'
    return (f"{len(h)} steps, {int(h['skipped'].astype(bool).sum())} overflows, "
            f"final scale {float(h['scale_after'].iloc[-1]):g}, min {float(h['scale'].min()):g}")


def compare(ref, rec) -> tuple:
    "(same, one line): `same_run`'s verdict on `rec` against `ref` (weights, losses, metrics, loss scales), its scales"
    from fastrepro.record.divergence import same_run
    ok, why = same_run(ref, rec)
    return ok, f"{'same' if ok else 'DIFFER'}: {why}; {scale_text(rec)}"


def harness_checks(args, prof, df, out:Path, env:dict) -> list:
    "Checks 1 and 2: fp16 classifier jobs, each stage a fresh process"
    from fastrepro.demo.jobs import Job, job_process, job_error
    from fastrepro.record.divergence import RunRecord
    from fastrepro.checkpoint.file import checkpoint_info
    from fastrepro.demo.ulmfit import Stage, lm_dls
    t0 = time.time()

    def run(spec, mode, status=0, **kwargs):
        p = job_process(spec, mode, env=env, **kwargs)
        if p.returncode != status:
            raise RuntimeError(f"job {mode} {kwargs}: expected exit status {status}; {job_error(p)}")
        return p

    vocab = lm_dls(df, prof).vocab
    run(Job('lm', df, out, profile=prof, seed=args.seed, stages=[Stage(0, 1, prof.lm_lr)]).write(), 'reference')
    job = Job('clas', df, out, vocab, profile=prof, seed=args.seed, fp16=True,
              stages=[Stage(0, args.epochs, prof.clas_lr)], every_iters=EVERY_ITERS)
    spec = job.write()
    print(f"  encoder: a 1-epoch float32 language model (job 'reference'), {time.time() - t0:.0f} s")
    recs = {}
    for name in ('A', 'B'):
        run(spec, 'reference', record=f'{name}.pt')
        recs[f'{name} (straight)'] = RunRecord.load(out/f'{name}.pt')
    run(spec, 'cancel', stop_epoch=STOP_EPOCH)
    run(spec, 'resume', checkpoint='cancel', record='C.pt')
    recs[f'C (cancelled after epoch {STOP_EPOCH}, resumed in a new process)'] = RunRecord.load(out/'C.pt')
    ref = recs['A (straight)']
    print(f"  fp16 classifier: {args.epochs} epochs, {len(ref.trace)} steps, {time.time() - t0:.0f} s so far")
    n_iter = len(ref.trace)//args.epochs
    it = n_iter + n_iter//2  # the middle of epoch 1
    run(spec, 'preempt', SIGTERM_STATUS, kill=(it, signal.SIGTERM))
    info = checkpoint_info(out/'models'/'checkpoint.pth')
    run(spec, 'resume', checkpoint='checkpoint', record='D.pt')
    where = f"epoch {info['epoch']} batch {info['batch']}"
    mid = {f'D (SIGTERM at iteration {it}, {where}; resumed)': RunRecord.load(out/'D.pt')}
    results = []
    for title, runs in (('1. fp16 classifier, stopped after an epoch', recs),
                        ('2. fp16 classifier, stopped inside an epoch', mid)):
        lines, ok = [], True
        for name, rec in runs.items():
            same, line = (True, scale_text(rec)) if rec is ref else compare(ref, rec)
            ok &= same
            lines.append(f"    {name}: {line}")
        print(f"{verdict(ok)} {title}: " + ('every run equals A' if ok else 'runs DIFFER from A'))
        print('\n'.join(lines))
        results.append(ok)
    print(f"  ({time.time() - t0:.0f} s for checks 1-2, 7 job processes)")
    return results


def rnn_dropout_check(seed:int, device:str='cuda') -> bool:
    "Check 3: cuDNN's RNN dropout is found, can be accepted, and its fix makes two runs the same"
    import torch
    from torch import nn
    from fastrepro.state.rng import seed_everything
    from fastrepro.state.audit import audit_model, fix_rnn_dropout, NondeterminismError, NondeterminismWarning

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.head = nn.LSTM(16, 32, num_layers=3, dropout=0.5, batch_first=True), nn.Linear(32, 1)
        def forward(self, x): return self.head(self.rnn(x)[0])

    def train(fix:bool):
        seed_everything(seed)
        m = Net().to(device)
        if fix: fix_rnn_dropout(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator(device=device).manual_seed(seed)
        for _ in range(5):
            x = torch.randn(8, 20, 16, device=device, generator=g)
            loss = m(x).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
        return {k: v.detach().clone() for k, v in m.state_dict().items()}

    same = lambda a, b: a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    seed_everything(seed)
    m = Net().to(device)
    try: audit_model(m, device_type=None); refused = False
    except NondeterminismError: refused = True
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        found = audit_model(m, device_type=None, allow_cudnn_rnn_dropout=True)
    warned = any(issubclass(x.category, NondeterminismWarning) for x in w)
    fix_rnn_dropout(m)
    clean = audit_model(m, device_type=None) == []
    plain_same = same(train(False), train(False))
    fixed_same = same(train(True), train(True))
    ok = refused and bool(found) and warned and clean and fixed_same
    print(f"{verdict(ok)} 3. cuDNN RNN dropout: audit refuses plain nn.LSTM(num_layers=3, dropout=0.5) on CUDA: "
          f"{refused}; allow_cudnn_rnn_dropout=True warns ({warned}) and reports {found}; after fix_rnn_dropout the "
          f"audit finds nothing: {clean}; two runs after the fix bit-identical: {fixed_same} "
          f"(for comparison: two plain runs {'equal' if plain_same else 'differ'})")
    return ok


CUBLAS_PROBE = '''
import os, sys, json, warnings
import torch
from fastrepro.state.rng import seed_everything
res = dict(env_at_start=os.environ.get('CUBLAS_WORKSPACE_CONFIG'), cuda_initialised_before=torch.cuda.is_initialized())
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter('always')
    seed_everything(0)
res.update(cfg=os.environ.get('CUBLAS_WORKSPACE_CONFIG'), deterministic=torch.are_deterministic_algorithms_enabled(),
           warnings=[str(x.message)[:80] for x in w if 'CUBLAS' in str(x.message)])
a = torch.randn(64, 64, device=sys.argv[1])
try: (a @ a).sum().item(); res['matmul'] = 'ran'
except RuntimeError as e: res['matmul'] = 'raised: ' + str(e)[:100]
print(json.dumps(res))
'''
CUBLAS_CONTROL = '''
import sys, torch
torch.use_deterministic_algorithms(True)
a = torch.randn(64, 64, device=sys.argv[1])
try: (a @ a).sum().item(); print('ran')
except RuntimeError as e: print('raised: ' + ' '.join(str(e).split())[:90])
'''


def switches_check(seed:int, device:str='cuda') -> bool:
    "Check 4: an op without a deterministic CUDA kernel raises (or warns); CUBLAS_WORKSPACE_CONFIG before CUDA"
    import torch
    from torch import nn
    from fastrepro.state.kernels import set_deterministic

    def step():
        torch.manual_seed(seed)
        m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d((3, 3))).to(device)
        m(torch.randn(2, 3, 9, 9, device=device)).sum().backward()  # adaptive_avg_pool2d_backward_cuda

    set_deterministic(True)
    try: step(); raised = 'ran'
    except RuntimeError as e: raised = 'raised' if 'deterministic' in str(e) else f'raised another error: {e}'
    set_deterministic(True, warn_only=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        try: step(); warned = any('deterministic' in str(x.message) for x in w)
        except RuntimeError: warned = False
    set_deterministic(True)
    env = {k: v for k, v in os.environ.items() if k != 'CUBLAS_WORKSPACE_CONFIG'}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT)] + [p for p in [env.get('PYTHONPATH')] if p])
    probe = subprocess.run([sys.executable, '-c', CUBLAS_PROBE, device], env=env, capture_output=True, text=True,
                           timeout=300)
    try: r = json.loads(probe.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError): r = {'error': (probe.stderr or probe.stdout)[-500:]}
    control = subprocess.run([sys.executable, '-c', CUBLAS_CONTROL, device], env=env, capture_output=True, text=True,
                             timeout=300)
    cublas_ok = (r.get('env_at_start') is None and r.get('cuda_initialised_before') is False
                 and r.get('cfg') == ':4096:8' and r.get('deterministic') is True and not r.get('warnings')
                 and r.get('matmul') == 'ran')
    ok = raised == 'raised' and warned and cublas_ok
    print(f"{verdict(ok)} 4. deterministic switches: AdaptiveAvgPool2d backward on CUDA under set_deterministic(True) "
          f"{raised}; with warn_only=True it warned and ran: {warned}; fresh process without CUBLAS_WORKSPACE_CONFIG: "
          f"{r} (for comparison, the same matmul without fastrepro under deterministic algorithms: "
          f"{(control.stdout or control.stderr).strip()[-120:]})")
    return ok


VERIFY_SCRIPT = '''"A tabular run on the default device (the GPU when there is one), verified while it trains"
import os
import numpy as np, pandas as pd
from fastai.tabular.all import *
from fastrepro.all import ReproCB, CheckpointCB, VerifyCB, seed_everything
seed_everything(0)
rng = np.random.default_rng(0)
df = pd.DataFrame({'a': rng.normal(size=512), 'b': rng.normal(size=512), 'c': rng.choice(list('xyz'), 512)})
df['y'] = 2*df.a + df.b + (df.c == 'x')
dls = TabularDataLoaders.from_df(df, y_names='y', cat_names=['c'], cont_names=['a', 'b'], bs=64,
                                 procs=[Categorify, Normalize], valid_idx=list(range(448, 512)))
learn = tabular_learner(dls, layers=[64, 32], n_out=1, cbs=[ReproCB(seed=0), CheckpointCB(every_iters=4),
                        VerifyCB(wait=300, device=os.environ['VERIFY_DEVICE'])])
with learn.no_bar(), learn.no_logging(): learn.fit(3, 1e-2)
print('trained on', dls.device)
'''


def verify_check(out:Path, env:dict, cuda:bool) -> bool:
    "Check 6: `VerifyCB` on the device: a GPU run's segment replayed on its GPU after the fit, or at once on the CPU"
    repo = out/'verify'
    repo.mkdir(parents=True, exist_ok=True)
    (repo/'train.py').write_text(VERIFY_SCRIPT)
    (repo/'.gitignore').write_text('/models/\n__pycache__/\n')
    git = lambda *a: subprocess.run(['git', '-c', 'user.name=gpu_check', '-c', 'user.email=gpu@check.invalid', *a],
                                    cwd=repo, check=True, capture_output=True)
    git('init', '-q'); git('add', '-A'); git('commit', '-qm', 'the script')
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    penv = {**os.environ, **env, 'PYTHONPATH': path}
    ok = True
    for device in ('wait', 'cpu'):
        p = subprocess.run([sys.executable, 'train.py'], cwd=repo, env={**penv, 'VERIFY_DEVICE': device},
                           capture_output=True, text=True, timeout=900)
        lines = [l for l in p.stderr.splitlines() if l.startswith('VerifyCB: ')]
        segment = next((l for l in lines if l.startswith('VerifyCB: segment fit 0, iterations 0-4: ')), '')
        told = any(('once the fit is over, on cuda' if device == 'wait' else 'replayed on the CPU') in l for l in lines)
        this = p.returncode == 0 and bool(segment) and (told or not cuda) and (
            'bit-identical' in segment if device == 'wait' or not cuda else True)
        ok = ok and this
        print(f"{verdict(this)} 6. VerifyCB(device={device!r}) on {'CUDA' if cuda else 'the CPU'}: exit "
              f"{p.returncode}, {p.stdout.strip().splitlines()[-1:] or p.stderr[-800:]}; " + ' | '.join(lines))
    return ok


def main():
    args = parse_args()
    import torch
    cuda = torch.cuda.is_available() and not args.cpu
    if not (cuda or args.cpu):
        print("gpu_check: no CUDA device here, nothing was run. Run this script on a machine with an NVIDIA GPU "
              "(or dry-run it with --cpu).")
        return 0
    if args.epochs < STOP_EPOCH + 2:
        sys.exit(f"--epochs must be at least {STOP_EPOCH + 2} to resume after epoch {STOP_EPOCH}")
    t0 = time.time()
    from fastrepro.state.rng import seed_everything
    seed_everything(args.seed)  # before any CUDA work: it also sets CUBLAS_WORKSPACE_CONFIG
    import pandas as pd
    from fastrepro.demo.ulmfit import install_imdb_sample, imdb_sample_path, get_profile, subsample
    out = Path(args.out or tempfile.mkdtemp(prefix='gpu_check'))
    child_tok = use_base_tokenizer(out/'site')
    install_imdb_sample(args.csv) if args.csv else install_imdb_sample()
    prof = get_profile(args.profile)
    df = subsample(pd.read_csv(imdb_sample_path()/'texts.csv'), prof.n_texts, prof.max_chars)
    env = {} if cuda else {'CUDA_VISIBLE_DEVICES': ''}  # --cpu: the job processes train on the CPU too
    where = torch.cuda.get_device_name() if cuda else 'CPU (dry run)'
    cudnn = torch.backends.cudnn.version() if cuda else None
    print(f"gpu_check on {where}: torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}, "
          f"profile {prof.name}, {args.epochs} epochs, seed {args.seed}, {len(df)} texts; folder {out}")
    print(f"  tokenizer: {TOKENIZER} (a new process's fastai WordTokenizer: {child_tok})")
    results = harness_checks(args, prof, df, out, env)
    for title, check in (('3. cuDNN RNN dropout', rnn_dropout_check), ('4. deterministic switches', switches_check)):
        if cuda: results.append(check(args.seed))
        else: print(f"SKIP {title}: skipped: needs CUDA")
    results.append(verify_check(out, env, cuda))
    print(f"INFO 5. cost on CUDA (ReproCB epoch ratio, ReproMixedPrecision step time, per-fit setup): "
          f"run `{BENCH_CMD}` (writes bench/GPU_RESULTS.md)")
    ok = all(results)
    print(f"gpu_check: {'all checks passed' if ok else 'SOME CHECKS FAILED'} ({sum(results)}/{len(results)} run), "
          f"{time.time() - t0:.0f} s")
    return 0 if ok else 1


if __name__ == '__main__':
    warnings.filterwarnings('ignore', category=FutureWarning)
    sys.exit(main())
