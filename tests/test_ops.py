"""ficco.ops on spawned gloo ranks: results, schedules, the table's pick, fallback, autograd,
torch.compile. Each test starts one group of W processes and checks many calls inside it."""

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]


def _rank_main(rank, world, init_file, body, args, env):
    os.environ.update(env)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    body(rank, world, *args)  # an exception ends the rank with it (spawn reports it)
    dist.barrier()
    exit_without_teardown()


def exit_without_teardown() -> None:
    """End a rank whose work is done (every rank passed a barrier: nothing is in flight)
    without tearing gloo down: under load its destructor can abort the process ('terminate
    called without an active exception'), failing a test whose every check passed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(body, world: int, *args, env: dict | None = None) -> None:
    """Run ``body(rank, world, *args)`` on ``world`` gloo ranks; a rank's exception fails."""
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "rendezvous")
        mp.start_processes(
            _rank_main,
            (world, init, body, args, env or {}),
            nprocs=world,
            join=True,
            start_method="forkserver",  # forked from a process that has torch (conftest)
        )


def rand(seed: int, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def gathered(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Every rank's ``t`` (same shape on every rank), plain all_gather."""
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return parts


def ag_reference(a_shard, b, world):
    return torch.cat(gathered(a_shard, world)).double() @ b.double()


def rs_reference(a, b, rank, world):
    pairs = zip(gathered(a, world), gathered(b, world), strict=True)
    total = sum(p.double() @ q.double() for p, q in pairs)
    rows = a.shape[0] // world
    return total[rank * rows : (rank + 1) * rows]


def close(got, want, dtype=torch.float32):
    tol = {torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 1e-1}[dtype]
    scale = max(1.0, want.abs().max().item())
    err = (got.double() - want).abs().max().item()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert err <= tol * scale, f"max abs error {err} > {tol * scale}"


# --- explicit schedules ------------------------------------------------------------------------

COMMON_W2 = (
    "serial/nccl/cublas",
    "serial/ce/cublas",
    "shard/ce/cublas",
    "shard/nccl/cublas+hi",
    "finer-c2-m/ce/cublas",
    "finer-c4-m/nccl/cublas+merged",
    "finer-c2-m/ce/triton",
)
AG_ONLY, RS_ONLY = ("finer-c2-k/nccl/cublas",), ("finer-c2-n/nccl/cublas",)


def _explicit(rank, world, ag_schedules, rs_schedules, dtype):
    from ficco.ops import all_gather_matmul, matmul_reduce_scatter

    S, K, N = 5, 17, 17  # odd shapes: M = 5W rows, ragged chunks along m, k and n
    a_shard, b = rand(10 + rank, S, K, dtype=dtype), rand(20 + rank, K, N, dtype=dtype)
    a = rand(30 + rank, S * world, K, dtype=dtype)
    for text in ag_schedules:
        close(all_gather_matmul(a_shard, b, schedule=text), ag_reference(a_shard, b, world), dtype)
    for text in rs_schedules:
        got = matmul_reduce_scatter(a, b, None, schedule=text)
        close(got, rs_reference(a, b, rank, world), dtype)


def test_explicit_schedules_at_w2():
    spawn(_explicit, 2, COMMON_W2 + AG_ONLY, COMMON_W2 + RS_ONLY, torch.float32)


def test_explicit_schedules_at_w3_fp16_and_all_peers():
    schedules = ("serial/nccl/cublas", "shard/ce/cublas+all_peers", "finer-c2-m/nccl/cublas")
    spawn(_explicit, 3, schedules, schedules, torch.float16)


def _refusals(rank, world):
    from ficco.ops import all_gather_matmul, matmul_reduce_scatter

    a_shard, b = rand(1, 5, 7), rand(2, 7, 9)
    with pytest.raises(ValueError, match="schedule: 'finer-c8-m/ce/cublas' is not legal"):
        all_gather_matmul(a_shard, b, schedule="finer-c8-m/ce/cublas")  # 8 chunks of 5 rows
    with pytest.raises(ValueError, match="cannot run on cpu here: Triton's CPU interpreter"):
        all_gather_matmul(a_shard.bfloat16(), b.bfloat16(), schedule="shard/ce/triton")
    with pytest.raises(ValueError, match="a: has 5 rows, which 2 ranks cannot share evenly"):
        matmul_reduce_scatter(a_shard, b)
    with pytest.raises(ValueError, match="b: has 7 rows but a_shard has 9 columns"):
        all_gather_matmul(rand(1, 5, 9), b)
    with pytest.raises(ValueError, match="a_shard: dtype torch.float64 is not supported"):
        all_gather_matmul(a_shard.double(), b.double())


def test_refusals_name_the_field_and_rule():
    spawn(_refusals, 2)


# --- the table's pick, its fallback, the rank check -------------------------------------------


def _table_pick(rank, world):
    from ficco.ops import all_gather_matmul, choose, matmul_reduce_scatter
    from ficco.problem import Problem

    # two token counts in a row, as in a step whose token count changes: each call picks anew
    for S in (3, 8):
        a_shard, b, w = rand(rank, S, 6), rand(9 + rank, 6, 4), rand(19 + rank, 4, 6)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the shipped table's pick runs on CPU: no fallback
            c = all_gather_matmul(a_shard, b)
            d = matmul_reduce_scatter(c, w)
        close(c, ag_reference(a_shard, b, world))
        close(d, rs_reference(c, w, rank, world))
        p = Problem(pattern="ag_gemm", m=S * world, n=4, k=6, world=world, dtype="fp32")
        choice = choose(p, "", "", "cpu")
        assert choice.source == "table" and str(choice.schedule) != "serial/nccl/cublas"


def test_table_picked_schedule_runs_and_is_correct():
    spawn(_table_pick, 2)


def _fallback(rank, world, table):
    from ficco.ops import FallbackWarning, all_gather_matmul

    a_shard, b = rand(rank, 4, 6, dtype=torch.bfloat16), rand(5 + rank, 6, 3, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = all_gather_matmul(a_shard, b, table=table)
        again = all_gather_matmul(a_shard[:2], b, table=table)  # another shape, same reason
    ours = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    text = str(ours[0].message)
    assert "shard/ce/triton+hi" in text and "serial/nccl/cublas" in text and "bf16" in text
    close(first, ag_reference(a_shard, b, world), torch.bfloat16)
    close(again, ag_reference(a_shard[:2], b, world), torch.bfloat16)


def test_fallback_to_serial_warns_once(tmp_path):
    # a table whose answer (the safe default, asked outside its range) a CPU cannot run in bf16
    table = json.loads((ROOT / "schedules/h200x2/table.json").read_text())
    table["safe_default"]["ag_gemm"]["schedule"] = "shard/ce/triton+hi"
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    spawn(_fallback, 2, str(path))


def _diverged(rank, world):
    from ficco.ops import all_gather_matmul, choice

    a_shard, b = rand(rank, 4, 6), rand(5, 6, 3)
    same = all_gather_matmul(a_shard, b, schedule="shard/ce/cublas")  # agreed: the check passes
    close(same, ag_reference(a_shard, b, world))
    mine = "shard/ce/cublas" if rank == 0 else "serial/nccl/cublas"
    with pytest.raises(ValueError, match="every rank passes the same schedule="):
        all_gather_matmul(a_shard, b, schedule=mine)
    with pytest.raises(ValueError, match="operands disagree"):  # shapes, never the table
        all_gather_matmul(a_shard[: 2 + rank], b)
    # operands agreed, decisions not (another table or ficco version on one rank): the
    # debug check blames the decision, not the operands
    real = choice._choose

    def skewed(problem, schedule, table, target):
        picked = real(problem, schedule, table, target)
        return picked if rank == 0 else choice.Choice(problem, choice.SERIAL, "table", "skew")

    choice._choose = skewed
    try:
        with pytest.raises(RuntimeError, match="ranks took different decisions"):
            all_gather_matmul(a_shard[:3], b)
    finally:
        choice._choose = real


def test_debug_check_catches_rank_divergent_decisions():
    spawn(_diverged, 2, env={"FICCO_OPS_CHECK": "1"})


# --- autograd ------------------------------------------------------------------------------------


def mlp(x_shard, w1, w2, group=None, schedules=(None, None)):
    """A sequence-parallel MLP: column-linear (all-gather + matmul), row-linear (matmul +
    reduce-scatter). x_shard [S, D], w1 [D, H/W], w2 [H/W, D] -> [S, D]."""
    from ficco.ops import all_gather_matmul, matmul_reduce_scatter

    h = all_gather_matmul(x_shard, w1, group, schedule=schedules[0])
    return matmul_reduce_scatter(torch.tanh(h), w2, group, schedule=schedules[1])


def mlp_reference(x_shard, w1, w2, g, rank, world):
    """The same MLP in one process in float64 from every rank's tensors (gathered), autograd
    through plain matmuls; returns this rank's (loss, grad x_shard, grad w1, grad w2)."""
    leaves = [
        [t.detach().double().requires_grad_() for t in gathered(v, world)]
        for v in (x_shard, w1, w2)
    ]
    xs, w1s, w2s = leaves
    gs = gathered(g, world)
    x = torch.cat(xs)
    total = sum(torch.tanh(x @ w1s[r]) @ w2s[r] for r in range(world))
    S = x_shard.shape[0]
    losses = [(total[r * S : (r + 1) * S] * gs[r].double()).sum() for r in range(world)]
    sum(losses).backward()
    return losses[rank], xs[rank].grad, w1s[rank].grad, w2s[rank].grad


def count_runs() -> dict[str, int]:
    """Count the runs of each pattern through ficco in this process (forward and backward)."""
    from ficco.ops import library

    calls = {"ag_gemm": 0, "gemm_rs": 0}

    def counting(name: str, run):
        def counted(*args):
            calls[name] += 1
            return run(*args)

        return counted

    import dataclasses

    # the custom ops' implementations (traced calls, and backward) and the eager calls
    library.run_ag_gemm = counting("ag_gemm", library.run_ag_gemm)
    library.run_gemm_rs = counting("gemm_rs", library.run_gemm_rs)
    for op_name, pattern in (
        ("all_gather_matmul", "ag_gemm"),
        ("matmul_reduce_scatter", "gemm_rs"),
    ):
        op = library._OPS[op_name]
        library._OPS[op_name] = dataclasses.replace(op, run=counting(pattern, op.run))
    return calls


def _autograd(rank, world, schedules):
    S, D, H = 5, 7, 6  # odd: M = 5W tokens, model dim 7, hidden slice 6 per rank
    x_shard = rand(rank, S, D).requires_grad_()
    w1, w2 = rand(10 + rank, D, H).requires_grad_(), rand(20 + rank, H, D).requires_grad_()
    g = rand(30 + rank, S, D)
    calls = count_runs()
    loss = (mlp(x_shard, w1, w2, schedules=schedules) * g).sum()
    assert calls == {"ag_gemm": 1, "gemm_rs": 1}
    loss.backward()
    # each backward ran its dual pattern through ficco
    assert calls == {"ag_gemm": 2, "gemm_rs": 2}, calls
    want = mlp_reference(x_shard, w1, w2, g, rank, world)
    for got, ref in zip((loss, x_shard.grad, w1.grad, w2.grad), want, strict=True):
        close(got.detach(), ref.detach())


@pytest.mark.parametrize("world", [2, 3])
def test_autograd_matches_serial_reference(world):
    spawn(_autograd, world, (None, None))  # the table's picks, forward and backward


def test_autograd_with_explicit_forward_schedules():
    spawn(_autograd, 2, ("finer-c2-m/ce/cublas", "shard/nccl/cublas"))


# --- torch.compile -----------------------------------------------------------------------------


class TinyMLP(torch.nn.Module):
    def __init__(self, rank: int, group_name: str) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(rand(10 + rank, 7, 6))
        self.w2 = torch.nn.Parameter(rand(20 + rank, 6, 7))
        self.group_name = group_name

    def forward(self, x_shard):
        return mlp(x_shard, self.w1, self.w2, self.group_name)


def _compiled(rank, world):
    from torch._dynamo.testing import CompileCounterWithBackend

    group_name = dist.group.WORLD.group_name
    model = TinyMLP(rank, group_name)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(TinyMLP(rank, group_name), backend=counter, fullgraph=True)
    for S in (5, 3):  # a second token count: the op picks per call, the graph holds the op
        x = rand(rank + S, S, 7)
        want, got = model(x), compiled(x)
        close(got.detach(), want.detach().double())
        want.sum().backward()
        got.sum().backward()
        close(compiled.w1.grad, model.w1.grad.double())
        close(compiled.w2.grad, model.w2.grad.double())
        model.zero_grad()
        compiled.zero_grad()
    assert counter.frame_count >= 1
    graph_ops = {str(n.target) for g in counter.graphs for n in g.graph.nodes}
    assert any("ficco.all_gather_matmul" in t for t in graph_ops), graph_ops
    assert any("ficco.matmul_reduce_scatter" in t for t in graph_ops), graph_ops
    _compiled_all_reduce(rank, world)


def _compiled_all_reduce(rank, world):
    """linear_all_reduce compiled: its backward's all-reduce of grad_c is traced too."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from ficco.ops import linear_all_reduce

    def row_linear(x, weight):
        return linear_all_reduce(x, weight, dist.group.WORLD.group_name)

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(row_linear, backend=counter, fullgraph=True)
    weight = rand(50 + rank, 4, 6).requires_grad_()
    x = rand(60 + rank, 3, 2, 6)
    g = rand(70 + rank, 3, 2, 4)  # another loss on every rank: grad_c is all-reduced
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no table covers gemm_ar: serial, said once
        (row_linear(x, weight) * g).sum().backward()
        eager, weight.grad = weight.grad, None
        (compiled(x, weight) * g).sum().backward()
    close(weight.grad, eager.double())
    total_g = g.clone()
    dist.all_reduce(total_g)
    close(weight.grad, total_g.reshape(-1, 4).t().double() @ x.reshape(-1, 6).double())
    graph_ops = {str(n.target) for gm in counter.graphs for n in gm.graph.nodes}
    assert any("ficco.matmul_all_reduce" in t for t in graph_ops), graph_ops


def test_torch_compile_matches_eager():
    spawn(_compiled, 2)


def test_fake_shapes():
    from ficco.ops import library  # noqa: F401 - registers the ops

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rdv", rank=0, world_size=1)
        try:
            from torch._subclasses.fake_tensor import FakeTensorMode

            name = dist.group.WORLD.group_name
            with FakeTensorMode():
                c, a_full = torch.ops.ficco.all_gather_matmul(
                    torch.empty(5, 7), torch.empty(7, 9), name, "", "", []
                )
                out = torch.ops.ficco.matmul_reduce_scatter(
                    torch.empty(6, 7), torch.empty(7, 9), name, "", "", []
                )
                # leading dimensions, uneven rows, the all-reduce and its backward's sum
                c3, a3 = torch.ops.ficco.all_gather_matmul(
                    torch.empty(5, 2, 7), torch.empty(7, 9), name, "", "", [5]
                )
                ar = torch.ops.ficco.matmul_all_reduce(
                    torch.empty(3, 2, 7), torch.empty(7, 9), name, "", "", False
                )
                summed = torch.ops.ficco.all_reduce(torch.empty(3, 9), name)
            assert (tuple(c.shape), tuple(a_full.shape), tuple(out.shape)) == (
                (5, 9),
                (5, 7),
                (6, 9),
            )
            assert (tuple(c3.shape), tuple(a3.shape)) == ((5, 2, 9), (10, 7))
            assert (tuple(ar.shape), tuple(summed.shape)) == ((3, 2, 9), (3, 9))
        finally:
            dist.destroy_process_group()


def test_import_ficco_does_not_import_ops():
    import subprocess
    import sys

    code = "import sys, ficco; print('ficco.ops' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_readme_example_runs_under_torchrun_on_cpu(tmp_path):
    """The README's drop-in example, exactly as written, on 2 CPU ranks (gloo)."""
    import re
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "# tp_mlp.py" in b]
    assert len(blocks) == 1, "the README should show one tp_mlp.py example"
    script = tmp_path / "tp_mlp.py"
    script.write_text(blocks[0])
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for rank in (0, 1):
        for tokens in (32, 47):
            assert re.search(rf"rank {rank}: {tokens} tokens, loss [0-9.]+", out.stdout), out.stdout
    assert "FallbackWarning" not in out.stderr
