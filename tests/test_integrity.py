"""A damaged checkpoint is refused, never resumed (`fastrepro.checkpoint.integrity`). A fuzz test over one real
checkpoint: cut at offsets in every part of the file, one byte flipped at offsets over every kind of record and every
zip structure torch reads; each outcome is either refused with the one-line `CheckpointError` or loaded bit-identical to
the original (a byte no reader uses), never a load that differs. Bad inputs: empty, a record removed, not a zip, a
folder, another architecture, a newer format; fastai's `SaveModelCallback` reloading a damaged best model. In fresh
processes: autoresume after SIGTERM with the newest checkpoint damaged continues from the newest intact one (`keep=2`)
bit-identical to the uninterrupted run, or refuses (`keep=1`); `fastrepro reproduce` refuses a damaged file with
exit 2."""
import io, os, pickle, signal, subprocess, sys, zipfile, warnings
from pathlib import Path
import pytest, torch
from fastai.basics import Callback, nn
from fastai.test_utils import synth_learner, RegModel
from conftest import ROOT, fastrepro_cli, hang_limit
from fastrepro.checkpoint.integrity import zip_records, record_holds, LOCAL_HEADER
from fastrepro.checkpoint.file import CheckpointError, read_checkpoint, checkpoint_info, split_state, FORMAT_VERSION
from fastrepro.checkpoint import file as checkpoint_file
from fastrepro.callback.repro import ReproCB
from fastrepro.callback.preempt import CheckpointCB
from fastrepro.state.rng import seed_everything

N_BATCH, EVERY = 5, 3  # a checkpoint inside the first epoch (after batch 3 of 5): it holds the generators' states
N_CUTS, N_SPREAD = 10, 20  # cuts at named places of the file; flips spread evenly over it, on top of the named ones
END_RECORD = 22  # a zip's end-of-central-directory record: 22 bytes at the end of a file without a comment
SIGTERM_STATUS = 128 + signal.SIGTERM
RUN_S = hang_limit(30)


class DropModel(RegModel):
    "fastai's test model with dropout on its input: the run draws random numbers at every batch"
    def __init__(self): super().__init__(); self.drop = nn.Dropout(0.5)
    def forward(self, x): return super().forward(self.drop(x))


def learner(path, *cbs):
    seed_everything(0)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return synth_learner(n_trn=N_BATCH, path=path, model=DropModel(), cbs=[ReproCB(seed=3, allow_dirty=True), *cbs])


@pytest.fixture(scope='module')
def ck(tmp_path_factory):
    "A checkpoint written inside an epoch: model weights, optimizer state, generator states, trace, Recorder"
    path = tmp_path_factory.mktemp('integrity')
    learn = learner(path, CheckpointCB(every_iters=EVERY))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        learn.fit(1)
    return path/'models'/'checkpoint.pth'


def same(a, b) -> bool:
    "Are two loaded states the same, tensors bit for bit?"
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and (a.dtype, a.shape) == (b.dtype, b.shape) and torch.equal(a, b)
    if isinstance(a, dict): return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)  # NaN


def kinds(ck) -> dict:
    "Record kind -> the records of that kind: the pickle, torch's details, weights, optimizer, generators, trace..."
    with open(ck, 'rb') as f:
        records = zip_records(f)
        res = {}
        for r in records:
            holds = record_holds(f, records, r.name)
            kind = (holds if isinstance(holds, str) else 'torch details' if holds is None else
                    'generators' if 'generators' in holds else 'trace' if 'trace' in holds else
                    'fastrepro' if '__fastrepro__' in holds else holds[0])
            res.setdefault(kind, []).append(r)
    return res


