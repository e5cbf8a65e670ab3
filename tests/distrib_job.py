"""One launch of the distributed tests: a small regression with dropout, trained by several processes under fastai's
`distrib_ctx` with `ReproCB` (and `CheckpointCB`), started by `torchrun` on CPUs (gloo).

    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 tests/distrib_job.py MODE OUT [ARG]

MODE: reference | epoch (stop after epoch 1 with a checkpoint) | preempt (SIGTERM to rank 0 only, after iteration ARG) |
kill (SIGKILL to rank 1 after iteration ARG, right after a periodic checkpoint) | resume (ARG: the checkpoint) |
mismatch (rank 1 reports another torch version). Each rank writes OUT/MODE-rank{r}.pt: its model's digest, its per-batch
losses, its Recorder's values and its dropout masks."""
import os, sys, signal
import torch
from fastai.basics import *
from fastai.test_utils import synth_dbunch, RegModel
from fastrepro.all import ReproCB, CheckpointCB, seed_everything, checkpoint_info, state_digest
# fastai.distributed after fastrepro: fastrepro patches its `DistributedDL` when it is imported (without the patch,
# fastai broadcasts rank 0's order as a CUDA tensor, which gloo cannot); examples/ulmfit_ddp.py imports it first
assert 'accelerate' not in sys.modules, 'importing fastrepro imported Accelerate'
from fastai.distributed import *  # noqa: E402

N_EPOCH, LR, EVERY, SEED = 3, 1e-2, 2, 7

class DropModel(RegModel):
    "fastai's test regression with dropout on its input"
    def __init__(self): super().__init__(); self.drop = nn.Dropout(0.5)
    def forward(self, x): return super().forward(self.drop(x))

class Masks(Callback):
    "The dropout mask of every training batch"
    def before_fit(self):
        self.masks = []
        self.hook = get_model(self.model).drop.register_forward_hook(
            lambda m, i, o: self.masks.append((o == 0).flatten().clone()) if m.training else None)
    def after_fit(self): self.hook.remove()

class Stop(Callback):
    "After epoch 1: save `epoch1` (inside the fit) and cancel"
    order = 70
    def after_epoch(self):
        if self.epoch == 1: self.learn.save('epoch1', with_opt=True); raise CancelFitException()

class Hit(Callback):
    "Send `signum` to this process after training iteration `it`, on rank `rank` only"
    def __init__(self, it, signum, rank):
        store_attr(); self.order = CheckpointCB.order + (1 if signum == signal.SIGKILL else -1)
    def after_batch(self):
        if self.training and self.learn.train_iter == self.it and rank_distrib() == self.rank:
            os.kill(os.getpid(), self.signum)

def learner(out, seed=0):
    seed_everything(seed)
    torch.manual_seed(0)  # the data, the same on every rank
    dls = synth_dbunch(bs=16, n_train=8, n_valid=2)
    torch.manual_seed(seed)
    return Learner(dls, DropModel(), loss_func=MSELossFlat(), path=out, cbs=[ReproCB(seed=SEED, allow_dirty=True),
                                                                              CheckpointCB(every_iters=EVERY)])

def main(mode, out, arg=None):
    out, rank, masks = Path(out), rank_distrib(), Masks()
    if mode == 'mismatch' and rank == 1: torch.__version__ = '0.0.0'  # another library version on this node
    learn = learner(out, seed=99 if mode == 'resume' else 0)
    cbs = ([Stop()] if mode == 'epoch' else [Hit(int(arg), signal.SIGTERM, 0)] if mode == 'preempt' else
           [Hit(int(arg), signal.SIGKILL, 1)] if mode == 'kill' else [])
    start = 0
    if mode == 'resume':
        learn.dls.one_batch(); torch.rand(3)  # stray draws before the load: they change nothing
        learn.load(arg)
        start = checkpoint_info(out/'models'/f'{arg}.pth')['epoch']
    with learn.distrib_ctx(sync_bn=False), learn.no_bar(), learn.no_logging():
        learn.fit_one_cycle(N_EPOCH, LR, start_epoch=start, cbs=[masks] + cbs)
    torch.save({'digest': state_digest(learn.model), 'loss': learn.repro_trace.loss.tolist(),
                'values': [[float(v) for v in r] for r in learn.recorder.values], 'masks': masks.masks},
               out/f"{mode}{'-' + arg if mode == 'resume' else ''}-rank{rank}.pt")
    # every rank done before any leaves, then the process group torn down: a rank whose peer has already exited can
    # abort (SIGABRT) in gloo's background thread when the connection closes under it
    distrib_barrier(); teardown_distrib()

if __name__ == '__main__': main(*sys.argv[1:])
