"""The markdown summary of a profile report (``summary.md``); :mod:`ficco.profile.report`
writes it beside the plots.

A store measured on the ``cpu`` backend gets what its records hold (verdicts per problem, and
timings marked as CPU harness timings) and a list of what needs a GPU store, instead of the
signature overview that only GPU records can fill.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM
from ficco.profile.frame import device_of

if TYPE_CHECKING:
    import pandas as pd

    from ficco.profile.store import Store

CPU_NOTE = (
    "Measured on the cpu backend: host wall-clock timings that exercise the harness only. "
    "Never use them to choose schedules."
)


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.3g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _family(name: str) -> tuple[str, str]:
    """``finer-c4-m/ce/cublas+hi`` -> (``finer-m``, ``ce``)."""
    parts = name.split("/")
    granularity = parts[0]
    if granularity.startswith("finer-"):
        granularity = "finer-" + granularity.rsplit("-", 1)[-1]
    return granularity, parts[1] if len(parts) > 1 else ""


def _overview(frame: pd.DataFrame, table: pd.DataFrame, figures: list[str]) -> list[str]:
    """Aggregates over the store: per pattern, what the best schedules gain and lose, which
    families win, and how contention differs between transports."""
    import numpy as np

    lines: list[str] = []
    shown = [f for f in figures if f.endswith(".png")]
    if shown:
        lines += ["Figures: " + ", ".join(f"[{f}]({f})" for f in shown) + ".", ""]
    best = table[table["best"].notna() & table["serial_ms"].notna()].copy()
    if best.empty:
        return lines
    best["family"] = best["best"].map(lambda n: "/".join(_family(n)))
    best["serial_best"] = best["best"].str.startswith("serial/")
    sched = frame[(frame["kind"] == "schedule") & (frame["verdict"] == "ok")]
    cols = ["gemm_decomp_loss", "comm_decomp_loss", "gemm_contention", "comm_contention"]
    sig = sched.set_index(["problem_key", "name"])[cols]
    best_sig = sig.reindex(list(zip(best["problem_key"], best["best"], strict=True)))
    best[cols] = best_sig.to_numpy()
    rows = []
    for pattern, group in best.groupby("pattern"):
        rows.append(
            [
                pattern,
                len(group),
                float(np.exp(np.log(group["speedup"]).mean())),
                float(group["speedup"].min()),
                float(group["pct_ideal"].median()),
                int(group["serial_best"].sum()),
                int(group["within_noise"].sum()),
                *(float(group[c].median()) for c in cols),
            ]
        )
    lines += [
        "## Overview",
        "",
        "Per pattern: the best schedule's speedup over serial (geomean, lowest), the median "
        "share of the ideal gain it realizes, how often a serial schedule is best, how often "
        "the runner-up is within noise, and the median signature of the best schedules "
        "(``ficco.measure.record``: decomposition losses against the undecomposed part alone; contention of "
        "the chunks inside the overlapped run against the same chunks alone).",
        "",
        _md_table(
            [
                "pattern",
                "problems",
                "speedup geomean",
                "lowest",
                "share of ideal (median)",
                "serial best",
                "runner-up within noise",
                "GEMM decomp.",
                "comm decomp.",
                "GEMM contention",
                "comm contention",
            ],
            rows,
        ),
        "",
    ]
    wins = best.groupby(["pattern", "family"]).size().unstack(fill_value=0)
    lines += [
        "Best schedules by family (granularity and split / transport), problems won:",
        "",
        _md_table(
            ["pattern", *wins.columns],
            [[p, *(int(v) for v in wins.loc[p])] for p in wins.index],
        ),
        "",
    ]
    fam = sched.assign(
        transport=sched["name"].map(lambda n: _family(n)[1]),
        granularity=sched["name"].map(lambda n: _family(n)[0]),
    )
    overlapped = fam[fam["granularity"] != "serial"]
    if len(overlapped):
        by = overlapped.groupby(["pattern", "transport"])[cols].median()
        lines += [
            "Every overlapped (not serial) schedule measured, median signature per transport. "
            "Decomposition losses compare with the undecomposed GEMM and the collective as "
            "a runtime calls it (`comm_alone`, NCCL), so a transport whose transfers alone "
            "beat that collective shows a negative comm decomposition loss.",
            "",
            _md_table(
                ["pattern", "transport", *(c.replace("_", " ") for c in cols)],
                [[p, t, *(float(v) for v in by.loc[(p, t)])] for p, t in by.index],
            ),
            "",
        ]
    above = best[best["pct_ideal"] > 1.0]
    if len(above):
        faster = int((above["gemm_decomp_loss"] < 0).sum())
        lines += [
            f"{len(above)} problem(s) realize more than the ideal gain (share above 1); in "
            f"{faster} of them the best schedule's GEMM chunks, run alone, are faster than the "
            "undecomposed GEMM (a negative GEMM decomposition loss), so `max(t_gemm, t_comm)` "
            "is not a floor there.",
            "",
        ]
    return lines


def markdown(summary: dict[str, Any], store: Store, sections: list[list[str]]) -> str:
    """``summary.md``: the store's counts, then ``sections`` (:func:`machine_markdown`, one
    per machine of ``summary["machines"]``, in that order): the one machine's lines as they
    are, or a ``## Machine`` section each where the store holds several."""
    lines = [
        "# ficco profile report",
        "",
        f"Store `{store.location}`: {summary['n_problems']} problems, {summary['n_records']} "
        f"records, {summary['n_failed']} not ok.",
    ]
    machines = summary["machines"]
    if len(machines) <= 1:
        return "\n".join(lines + [body for section in sections for body in section])
    listing = "; ".join(
        f"`{fp_id or '(none)'}` {part['device'] or '?'} ({part['n_records']} records)"
        for fp_id, part in machines.items()
    )
    lines += [
        f"Its records come from {len(machines)} machines or software stacks (fingerprints), "
        f"each reported on its own below, with its plots in a directory named by its "
        f"fingerprint id: {listing}. No figure mixes them: a schedule's time on one machine "
        "says nothing of its time on another.",
        "",
    ]
    for (fp_id, part), section in zip(machines.items(), sections, strict=True):
        lines += [f"## Machine `{fp_id or '(none)'}`: {part['device'] or '?'}", ""]
        # the machine's own headings one level down
        lines += ["#" + line if line.startswith("## ") else line for line in section]
    return "\n".join(lines)


