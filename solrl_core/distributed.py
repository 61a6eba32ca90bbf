"""Scale-out on torch.distributed, launched by torchrun (DESIGN: "Extension points and scale-out").

A run of world size W shards the iteration's P prompt groups into W contiguous blocks of P / W
groups, each group's whole pool on one rank, so rank r holds global group slots
[r P/W, (r+1) P/W). Seeds are keyed by the global slot and sample index (solrl_core.seeds), so a
sample's noise never depends on the rank or on W. What crosses ranks:

* the kept samples' rewards (all-gathered: the advantage's std is over the whole iteration);
* the LoRA gradients (summed once per optimizer step; each rank's loss is already divided by the
  step's *global* item count, so the sum is exactly the one-process gradient, also when ranks
  hold different numbers of trainable items);
* the per-rank ledger rows, scores and losses of an iteration (gathered, so rank 0 writes the
  same ledger and metrics one process would);
* the evaluation: its (prompt, seed) pairs are sharded, rewards all-gathered, images gathered to
  rank 0 for the grid.

With W = 1 none of this runs: every helper returns its input, and the one-process path stays
exactly as it was. The process group has a timeout (``--rank-timeout``): a rank that dies or hangs
makes the others fail their next collective within it instead of waiting forever.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch

from solrl_core.config import ConfigError

# Seconds a rank waits in a collective for the others before the run fails. The slowest gap
# between two collectives is one stage of one rank's shard, so this must exceed the longest
# stage; ten minutes covers a pool of 96 on a GPU with room to spare.
DEFAULT_TIMEOUT_S = 600
# torchrun's environment (https://pytorch.org/docs/stable/elastic/run.html#environment-variables).
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# The timeout torchrun's children read; set by `solrl run --rank-timeout` for them.
TIMEOUT_VARIABLE = "SOLRL_RANK_TIMEOUT_S"


class DistributedError(ConfigError):
    """A scale-out setting that cannot work (user error: one line, exit code 2)."""


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def under_torchrun(environment=os.environ) -> bool:
    return "WORLD_SIZE" in environment and "RANK" in environment


def world_from_environment(environment=os.environ) -> World:
    """The world torchrun describes in the environment; one process when it is not set."""
    if not under_torchrun(environment):
        return World()
    try:
        world = World(rank=int(environment["RANK"]), size=int(environment["WORLD_SIZE"]),
                      local_rank=int(environment.get("LOCAL_RANK", "0")))
    except ValueError:
        raise DistributedError(f"RANK={environment.get('RANK')!r} / WORLD_SIZE={environment.get('WORLD_SIZE')!r} "
                               "are not integers; start the run with torchrun or `solrl run --nproc-per-node N`") from None
    if world.size < 1 or not 0 <= world.rank < world.size:
        raise DistributedError(f"RANK {world.rank} is not in a world of size {world.size}")
    return world


def current() -> World:
    """The world of the process group this process is in (one process when there is none)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return World()
    return World(rank=torch.distributed.get_rank(), size=torch.distributed.get_world_size(),
                 local_rank=int(os.environ.get("LOCAL_RANK", "0")))


