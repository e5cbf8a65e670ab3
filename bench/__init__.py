"""The fastrepro benchmarks: what reproducibility costs, measured against plain fastai in the same process.

Run them as modules from the root of the checkout, so that the fastrepro they measure is this checkout's whatever is
installed (`python -m` puts the current folder first on the module path):

    python -m bench.run [--quick]          # every CPU benchmark; writes bench/RESULTS.md and bench/results.json
    python -m bench.epoch_time [--quick]   # one benchmark, its rows printed
    python -m bench.gpu_bench [--cpu]      # the GPU benchmarks (GPU_RESULTS.md)
    python -m bench.gpu_check [--cpu]      # fp16 runs, resumes (fresh processes), cuDNN RNN dropout, switches on a GPU
    python -m bench.profile_misses         # where fastrepro's time goes (the profiles quoted in RESULTS.md)
    python -m bench.stress_resume          # same-seed kill-and-resume runs under load (CPU_NUMERICS.md)
    python -m bench.portable_check         # portable mode's digests, native and under other instruction sets
    python -m bench.portable_cost          # what MKL's CNR and portable mode cost
"""
