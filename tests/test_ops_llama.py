"""A Llama block through ficco.ops as a runtime runs it: tensor- and sequence-parallel over 2
gloo ranks, against the same block unsharded in float64.

The block is Llama's, written out: RMSNorm, grouped-query attention (4 query heads sharing 2
key/value heads) with rotary position embeddings and a causal mask, a SwiGLU MLP, residuals.
Sharded as Megatron does with sequence parallelism, in its ``[s, b, h]`` layout: each rank
holds a slice of the sequence between the linears; the fused q/k/v and gate/up projections
are column-parallel (``all_gather_linear``: the gathered rows come back in sequence order),
the output and down projections row-parallel (``linear_reduce_scatter``); the norms'
weights are replicated and their gradients all-reduced. The sequence has 7 tokens, split
4/3 (``rows``), and every weight is an ``nn.Linear``-style ``[out, in]`` tensor. Checked:
the output, every parameter's gradient, three SGD steps, and ``torch.compile(fullgraph=True)``
of the sharded block (forward and gradients) against eager.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from test_ops import close, spawn

D, HEADS, KV_HEADS, HD, FFN = 16, 4, 2, 4, 24  # model dim, heads, key/value heads, head dim, MLP
T, B, ROWS = 7, 2, [4, 3]  # tokens (split 4/3 over the ranks), batch
EPS, LR, STEPS = 1e-5, 0.002, 3  # the loss falls 693 -> 435 -> 359


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def rope(x):
    """Rotary embeddings of ``x [T, B, heads, HD]`` at positions 0..T-1 (half-split form)."""
    half = HD // 2
    freqs = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(x.shape[0], dtype=torch.float64)[:, None] * freqs[None]
    cos, sin = (f(angles).to(x.dtype)[:, None, None] for f in (torch.cos, torch.sin))
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention(q, k, v):
    """Causal GQA: ``q [T, B, h, HD]``, ``k, v [T, B, kv, HD]`` -> ``[T, B, h * HD]``."""
    repeat = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [B, h, T, HD]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.permute(2, 0, 1, 3).flatten(2)


def full_params(dtype) -> dict[str, torch.Tensor]:
    """The block's weights, the same on every rank (one seed), nn.Linear's [out, in]."""
    gen = torch.Generator().manual_seed(0)
    shapes = {
        "attn_norm": (D,), "wq": (HEADS * HD, D), "wk": (KV_HEADS * HD, D),
        "wv": (KV_HEADS * HD, D), "wo": (D, HEADS * HD), "mlp_norm": (D,),
        "w_gate": (FFN, D), "w_up": (FFN, D), "w_down": (D, FFN),
    }  # fmt: skip
    params = {n: torch.randn(s, generator=gen) / s[-1] ** 0.5 for n, s in shapes.items()}
    params["attn_norm"] = 1 + 0.1 * torch.randn(D, generator=gen)
    params["mlp_norm"] = 1 + 0.1 * torch.randn(D, generator=gen)
    return {n: p.to(dtype).requires_grad_() for n, p in params.items()}


def block(x, p):
    """The unsharded block: ``x [T, B, D]`` -> ``[T, B, D]``."""
    h = rms_norm(x, p["attn_norm"])
    q = (h @ p["wq"].t()).unflatten(-1, (HEADS, HD))
    k = (h @ p["wk"].t()).unflatten(-1, (KV_HEADS, HD))
    v = (h @ p["wv"].t()).unflatten(-1, (KV_HEADS, HD))
    x = x + attention(rope(q), rope(k), v) @ p["wo"].t()
    h = rms_norm(x, p["mlp_norm"])
    return x + (F.silu(h @ p["w_gate"].t()) * (h @ p["w_up"].t())) @ p["w_down"].t()


def shard_slices(rank: int, world: int) -> dict[str, tuple[int, slice]]:
    """(dimension, slice) of each weight this rank holds: heads, key/value heads and the MLP
    hidden units split W ways (the norms: replicated)."""
    q, kv, f = HEADS * HD // world, KV_HEADS * HD // world, FFN // world
    return {
        "wq": (0, slice(rank * q, (rank + 1) * q)),
        "wk": (0, slice(rank * kv, (rank + 1) * kv)),
        "wv": (0, slice(rank * kv, (rank + 1) * kv)),
        "wo": (1, slice(rank * q, (rank + 1) * q)),
        "w_gate": (0, slice(rank * f, (rank + 1) * f)),
        "w_up": (0, slice(rank * f, (rank + 1) * f)),
        "w_down": (1, slice(rank * f, (rank + 1) * f)),
    }


def part(t: torch.Tensor, where: tuple[int, slice]) -> torch.Tensor:
    dim, cut = where
    return t[cut] if dim == 0 else t[:, cut]


class ShardedBlock(torch.nn.Module):
    """The block on one rank of W: ``x_shard [ROWS[rank], B, D]`` -> the same shape."""

    def __init__(self, full: dict[str, torch.Tensor], rank: int, world: int, group_name: str):
        super().__init__()
        cut = shard_slices(rank, world)
        take = lambda name: part(full[name].detach(), cut[name])  # noqa: E731
        self.qkv = torch.nn.Parameter(torch.cat([take("wq"), take("wk"), take("wv")]))
        self.wo = torch.nn.Parameter(take("wo").clone())
        self.gate_up = torch.nn.Parameter(torch.cat([take("w_gate"), take("w_up")]))
        self.w_down = torch.nn.Parameter(take("w_down").clone())
        self.attn_norm = torch.nn.Parameter(full["attn_norm"].detach().clone())
        self.mlp_norm = torch.nn.Parameter(full["mlp_norm"].detach().clone())
        self.heads, self.kv_heads = HEADS // world, KV_HEADS // world
        self.group_name = group_name

    def forward(self, x_shard):
        from ficco.ops import all_gather_linear, linear_reduce_scatter

        g = self.group_name
        qkv = all_gather_linear(rms_norm(x_shard, self.attn_norm), self.qkv, g, rows=ROWS)
        q, k, v = qkv.split([self.heads * HD, self.kv_heads * HD, self.kv_heads * HD], dim=-1)
        heads = lambda t: t.unflatten(-1, (-1, HD))  # noqa: E731
        a = attention(rope(heads(q)), rope(heads(k)), heads(v))  # [T, B, heads * HD]
        x_shard = x_shard + linear_reduce_scatter(a, self.wo, g, rows=ROWS)
        gate, up = all_gather_linear(
            rms_norm(x_shard, self.mlp_norm), self.gate_up, g, rows=ROWS
        ).chunk(2, dim=-1)
        return x_shard + linear_reduce_scatter(F.silu(gate) * up, self.w_down, g, rows=ROWS)

    def replicated(self) -> list[torch.nn.Parameter]:
        return [self.attn_norm, self.mlp_norm]


def expected_grads(model: ShardedBlock, ref: dict[str, torch.Tensor], rank: int, world: int):
    """This rank's parameters' gradients as the unsharded block's gradients give them."""
    cut = shard_slices(rank, world)
    grad = lambda name: part(ref[name].grad, cut[name])  # noqa: E731
    return {
        "qkv": torch.cat([grad("wq"), grad("wk"), grad("wv")]),
        "wo": grad("wo"),
        "gate_up": torch.cat([grad("w_gate"), grad("w_up")]),
        "w_down": grad("w_down"),
        "attn_norm": ref["attn_norm"].grad,
        "mlp_norm": ref["mlp_norm"].grad,
    }


