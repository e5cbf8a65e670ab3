"""fastai's own habits keep working with fastrepro attached, \
and change no bits: lr_find before fit, SaveModelCallback in
its default mode, fine_tune, multi-stage fits (ULMFiT's gradual \
unfreezing) resumed at a stage boundary, export/load_learner."""
import warnings
import pytest, torch
from fastai.text.all import SaveModelCallback, load_learner
from fastrepro.all import ReproCB, seed_everything
from fastrepro.demo.ulmfit import imdb_sample_df, lm_dls, clas_dls, clas_learner
from conftest import same_bits


@pytest.fixture(scope='module')
def data(fastai_home):
    df = imdb_sample_df('test')
    return df, lm_dls(df).vocab

def clas(data, tmp_path, fp16=False, **kwargs):
    df, vocab = data
    seed_everything(0)
    learn = clas_learner(clas_dls(df, vocab=vocab), path=tmp_path, cbs=ReproCB(seed=7, allow_dirty=True, **kwargs))
    return learn.to_repro_fp16() if fp16 else learn


@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_lr_find_first_changes_nothing(data, tmp_path):
    a = clas(data, tmp_path)
    with a.no_bar(): a.fit_one_cycle(2, 1e-2)
    b = clas(data, tmp_path)
    b.lr_find(num_it=10, show_plot=False)
    with b.no_bar(): b.fit_one_cycle(2, 1e-2)
    assert same_bits(a, b)
    assert a.repro_trace.loss.tolist() == b.repro_trace.loss.tolist()

@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_save_model_callback_default_mode(data, tmp_path):
    "SaveModelCallback reloads the best model after fit: no spurious resume warning, the next stage stays reproducible"
    def run():
        learn = clas(data, tmp_path)
        with learn.no_bar(), warnings.catch_warnings():
            warnings.simplefilter('error', UserWarning)
            learn.fit_one_cycle(2, 1e-2, cbs=SaveModelCallback())
            learn.fit_one_cycle(1, 1e-3)
        return learn
    a, b = run(), run()
    assert same_bits(a, b)
    n = len(a.dls.train)
    assert a.repro_trace.fit.tolist() == [0]*2*n + [1]*n   # both fits recorded, the second with its own stream

@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_fine_tune_is_reproducible(data, tmp_path):
    a, b = clas(data, tmp_path), clas(data, tmp_path)
    for l in (a, b):
        with l.no_bar(): l.fine_tune(1, 1e-2)
    assert same_bits(a, b)
    assert a.repro_trace.fit.nunique() == 2     # fine_tune is two fits: two streams

def test_gradual_unfreezing_resumed_at_a_stage_boundary(data, tmp_path):
    "ULMFiT's classifier schedule, uninterrupted vs saved after stage 1 and continued by a freshly built learner"
    def stage(learn, i):
        if i == 1: learn.freeze_to(-2)
        if i == 2: learn.unfreeze()
        with learn.no_bar(): learn.fit_one_cycle(1, 1e-2 / (2.6**4)**i)
    ref = clas(data, tmp_path)
    for i in range(3): stage(ref, i)
    first = clas(data, tmp_path)
    stage(first, 0); first.save('stage0')
    seed_everything(99)
    cont = clas(data, tmp_path)
    cont.load('stage0')
    for i in (1, 2): stage(cont, i)
    assert same_bits(ref, cont)
    r, c = ref.repro_trace, cont.repro_trace
    assert r[r.fit > 0].loss.tolist() == c[c.fit > 0].loss.tolist()

def test_export_and_load_learner(data, tmp_path):
    learn = clas(data, tmp_path, fp16=True)
    with learn.no_bar(): learn.fit(1, 1e-2)
    learn.save('trained')  # its trace now in the trace file beside it: the exported learner reads it there
    learn.export('export.pkl')
    back = load_learner(tmp_path/'export.pkl')
    assert isinstance(back.repro_cb, ReproCB) and back.repro_cb.seed == 7
    assert back.repro_trace.loss.tolist() == learn.repro_trace.loss.tolist() and len(learn.repro_trace)
    with torch.no_grad():
        x = learn.dls.valid.one_batch()[0].cpu()
        learn.model.eval(); back.model.eval()
        learn.model.reset(); back.model.reset()
        assert torch.equal(learn.model.float()(x)[0], back.model.float()(x)[0])
