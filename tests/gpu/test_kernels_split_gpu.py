"""The persistent TMA GEMM's split tail on a CUDA GPU in bf16, where the last wave is more
than half full and `configs.split_plan` splits it into several waves of K-range units: the
shapes the space now offers it on, views and accumulate, deterministic reruns.

Skipped without CUDA. Bar: relative Frobenius error against an fp32 reference at most twice
torch.matmul's own in bf16, and never above 1e-2.
"""

from dataclasses import replace

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ficco.kernels import matmul  # noqa: E402
from ficco.kernels import persistent as kernel_paths  # noqa: E402
from ficco.kernels.configs import GemmConfig, split_plan  # noqa: E402

pytestmark = pytest.mark.gpu

# the big tiles the several-wave split is offered on (configs.GPU_CONFIGS)
SPLIT_TILES = (
    GemmConfig(128, 256, 64, 8, 4, 8, True, split_tail=True),
    GemmConfig(256, 128, 64, 8, 3, 8, split_tail=True),
    GemmConfig(128, 128, 64, 8, 5, 4, True, split_tail=True),
    GemmConfig(64, 256, 64, 8, 4, 4, split_tail=True),
)

DEV = torch.device("cuda", torch.cuda.current_device())


def _err(out, ref):
    return float((out.float() - ref).norm() / ref.norm())


@pytest.mark.parametrize("mnk", [(512, 5120, 8192), (256, 5120, 8192), (500, 5000, 8000)])
def test_several_wave_split_bf16(mnk):
    m, n, k = mnk
    sms = kernel_paths.default_sm_budget(DEV)
    gen = torch.Generator(device=DEV).manual_seed(m + n + k)
    a = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    b = torch.randn(k, n, device=DEV, generator=gen).to(torch.bfloat16)
    ref = a.float() @ b.float()
    bar = min(1e-2, 2 * _err(torch.matmul(a, b), ref) + 1e-4)
    ran = 0
    for cfg in SPLIT_TILES:
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        plan = split_plan(tiles, sms, -(-k // cfg.block_k))
        if plan is None or plan.units - plan.dp_tiles <= sms:
            continue  # not a several-wave split here
        outs = []
        for _ in range(2):  # arrival counters reset themselves; the sum order is fixed
            out = torch.full((m, n), float("nan"), device=DEV, dtype=torch.bfloat16)
            matmul(a, b, out, config=cfg)
            outs.append(out)
        torch.cuda.synchronize()
        assert _err(outs[0], ref) <= bar, cfg.name
        assert torch.equal(outs[0], outs[1]), cfg.name
        ran += 1
    assert ran
    assert all(int(buf.abs().sum()) == 0 for buf in kernel_paths._locks.values())


def test_several_wave_split_accumulate_into_fp32_slice():
    m, n, k = 256, 5120, 8192  # 80 tiles of 128x128 on 132 SMs: 3 ways, two waves
    gen = torch.Generator(device=DEV).manual_seed(3)
    a = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, device=DEV, generator=gen).to(torch.bfloat16)  # b = w^T
    wide = torch.randn(m, n + 64, device=DEV, generator=gen)
    keep = wide.clone()
    cfg = replace(SPLIT_TILES[2], epilogue_subtile=False)  # room for the C read-back
    matmul(a, w.t(), wide[:, 32 : 32 + n], accumulate=True, config=cfg)
    ref = a.float() @ w.float().t() + keep[:, 32 : 32 + n]
    assert _err(wide[:, 32 : 32 + n], ref) <= 1e-2
    assert torch.equal(wide[:, :32], keep[:, :32]) and torch.equal(
        wide[:, 32 + n :], keep[:, 32 + n :]
    )
