"""ficco.kernels.reduce: the one-pass sum the CUDA backend reduces W > 2 staged partials with,
under Triton's interpreter on CPU (and on the GPU where one is present): the same bits as the
torch path it replaces (fp32 copy of the first input, the others added in order, one cast)."""

import pytest
import torch

from ficco.kernels.reduce import MAX_INPUTS, sum_into

# the interpreter runs CPU tensors where no GPU is (tests/conftest.py sets it); with a GPU the
# kernel is compiled and takes CUDA tensors
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


def _same(got, want, device):
    """Bitwise on a GPU; under the CPU interpreter, which truncates fp32 to bf16 where the GPU
    rounds to nearest even, bf16 within one unit in the last place."""
    if device == "cuda" or got.dtype == torch.float32:
        return torch.equal(got, want)
    ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp_min(1e-30)
    return bool(((got.float() - want.float()).abs() <= ulp * 1.0001).all())


def _torch_path(views, out_dtype):
    total = views[0].to(torch.float32, copy=True)
    for v in views[1:]:
        total.add_(v)
    return total.to(out_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n", [3, 4, 8])
def test_row_blocks_of_a_staging_buffer_sum_to_the_torch_path_bitwise(device, dtype, n):
    gen = torch.Generator().manual_seed(n)
    rows, cols = 37, 300  # ragged against the 16 x 256 blocks
    staging = torch.randn((n * rows, cols), generator=gen).to(dtype).to(device)
    views = [staging[i * rows : (i + 1) * rows] for i in range(n)]
    out = torch.full((rows, cols), float("nan"), dtype=dtype, device=device)
    assert sum_into(views, out)
    assert _same(out, _torch_path(views, dtype), device)


@pytest.mark.parametrize("device", DEVICES)
def test_column_slices_and_an_output_that_is_one_of_the_inputs(device):
    gen = torch.Generator().manual_seed(1)
    full = [torch.randn((20, 96), generator=gen).to(torch.bfloat16).to(device) for _ in range(4)]
    views = [t[:, 32:80] for t in full]  # strided: row stride 96
    want = _torch_path(views, torch.bfloat16)
    others = full[0].clone()
    assert sum_into(views, views[0])  # in place into the first input, exactly overlapping
    assert _same(views[0], want, device)
    assert torch.equal(full[0][:, :32], others[:, :32])  # outside the slice: untouched


def test_calls_the_kernel_cannot_take_are_left_to_the_caller():
    a = torch.zeros((8, 64))
    too_many = [a] * (MAX_INPUTS + 1)
    assert not sum_into(too_many, torch.empty((8, 64)))
    assert not sum_into([a, a, torch.zeros((8, 32))], torch.empty((8, 64)))  # a shape differs
    assert not sum_into([a, a, a.t().contiguous().t()], torch.empty((8, 64)))  # column stride
    buf = torch.zeros((9, 64))
    shifted = buf[1:]  # overlaps the output's rows one row off
    assert not sum_into([buf[:8], a, a], shifted)
    out = torch.full((8, 64), 7.0)
    assert not sum_into([a, a, a, a, a, a, a, a, a], out) and (out == 7.0).all()
