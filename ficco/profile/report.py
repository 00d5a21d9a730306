"""Plots and a markdown summary of a profile store.

Files written to the output directory:

``speedup_heatmap.png``       speedup over serial (``t_gemm + t_comm`` / t(S)) per problem and
                              schedule, for the schedules that win or come close most often
                              (more pages, ``speedup_heatmap_2.png`` ..., for many problems)
``signature_breakdown.png``   where the time of the best and the runner-up schedule goes, as a
                              share of serial: ideal, decomposition and contention losses of
                              each side, and what is left exposed (sync, launch, waits)
``share_of_ideal.png``        the realized share of the ideal gain (``pct_ideal``) of each
                              problem's best schedule, per model
``summary.md``                counts, fingerprints, the best schedule per problem

Stores measured on the ``cpu`` backend are marked: CPU timings exercise the harness only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ficco.measure.record import BASELINE_COMM, BASELINE_GEMM
from ficco.profile.frame import load_frame
from ficco.profile.store import ProfileStore

if TYPE_CHECKING:
    import pandas as pd

#: most problems per heatmap page, schedules (columns) per heatmap, problems per breakdown page
HEATMAP_ROWS = 40
HEATMAP_COLUMNS = 24
BREAKDOWN_ROWS = 16

CPU_NOTE = (
    "Measured on the cpu backend: host wall-clock timings that exercise the harness only. "
    "Never use them to choose schedules."
)


def problem_label(row: Any) -> str:
    """``llama3-70b.fc1 m=4096`` (the problem key when the problem has no name)."""
    name = row["problem_name"] or f"{row['pattern']} n={row['n']} k={row['k']} w={row['world']}"
    return f"{name} m={row['m']}"


def best_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per problem: best and runner-up correct schedules, speedup, share of ideal."""
    import pandas as pd

    sched = frame[frame["kind"] == "schedule"]
    ok = sched[(sched["verdict"] == "ok") & sched["median_ms"].notna()]
    ok = ok.assign(_complexity=ok["name"].map(_complexity))
    ok = ok.sort_values(["problem_key", "median_ms", "_complexity"])
    rows = []
    for key, group in frame.groupby("problem_key", sort=False):
        first = group.iloc[0]
        cands = ok[ok["problem_key"] == key]
        s_all = sched[sched["problem_key"] == key]
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


def summarize(frame: pd.DataFrame, store: ProfileStore | None = None) -> dict[str, Any]:
    """The summary object ``ficco report --json`` prints."""
    problems = frame["problem_key"].nunique()
    return {
        "store": str(store.path) if store is not None else None,
        "n_problems": int(problems),
        "n_records": len(frame),
        "n_failed": int((frame["verdict"] != "ok").sum()),
        "fingerprints": sorted(set(frame["fingerprint_id"]) - {""}),
        "backends": sorted(set(frame["backend"]) - {""}),
        "verdicts": {k: int(v) for k, v in frame["verdict"].value_counts().items()},
    }


