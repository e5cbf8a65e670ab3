"""Processes of the DataLoader-resume tests: small learners on fastai's DataLoader types, trained with `ReproCB` and
`CheckpointCB(every_iters=3, autoresume=True)`.

    LOADER_STAGE=STAGE python tests/loader_jobs.py DIR CASE [CASE ...]

Each CASE is KIND-SHARE-WHERE, run in DIR/CASE, one after another in this process (as a user's script fits several
learners). KIND: a key of `LEARNERS`. SHARE: 0; or 1, to serve rank 1's share of each training pass through fastai's
`DistributedDL` (world size 2, wrapped at `before_train` as fastai's `DistributedTrainer` does); or `ddp`, under
`torchrun` (`learn.distrib_ctx()`, gloo on CPUs; one case per launch): each rank records its run as NAME-rank{r}.pt.
WHERE: `middle` (the run is stopped after the middle batch of epoch `STOP_EPOCH`) or `last` (after its last batch,
before its validation). STAGE (a variable: a rerun is the same command line, as the run's identity requires): `stop`
trains the uninterrupted run (ref) and records it, then the same run in run/, sent SIGTERM there (CheckpointCB writes
its checkpoint and ends the fit with `SystemExit(143)`; stopped.pt: where, and the status); `resume` runs the case again
in run/, which continues the stopped fit. Each run's record: NAME.pt (weights, optimizer state, per-batch losses,
metrics, iteration count)."""
import os, sys, signal, warnings
from contextlib import nullcontext
import numpy as np, pandas as pd, torch
from PIL import Image
from fastai.tabular.all import *
from fastai.collab import *
from fastai.vision.all import *
from fastai.callback.data import WeightedDL, PartialDL
from fastai.distributed import DistributedDL, DistributedTrainer
from fastrepro.all import ReproCB, CheckpointCB, seed_everything, state_digest, checkpoint_info
from fastrepro.demo.jobs import KillAt
from fastrepro.record.divergence import RunRecord

N_EPOCH, LR, EVERY, STOP_EPOCH, SEED = 3, 1e-2, 3, 2, 1
N_ROWS, BS = 360, 16
SIGTERM_STATUS = 128 + signal.SIGTERM


def frame() -> pd.DataFrame:
    "A small tabular classification problem"
    rng = np.random.default_rng(0)
    df = pd.DataFrame({'a': rng.normal(size=N_ROWS), 'b': rng.normal(size=N_ROWS),
                       'kind': rng.choice(['x', 'y', 'z'], N_ROWS)})
    df['y'] = np.where(df.a + df.b + (df.kind == 'x') > 0.5, 'p', 'n')
    return df


def tabular_pandas() -> TabularPandas:
    return TabularPandas(frame(), [Categorify, Normalize], ['kind'], ['a', 'b'], y_names='y',
                         splits=(list(range(300)), list(range(300, N_ROWS))))


def tab_learner(dls, path):
    return tabular_learner(dls, layers=[20, 10], metrics=accuracy, path=path, config=dict(ps=[0.1, 0.1], embed_p=0.1))


def tabular(path):
    "fastai's default tabular loader (`TabWeightedDL`, unweighted)"
    dls = TabularDataLoaders.from_df(frame(), path=path, procs=[Categorify, Normalize], cat_names=['kind'],
                                     cont_names=['a', 'b'], y_names='y', valid_idx=list(range(300, N_ROWS)), bs=BS)
    assert type(dls.train) is TabWeightedDL
    return tab_learner(dls, path)


def tabular_weighted(path):
    "`TabWeightedDL` with weights: NumPy's weighted sampling with replacement"
    wgts = np.linspace(1., 3., 300)
    return tab_learner(tabular_pandas().dataloaders(bs=BS, path=path, dl_kwargs=[{'wgts': wgts}, {}]), path)


def tabular_plain(path):
    "`TabDataLoader`"
    return tab_learner(tabular_pandas().dataloaders(bs=BS, path=path, dl_type=TabDataLoader), path)


