"What worker processes (multiprocessing, Dask) run in the tests: ledger writers, a seed of the tiny ULMFiT classifier"
import os, time, pickle, signal, hashlib, functools
from pathlib import Path

PROFILE = 'test'  # fastrepro.demo.ulmfit's smallest profile: 120 short reviews, a 2-layer AWD-LSTM of 64 units
EPOCHS = 1
KILL_AT_ITER = 3  # the training iteration at which the victim seed's process is killed


def write_runs(address, writer:int, n:int, start_at:float|None=None, barrier=None) -> tuple:
    "Add `n` records to the ledger at `address` as writer `writer`, all writers at once; (first, last write's end)"
    from fastrepro.experiments.ledger import Ledger
    ledger = Ledger(address)
    if barrier is not None: barrier.wait(timeout=600)  # stops a hang: the workers meet in seconds
    if start_at is not None: time.sleep(max(0., start_at - time.time()))
    t0 = time.time()
    for i in range(n): ledger.add(dict(experiment='concurrency', variant=f'w{writer}', seed=i))
    return t0, time.time()


def square(seed): return {'square': seed**2}


def square_killed_once(marker:str, seed:int) -> dict:
    "`square`, but the process running seed 1 is killed (SIGKILL) the first time"
    if seed == 1 and not Path(marker).exists(): Path(marker).touch(); os.kill(os.getpid(), signal.SIGKILL)
    return square(seed)


@functools.cache
def _classifier_data() -> bytes:
    "The classifier's DataLoaders on the IMDB sample with the language model's vocabulary, pickled: built once per "
    "process (under seed 0, so the same in every process), and each seed trains on a fresh copy"
    from fastrepro.state.rng import seed_everything
    from fastrepro.demo.ulmfit import imdb_sample_df, lm_dls, clas_dls
    df = imdb_sample_df(PROFILE)
    seed_everything(0)
    vocab = lm_dls(df, PROFILE).vocab  # fastai tokenizes with a process pool: not in a daemonic process
    # num_workers=0: ReproCB's DataLoader carries a torch.Generator, which a DataLoader worker started with spawn (as in
    # Dask's workers) fails to unpickle (torch: "unable to resize file ..."); reported, to be fixed in
    # fastrepro.state.data
    return pickle.dumps(clas_dls(df, vocab, PROFILE, num_workers=0))


def weights_digest(model) -> str:
    "sha256 over every parameter and buffer of `model` (names and bytes, in `state_dict` order)"
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode()); h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train_classifier(seed:int, out:str, kill_seed:int|None=None) -> dict:
    "One seed of the tiny ULMFiT classifier: final metrics; the weights' digest in out/<seed>.sha256. The first time, "
    "the process training `kill_seed` is killed (SIGKILL) at iteration `KILL_AT_ITER`."
    from fastai.text.all import Callback
    from fastrepro.callback.repro import ReproCB
    from fastrepro.state.rng import seed_everything
    from fastrepro.demo.ulmfit import clas_learner
    marker = Path(out)/'killed'
    class KillAt(Callback):
        def after_batch(self):
            if self.training and self.iter == KILL_AT_ITER: marker.touch(); os.kill(os.getpid(), signal.SIGKILL)
    dls = pickle.loads(_classifier_data())
    seed_everything(seed)
    cbs = [ReproCB(seed=seed, allow_dirty=True)] + ([KillAt()] if seed == kill_seed and not marker.exists() else [])
    learn = clas_learner(dls, PROFILE, cbs=cbs)
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(EPOCHS, 1e-2)
    (Path(out)/f'{seed}.sha256').write_text(weights_digest(learn.model))
    return dict(zip(learn.recorder.metric_names[1:-1], learn.recorder.values[-1]))
