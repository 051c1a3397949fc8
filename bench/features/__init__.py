"""The secondary features, one home each: a module, or a folder for a feature of several.

Each is declared in bench/model/features.py (its settings, row groups, cell steps, what it keeps
in a worker, its steps of a sweep's preparation, its passes, its report section and its
commands), and the core reaches it only through that declaration: no module of the core imports
one (tests/test_layout.py checks it).  A feature's command lives in bench/cli/ and its report
section in reports/sections/, where the command line and the report look for them.

- contention/: the load around each cell, the leftover check, contended cells timed again
- gpu_state/: NVML's clocks, power and energy; the kernels that ran and the CUDA-graph check
- cost_model/: the cases' costs, the projection of a sweep's wall time, what compiled here
- shards/: a sweep's shards, its cluster jobs, merged run folders
- profile/: torch.profiler's categories of each cell's time, the profiled pass
- frontier.py: the largest n that fits in memory and a time budget
- steps.py: what a training or serving step costs beyond the kernel
- repro.py: each cell's command (``status``)
- selfcheck.py: the timer against torch.utils.benchmark on this machine
- export.py: rows as pytest-benchmark and torch.utils.benchmark read them
- ab.py: two builds timed in turn
"""
