"""torch.distributed: every rank takes the same step (two gloo processes on CPU).

* DDP: ranks see different halves of each batch; DDP averages the gradients and the optimizer
  averages the loss, so both ranks end bit-identical and equal to one process fed the union.
* Sharded DTensor parameters (FSDP2/TP-style): each rank holds half of every tensor; ``||g||_1``
  and ``<g, z - x>`` are summed across the shards, so the sharded run equals the unsharded one.

Both with the step size on the host and on the device (``device_scalars``, the accelerators'
default): the collectives are the same, only where their results are read differs.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from curvecast.sfplus import ScheduleFreePlus

from .conftest import batches, make_model, max_rel_diff, params_of
from .test_host_syncs import HostReads

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

STEPS = 20
KW = {"warmup_steps": 5, "c_warmup": 8, "weight_decay": 5.0, "anneal_steps": 15, "r": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, out: str) -> None:
    # Both scenarios in one pair of processes: starting Python + torch twice costs more than
    # the 2 x 20 training steps.
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        result = {(scenario, device_scalars): run(rank, device_scalars)
                  for scenario, run in (("ddp", _ddp), ("dtensor", _dtensor))
                  for device_scalars in (False, True)}
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _train(
    opt: ScheduleFreePlus,
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    params: Callable[[], list[torch.Tensor]],
    batch_size: int = 32,
) -> dict[str, object]:
    """``STEPS`` steps on the shared batches; then the training point y, the averaged point x
    (after ``eval()``) and the optimizer's statistics, the three things the tests compare, and
    the host reads of each step."""
    reads = []
    for x, y in batches(STEPS, batch_size=batch_size):
        loss = loss_of(x, y)
        loss.backward()
        with HostReads() as counter:
            opt.step(loss=loss)
        reads.append(counter.count)
        opt.zero_grad()
    y_params = params()
    stats = opt.stats(norms=True)
    opt.eval()
    return {"y": y_params, "x": params(), "stats": stats, "reads": reads}


def _ddp(rank: int, device_scalars: bool) -> dict[str, object]:
    model = make_model()
    ddp = DDP(model)
    opt = ScheduleFreePlus(ddp.parameters(), device_scalars=device_scalars, **KW)
    half = slice(16 * rank, 16 * (rank + 1))
    # This rank's loss only: DDP averages the gradients, the optimizer the loss.
    return _train(opt, lambda x, y: F.cross_entropy(ddp(x[half]), y[half]),
                  lambda: params_of(model))


def _dtensor(rank: int, device_scalars: bool) -> dict[str, object]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    model = make_model()
    names = [n for n, _ in model.named_parameters()]
    shards = {
        n: torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)]))
        for n, p in model.named_parameters()
    }
    opt = ScheduleFreePlus(list(shards.values()), device_scalars=device_scalars, **KW)

    def full() -> list[torch.Tensor]:
        return [shards[n].detach().full_tensor() for n in names]

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # Both ranks see the whole batch; the all-gathered weights are differentiable, and each
        # rank's gradient is its shard of the full gradient.
        weights = {n: p.full_tensor() for n, p in shards.items()}
        return F.cross_entropy(torch.func.functional_call(model, weights, (x,)), y)

    result = _train(opt, loss_of, full)
    assert shards[names[0]].to_local().shape[0] < model.emb.weight.shape[0]  # really sharded
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _single_process(batch_size: int = 32) -> dict[str, object]:
    model = make_model()
    opt = ScheduleFreePlus(model.parameters(), **KW)
    return _train(opt, lambda x, y: F.cross_entropy(model(x), y), lambda: params_of(model),
                  batch_size=batch_size)


@pytest.mark.parametrize("device_scalars", [False, True], ids=["host-scalars", "device-scalars"])
def test_ddp_ranks_stay_identical_and_match_one_process(ranks: list[dict],
                                                        device_scalars: bool) -> None:
    r0, r1 = (r["ddp", device_scalars] for r in ranks)
    assert set(r0["reads"]) == {0 if device_scalars else 1}  # the collectives read nothing
    assert all(torch.equal(a, b) for a, b in zip(r0["y"], r1["y"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(r0["x"], r1["x"], strict=True))
    assert r0["stats"] == r1["stats"]
    single = _single_process()
    # float64 throughout; the only difference is the order of floating-point sums.
    assert max_rel_diff(r0["y"], single["y"]) < 1e-9
    assert max_rel_diff(r0["x"], single["x"]) < 1e-9
    for key, value in single["stats"].items():
        assert r0["stats"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


@pytest.mark.parametrize("device_scalars", [False, True], ids=["host-scalars", "device-scalars"])
def test_sharded_dtensor_parameters_match_the_unsharded_run(ranks: list[dict],
                                                            device_scalars: bool) -> None:
    r0, r1 = (r["dtensor", device_scalars] for r in ranks)
    if device_scalars:
        assert set(r0["reads"]) == {0}
    assert r0["stats"] == r1["stats"]
    single = _single_process()
    assert max_rel_diff(r0["y"], single["y"]) < 1e-9
    assert max_rel_diff(r0["x"], single["x"]) < 1e-9
    for key in ("grad_l1", "inner", "eta", "x_l2", "z_l2", "grad_l2"):
        assert r0["stats"][key] == pytest.approx(single["stats"][key], rel=1e-9), key
