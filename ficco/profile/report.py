"""Plots and a markdown summary of a profile store.

Files written to the output directory:

``speedup_heatmap.png``       speedup over serial (``t_gemm + t_comm`` / t(S)) per problem and
                              schedule, for the schedules that win or come close most often
                              (more pages, ``speedup_heatmap_2.png`` ..., for many problems)
``signature_breakdown.png``   where the time of the best and the runner-up schedule goes, as a
                              share of serial: a GEMM lane and a comm lane each (they run side
                              by side), each the undecomposed part alone plus its decomposition
                              and contention losses, against the measured t(S) and ideal
``share_of_ideal.png``        the realized share of the ideal gain (``pct_ideal``) of each
                              problem's best schedule, per model
``summary.md``                counts, fingerprints, the best schedule per problem

A store holding records of several machines (fingerprints) is reported per machine: a
``<fingerprint id>/`` directory of the plots above for each, and a section of ``summary.md``
for each. No figure mixes machines.

Stores measured on the ``cpu`` backend are marked: CPU timings exercise the harness only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.measure.fingerprint import identity
from ficco.outputs import staged_directory
from ficco.profile.frame import device_of, fingerprint_counts, frame_from_records, pick_fingerprint
from ficco.profile.report_markdown import CPU_NOTE, machine_markdown, markdown
from ficco.profile.store import Store
from ficco.profile.stores import open_store

if TYPE_CHECKING:
    import pandas as pd

#: most problems per heatmap page, schedules (columns) per heatmap, problems per breakdown page
HEATMAP_ROWS = 40
HEATMAP_COLUMNS = 24
BREAKDOWN_ROWS = 12

__all__ = ["CPU_NOTE", "best_table", "lane_segments", "summarize", "write_report"]


def problem_label(row: Any) -> str:
    """``llama3-70b.fc1 m=4096`` (the problem key when the problem has no name)."""
    name = row["problem_name"] or f"{row['pattern']} n={row['n']} k={row['k']} w={row['world']}"
    return f"{name} m={row['m']}"


def best_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per problem: best and runner-up correct schedules, speedup, share of ideal."""
    import pandas as pd

    sched = frame[frame["kind"] == "schedule"]
    ok = sched[(sched["verdict"] == "ok") & sched["median_ms"].notna()]
    complexity = {name: _complexity(name) for name in ok["name"].unique()}
    ok = ok.assign(_complexity=ok["name"].map(complexity))
    ok = ok.sort_values(["problem_key", "median_ms", "_complexity"])
    # each problem's rows, split once (in their order: the candidates fastest first)
    cands_of = dict(list(ok.groupby("problem_key", sort=False)))
    sched_of = dict(list(sched.groupby("problem_key", sort=False)))
    rows = []
    for key, group in frame.groupby("problem_key", sort=False):
        first = group.iloc[0]
        cands = cands_of.get(key, ok.iloc[:0])
        s_all = sched_of.get(key, sched.iloc[:0])
        row = {
            "problem_key": key,
            "problem": problem_label(first),
            "problem_name": first["problem_name"],
            "model": first["model"],
            "pattern": first["pattern"],
            "m": first["m"],
            "n": first["n"],
            "k": first["k"],
            "world": first["world"],
            "schedules": len(s_all),
            "failed": int((s_all["verdict"] != "ok").sum()),
            "serial_ms": first["serial_ms"],
            "ideal_ms": first["ideal_ms"],
        }
        for prefix, idx in (("best", 0), ("runner_up", 1)):
            hit = cands.iloc[idx] if len(cands) > idx else None
            row[prefix] = hit["name"] if hit is not None else None
            row[f"{prefix}_ms"] = hit["median_ms"] if hit is not None else math.nan
            row[f"{prefix}_spread_ms"] = hit["spread_ms"] if hit is not None else math.nan
        row["speedup"] = row["serial_ms"] / row["best_ms"] if row["best_ms"] else math.nan
        best = cands.iloc[0] if len(cands) else None
        row["pct_ideal"] = best["pct_ideal"] if best is not None else math.nan
        gap = row["runner_up_ms"] - row["best_ms"]
        noise = max(row["best_spread_ms"], row["runner_up_spread_ms"])
        row["within_noise"] = bool(gap <= noise) if not math.isnan(gap) else False
        rows.append(row)
    return pd.DataFrame(rows)


