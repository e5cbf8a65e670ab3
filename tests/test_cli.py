("End to end tests of the `fastrepro` command line on a ledger built here: through its `main` in this process (the "
 "exit code and output a fresh process gives), and `env` and the console script as processes of their own.")
import sys, json, shutil, subprocess
import git, pytest
from fastrepro.experiments.ledger import Ledger
from fastrepro.experiments.store import LEDGER_ENV
from conftest import fastrepro_cli, fastrepro_here, assert_user_error, CLI_TIMEOUT_S


@pytest.fixture(scope='module')
def ledger(tmp_path_factory):
    ("A ledger with 5 seeds of a baseline, a better variant, a worse one, one failed run and a variant under a new "
     "metric version")
    path = tmp_path_factory.mktemp('ledger')/'runs.db'
    lab = Ledger(path)
    noise = (-0.002, 0.001, 0.0, 0.002, -0.001)
    for variant, acc, version in (('baseline', 0.90, 1), ('mixup', 0.91, 1), ('dropout0', 0.88, 1),
                                  ('newval', 0.93, 2)):
        for seed, n in enumerate(noise):
            lab.add(dict(experiment='imdb', variant=variant, seed=seed, commit='0123456789abcdef0123', dirty=False,
                         metric_version=version, hyperparameters={'lr': 1e-3, 'epochs': 2},
                         metrics={'final': {'accuracy': acc + n, 'error_rate': 1 - acc - n},
                                  'best': {'accuracy': acc + n + 0.001}}))
    lab.add(dict(experiment='imdb', variant='mixup', seed=5, status='failed', notes='CUDA out of memory'))
    lab.add(dict(experiment='cifar', variant='baseline', seed=0, metrics={'final': {'accuracy': 0.7}}))
    return path


def test_runs_table(ledger, capsys):
    res = fastrepro_here(capsys, 'runs', '--ledger', ledger, '--experiment', 'imdb', '--variant', 'mixup')
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 + 6
    assert lines[0].split()[:5] == ['id', 'experiment', 'variant', 'seed', 'status']
    assert 'accuracy' in lines[0] and 'error_rate' in lines[0]
    assert '01234567' in res.stdout and 'failed' in res.stdout


def test_runs_json_and_env_var(ledger, capsys, monkeypatch):
    "The ledger can come from FASTREPRO_LEDGER; --json gives every field"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    res = fastrepro_here(capsys, 'runs', '--status', 'failed', '--json')
    assert res.returncode == 0, res.stderr
    (run,) = json.loads(res.stdout)
    assert (run['experiment'], run['variant'], run['seed'], run['notes']) == ('imdb', 'mixup', 5, 'CUDA out of memory')
    assert run['started'].endswith('+00:00')


def test_runs_unknown_experiment(ledger, capsys):
    assert_user_error(fastrepro_here(capsys, 'runs', '--ledger', ledger, '--experiment', 'mnist'),
                      "No experiment 'mnist'", "'cifar': baseline (1 runs)", "'imdb': baseline (5 runs)")


def test_missing_ledger(tmp_path, capsys):
    missing = tmp_path/'nowhere.db'
    assert_user_error(fastrepro_here(capsys, 'runs', '--ledger', missing), 'No ledger at', LEDGER_ENV)
    assert not missing.exists()


def test_compare(ledger, capsys):
    res = fastrepro_here(capsys, 'compare', '--ledger', ledger, '--experiment', 'imdb', '--baseline', 'baseline',
                    '--variant', 'mixup', '--metric', 'accuracy')
    assert res.returncode == 0 and res.stderr == '', res.stderr
    assert 'imdb/mixup vs imdb/baseline' in res.stdout and 'verdict: progression' in res.stdout
    assert '95% CI' in res.stdout and "Hedges' g" in res.stdout


def test_compare_lower_is_better_json(ledger, capsys):
    args = ('compare', '--ledger', ledger, '--experiment', 'imdb', '--baseline', 'baseline', '--variant', 'dropout0',
            '--metric', 'error_rate', '--json')
    r = json.loads(fastrepro_here(capsys, *args, '--lower-is-better').stdout)
    assert r['verdict'] == 'regression' and r['n'] == [5, 5] and r['mean_diff'] > 0
    assert json.loads(fastrepro_here(capsys, *args).stdout)['verdict'] == 'progression'


def test_compare_fail_on_regression(ledger, capsys):
    res = fastrepro_here(capsys, 'compare', '--ledger', ledger, '--experiment', 'imdb', '--baseline', 'baseline',
                    '--variant', 'dropout0', '--metric', 'accuracy', '--fail-on-regression')
    assert res.returncode == 1 and 'verdict: regression' in res.stdout


def test_compare_errors(ledger, capsys):
    base = ('compare', '--ledger', ledger, '--experiment', 'imdb', '--baseline', 'baseline', '--metric', 'accuracy')
    assert_user_error(fastrepro_here(capsys, *base, '--variant', 'cutmix'), "No variant 'cutmix' of experiment 'imdb'",
                      'mixup (6 runs)')
    assert_user_error(fastrepro_here(capsys, *base, '--variant', 'newval'), 'metric_version', 're-run the baseline')


def test_env(tmp_path):
    "In a clean repository `env --json` gives the commit and the environment"
    repo = git.Repo.init(tmp_path, initial_branch='main')
    with repo.config_writer() as cw:
        cw.set_value('user', 'name', 'tests'); cw.set_value('user', 'email', 'tests@fastrepro.invalid')
    (tmp_path/'train.py').write_text('print(1)\n')
    repo.index.add(['train.py'])
    head = repo.index.commit('initial').hexsha
    repo.close()
    res = fastrepro_cli('env', '--json', cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert (info['git']['commit'], info['git']['branch'], info['git']['dirty']) == (head, 'main', False)
    assert len(info['env']['env_hash']) == 64 and info['env']['python'] == '.'.join(map(str, sys.version_info[:3]))
    assert 'cudnn_benchmark' in info['env']['switches']


def test_env_outside_repo(tmp_path):
    "The text output; outside a repository it says so, with a warning"
    res = fastrepro_cli('env', cwd=tmp_path)
    assert res.returncode == 0
    assert 'env_hash' in res.stdout and 'num_threads' in res.stdout and 'cudnn_benchmark' in res.stdout
    assert 'git: not a git repository' in res.stdout
    assert res.stderr.startswith('fastrepro: warning:') and 'not inside a git repository' in res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr  # no deprecation notice of torch's or fastai's imports


@pytest.mark.skipif(shutil.which('fastrepro') is None, reason='the package is not installed (pip install -e .)')
def test_console_script():
    res = subprocess.run(['fastrepro', '--help'], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert res.returncode == 0 and all(c in res.stdout for c in ('env', 'runs', 'compare'))