def sharded_grads(model: ShardedBlock) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, the replicated ones' summed over the ranks."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.clone()
        if any(p is q for q in model.replicated()):
            dist.all_reduce(g)
        out[name] = g
    return out


def _llama(rank, world):
    from torch._dynamo.testing import CompileCounterWithBackend

    group_name = dist.group.WORLD.group_name
    ref = full_params(torch.float64)
    model = ShardedBlock(full_params(torch.float32), rank, world, group_name)
    gen = torch.Generator().manual_seed(1)
    x, target = torch.randn(T, B, D, generator=gen), torch.randn(T, B, D, generator=gen)
    start = sum(ROWS[:rank])
    mine = slice(start, start + ROWS[rank])
    x_shard, target_shard = x[mine].clone().requires_grad_(), target[mine]
    x_ref = x.double().requires_grad_()
    for step in range(STEPS):
        model.zero_grad()
        for p in ref.values():
            p.grad = None
        out = model(x_shard)
        loss = ((out - target_shard) ** 2).sum()  # each rank's loss reads its own tokens
        loss.backward()
        out_ref = block(x_ref, ref)
        loss_ref = ((out_ref - target.double()) ** 2).sum()
        loss_ref.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        close(total, loss_ref.detach())
        grads, want = sharded_grads(model), expected_grads(model, ref, rank, world)
        for name, g in grads.items():
            close(g, want[name])
        if step == 0:
            close(out.detach(), out_ref[mine].detach())
            close(x_shard.grad, x_ref.grad[mine])
        with torch.no_grad():  # SGD, the replicated parameters with their summed gradients
            for name, p in model.named_parameters():
                p -= LR * grads[name]
            for p in ref.values():
                p -= LR * p.grad
    # torch.compile: one graph, no breaks, the same output and gradients as eager
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    x_shard.grad = None
    model.zero_grad()
    eager_out = model(x_shard)
    eager_out.sum().backward()
    eager = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled_out = compiled(x_shard)
    compiled_out.sum().backward()
    close(compiled_out.detach(), eager_out.detach().double())
    for name, p in model.named_parameters():
        close(p.grad, eager[name].double())
    assert counter.frame_count == 1, counter.frame_count
    targets = [str(n.target) for g in counter.graphs for n in g.graph.nodes]
    assert sum("ficco.all_gather_matmul" in t for t in targets) == 2, targets
    assert sum("ficco.matmul_reduce_scatter" in t for t in targets) == 2, targets


def test_llama_block_tp_sp_matches_unsharded_model():
    spawn(_llama, 2)