def summarize(frame: pd.DataFrame, store: Store | None = None) -> dict[str, Any]:
    """The summary object ``ficco report --json`` prints."""
    problems = frame["problem_key"].nunique()
    backends = sorted(set(frame["backend"]) - {""})
    return {
        "store": store.location if store is not None else None,
        "n_problems": int(problems),
        "n_records": len(frame),
        "n_failed": int((frame["verdict"] != "ok").sum()),
        "fingerprints": sorted(set(frame["fingerprint_id"]) - {""}),
        "backends": backends,
        "timings": "cpu harness" if "cpu" in backends else "gpu",
        "verdicts": {k: int(v) for k, v in frame["verdict"].value_counts().items()},
    }


def write_report(
    store: str | Path | Store, out_dir: str | Path, fingerprint: str | None = None
) -> dict[str, Any]:
    """Write the plots and summary of ``store`` (a directory, a database URL or a
    :class:`Store`) into ``out_dir``.

    Each machine (fingerprint: the identity a record was measured with) is reported on its
    own: no figure mixes machines, since a schedule's time on one says nothing of its time on
    another. A store of one machine (or ``fingerprint`` picking one) gets its plots in
    ``out_dir`` itself; a store of several gets a ``<fingerprint id>/`` directory of plots per
    machine and one ``summary.md`` with a section per machine.

    Returns :func:`summarize`'s object over all records plus ``machines`` (per fingerprint
    id: its own summary with ``device``, ``identity``, ``files`` and ``not_shown``: each
    figure or section left out, and why), ``files`` (every path written) and ``not_shown``
    (each machine's, prefixed with its fingerprint id where there are several)."""
    import matplotlib

    matplotlib.use("Agg")

    opened = open_store(store)
    try:
        records = opened.records()
    finally:
        if opened is not store:
            opened.close()
    frame = frame_from_records(records)
    if fingerprint is not None:
        frame = pick_fingerprint(frame, fingerprint, source=f"store {opened.location}")
    fingerprints = _record_fingerprints(records, opened)
    machines = fingerprint_counts(frame) or [(opened.header.get("fingerprint_id", ""), "", 0)]
    several = len(machines) > 1
    target = Path(out_dir)
    # the files are drawn in a temporary directory and moved into out_dir once all exist
    with staged_directory("out", target) as out:
        summary = summarize(frame, opened)
        summary["machines"] = {}
        files: list[Path] = []
        sections = []
        for fp_id, _, _ in machines:
            mine = frame[frame["fingerprint_id"].fillna("") == fp_id] if several else frame
            where = out / machine_directory(fp_id) if several else out
            where.mkdir(exist_ok=True)
            fp = fingerprints.get(fp_id) or opened.header.get("fingerprint", {})
            label = f"\n[{device_of(fp)}, fingerprint {fp_id or '(none)'}]" if several else ""
            part, table, drawn = _machine_report(mine, opened, where, fp, label)
            names = [f.relative_to(out).as_posix() for f in drawn]
            sections.append(machine_markdown(part, table, mine, names, fp))
            part["files"] = [str(target / name) for name in names]
            summary["machines"][fp_id] = part
            files += drawn
        summary["not_shown"] = [
            f"{fp_id}: {why}" if several else why
            for fp_id, part in summary["machines"].items()
            for why in part["not_shown"]
        ]
        md = out / "summary.md"
        md.write_text(markdown(summary, opened, sections))
        files.append(md)
    summary["files"] = [str(target / f.relative_to(out)) for f in files]
    return summary


def machine_directory(fp_id: str) -> str:
    """The directory of one machine's plots in a report of several machines."""
    return fp_id or "no-fingerprint"


def _record_fingerprints(records: list[dict[str, Any]], store: Store) -> dict[str, dict]:
    """``{fingerprint id: full fingerprint}``: as the records carry it (the first record of
    each id), else the store header's for its own id."""
    found: dict[str, dict] = {}
    for r in records:
        fp_id = r.get("fingerprint_id") or ""
        if fp_id not in found and r.get("fingerprint"):
            found[fp_id] = r["fingerprint"]
    header_id = store.header.get("fingerprint_id")
    if header_id is not None and header_id not in found:
        found[header_id] = store.header.get("fingerprint") or {}
    return found


