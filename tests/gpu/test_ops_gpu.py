"""ficco.ops on GPUs: every transport through the caller's group, autograd and torch.compile;
over NCCL with a GPU per rank, and over gloo with ranks that share one GPU (CUDA IPC)."""

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.gpus(1),
]

SCHEDULES = (
    "serial/nccl/cublas",
    "serial/ce/cublas",
    "shard/ce/cublas+hi",
    "finer-c2-m/ce/cublas",
    "finer-c4-m/ce/triton",
    "shard/nccl/cublas",
)


def _body(rank, world, init_file, shared):
    import torch.distributed as dist

    from ficco.ops import all_gather_matmul, matmul_reduce_scatter

    if shared:  # every rank on GPU 0, a gloo group: ficco.ops takes the shared-GPU path
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    else:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group(
            "nccl", init_method=f"file://{init_file}", rank=rank, world_size=world, device_id=dev
        )
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        gen = torch.Generator(device=dev).manual_seed(rank)
        a_shard = torch.randn(512, 256, device=dev, generator=gen)
        b = torch.randn(256, 384, device=dev, generator=gen)
        a = torch.randn(512 * world, 256, device=dev, generator=gen)
        a_full = torch.empty(512 * world, 256, device=dev)
        dist.all_gather_into_tensor(a_full, a_shard)
        want_ag = a_full @ b
        want_rs = torch.empty(512, 384, device=dev)
        dist.reduce_scatter_tensor(want_rs, a @ b)
        for text in SCHEDULES:
            for _ in range(3):  # reuse of the symmetric buffers across calls
                got = all_gather_matmul(a_shard, b, schedule=text)
                torch.testing.assert_close(got, want_ag, rtol=1e-4, atol=1e-3)
                got = matmul_reduce_scatter(a, b, schedule=text)
                torch.testing.assert_close(got, want_rs, rtol=1e-4, atol=1e-3)
        x = a_shard.clone().requires_grad_()
        w1 = b.clone().requires_grad_()
        matmul_reduce_scatter(all_gather_matmul(x, w1), w1.t().contiguous()).sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        compiled = torch.compile(
            lambda x, w: all_gather_matmul(x, w, schedule="finer-c2-m/ce/cublas"),
            backend="aot_eager",
            fullgraph=True,
        )
        torch.testing.assert_close(compiled(a_shard, b), want_ag, rtol=1e-4, atol=1e-3)
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("world", "shared"),
    [
        pytest.param(2, False, marks=pytest.mark.gpus(2, why="NCCL puts one rank on each GPU")),
        *((w, True) for w in (2, 4)),
    ],
    ids=["nccl-w2", "shared-w2", "shared-w4"],
)
def test_ops_forward_backward_compile(world, shared):
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_body, (world, os.path.join(tmp, "rdv"), shared), nprocs=world, join=True)
