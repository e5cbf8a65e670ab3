"""One process of the trackers' tests (tests/test_trackers.py): a small tabular classifier with dropout, fastrepro's
`ReproCB` and `CheckpointCB(autoresume=True)`, and the trackers the command line names, trained for a few epochs in the
current directory; `TRACKER_KILL=N` ends the process by SIGKILL right after training iteration N (after the periodic
checkpoint of that iteration, if one fell due), as a machine that dies. Run again with the same command line (the run's
identity), it continues."""
import argparse, os, signal, sys, time, urllib.request
import numpy as np, pandas as pd, torch
from fastai.tabular.all import *
from fastrepro.callback.repro import ReproCB
from fastrepro.callback.preempt import CheckpointCB
from fastrepro.callback.fp16 import ReproMixedPrecision  # `Learner.to_repro_fp16`
from fastrepro.state.rng import seed_everything
from fastrepro.checkpoint.manifest import state_digest

N_EPOCH, EVERY, SEED, LR = 3, 3, 5, 1e-2
N_ROWS, N_VALID, BS = 80, 16, 16  # 4 training batches an epoch
SERVER_START_S = 180  # `mlflow server` creates its SQLite schema when it starts: about 30 s on a loaded 2-core machine


def wait_for_server(url:str):
    "Wait until the MLflow server at `url` answers (the tests start it and this job together)"
    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            with urllib.request.urlopen(f'{url}/health', timeout=5): return
        except OSError:
            if time.monotonic() > deadline: raise RuntimeError(f"No MLflow server answers at {url} after "
                                                               f"{SERVER_START_S} s: see its log.")
            time.sleep(0.5)


def learner(cbs) -> Learner:
    "A small tabular problem and a learner with dropout (the run draws random numbers at every batch)"
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'a': rng.normal(size=N_ROWS), 'kind': rng.choice(['x', 'y'], N_ROWS)})
    df['y'] = np.where(df.a + (df.kind == 'x') > 0.5, 'p', 'n')
    dls = TabularDataLoaders.from_df(df, path='.', procs=[Categorify, Normalize], cat_names=['kind'], cont_names=['a'],
                                     y_names='y', valid_idx=list(range(N_ROWS - N_VALID, N_ROWS)), bs=BS)
    # WandbCallback logs every init argument; fastai's `synth_learner` has some it cannot (tuples of tensors)
    return tabular_learner(dls, layers=[8], metrics=accuracy, cbs=cbs, config=dict(ps=[0.2], embed_p=0.1))


class KillAt(Callback):
    "SIGKILL this process after training iteration `it`"
    order = CheckpointCB.order + 1  # after CheckpointCB wrote that iteration's periodic checkpoint
    def __init__(self, it): self.it = it
    def after_batch(self):
        if self.training and self.learn.train_iter == self.it: os.kill(os.getpid(), signal.SIGKILL)


def main(args):
    torch.set_num_threads(1)
    cbs = [ReproCB(seed=SEED, allow_dirty=True, ledger=args.ledger), CheckpointCB(every_iters=EVERY, autoresume=True)]
    if args.csv: cbs.append(CSVLogger())
    if args.tensorboard:
        from fastai.callback.tensorboard import TensorBoardCallback
        cbs.append(TensorBoardCallback(trace_model=False, log_preds=False))
    if args.wandb:
        import wandb
        import fastai.callback.wandb as fastai_wandb
        from fastai.callback.wandb import WandbCallback
        # fastai 2.8's WandbCallback logs the init arguments of everything it finds (`gather_args`) with fastcore's
        # `init_args`, which since fastcore 2.2 raises on values without a `__dict__` (None, tuples): no fit with it
        # starts, fastrepro or not. Those values are left out of the config here
        fastai_wandb.init_args = lambda o, f=fastai_wandb.init_args: f(o) if hasattr(o, '__dict__') else {}
        wandb.init(project='fastrepro-test', dir='.')
        cbs.append(WandbCallback(log_preds=False))
    if args.mlflow:
        import mlflow
        wait_for_server(mlflow.get_tracking_uri())
        mlflow.set_experiment('fastrepro-test')
        mlflow.start_run(run_name=Path.cwd().name)
    if os.environ.get('TRACKER_KILL'): cbs.append(KillAt(int(os.environ['TRACKER_KILL'])))
    seed_everything(0)
    learn = learner(cbs)
    if args.fp16: learn.to_repro_fp16()
    with learn.no_bar(): learn.fit_one_cycle(N_EPOCH, LR)
    Path('final.txt').write_text(state_digest(learn.model))
    if args.wandb: wandb.finish()
    if args.mlflow: mlflow.end_run()


if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--ledger', default=None)
    for t in ('csv', 'tensorboard', 'wandb', 'mlflow', 'fp16'): p.add_argument(f'--{t}', action='store_true')
    main(p.parse_args())