def _machine_report(
    frame: pd.DataFrame, store: Store, out: Path, fp: dict[str, Any], label: str = ""
) -> tuple[dict[str, Any], pd.DataFrame | None, list[Path]]:
    """The plots of one machine's records into ``out``, ``label`` (which machine) under each
    title: (its summary, its best table, the files drawn)."""
    summary = summarize(frame, store)
    del summary["store"]
    summary["device"] = device_of(fp) if fp else ""
    summary["identity"] = identity(fp) if fp else {}
    cpu = summary["timings"] == "cpu harness"
    files: list[Path] = []
    not_shown: list[str] = []
    table = None
    if len(frame):
        table = best_table(frame)
        order = table.sort_values(["model", "problem_name", "pattern", "m"], kind="stable")
        note = label + _cpu_subtitle(frame)
        files += plot_speedup_heatmap(frame, order, out, note)
        breakdown = plot_signature_breakdown(frame, order, out, note)
        if not breakdown:
            not_shown.append(
                "signature_breakdown.png: no record carries a signature (the GEMM and comm "
                "parts timed alone and per task); a GPU store has them (ficco sweep --backend "
                "cuda, with --signatures, the default)"
            )
        files += breakdown
        if cpu:
            not_shown.append(
                "share_of_ideal.png and the signature overview: the share of the ideal gain "
                "and the losses behind it are GPU quantities; CPU harness timings say nothing "
                "about them (use a GPU store, e.g. ficco report --store profiles/h200x2/store)"
            )
        else:
            files += plot_share_of_ideal(table, out, note)
    summary["not_shown"] = not_shown
    return summary, table, files


# --- plots -----------------------------------------------------------------------------------


def _complexity(name: str) -> int:
    from ficco.space import Schedule

    try:
        return Schedule.parse(name).complexity
    except ValueError:
        return 1 << 30


def _pages(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def _page_name(stem: str, page: int) -> str:
    return f"{stem}.png" if page == 0 else f"{stem}_{page + 1}.png"


def _save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (every figure of the report at one resolution) and close it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cpu_subtitle(frame: pd.DataFrame) -> str:
    if "cpu" in set(frame["backend"]):
        return "\n[cpu backend: harness timings only, never for choosing schedules]"
    return ""


def plot_speedup_heatmap(
    frame: pd.DataFrame, order: pd.DataFrame, out: Path, note: str = ""
) -> list[Path]:
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    ok = frame[(frame["kind"] == "schedule") & (frame["verdict"] == "ok")]
    grid = ok.pivot_table(index="problem_key", columns="name", values="speedup", aggfunc="first")
    if grid.empty or grid.notna().sum().sum() == 0:
        return []
    # columns: the schedules closest to each problem's best, most often
    rel = grid.div(grid.max(axis=1), axis=0)
    score = (rel >= 0.97).sum() + rel.mean().fillna(0)
    columns = score.sort_values(ascending=False).index[:HEATMAP_COLUMNS].tolist()
    keys = [k for k in order["problem_key"] if k in grid.index]
    labels = dict(zip(order["problem_key"], order["problem"], strict=True))
    files = []
    for page, chunk in enumerate(_pages(keys, HEATMAP_ROWS)):
        data = grid.loc[chunk, columns].to_numpy(dtype=float)
        finite = data[np.isfinite(data)]
        lo, hi = float(finite.min()), float(finite.max())
        norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 0.999), vmax=max(hi, 1.001))
        fig, ax = plt.subplots(
            figsize=(max(8.0, 3.5 + 0.42 * len(columns)), 3.2 + 0.32 * len(chunk)),
            layout="constrained",
        )
        cmap = plt.get_cmap("RdYlGn").with_extremes(bad="#dddddd")
        image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, aspect="auto")
        ax.set_xticks(range(len(columns)), columns, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(len(chunk)), [labels[k] for k in chunk], fontsize=8)
        if data.size <= 300:
            for (i, j), value in np.ndenumerate(data):
                if math.isfinite(value):
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=6.5)
        fig.colorbar(image, ax=ax, label="speedup over serial")
        title = "Speedup over serial (gemm_alone + comm_alone) per problem and schedule\n(grey: not run or failed)"
        if len(keys) > HEATMAP_ROWS:
            title += f", page {page + 1}"
        ax.set_title(title + note, fontsize=10)
        files.append(_save(fig, out / _page_name("speedup_heatmap", page)))
    return files