def machine_markdown(
    summary: dict[str, Any],
    table: pd.DataFrame | None,
    frame: pd.DataFrame | None,
    figures: list[str],
    fp: dict[str, Any],
) -> list[str]:
    """The lines of one machine's part of ``summary.md``: its counts and fingerprint, its
    verdicts, its overview (or what its CPU records hold), its best schedule per problem and
    what is not shown; ``figures`` are its plots, as paths relative to ``summary.md``."""
    lines = [
        f"Backend {', '.join(summary['backends']) or '?'}; machine {device_of(fp)}; torch "
        f"{fp.get('torch')}, Triton {fp.get('triton')}, NCCL {fp.get('nccl')}; fingerprint "
        f"{', '.join(summary['fingerprints']) or '(none)'}; {summary['n_problems']} problems, "
        f"{summary['n_records']} records, {summary['n_failed']} not ok.",
        "",
    ]
    cpu = summary.get("timings") == "cpu harness"
    if cpu:
        lines += [f"> {CPU_NOTE}", ""]
    verdicts = ", ".join(f"{k}: {v}" for k, v in sorted(summary["verdicts"].items()))
    lines += [f"Verdicts: {verdicts}.", ""]
    if cpu and table is not None and len(table) and frame is not None:
        lines += _cpu_records(frame, table, figures)
    elif table is not None and len(table) and frame is not None:
        lines += _overview(frame, table, figures)
    if not cpu and table is not None and len(table):
        lines += [
            "## Best schedule per problem",
            "",
            "Speedup is over serial (`gemm_alone + comm_alone`); share of ideal is "
            "`(speedup - 1) / (serial / ideal - 1)`. *within noise*: the runner-up is closer "
            "than the larger spread (p90 - p10) of the two, so their order is not measured.",
            "",
        ]
        rows = []
        for r in table.sort_values(["model", "problem_name", "pattern", "m"]).to_dict("records"):
            rows.append(
                [
                    r["problem"],
                    r["pattern"],
                    f"{r['m']}x{r['n']}x{r['k']} w{r['world']}",
                    r["best"] or "(none correct)",
                    r["best_ms"],
                    r["speedup"],
                    r["pct_ideal"],
                    r["runner_up"] or "",
                    "yes" if r["within_noise"] else "",
                    f"{r['failed']}/{r['schedules']}",
                ]
            )
        lines.append(
            _md_table(
                [
                    "problem",
                    "pattern",
                    "MxNxK",
                    "best",
                    "ms",
                    "speedup",
                    "share of ideal",
                    "runner-up",
                    "within noise",
                    "failed",
                ],
                rows,
            )
        )
        lines.append("")
    missing = []
    if table is not None:
        missing = table[table["serial_ms"].isna()]["problem"].tolist()
    if missing:
        lines += [
            f"Problems without both `{BASELINE_GEMM}` and `{BASELINE_COMM}` baselines (no "
            f"signatures): {', '.join(missing)}.",
            "",
        ]
    if summary.get("not_shown"):
        lines += ["## Needs a GPU store" if cpu else "## Not shown", ""]
        lines += [f"- {why}" for why in summary["not_shown"]] + [""]
    return lines


def _cpu_records(frame: pd.DataFrame, table: pd.DataFrame, figures: list[str]) -> list[str]:
    """What CPU records hold: per problem, the verdicts of the schedules run (each checked
    against the float64 reference) and the harness timings, marked as such."""
    lines: list[str] = []
    shown = [f for f in figures if f.endswith(".png")]
    if shown:
        lines += ["Figures (CPU harness timings): " + ", ".join(f"[{f}]({f})" for f in shown)]
        lines += [""]
    sched = frame[frame["kind"] == "schedule"]
    rows = []
    for r in table.sort_values(["model", "problem_name", "pattern", "m"]).to_dict("records"):
        mine = sched[sched["problem_key"] == r["problem_key"]]
        others = mine[mine["verdict"] != "ok"]["verdict"].value_counts()
        rows.append(
            [
                r["problem"],
                r["pattern"],
                f"{r['m']}x{r['n']}x{r['k']} w{r['world']}",
                len(mine),
                int((mine["verdict"] == "ok").sum()),
                ", ".join(f"{v}: {n}" for v, n in others.items()) or "",
                r["best"] or "(none correct)",
                r["best_ms"],
                r["serial_ms"],
            ]
        )
    lines += [
        "## What these CPU records hold",
        "",
        "Every schedule ran on CPU processes (gloo, Triton under its interpreter) and its "
        "result was checked against the float64 reference: the verdicts are real. The times "
        "are CPU harness timings (host wall clock between verified results, verification "
        "included): they exercise the pipeline and rank nothing.",
        "",
        _md_table(
            [
                "problem",
                "pattern",
                "MxNxK",
                "schedules",
                "ok",
                "not ok",
                "fastest (harness)",
                "CPU harness ms",
                "gemm_alone + comm_alone, CPU harness ms",
            ],
            rows,
        ),
        "",
    ]
    return lines
