"""The ``--threads`` option the CPU benchmarks share: on a shared machine, spinning OpenMP threads
of several processes (or of Prefect's server beside the stages) make every op wait, so a benchmark
can be pinned to fewer torch threads than there are cores. :func:`use_threads` also sets the
numerics a run has (flush-to-zero), so that a benchmark measures what a run computes and as fast."""

from __future__ import annotations

import argparse

import torch

from solrl_core.numerics import flush_denormals


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); fewer than the cores on a shared machine, where "
                             "spinning threads of other processes make every op wait")


def use_threads(args: argparse.Namespace) -> None:
    flush_denormals()  # first: the threads torch starts later inherit it
    if args.threads:
        torch.set_num_threads(args.threads)