#: the two lanes of a schedule's breakdown: (lane, base, decomposition, contention) colours
_LANES = (
    ("gemm", "GEMM", ("#4c72b0", "#dd8452", "#c44e52")),
    ("comm", "comm", ("#55a868", "#f2c14e", "#8172b3")),
)


def lane_segments(row: Any, side: str) -> list[tuple[str, float]]:
    """One lane of a schedule's breakdown, in ms: the undecomposed part alone (``t_gemm`` or
    ``t_comm``), its decomposition loss (the schedule's chunks alone, back to back, minus
    that) and its contention (the chunks inside the overlapped run against the same chunks
    alone, applied to the chunks' time alone). A loss below zero is a gain: the lane is that
    much shorter. Empty where the signature was not measured."""
    base = row[f"t_{side}_ms"]
    alone = row[f"{side}_chunks_alone_ms"]
    contention = row[f"{side}_contention"]
    if not all(isinstance(v, float | int) and math.isfinite(v) for v in (base, alone, contention)):
        return []
    return [("alone", base), ("decomposition", alone - base), ("contention", alone * contention)]


def plot_signature_breakdown(
    frame: pd.DataFrame, order: pd.DataFrame, out: Path, note: str = ""
) -> list[Path]:
    """Per problem, the best and the runner-up schedule, each as two lanes (GEMM, comm)
    that run side by side: what each lane costs over its undecomposed part alone, against
    the schedule's measured time, serial and ideal (all as shares of serial)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    order = order[order["best"].notna() & order["serial_ms"].notna()]
    signed = frame[frame[["gemm_contention", "comm_contention"]].notna().any(axis=1)]
    order = order[order["problem_key"].isin(set(signed["problem_key"]))]
    if order.empty:  # no problem has a schedule with a signature: nothing to break down
        return []
    indexed = frame.set_index(["problem_key", "name"])
    rows = order.to_dict("records")
    files = []
    per_problem = 5.0  # 2 schedules x 2 lanes, and a gap
    for page, chunk in enumerate(_pages(rows, BREAKDOWN_ROWS)):
        fig, ax = plt.subplots(figsize=(12, 1.8 + 0.95 * len(chunk)), layout="constrained")
        ticks, ticklabels = [], []
        longest = 1.0
        bars: list[tuple] = []  # (y, width, left, face, edge, hatch): one barh call per page
        for i, prob in enumerate(chunk):
            base_y = i * per_problem
            serial = prob["serial_ms"]
            ideal = prob["ideal_ms"] / serial
            ax.plot(
                [ideal, ideal],
                [base_y - 0.5, base_y + 3.5],
                color="black",
                linestyle=":",
                linewidth=1,
            )
            ticks.append(base_y + 1.5)
            ticklabels.append(prob["problem"])
            for j, which in enumerate(("best", "runner_up")):
                name = prob[which]
                if not isinstance(name, str):
                    continue
                rec = indexed.loc[(prob["problem_key"], name)]
                rec = rec.iloc[0] if rec.ndim > 1 else rec
                total = rec["median_ms"] / serial
                lane_ends = []
                for k, (side, _, colors) in enumerate(_LANES):
                    y = base_y + 2 * j + k
                    left = 0.0
                    segments = lane_segments(rec, side)  # [] without a signature
                    for (_, value), color in zip(segments, colors[: len(segments)], strict=True):
                        width = value / serial
                        if width >= 0:
                            bars.append((y, width, left, color, "white", None))
                        else:  # a gain: the part of the lane it took away, hatched
                            bars.append((y, -width, left + width, "white", color, "////"))
                        left += width
                    lane_ends.append(left)
                y0, y1 = base_y + 2 * j - 0.45, base_y + 2 * j + 1.45
                ax.plot([total, total], [y0, y1], color="black", linewidth=2)
                end = max([total, *lane_ends])
                longest = max(longest, end)
                tag = "best" if j == 0 else "2nd"
                ax.text(
                    end + 0.01,
                    base_y + 2 * j + 0.5,
                    f"{tag}: {name}  (t/serial {total:.2f})",
                    va="center",
                    fontsize=7.5,
                )
        if bars:  # in the order drawn: a later segment covers what an earlier one overlaps
            y, width, left, face, edge, hatch = zip(*bars, strict=True)
            ax.barh(
                y,
                width,
                left=left,
                color=face,
                height=0.8,
                edgecolor=edge,
                hatch=list(hatch),
                linewidth=0.5,
            )
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(ticks, ticklabels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, longest * 1.45)
        ax.set_xlabel("time as a share of serial (t_gemm + t_comm)")
        handles = []
        for _, label, colors in _LANES:
            handles += [
                Patch(color=colors[0], label=f"t_{label.lower()} alone (undecomposed)"),
                Patch(color=colors[1], label=f"{label} decomposition loss"),
                Patch(color=colors[2], label=f"{label} contention"),
            ]
        handles += [
            Patch(
                facecolor="white", edgecolor="grey", hatch="////", label="negative loss (a gain)"
            ),
            Line2D([], [], color="black", linewidth=2, label="measured t(S)"),
            Line2D([], [], color="black", linestyle="--", label="serial"),
            Line2D([], [], color="black", linestyle=":", label="ideal = max(t_gemm, t_comm)"),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8)
        title = (
            "Signature of the best and runner-up schedule: GEMM lane (upper) and comm lane "
            "(lower) of each, run side by side"
        )
        if len(rows) > BREAKDOWN_ROWS:
            title += f", page {page + 1}"
        ax.set_title(title + note, fontsize=10)
        files.append(_save(fig, out / _page_name("signature_breakdown", page)))
    return files


def plot_share_of_ideal(table: pd.DataFrame, out: Path, note: str = "") -> list[Path]:
    import matplotlib.pyplot as plt
    import numpy as np

    data = table[table["pct_ideal"].notna()].copy()
    if data.empty:
        return []
    data["model"] = data["model"].replace("", "(unnamed)")
    models = sorted(data["model"].unique())
    patterns = sorted(data["pattern"].unique())
    lo, hi = -1.0, 1.2
    fig, ax = plt.subplots(figsize=(max(7.0, 3.5 + 1.2 * len(models)), 5.5), layout="constrained")
    rng = np.random.default_rng(0)
    colors = dict(zip(patterns, plt.get_cmap("tab10").colors, strict=False))
    for x, model in enumerate(models):
        sub = data[data["model"] == model]
        for pattern, group in sub.groupby("pattern"):
            values = group["pct_ideal"].to_numpy(dtype=float)
            jitter = x + rng.uniform(-0.22, 0.22, size=len(values))
            clipped = (values < lo) | (values > hi)
            shown = np.clip(values, lo, hi)
            ax.scatter(
                jitter[~clipped], shown[~clipped], color=colors[pattern], s=28, label=pattern
            )
            ax.scatter(jitter[clipped], shown[clipped], color=colors[pattern], s=36, marker="v")
        median = float(np.clip(sub["pct_ideal"].median(), lo, hi))
        ax.plot([x - 0.3, x + 0.3], [median, median], color="black", linewidth=2)
    ax.axhline(0.0, color="grey", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="green", linestyle="--", linewidth=1)
    ax.text(len(models) - 0.5, 1.0, " ideal", va="bottom", ha="right", fontsize=8, color="green")
    ax.text(len(models) - 0.5, 0.0, " serial", va="bottom", ha="right", fontsize=8, color="grey")
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right")
    ax.set_xlim(-0.6, len(models) - 0.4)
    ax.set_ylim(lo - 0.08, hi + 0.08)
    ax.set_ylabel("share of the ideal gain realized by the best schedule")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    fig.legend(unique.values(), unique.keys(), fontsize=8, loc="outside right", title="pattern")
    title = "Realized share of the ideal gain across the catalog\n(best schedule per problem; bar: median; v: clipped to the axis)"
    ax.set_title(title + note, fontsize=10)
    return [_save(fig, out / "share_of_ideal.png")]