def collab(path):
    "fastai's collaborative filtering (its loaders are `TabWeightedDL`s)"
    rng = np.random.default_rng(1)
    ratings = pd.DataFrame({'user': rng.integers(0, 30, N_ROWS), 'item': rng.integers(0, 20, N_ROWS)})
    ratings['rating'] = ((ratings.user % 5 + ratings.item % 3) / 2 + rng.normal(0, .3, N_ROWS)).astype('float32')
    dls = CollabDataLoaders.from_df(ratings, bs=BS, seed=0, path=path)
    return collab_learner(dls, n_factors=8, y_range=(0, 4), path=path)


def images(path) -> Path:
    "Small two-class images: bright or dark squares with noise"
    rng, root = np.random.default_rng(2), path/'images'
    for cls, level in (('bright', 170), ('dark', 80)):
        (root/cls).mkdir(parents=True, exist_ok=True)
        for i in range(100):
            px = np.clip(rng.normal(level, 40, (20, 20, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(px).save(root/cls/f'{i}.png')
    return root


def vision(path):
    "fastai's vision loaders (`TfmdDL`): random item crops and random batch augmentation"
    dls = ImageDataLoaders.from_folder(images(path), valid_pct=0.2, seed=0, bs=BS,
                                       item_tfms=RandomResizedCrop(16, min_scale=0.7),
                                       batch_tfms=aug_transforms(size=16, max_rotate=20, min_scale=0.8))
    model = nn.Sequential(ConvLayer(3, 8, stride=2), ConvLayer(8, 16, stride=2), nn.AdaptiveAvgPool2d(1), Flatten(),
                          nn.Dropout(0.2), nn.Linear(16, 2))
    return Learner(dls, model, metrics=accuracy, path=path)


class Feature(Transform):
    "Item `i` of a fixed random regression problem: its input"
    def __init__(self): self.x = torch.randn(N_ROWS, 4, generator=torch.Generator().manual_seed(3))
    def encodes(self, i:int): return self.x[i]

class Target(Feature):
    "Item `i`'s target"
    def encodes(self, i:int): return self.x[i].sum(0, keepdim=True)

class Jitter(RandTransform):
    "Random noise on an item's input (a random item transform: it draws from torch's generator)"
    split_idx = 0
    def encodes(self, x:Tensor): return x + torch.randn_like(x)*0.05


def datasets() -> Datasets:
    return Datasets(list(range(N_ROWS)), [[Feature(), Jitter()], [Target()]],
                    splits=(list(range(300)), list(range(300, N_ROWS))))


def reg_learner(dls, path):
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
    return Learner(dls, model, loss_func=MSELossFlat(), metrics=rmse, path=path)


def tfmd(path):
    "A plain `TfmdDL` from `Datasets.dataloaders`"
    return reg_learner(datasets().dataloaders(bs=BS, path=path), path)


def weighted(path):
    "`WeightedDL` (`Datasets.weighted_dataloaders`)"
    return reg_learner(datasets().weighted_dataloaders(np.linspace(1., 2., 300), bs=BS, path=path), path)


def partial(path):
    "`PartialDL` (`Datasets.partial_dataloaders`): a random 200 of the 300 items each epoch"
    return reg_learner(datasets().partial_dataloaders(partial_n=200, bs=BS, path=path), path)


class OwnOrderDL(TfmdDL):
    "A user's loader with an order of its own, drawn from NumPy's global generator, and a `before_iter` that draws"
    def before_iter(self):
        super().before_iter()
        self.flip = bool(np.random.rand() < 0.5)
    def get_idxs(self):
        idxs = list(np.argsort(np.random.rand(self.n))) if self.shuffle else list(range(self.n))
        return idxs[::-1] if self.shuffle and self.flip else idxs


def own_order(path):
    "A user's `TfmdDL` subclass with its own `get_idxs` and `before_iter`, both drawing from the global generators"
    return reg_learner(datasets().dataloaders(bs=BS, path=path, dl_type=OwnOrderDL), path)


LEARNERS = dict(tabular=tabular, tabular_weighted=tabular_weighted, tabular_plain=tabular_plain, collab=collab,
                vision=vision, tfmd=tfmd, weighted=weighted, partial=partial, own_order=own_order)


class ShareOf(Callback):
    "Serve this rank's share of each training pass through fastai's `DistributedDL`, as `DistributedTrainer` does"
    order = 11  # `DistributedTrainer`'s
    def __init__(self, rank:int, world_size:int): self.rank, self.world_size = rank, world_size
    def before_train(self): self.learn.dl = DistributedDL(self.learn.dl, self.rank, self.world_size)


def stop_batch(learn, share, where:str) -> int:
    "The batch of epoch `STOP_EPOCH` after which the run is stopped"
    n = (len(DistributedDL(learn.dls.train, 1, 2)) if share == 1 else len(learn.dls.train) if share == 0
         else len(DistributedDL(learn.dls.train, rank_distrib(), num_distrib())))
    return n if where == 'last' else n//2


def learner(kind:str, share, path:Path, run:str, where:str='middle') -> Learner:
    "The learner of `kind` for `run`: 'ref' (uninterrupted), 'stop' (sent SIGTERM inside an epoch) or 'resume'"
    torch.set_num_threads(1)
    seed_everything(0)
    learn = LEARNERS[kind](path)
    cbs = [ReproCB(seed=SEED, allow_dirty=True)] + ([ShareOf(1, 2)] if share == 1 else [])
    if run != 'ref': cbs.append(CheckpointCB(every_iters=EVERY, autoresume=True))
    if run == 'stop':
        n = stop_batch(learn, share, 'last')
        cbs.append(KillAt(STOP_EPOCH*n + stop_batch(learn, share, where), signal.SIGTERM))
    learn.add_cbs(cbs)
    return learn


def opt_digest(learn) -> str:
    "sha256 over every tensor of the optimizer's state, and its hyper-parameters' values (exact, as floats)"
    sd = learn.opt.state_dict()
    tensors = {f'{i}.{k}': v for i, st in enumerate(sd['state']) for k, v in st.items() if isinstance(v, Tensor)}
    return state_digest(tensors) + repr([{k: float(v).hex() for k, v in h.items()} for h in sd['hypers']])


def train(learn:Learner, name:str, path:Path):
    ddp = learn.distrib_ctx(sync_bn=False) if num_distrib() > 1 else nullcontext()
    with ddp, learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(N_EPOCH, LR)
    if num_distrib() > 1: name += f'-rank{rank_distrib()}'
    rec = RunRecord.of(learn)
    torch.save({'digest': rec.digest, 'opt': opt_digest(learn),
                'loss': torch.tensor(rec.trace.loss.to_numpy()), 'iter': torch.tensor(rec.trace.iter.to_numpy()),
                'values': rec.values, 'train_iter': learn.train_iter, 'n_batches': len(learn.dls.train)},
               path/f'{name}.pt')


def case_name(kind:str, share, where:str) -> str: return f'{kind}-{share}-{where}'


def stop(kind:str, share, where:str, out:Path):
    "The uninterrupted run, then the run sent SIGTERM inside epoch `STOP_EPOCH`: where it stopped, and how"
    train(learner(kind, share, out/'ref', 'ref'), 'ref', out)
    learn = learner(kind, share, out/'run', 'stop', where)
    n = stop_batch(learn, share, 'last')
    try: train(learn, 'unstopped', out)
    except SystemExit as e:  # CheckpointCB's exit at the signal
        info = checkpoint_info(out/'run'/'models'/'checkpoint.pth')
        if rank_distrib() == 0: torch.save({k: info[k] for k in ('epoch', 'batch', 'iteration')} |
                                           {'n_batches': n, 'status': e.code}, out/'stopped.pt')
        if share == 'ddp': sys.exit(e.code)  # torchrun's ranks end as a killed job's do


if __name__ == '__main__':
    # the stage comes from the environment: a rerun of a stopped run is the same command line (the run's identity)
    stage, out, cases = os.environ['LOADER_STAGE'], Path(sys.argv[1]), sys.argv[2:]
    warnings.simplefilter('ignore')
    for case in cases:
        kind, share, where = case.split('-')
        share = share if share == 'ddp' else int(share)
        (out/case).mkdir(parents=True, exist_ok=True)
        if stage == 'stop': stop(kind, share, where, out/case)
        elif stage == 'resume': train(learner(kind, share, out/case/'run', 'resume'), 'resumed', out/case)
        else: raise ValueError(f"Unknown stage {stage!r}: 'stop' or 'resume'.")
        for f in (sys.stdout, sys.stderr): print(f"{case}: {stage} done", file=f, flush=True)  # ends its output
