"""End to end tests of `fastrepro demo`: two checks of the test profile in a fresh process (report files, exit code 0,
the checks passed; `nbs/demo/04_run.ipynb` runs all seven), and input it cannot use (exit code 2, one clear message,
no traceback): in this process through the command line's `main`, and once in a fresh process (no IMDB sample, no
network)."""
import json
import pandas as pd
import pytest
from conftest import fastrepro_cli, fastrepro_here, assert_user_error, CLI_TIMEOUT_S, ROOT, hang_limit

DEMO_TIMEOUT_S = hang_limit(30)  # checks 1 and 4 of the test profile take about 15 s on a 2-core CPU; this stops a hang
CHECKS = ['same seed, same bits', 'killed and resumed', 'fp16 loss scale', 'nondeterminism found', 'change over seeds',
          'fast loop', 'reproduced from one file']


def demo(*args, timeout=CLI_TIMEOUT_S, cwd=ROOT, **env):
    "Run `fastrepro demo args` in a fresh process (in folder `cwd`); the completed process"
    return fastrepro_cli('demo', *args, cwd=cwd, timeout=timeout, **env)


@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_demo_test_profile(fastai_home, tmp_path):
    ("The command end to end in a fresh process, on checks 4 and 1 (every check runs, with its outputs, in `04_run`, "
     "which calls the same `run_demo`): the checks in the demo's order, the report files, the table, the exit code")
    out = tmp_path/'out'
    res = demo('--profile', 'test', '--checks', '4', '1', '--out', out, timeout=DEMO_TIMEOUT_S, cwd=tmp_path)
    assert res.returncode == 0, (res.stdout[-5000:], res.stderr[-5000:])
    for f in ('report.md', 'report.json', 'same_seed.png', 'nondeterminism.png'):
        assert (out/f).is_file() and (out/f).stat().st_size > 0, f
    assert not (out/'variants.png').exists() and not (out/'fp16_loss_scale.png').exists()  # checks 3 and 5 did not run
    rep = json.loads((out/'report.json').read_text())
    ran = [CHECKS[0], CHECKS[3]]  # in the demo's order, whatever the order asked
    assert rep['passed'] and [c['check'] for c in rep['checks']] == ran
    assert all(c['passed'] and not c['skipped'] for c in rep['checks']), [c['detail'] for c in rep['checks']]
    assert rep['info']['profile'] == 'test' and 'trained from scratch' in rep['info']['weights']
    for c in ran: assert c in res.stdout                      # the report table
    assert '2/2 checks passed in' in res.stdout
    md = (out/'report.md').read_text()
    assert '| check | result | detail | seconds |' in md and '![same seed, same bits](same_seed.png)' in md
    assert (out/'traces'/'stray_draw.trace').is_file()


def test_unknown_check(tmp_path, capsys):
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--checks', '2', '9', '--out', tmp_path/'o'),
                      '1 to 7, got 9', '7 reproduced from one file')
    assert not (tmp_path/'o').exists()


@pytest.fixture
def csv(tmp_path, fastai_home):
    "Write a CSV of `n` IMDB-sample texts, changed by `f`; its path"
    texts = pd.read_csv(fastai_home/'data'/'imdb_sample'/'texts.csv')
    def _write(name, f=lambda df: df, n=200):
        p = tmp_path/name
        f(texts.head(n)[['text', 'label', 'is_valid']]).to_csv(p, index=False)
        return p
    return _write


def test_missing_columns(csv, tmp_path, capsys):
    p = csv('cols.csv', lambda df: df.rename(columns={'label': 'sentiment'}))
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', p, '--out', tmp_path/'o'),
                      "no 'label' column", 'sentiment')


def test_one_class(csv, tmp_path, capsys):
    p = csv('one.csv', lambda df: df.assign(label='positive'))
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', p, '--out', tmp_path/'o'),
                      'at least two classes')


def test_empty_file(tmp_path, capsys):
    (tmp_path/'empty.csv').write_text('')
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', tmp_path/'empty.csv', '--out',
                                     tmp_path/'o'), 'is empty')


def test_header_only(tmp_path, capsys):
    (tmp_path/'header.csv').write_text('text,label\n')
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', tmp_path/'header.csv', '--out',
                                     tmp_path/'o'), 'no row with both')


def test_unreadable(tmp_path, capsys):
    (tmp_path/'binary.csv').write_bytes(bytes(range(256)) * 8)
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', tmp_path/'binary.csv', '--out',
                                     tmp_path/'o'), 'cannot be read as a CSV')
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', tmp_path/'nowhere.csv', '--out',
                                     tmp_path/'o'), 'no such file')


def test_bad_split(csv, tmp_path, capsys):
    p = csv('split.csv', lambda df: df.assign(is_valid='sometimes'))
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'test', '--data', p, '--out', tmp_path/'o'),
                      "'is_valid' must be True/False")


def test_too_little_text(csv, tmp_path, capsys):
    p = csv('small.csv', lambda df: df.assign(is_valid=[False]*9 + [True]*3), n=12)
    assert_user_error(fastrepro_here(capsys, 'demo', '--profile', 'fast', '--data', p, '--out', tmp_path/'o'),
                      'too little text for the fast profile')


def test_bad_arguments(tmp_path, capsys):
    demo = lambda *args: fastrepro_here(capsys, 'demo', *args)
    assert_user_error(demo('--profile', 'huge', '--out', tmp_path/'o'), "Unknown profile 'huge'")
    assert_user_error(demo('--profile', 'test', '--seeds', '1', '--out', tmp_path/'o'), 'at least 2')
    assert_user_error(demo('--profile', 'test', '--workers', '-1', '--out', tmp_path/'o'), 'workers=-1')
    (tmp_path/'file').write_text('x')
    assert_user_error(demo('--profile', 'test', '--out', tmp_path/'file'), 'is not a folder')


def test_no_imdb_sample(tmp_path):
    ("No IMDB sample, no project copy (the process runs outside the project) and no network: the message says how to "
     "provide it")
    env = dict(FASTAI_HOME=str(tmp_path/'empty_home'), no_proxy='', https_proxy='http://127.0.0.1:9',
               http_proxy='http://127.0.0.1:9', HTTPS_PROXY='http://127.0.0.1:9', HTTP_PROXY='http://127.0.0.1:9')
    res = fastrepro_cli('demo', '--profile', 'test', '--out', tmp_path/'o', cwd=tmp_path, **env)
    assert_user_error(res, 'The IMDB sample is not available', 'imdb_sample/texts.csv', '--data')
