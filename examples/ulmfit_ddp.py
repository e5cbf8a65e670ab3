"""ULMFiT on several processes, exactly reproducibly: the small AWD-LSTM language model, then its classifier, trained
data-parallel under fastai's `distrib_ctx`, with `ReproCB` and `CheckpointCB` as the only additions.

    ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 examples/ulmfit_ddp.py         # two CPU processes (gloo)
    torchrun --nproc_per_node 2 examples/ulmfit_ddp.py                                # two GPUs (NCCL)
    accelerate launch --multi_gpu --num_processes 2 examples/ulmfit_ddp.py            # the same, with Accelerate

A second launch prints the same digests. Stop a launch (Ctrl-C, or the scheduler's SIGTERM) and start it again with the
same command: it skips the fits it completed, continues the interrupted one from its last checkpoint (inside an epoch
too) and ends with the same digests as an uninterrupted launch. `--fresh` starts over. Every process trains on its
share of each batch; only rank 0 writes checkpoints and prints."""
import argparse, shutil
from fastai.text.all import *
from fastai.distributed import *
from fastrepro.all import ReproCB, CheckpointCB, state_digest
from fastrepro.demo.ulmfit import imdb_sample_df, lm_dls, clas_dls, lm_learner, clas_learner, get_profile

def main(out='runs/ulmfit_ddp', seed=42, profile='test', every_iters=5, allow_dirty=False, fresh=False):
    out, p = Path(out), get_profile(profile)
    if fresh and rank_distrib() == 0: shutil.rmtree(out, ignore_errors=True)
    set_seed(seed)  # the weights' initialisation: the same on every rank, as DDP requires
    df = imdb_sample_df(p)
    # what fastrepro adds: ReproCB (streams, switches, provenance, resumable state) and CheckpointCB (preemption)
    repro = lambda name: [ReproCB(seed=seed, allow_dirty=allow_dirty),
                          CheckpointCB(name, every_iters=every_iters, autoresume=True)]
    lm = lm_learner(lm_dls(df, p), p, path=out, cbs=repro('lm'))
    with lm.distrib_ctx(sync_bn=False), lm.no_bar():  # sync_bn=False: SyncBatchNorm needs GPUs (AWD-LSTM has none)
        lm.fit_one_cycle(p.lm_epochs, p.lm_lr)
        lm.save_encoder('enc')  # rank 0 writes it
    clas = clas_learner(clas_dls(df, lm.dls.vocab, p), p, path=out, cbs=repro('clas'))
    with clas.distrib_ctx(sync_bn=False), clas.no_bar():
        distrib_barrier()  # fastai's `save_encoder` does not wait for rank 0's write
        clas.load_encoder('enc')
        clas.fit_one_cycle(p.clas_epochs, p.clas_lr)
    if rank_distrib() == 0:
        print(f"language model {state_digest(lm.model)[:12]}, classifier {state_digest(clas.model)[:12]}, "
              f"{num_distrib() or 1} process(es)")
    distrib_barrier(); teardown_distrib()  # every rank done before any leaves (a gloo peer can abort when one exits)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--out', default='runs/ulmfit_ddp', help="the run's folder: checkpoints, encoder")
    ap.add_argument('--seed', type=int, default=42)
    ap.add_argument('--profile', default='test', help="fastrepro.demo.ulmfit's size: test (seconds) or fast")
    ap.add_argument('--every-iters', type=int, default=5, help='a checkpoint every N training iterations')
    ap.add_argument('--allow-dirty', action='store_true', help='run from a working tree with uncommitted changes')
    ap.add_argument('--fresh', action='store_true', help="delete the run's folder first: start over")
    a = ap.parse_args()
    main(a.out, a.seed, a.profile, a.every_iters, a.allow_dirty, a.fresh)
