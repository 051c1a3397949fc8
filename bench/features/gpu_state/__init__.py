"""The GPU state: NVML's clocks, power and energy around each turn (nvml.py), and the kernels that ran
with the CUDA-graph check (kernels.py), each a step of a GPU cell."""