def offsets(ck) -> dict:
    "Where to flip a byte: place -> offset; every kind of record and every zip field torch's reader uses, then spread"
    data, size = ck.read_bytes(), ck.stat().st_size
    with open(ck, 'rb') as f: records = zip_records(f)
    res = {}
    for kind, rs in kinds(ck).items():
        for r in rs[:2]: res[f'{kind} {r.name} first'], res[f'{kind} {r.name} last'] = r.start, r.start + r.size - 1
    r = records[4]
    head = data.rfind(b'PK\x03\x04', 0, r.start)  # its local header
    for field, at in [('magic', 0), ('flags', 6), ('method', 8), ('time', 10), ('crc', 14), ('size', 18),
                      ('name length', 26), ('extra length', 28), ('name', 30), ('padding', 30 + len(r.name) + 4)]:
        res[f'local header {field}'] = head + at
    res['data descriptor'] = r.start + r.size + 6
    cd = data.rfind(b'PK\x01\x02', 0, data.rfind(b'PK\x01\x02') + 1)  # the last record's directory entry
    first_cd = data.find(b'PK\x01\x02')
    for field, at in [('magic', 0), ('method', 10), ('crc', 16), ('size', 20), ('uncompressed size', 24),
                      ('name length', 28), ('offset', 42), ('name', 46)]:
        res[f'directory {field}'] = cd + at
    res['first directory entry offset'] = first_cd + 42
    z64 = data.rfind(b'PK\x06\x06')  # torch writes the zip64 end record (and its locator) that both readers use
    for field, at in [('entries on disk', 24), ('entries', 32), ('directory size', 40), ('directory offset', 48)]:
        res[f'zip64 end record {field}'] = z64 + at
    loc = data.rfind(b'PK\x06\x07')
    res['zip64 locator magic'], res['zip64 locator offset'], res['zip64 locator disks'] = loc, loc + 8, loc + 16
    end = size - END_RECORD
    for field, at in [('magic', 0), ('entries', 10), ('directory size', 12), ('directory offset', 16)]:
        res[f'end record {field}'] = end + at
    for i in range(N_SPREAD): res[f'spread {i}'] = i * (size - 1) // (N_SPREAD - 1)
    return res


def cuts(ck) -> dict:
    "Where to cut the file: place -> its new length"
    data, size = ck.read_bytes(), ck.stat().st_size
    k = kinds(ck)
    pkl, weights = k['pickle'][0], k['model'][0]
    first_cd = data.find(b'PK\x01\x02')
    res = {'inside the first local header': 10, 'inside the pickle': pkl.start + pkl.size // 2,
           'after the pickle': pkl.start + pkl.size, 'inside a weight record': weights.start + 2,
           'inside the last record': first_cd - 20, 'at the directory': first_cd,
           'inside the directory': (first_cd + size - END_RECORD) // 2, 'at the end record': size - END_RECORD,
           'inside the end record': size - 10, 'one byte short': size - 1}
    assert len(res) == N_CUTS
    return res


def outcome(f, ref, learn, ref_model) -> str:
    "'refused' (CheckpointError from every reader), 'identical' (each loads what the original holds), or why not"
    res = []
    for read in (lambda: read_checkpoint(f), lambda: checkpoint_info(f), lambda: learn.load(f.stem)):
        try: got = read()
        except CheckpointError as e:
            assert '\n' not in str(e) and str(f) in str(e), str(e)
            res.append('refused'); continue
        if isinstance(got, dict) and 'fastrepro' in got: res.append('identical'); continue  # checkpoint_info
        if not isinstance(got, dict):  # learn.load
            sd = got.model.state_dict()
            res.append('identical' if same(sd, ref_model) else 'different'); continue
        res.append('identical' if same(got, ref) else 'different')
    return res[0] if len(set(res)) == 1 else f'readers disagree: {res}'


@pytest.mark.parametrize('beside', [False, True], ids=['checked before the read', 'checked beside the read'])
def test_fuzz_flips_and_cuts(ck, capsys, monkeypatch, beside):
    ("Every cut and every flipped byte: refused with the line, or loaded bit-identical; never a load that differs; "
     "with the CRC-32 pass before torch reads the file (a small file) and beside it (a large one: torch reads damaged "
     "bytes, and nothing of them is handed on)")
    if beside: monkeypatch.setattr(checkpoint_file, 'BESIDE_BYTES', 0)
    ref, models = read_checkpoint(ck), ck.parent
    learn = learner(ck.parent.parent)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        learn.load(ck.stem)
    ref_model = {k: v.clone() for k, v in learn.model.state_dict().items()}
    data, counts, bad, same_at = ck.read_bytes(), {}, {}, []
    trials = [(f'cut {w}', data[:n]) for w, n in cuts(ck).items()]
    for w, at in offsets(ck).items():
        b = bytearray(data); b[at] ^= 0x10; trials.append((f'flip {w} @{at}', bytes(b)))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for w, b in trials:
            f = models/'damaged.pth'
            f.write_bytes(b)
            res = outcome(f, ref, learn, ref_model)
            counts[res] = counts.get(res, 0) + 1
            if res == 'identical': same_at.append(w)
            if res not in ('refused', 'identical'): bad[w] = res
    with capsys.disabled():
        print(f"\nfuzz ({'beside' if beside else 'before'} the read): {len(trials)} tried ({N_CUTS} cuts, "
              f"{len(trials) - N_CUTS} flips): "
              + ', '.join(f'{k} {v}' for k, v in sorted(counts.items())) + f"; loaded-different {len(bad)}\n"
              f"loaded identical (bytes no reader uses): {same_at}")
    assert not bad, bad
    assert counts['refused'] >= N_CUTS  # every cut is refused


