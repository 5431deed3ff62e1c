"""pytest-benchmark set-up: machine info extended with what decides kernel speed.

Results are saved per machine class, benchmark device and size (``make bench`` stores them under
``.benchmarks/<machine_class>/<device>-x<scale>``), so a comparison never mixes a laptop with a
GPU node, nor a CPU run with a CUDA run of the same GPU machine.
"""

from __future__ import annotations

import os

import torch

from suites.timegate import machine_class


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["machine_class"] = machine_class()
    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda or ""
    machine_info["device"] = (torch.cuda.get_device_name(0) if torch.cuda.is_available()
                              else "cpu")
    # what the benchmarks ran on and at which size (benchmarks/test_micro.py): a CPU run and a
    # BENCH_DEVICE=cuda run on one GPU machine share a machine class, not their numbers
    machine_info["bench_device"] = os.environ.get("BENCH_DEVICE", "cpu")
    machine_info["bench_scale"] = os.environ.get("BENCH_SCALE", "1")
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS", "")


def pytest_configure(config):
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
