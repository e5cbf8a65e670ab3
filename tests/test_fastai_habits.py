"""fastai's own habits keep working with fastrepro attached, and change no bits: lr_find before fit, SaveModelCallback in
its default mode, fine_tune, multi-stage fits (ULMFiT's gradual unfreezing) resumed at a stage boundary, export/load_learner."""
import warnings
import pytest, torch
from fastai.text.all import SaveModelCallback, load_learner
from fastrepro.all import ReproCB, seed_everything, imdb_sample_df, lm_dls, clas_dls, clas_learner

@pytest.fixture(scope='module')
def data(fastai_home):
    df = imdb_sample_df('test')
    return df, lm_dls(df).vocab

def clas(data, tmp_path, fp16=False, **kwargs):
    df, vocab = data
    seed_everything(0)
    learn = clas_learner(clas_dls(df, vocab=vocab), path=tmp_path, cbs=ReproCB(seed=7, allow_dirty=True, **kwargs))
    return learn.to_repro_fp16() if fp16 else learn

def same_bits(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)

def quiet(learn): return learn.no_bar()

def test_lr_find_first_changes_nothing(data, tmp_path):
    a = clas(data, tmp_path)
    with quiet(a): a.fit_one_cycle(2, 1e-2)
    b = clas(data, tmp_path)
    b.lr_find(num_it=10, show_plot=False)
    with quiet(b): b.fit_one_cycle(2, 1e-2)
    assert same_bits(a, b)
    assert a.repro_trace.loss.tolist() == b.repro_trace.loss.tolist()

def test_save_model_callback_default_mode(data, tmp_path):
    "SaveModelCallback reloads the best model after fit: no spurious resume warning, the next stage stays reproducible"
    def run():
        learn = clas(data, tmp_path)
        with quiet(learn), warnings.catch_warnings():
            warnings.simplefilter('error', UserWarning)
            learn.fit_one_cycle(2, 1e-2, cbs=SaveModelCallback())
            learn.fit_one_cycle(1, 1e-3)
        return learn
    a, b = run(), run()
    assert same_bits(a, b)
    assert a.repro_trace.fit.tolist() == [0]*a.repro_trace.fit.eq(0).sum() + [1]*a.repro_trace.fit.eq(1).sum()

def test_fine_tune_is_reproducible(data, tmp_path):
    a, b = clas(data, tmp_path), clas(data, tmp_path)
    for l in (a, b):
        with quiet(l): l.fine_tune(1, 1e-2)
    assert same_bits(a, b)
    assert a.repro_trace.fit.nunique() == 2     # fine_tune is two fits: two streams

def test_gradual_unfreezing_resumed_at_a_stage_boundary(data, tmp_path):
    "ULMFiT's classifier schedule, uninterrupted vs saved after stage 1 and continued by a freshly built learner"
    def stage(learn, i):
        if i == 1: learn.freeze_to(-2)
        if i == 2: learn.unfreeze()
        with quiet(learn): learn.fit_one_cycle(1, 1e-2 / (2.6**4)**i)
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
    with quiet(learn): learn.fit(1, 1e-2)
    learn.export('export.pkl')
    back = load_learner(tmp_path/'export.pkl')
    assert isinstance(back.repro_cb, ReproCB) and back.repro_cb.seed == 7
    with torch.no_grad():
        x = learn.dls.valid.one_batch()[0].cpu()
        learn.model.eval(); back.model.eval()
        learn.model.reset(); back.model.reset()
        assert torch.equal(learn.model.float()(x)[0], back.model.float()(x)[0])