def test_bad_inputs(ck, tmp_path):
    "Empty, a record removed, not a zip (text, a pickle), a folder: each refused with one line naming the file"
    data = ck.read_bytes()
    files = {'empty.pth': b'', 'text.pth': b'epoch,loss\n0,1.5\n', 'pickle.pth': pickle.dumps({'model': {}})}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        weights = [r for r in kinds(ck)['model']][0].name
        for name, drop in (('no-weights.pth', weights), ('no-pickle.pth', 'archive/data.pkl')):
            out = io.BytesIO()
            with zipfile.ZipFile(out, 'w', zipfile.ZIP_STORED) as w:
                for i in z.infolist():  # a new ZipInfo each: `writestr` sets the offsets of the one it is given
                    if i.filename != drop: w.writestr(zipfile.ZipInfo(i.filename, i.date_time), z.read(i))
            files[name] = out.getvalue()
    for name, b in files.items():
        (tmp_path/name).write_bytes(b)
        for read in (read_checkpoint, checkpoint_info):
            with pytest.raises(CheckpointError) as e: read(tmp_path/name)
            assert '\n' not in str(e.value) and name in str(e.value), str(e.value)
    with pytest.raises(CheckpointError, match=rf"{weights} \(model weights: a\): the record is missing"):
        read_checkpoint(tmp_path/'no-weights.pth')
    with pytest.raises(CheckpointError, match='empty'): read_checkpoint(tmp_path/'empty.pth')
    with pytest.raises(CheckpointError, match='is a folder'): read_checkpoint(tmp_path)


def test_other_architecture_and_newer_format(ck, tmp_path):
    "Still refused as before: a checkpoint of another architecture, one of a newer format than this fastrepro reads"
    learn = learner(ck.parent.parent)
    learn.model.b = nn.Parameter(torch.zeros(2))
    with pytest.raises(CheckpointError, match='another architecture'): learn.load(ck.stem)
    state = read_checkpoint(ck)
    state['opt']['__fastrepro__']['format'] = FORMAT_VERSION + 1
    torch.save(state, ck.parent/'newer.pth')
    for read in (lambda: checkpoint_info(ck.parent/'newer.pth'), lambda: learner(ck.parent.parent).load('newer')):
        with pytest.raises(CheckpointError, match='newer fastrepro'): read()


def test_plain_fastai_checkpoint_is_checked(tmp_path):
    "A learner without fastrepro's callbacks: fastai's own `load`, after the same check"
    seed_everything(0)
    plain = synth_learner(path=tmp_path)
    f = plain.save('plain')
    with open(f, 'rb') as h: r = [r for r in zip_records(h) if '/data/' in r.name][0]
    b = bytearray(f.read_bytes()); b[r.start] ^= 1
    f.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match=r'damaged .*model weights: a'): plain.load('plain')


def test_best_model_reload_is_checked(tmp_path):
    "fastai's `SaveModelCallback` with ReproCB attached: a best model damaged during the fit is refused at its reload"
    from fastai.callback.tracker import SaveModelCallback
    class Damage(Callback):
        "After the last epoch's best model is written, flip a byte of its weights"
        order = SaveModelCallback.order + 1
        def after_epoch(self):
            if self.epoch == self.n_epoch - 1: damage_weights(self.path/self.model_dir/'best.pth')
    learn = learner(tmp_path)
    with warnings.catch_warnings(), pytest.raises(CheckpointError, match=r'best.pth is damaged .*model weights'):
        warnings.simplefilter('ignore')
        learn.fit(2, cbs=[SaveModelCallback(monitor='train_loss', comp=lambda a, b: True, fname='best'), Damage()])


