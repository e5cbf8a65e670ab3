"""Smoke test of the benchmarks: `python -m bench.run --quick` runs every benchmark end to end (tiny models, two
rounds) and `python -m bench.gpu_bench` runs where there is no GPU. Nothing here judges speed: benchmarks are not timed
tests. The `bench` package is imported from the root of the checkout (setup.cfg's `pythonpath`)."""
import json, re, subprocess, sys
from pathlib import Path
import pytest
from conftest import hang_limit

ROOT = Path(__file__).resolve().parents[1]
RATIO = re.compile(r'ratio \d+\.\d+x')


@pytest.mark.slow  # trains in fresh processes: the inner loop skips it
def test_bench_quick(tmp_path, fastai_home):
    # one timed round per comparison: a smoke run proves every benchmark runs end to end, it judges no target
    r = subprocess.run([sys.executable, '-m', 'bench.run', '--quick', '--reps', '1', '--out', str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=hang_limit(60))
    assert r.returncode == 0, (f"python -m bench.run --quick failed ({r.returncode}):\n"
                               f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    assert len(RATIO.findall(r.stdout)) >= 10, f"too few ratios printed:\n{r.stdout[-3000:]}"
    res = json.loads((tmp_path/'results.json').read_text())
    assert not res['errors'] and res['config']['quick'] and res['config']['reps'] == 1
    assert {row['bench'].split()[0] for row in res['rows']} == {'1', '2', '3', '3b', '4', '5', '6', '7', '8', '9', '12'}
    md = (tmp_path/'RESULTS.md').read_text()
    assert '<!-- bench:begin -->' in md and 'ratio B/A' in md
    scratch = tmp_path/'out'  # checkpoints and ledgers go under --out, not into bench/
    assert scratch.is_dir() and {'checkpoints', 'ledgers', 'preempt'} <= {p.name for p in scratch.iterdir()}


def test_results_md_keeps_analysis(tmp_path):
    "Re-running replaces only the generated block of RESULTS.md, not the analysis around it"
    from bench.run import write_results, BEGIN, END
    from bench._common import Config
    md = tmp_path/'RESULTS.md'
    md.write_text(f"# analysis above\n\n{BEGIN}\nold numbers\n{END}\n\n## analysis below\n")
    machine = dict(date='d', cpu='c', logical_cpus=2, num_threads=1, interop_threads=1, python='3', torch='t',
                   fastai='f', fastcore='fc', fastrepro='fr', numpy='n', os='p',
                   git=dict(is_repo=True, commit='0123456789', dirty=True),
                   load_avg_start=(0, 0, 0), load_avg_end=(0, 0, 0), load_max=0.5, quiet=True)
    write_results(tmp_path, machine, Config.make(quick=True, out=tmp_path/'out'), [], {}, 1.0)
    text = md.read_text()
    assert text.startswith('# analysis above') and text.rstrip().endswith('## analysis below')
    assert 'old numbers' not in text and text.count(BEGIN) == 1
    assert '| code | 0123456 (dirty working tree) |' in text


def test_gpu_bench_without_gpu():
    "Without CUDA the GPU script says so and exits 0 (on a GPU machine this test is skipped: run the script itself)"
    import torch
    if torch.cuda.is_available(): pytest.skip('CUDA is here: run python -m bench.gpu_bench itself')
    r = subprocess.run([sys.executable, '-m', 'bench.gpu_bench'], cwd=ROOT, capture_output=True, text=True,
                       timeout=hang_limit(10))
    assert r.returncode == 0 and 'no CUDA device' in r.stdout, r.stdout + r.stderr