def write_report(store_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Write the plots and summary of the store at ``store_dir`` into ``out_dir``.

    Returns :func:`summarize`'s object plus ``files``: the paths written."""
    import matplotlib

    matplotlib.use("Agg")

    store = ProfileStore.read(store_dir)
    frame = load_frame(store)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(frame, store)
    files: list[Path] = []
    if len(frame):
        table = best_table(frame)
        order = table.sort_values(["model", "problem_name", "pattern", "m"], kind="stable")
        note = _cpu_subtitle(frame)
        files += plot_speedup_heatmap(frame, order, out, note)
        files += plot_signature_breakdown(frame, order, out, note)
        files += plot_share_of_ideal(table, out, note)
    else:
        table = None
    md = out / "summary.md"
    md.write_text(_markdown(summary, table, store))
    files.append(md)
    summary["files"] = [str(f) for f in files]
    return summary


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
        path = out / _page_name("speedup_heatmap", page)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    return files


#: stacked parts of a schedule's time as a share of serial, with their colours
_PARTS = (
    ("ideal", "max(t_gemm, t_comm)", "#4c72b0"),
    ("gemm_decomp", "GEMM decomposition loss", "#dd8452"),
    ("comm_decomp", "comm decomposition loss", "#f2c14e"),
    ("gemm_cont", "GEMM contention", "#c44e52"),
    ("comm_cont", "comm contention", "#8172b3"),
    ("other", "exposed rest (sync, launch, waits)", "#b0b0b0"),
)


def _parts(row: Any) -> dict[str, float]:
    serial = row["serial_ms"]

    def share(value: float) -> float:
        return max(0.0, value / serial) if math.isfinite(value) and serial else 0.0

    parts = {
        "ideal": share(row["ideal_ms"]),
        "gemm_decomp": share(row["gemm_decomp_loss"] * row["t_gemm_ms"]),
        "comm_decomp": share(row["comm_decomp_loss"] * row["t_comm_ms"]),
        "gemm_cont": share(row["gemm_in_overlap_ms"] - row["gemm_chunks_alone_ms"]),
        "comm_cont": share(row["comm_in_overlap_ms"] - row["comm_chunks_alone_ms"]),
    }
    parts["other"] = max(0.0, share(row["median_ms"]) - sum(parts.values()))
    return parts


def plot_signature_breakdown(
    frame: pd.DataFrame, order: pd.DataFrame, out: Path, note: str = ""
) -> list[Path]:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    order = order[order["best"].notna() & order["serial_ms"].notna()]
    if order.empty:
        return []
    indexed = frame.set_index(["problem_key", "name"])
    rows = order.to_dict("records")
    files = []
    for page, chunk in enumerate(_pages(rows, BREAKDOWN_ROWS)):
        fig, ax = plt.subplots(figsize=(12, 1.6 + 0.62 * len(chunk)), layout="constrained")
        ticks, ticklabels = [], []
        longest = 1.0
        for i, prob in enumerate(chunk):
            base = i * 3
            ticks.append(base + 0.5)
            ticklabels.append(prob["problem"])
            for j, which in enumerate(("best", "runner_up")):
                name = prob[which]
                if not isinstance(name, str):
                    continue
                rec = indexed.loc[(prob["problem_key"], name)]
                rec = rec.iloc[0] if rec.ndim > 1 else rec
                y, left = base + j, 0.0
                for part, value in _parts(rec).items():
                    color = next(c for p, _, c in _PARTS if p == part)
                    ax.barh(y, value, left=left, color=color, height=0.8, edgecolor="white")
                    left += value
                total = rec["median_ms"] / rec["serial_ms"]
                longest = max(longest, left, total)
                ax.plot([total, total], [y - 0.4, y + 0.4], color="black", linewidth=1.5)
                tag = "best" if j == 0 else "2nd"
                ax.text(
                    max(left, total) + 0.01,
                    y,
                    f"{tag}: {name}  ({total:.2f})",
                    va="center",
                    fontsize=7.5,
                )
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(ticks, ticklabels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, longest * 1.55)
        ax.set_xlabel("time as a share of serial (dashed: serial; black tick: measured t(S))")
        handles = [Patch(color=c, label=label) for _, label, c in _PARTS]
        fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=8)
        title = "Signature of the best and runner-up schedule per problem"
        if len(rows) > BREAKDOWN_ROWS:
            title += f", page {page + 1}"
        ax.set_title(title + note, fontsize=10)
        path = out / _page_name("signature_breakdown", page)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
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
    path = out / "share_of_ideal.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


# --- markdown ---------------------------------------------------------------------------------


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:.3g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _markdown(summary: dict[str, Any], table: pd.DataFrame | None, store: ProfileStore) -> str:
    fp = store.header.get("fingerprint", {})
    lines = [
        "# ficco profile report",
        "",
        f"Store `{store.path}`: {summary['n_problems']} problems, {summary['n_records']} "
        f"records, {summary['n_failed']} not ok.",
        f"Backend {', '.join(summary['backends']) or '?'}; machine {fp.get('gpu') or 'no GPU'} "
        f"x{fp.get('gpu_count', 0)}; torch {fp.get('torch')}, Triton {fp.get('triton')}, NCCL "
        f"{fp.get('nccl')}; fingerprint(s) {', '.join(summary['fingerprints'])}.",
        "",
    ]
    if "cpu" in summary["backends"]:
        lines += [f"> {CPU_NOTE}", ""]
    verdicts = ", ".join(f"{k}: {v}" for k, v in sorted(summary["verdicts"].items()))
    lines += [f"Verdicts: {verdicts}.", ""]
    if table is not None and len(table):
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
    return "\n".join(lines)