def timeout_from_environment(environment=os.environ) -> float:
    text = environment.get(TIMEOUT_VARIABLE, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise DistributedError(f"{TIMEOUT_VARIABLE}={text!r} is not a number of seconds") from None
    return require_timeout(seconds)


def require_timeout(seconds: float) -> float:
    if not seconds > 0:
        raise DistributedError(f"--rank-timeout ({seconds}) must be a positive number of seconds")
    return seconds


# ---------------------------------------------------------------------------------------------
# Checks before anything starts


def require_divisible(prompt_groups: int, world_size: int) -> None:
    """Each rank takes the same number of whole prompt groups (as the reference: 48 on 8 GPUs)."""
    if prompt_groups % world_size:
        raise DistributedError(f"prompts_per_iteration ({prompt_groups}) is not divisible by the world size "
                               f"({world_size}): every rank takes the same number of whole prompt groups; "
                               f"choose a multiple of {world_size} (-S prompts_per_iteration=N) or another rank count")


def require_shardable(config, world_size: int) -> None:
    require_divisible(config.prompts_per_iteration, world_size)
    pairs = config.eval.prompts * config.eval.seeds_per_prompt
    if pairs < world_size:
        raise DistributedError(f"the evaluation's {pairs} (prompt, seed) pairs cannot be shared by {world_size} ranks; "
                               f"raise eval.prompts or eval.seeds_per_prompt to at least {world_size} pairs")


def require_same_world(saved_size: int, world_size: int, out_dir) -> None:
    if saved_size != world_size:
        raise DistributedError(f"cannot resume {out_dir} on {world_size} rank(s): it ran on {saved_size}; resume it "
                               f"with the same number of ranks (`solrl run --nproc-per-node ... --resume`)")


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(f"--rdzv-endpoint {endpoint!r} is not HOST:PORT (e.g. 10.0.0.1:29400)")
    return host.strip("[]"), int(port)


def check_rendezvous(endpoint: str, hosts_store: bool, timeout_s: float) -> None:
    """Refuse, before torchrun starts, a rendezvous address this node cannot use: a name that does
    not resolve; on the node that hosts the store, an address not of this machine; elsewhere, an
    address nothing answers on within ``timeout_s`` (the host node may start a little later)."""
    host, port = split_endpoint(endpoint)
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError as error:
        raise DistributedError(f"--rdzv-endpoint {endpoint}: cannot resolve {host!r} ({error.strerror or error})") from None
    if hosts_store:
        if not any(_is_local_address(address) for address in addresses):
            raise DistributedError(f"--rdzv-endpoint {endpoint}: {host} is not an address of this machine, so node "
                                   "rank 0 cannot host the rendezvous; give this node's address")
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout_s)):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise DistributedError(f"--rdzv-endpoint {endpoint}: nothing answered within {timeout_s:.0f} s; "
                                       "start node rank 0 first, or check the address and the firewall") from None
            time.sleep(1.0)


def _is_local_address(address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))  # only an address of this machine can be bound
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The process group


@contextmanager
def process_group(world: World, device_type: str, timeout_s: float):
    """Join torchrun's process group (gloo on CPUs, nccl on GPUs, one device per local rank) for the
    duration of the block; with one process, nothing."""
    if not world.distributed:
        yield
        return
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(world.local_rank)
    torch.distributed.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        # After a failure a peer may be gone: destroying the group must not wait on it.
        torch.distributed.destroy_process_group()


def shard(count: int, world: World | None = None) -> range:
    """This rank's contiguous block of ``count`` items (sizes differ by at most one)."""
    world = world or current()
    return range(world.rank * count // world.size, (world.rank + 1) * count // world.size)


def all_gather_objects(value) -> list:
    """``value`` from every rank, in rank order (``[value]`` in one process)."""
    world = current()
    if not world.distributed:
        return [value]
    gathered = [None] * world.size
    torch.distributed.all_gather_object(gathered, value)
    return gathered


def gather_to_main(value) -> list | None:
    """``value`` from every rank on rank 0 (None elsewhere): for what only rank 0 writes."""
    world = current()
    if not world.distributed:
        return [value]
    gathered = [None] * world.size if world.is_main else None
    torch.distributed.gather_object(value, gathered, dst=0)
    return gathered


def sum_floats(values: list[float]) -> list[float]:
    """Element-wise sum over ranks, in float64 (loss shares, skip counts)."""
    if not current().distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device())
    torch.distributed.all_reduce(tensor)
    return tensor.cpu().tolist()


def sum_gradients(parameters: list[torch.Tensor]) -> None:
    """Sum the parameters' gradients over ranks in one flat all-reduce. A parameter with no gradient
    on this rank (no trainable item here in this step) contributes zeros, so every rank joins."""
    if not current().distributed or not parameters:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    torch.distributed.all_reduce(flat)
    offset = 0
    for parameter, grad in zip(parameters, grads):
        parameter.grad = flat[offset:offset + grad.numel()].view_as(grad).clone()
        offset += grad.numel()


def _collective_device() -> torch.device:
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
