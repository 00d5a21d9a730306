"""On one GPU: do this torch's symmetric-memory all-reduce ops take the calls ficco makes?

    python scripts/check_symm_ops_gpu.py [--out $OUT/symm_ops_single_gpu.json]

The ``symm1`` / ``symm2`` transports of gemm_ar call ``torch.ops.symm_mem.one_shot_all_reduce_out``
and ``two_shot_all_reduce_`` (``ficco.execute.allreduce.cuda_symm_all_reduce``) on a chunk: a
view at a row offset of a rendezvoused symmetric buffer. This checks, on a one-rank NCCL group
(a sum over one rank is the input), that both ops exist in the installed torch, accept such a
view in fp32 and bf16 at several offsets (chunks of a plan), write exactly the chunk (rows
around it untouched), and capture into a CUDA graph that replays correctly. The sums over
several ranks are checked by ``tests/gpu/test_symm_allreduce_gpu.py`` on 2 GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ficco.execute.allreduce import (  # noqa: E402
    ONE_SHOT,
    TWO_SHOT,
    cuda_symm_all_reduce,
    require_symm_ops,  # noqa: E402
)

ROWS, COLS = 512, 256
#: (first row, rows) of the chunks tried: the whole buffer, halves, an odd tail
CHUNKS = ((0, ROWS), (0, ROWS // 2), (ROWS // 2, ROWS // 2), (64, 1), (448, 64))


def check(kind: str, dtype: torch.dtype, group_name: str, graphed: bool) -> dict:
    import torch.distributed._symmetric_memory as symm_mem

    buf = symm_mem.empty((ROWS, COLS), dtype=dtype, device="cuda")
    symm_mem.rendezvous(buf, group_name)
    out = torch.full((ROWS, COLS), -7.0, dtype=dtype, device="cuda")
    results = []
    for first, rows in CHUNKS:
        torch.manual_seed(first + rows)
        data = torch.randn(ROWS, COLS, device="cuda").to(dtype)
        buf.copy_(data)
        out.fill_(-7.0)
        src = buf[first : first + rows]
        dst = src if kind == TWO_SHOT else out[first : first + rows]

        def call(src=src, dst=dst):
            cuda_symm_all_reduce(kind, src, dst, group_name)

        if graphed:
            graph = torch.cuda.CUDAGraph()
            call()  # warm up outside capture (the op's first call may allocate)
            buf.copy_(data)
            out.fill_(-7.0)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                call()
            buf.copy_(data)
            out.fill_(-7.0)
            graph.replay()
        else:
            call()
        torch.cuda.synchronize()
        got = buf if kind == TWO_SHOT else out
        chunk_ok = torch.equal(got[first : first + rows], data[first : first + rows])
        outside = torch.cat([got[:first], got[first + rows :]])
        expected_outside = (
            torch.cat([data[:first], data[first + rows :]])
            if kind == TWO_SHOT
            else torch.full_like(outside, -7.0)
        )
        untouched = torch.equal(outside, expected_outside)
        results.append(
            {
                "first_row": first,
                "rows": rows,
                "chunk_equal": chunk_ok,
                "outside_untouched": untouched,
            }
        )
    return {
        "kind": kind,
        "dtype": str(dtype).removeprefix("torch."),
        "graphed": graphed,
        "ok": all(r["chunk_equal"] and r["outside_untouched"] for r in results),
        "chunks": results,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "symm_ops_single_gpu.json")
    )
    args = parser.parse_args()
    from ficco.measure.fingerprint import fingerprint

    report: dict = {"torch": torch.__version__, "fingerprint": fingerprint("cuda"), "checks": []}
    try:
        require_symm_ops()
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        name = dist.group.WORLD.group_name
        for kind in (ONE_SHOT, TWO_SHOT):
            for dtype in (torch.float32, torch.bfloat16):
                for graphed in (False, True):
                    try:
                        report["checks"].append(check(kind, dtype, name, graphed))
                    except Exception as err:  # recorded, and the others go on
                        report["checks"].append(
                            {
                                "kind": kind,
                                "dtype": str(dtype),
                                "graphed": graphed,
                                "ok": False,
                                "error": f"{type(err).__name__}: {err}"[:2000],
                                "traceback": traceback.format_exc()[-3000:],
                            }
                        )
    except Exception as err:
        report["error"] = f"{type(err).__name__}: {err}"[:2000]
    report["all_ok"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for c in report["checks"]:
        print(
            f"{c['kind']:22s} {c['dtype']:10s} graphed={c['graphed']!s:5s} ok={c['ok']} {c.get('error', '')[:200]}"
        )
    print("all ok" if report["all_ok"] else f"NOT ok {report.get('error', '')}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
