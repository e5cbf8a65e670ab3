"""Importing fastrepro changes nothing in plain fastai: a run without our callbacks is bit-identical with and
without `import fastrepro.all` (which patches Learner.fit/save/load and DataLoader methods, gated on our callbacks)."""
import hashlib
import pytest
from conftest import run_py

pytestmark = pytest.mark.slow  # trains in fresh processes: the inner loop (-m "not slow") skips it

RUN = '''
import sys, hashlib, torch
if sys.argv[-1] == "with": import fastrepro.all
from fastai.text.all import *
df = pd.read_csv(untar_data(URLs.IMDB_SAMPLE)/"texts.csv").head(80)
df["text"] = df.text.str.slice(0, 300)
set_seed(0, reproducible=True)
dls = TextDataLoaders.from_df(df, text_col="text", is_lm=True, valid_col="is_valid", bs=8, seq_len=24)
learn = language_model_learner(dls, AWD_LSTM, config=dict(awd_lstm_lm_config, emb_sz=16, n_hid=32, n_layers=2), \
pretrained=False)
learn.fit_one_cycle(2, 1e-2)
learn.save("m"); learn.load("m")
dls.one_batch()
h = hashlib.sha256()
for k, v in learn.model.state_dict().items(): h.update(k.encode()); h.update(v.numpy().tobytes())
print("DIGEST", h.hexdigest(), [float(x) for x in learn.recorder.losses])
'''

def digest(out): return [l for l in out.splitlines() if l.startswith('DIGEST')][0]

def test_plain_fastai_is_bit_identical_with_and_without_fastrepro(fastai_home, tmp_path):
    script = tmp_path/'run.py'; script.write_text(RUN)
    code = f"import sys, runpy; sys.argv = ['run', '{{}}']; runpy.run_path({str(script)!r})"
    without, with_ = (digest(run_py(code.format(m), cwd=tmp_path)) for m in ('without', 'with'))
    assert without == with_