# ---- autoresume, in fresh processes

SCRIPT = '''
import os, sys, signal, warnings
from pathlib import Path
import torch
warnings.simplefilter('ignore')
sys.path.insert(0, {tests!r})
from test_integrity import learner
from fastai.basics import Callback
from fastrepro.callback.preempt import CheckpointCB

class Term(Callback):
    "SIGTERM to this process after training iteration `it` (CheckpointCB writes a checkpoint and exits with 143)"
    order = CheckpointCB.order - 1
    def __init__(self, it): self.it = it
    def after_batch(self):
        if self.training and self.learn.train_iter == self.it: os.kill(os.getpid(), signal.SIGTERM)

folder, keep, stop = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
learn = learner(folder, CheckpointCB(every_iters=2, keep=keep, autoresume=True), *([Term(stop)] if stop else []))
learn.fit(3, lr=1e-2)
torch.save(learn.model.state_dict(), folder/'final.pt')
'''


def script(folder, keep, stop=0) -> subprocess.CompletedProcess:
    "Run the three-epoch script in a fresh process (`stop`: SIGTERM after that training iteration)"
    code = SCRIPT.format(tests=str(Path(__file__).parent))
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')])}
    return subprocess.run([sys.executable, '-c', code, str(folder), str(keep), str(stop)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=RUN_S)


def damage_weights(f):
    "Flip one byte inside the first model-weights record of checkpoint `f`"
    r = kinds(f)['model'][0]
    b = bytearray(f.read_bytes()); b[r.start] ^= 0x10
    f.write_bytes(bytes(b))
    return r.name


@pytest.mark.slow
def test_autoresume_falls_back_to_the_newest_intact(tmp_path):
    ("SIGTERM inside epoch 1, the newest checkpoint damaged: the rerun skips it with one line, continues from the "
     "older one `keep=2` kept and ends bit-identical to the uninterrupted run; with `keep=1` it refuses")
    ref = script(tmp_path/'ref', 2)
    assert ref.returncode == 0, ref.stderr[-3000:]
    stop = N_BATCH + 2  # iteration 7, inside epoch 1: the newest checkpoint is written there, the older one at 6
    for keep in (2, 1):
        run = tmp_path/f'keep{keep}'
        p = script(run, keep, stop)
        assert p.returncode == SIGTERM_STATUS, p.stderr[-3000:]
        newest = run/'models'/'checkpoint.pth'
        assert checkpoint_info(newest)['iteration'] == stop
        record = damage_weights(newest)
        p = script(run, keep)
        if keep == 1:
            assert p.returncode != 0 and 'No intact checkpoint to continue fit 0 from' in p.stderr, p.stderr[-3000:]
            assert f'checkpoint.pth ({record}: its bytes do not match the CRC-32' in p.stderr, p.stderr[-3000:]
            assert not (run/'final.pt').exists()
            continue
        assert p.returncode == 0, p.stderr[-3000:]
        line = [l for l in p.stdout.splitlines() if 'skipped the damaged' in l]
        assert len(line) == 1 and 'checkpoint.pth' in line[0] and 'checkpoint.1.pth' in line[0], p.stdout
        assert (run/'models'/'checkpoint.pth.damaged').exists()
        a, b = torch.load(tmp_path/'ref'/'final.pt'), torch.load(run/'final.pt')
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_reproduce_refuses_a_damaged_file(ck, tmp_path):
    "`fastrepro reproduce damaged.pth`: exit 2, one line naming the file and the damaged record"
    f = tmp_path/'damaged.pth'
    f.write_bytes(ck.read_bytes())
    record = damage_weights(f)
    p = fastrepro_cli('reproduce', f)
    assert p.returncode == 2 and 'Traceback' not in p.stderr, (p.returncode, p.stderr[-3000:])
    lines = [l for l in p.stderr.splitlines() if not l.startswith('fastrepro: warning:')]  # torch's, on import
    assert len(lines) == 1 and lines[0].startswith('fastrepro reproduce: '), p.stderr  # reproduce's form
    for e in ('damaged.pth is damaged', record, 'CRC-32'): assert e in lines[0], p.stderr
