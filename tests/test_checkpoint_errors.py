"""Bad checkpoints get a precise error, never a silent wrong resume: another vocabulary of the same size (which
would load and silently scramble the embeddings), another architecture, a truncated file."""
import pytest, torch
from fastrepro.all import ReproCB, seed_everything, CheckpointError
from fastrepro.demo.ulmfit import imdb_sample_df, lm_dls, clas_dls, clas_learner

@pytest.fixture(scope='module')
def saved(fastai_home, tmp_path_factory):
    path = tmp_path_factory.mktemp('ck')
    df = imdb_sample_df('test'); vocab = lm_dls(df).vocab
    seed_everything(0)
    learn = clas_learner(clas_dls(df, vocab=vocab), path=path, cbs=ReproCB(seed=1, allow_dirty=True))
    with learn.no_bar(): learn.fit(1, 1e-2)
    learn.save('ck')
    return path, df, vocab

def learner(saved, vocab, **kwargs):
    path, df, _ = saved
    return clas_learner(clas_dls(df, vocab=vocab), path=path, cbs=ReproCB(seed=1, allow_dirty=True), **kwargs)

def test_same_vocab_loads(saved):
    import torch
    path, _, vocab = saved
    learn = learner(saved, vocab).load('ck')
    back = torch.load(path/'models'/'ck.pth', weights_only=False)['model']
    assert all(torch.equal(v, back[k]) for k, v in learn.model.state_dict().items())
    assert learn.repro_cb.pending is not None and learn.repro_cb.pending['seed'] == 1

def test_other_vocabulary_of_the_same_size_is_refused(saved):
    vocab = list(saved[2]); vocab[10], vocab[11] = vocab[11], vocab[10]
    with pytest.raises(CheckpointError, match='another vocabulary'): learner(saved, vocab).load('ck')

def test_other_architecture_is_refused(saved):
    from fastai.text.all import awd_lstm_clas_config, AWD_LSTM, text_classifier_learner
    path, df, vocab = saved
    learn = text_classifier_learner(clas_dls(df, vocab=vocab), AWD_LSTM, pretrained=False, path=path,
                                    config=dict(awd_lstm_clas_config, emb_sz=32, n_hid=48, n_layers=2),
                                    cbs=ReproCB(seed=1))
    with pytest.raises(CheckpointError, match='another architecture'): learn.load('ck')

def test_truncated_file_is_refused(saved):
    path = saved[0]/'models'
    (path/'cut.pth').write_bytes((path/'ck.pth').read_bytes()[:5000])
    with pytest.raises(CheckpointError, match='truncated or corrupt'): learner(saved, saved[2]).load('cut')
