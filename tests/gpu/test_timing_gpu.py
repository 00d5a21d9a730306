"""`ficco.execute.timing.RanksClock` on a CUDA GPU: CUDA events around each step, the max
over ranks (one rank here), through `time_rounds` as the step benchmarks use it."""

import json

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

pytestmark = pytest.mark.gpu


def _rank(rank: int, store_path: str, out: str) -> None:
    import torch.distributed as dist

    from ficco.execute.options import TimingOptions
    from ficco.execute.timing import RanksClock, time_rounds

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=rank, world_size=1)
    try:
        # about 1.1 TFLOP: 1-2 ms on an H100 or H200
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        fns = {"matmul": lambda: a @ a, "empty": lambda: None}
        got = time_rounds(
            fns, TimingOptions(warmup=1, rounds=4), RanksClock(torch.device("cuda", 0)), "synced",
            rotate=True,
        )  # fmt: skip
        with open(out, "w") as f:
            json.dump(got, f)
    finally:
        dist.destroy_process_group()


def test_ranks_clock_times_gpu_work_with_events(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "samples.json"
    mp.start_processes(
        _rank, args=(str(tmp_path / "store"), str(out)), nprocs=1, start_method="spawn"
    )
    got = json.loads(out.read_text())
    assert len(got["matmul"]) == len(got["empty"]) == 4
    # the GEMM runs between its events; nothing runs between the empty step's
    assert min(got["matmul"]) > 0.5 > max(got["empty"])


def test_device_clock_times_on_the_stream_it_is_given():
    from ficco.execute.options import TimingOptions
    from ficco.execute.timing import DeviceClock, time_rounds

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    side = torch.cuda.Stream()
    seen = []

    def gemm() -> None:
        seen.append(torch.cuda.current_stream() == side)
        torch.matmul(a, a, out=out)

    got = time_rounds(
        {"gemm": gemm}, TimingOptions(warmup=1, rounds=3), DeviceClock(stream=side), rotate=True
    )
    assert seen == [False, True, True, True]  # the warm-up call on the caller's stream
    assert len(got["gemm"]) == 3 and min(got["gemm"]) > 0
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), (a.float() @ a.float()), rtol=2e-2, atol=2.0)
