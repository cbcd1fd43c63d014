"""The evaluation report: a self-contained report.html (PNGs embedded as base64), its figures,
and the summary table on stdout. Inputs: metrics.csv's frame, the metadata dict and the per-run
logs under OUT/runs (see :mod:`jigsaw_env.evaluate`).

Confidence intervals are over seeds: mean +- t_{0.975, n-1} x sd / sqrt(n) (Student's t, sd with
n - 1 degrees of freedom); none for n = 1.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

SIZE_BUCKETS = [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 10**9)]
SUMMARY_METRICS = [("avg_jct_s", "mean JCT (h)", 1 / 3600), ("p95_jct_s", "p95 JCT (h)", 1 / 3600),
                   ("p99_jct_s", "p99 JCT (h)", 1 / 3600), ("makespan_s", "makespan (h)", 1 / 3600),
                   ("avg_queue_s", "mean queueing (h)", 1 / 3600), ("saturated_efficiency", "saturated efficiency", 1.0),
                   ("cluster_efficiency", "cluster efficiency", 1.0),
                   ("gpu_utilization", "GPU util.", 1.0), ("compute_utilization", "compute util.", 1.0),
                   ("ftf_mean", "FTF rho mean", 1.0), ("jobs_completed", "jobs done", 1.0)]


# ----------------------------------------------------------------------------------------------- stats
def ci95(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, half-width of the 95% CI, n) over the finite values; half-width NaN when n < 2."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    n = len(x)
    if n == 0:
        return float("nan"), float("nan"), 0
    m = float(x.mean())
    if n < 2:
        return m, float("nan"), n
    from scipy.stats import t
    return m, float(t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)), n


#: the metrics whose per-seed paired difference from a baseline agent evaluate reports (--baseline)
PAIRED_METRICS = (("avg_jct_s", "mean JCT (h)", 1 / 3600), ("saturated_efficiency", "saturated efficiency", 1.0),
                  ("cluster_efficiency", "cluster efficiency", 1.0))


def paired_differences(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (agent other than ``baseline``, load, eta, metric of :data:`PAIRED_METRICS`): the mean
    over seeds of ``metric(agent, seed) - metric(baseline, seed)`` on the same job set, the
    half-width of its 95% CI (t distribution; NaN with fewer than two seeds) and the number of
    seeds both finished."""
    keys = ["load", "eta", "seed"]
    base = df[df["agent"] == baseline].copy()
    base["eta"], base["load"] = base["eta"].astype(str), _num(base["load"])
    rows = []
    for agent in dict.fromkeys(df["agent"]):
        if agent == baseline:
            continue
        a = df[df["agent"] == agent].copy()
        a["eta"], a["load"] = a["eta"].astype(str), _num(a["load"])
        m = a.merge(base, on=keys, suffixes=("", "_base"))
        for (load, eta), g in m.groupby(["load", "eta"], sort=False, dropna=False):
            for col, _, _ in PAIRED_METRICS:
                if col not in g.columns:
                    continue
                mean, half, n = ci95((_num(g[col]) - _num(g[col + "_base"])).tolist())
                rows.append({"agent": agent, "baseline": baseline, "load": load, "eta": eta, "metric": col,
                             "mean_diff": mean, "ci95": half, "seeds": n})
    return pd.DataFrame(rows, columns=["agent", "baseline", "load", "eta", "metric", "mean_diff", "ci95", "seeds"])


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (agent, load, eta): mean and CI half-width of each summary metric."""
    rows = []
    keys = ["agent", "load", "eta"]
    order = {a: i for i, a in enumerate(dict.fromkeys(df["agent"]))}
    for (agent, load, eta), g in df.groupby(keys, sort=False, dropna=False):
        r: dict[str, Any] = {"agent": agent, "load": load, "eta": eta, "seeds": len(g)}
        for col, _, _ in SUMMARY_METRICS:
            if col in g.columns:
                m, h, _ = ci95(_num(g[col]).tolist())
                r[col], r[col + "_ci"] = m, h
        rows.append(r)
    out = pd.DataFrame(rows)
    if len(out):
        out["_o"] = out["agent"].map(order)
        out = out.sort_values(["_o"], kind="stable").drop(columns="_o").reset_index(drop=True)
    return out


def _fmt(v: float, scale: float = 1.0, ci: float | None = None, integer: bool = False) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    x = v * scale
    if integer and float(x).is_integer():
        return f"{int(x):,d}"
    digits = 3 if abs(x) < 10 else (2 if abs(x) < 100 else 0)
    s = f"{x:,.{digits}f}"
    if ci is not None:
        s += f" ± {ci * scale:,.{digits}f}" if np.isfinite(ci) else " ± n/a"
    return s


# ----------------------------------------------------------------------------------------------- figures
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _colors(agents: Sequence[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {a: cmap(i % 10) for i, a in enumerate(agents)}


def _read(out: Path, rel: str, name: str) -> pd.DataFrame | None:
    p = out / rel / name
    return pd.read_csv(p) if p.is_file() else None


def fig_jct_cdf(out: Path, base: pd.DataFrame, agents: Sequence[str], colors) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    lo = math.inf
    for a in agents:
        frames = [_read(out, r, "jobs.csv") for r in base.loc[base["agent"] == a, "run_dir"]]
        jct = pd.concat([f for f in frames if f is not None])
        x = np.sort(jct.loc[jct["status"] == "done", "jct_s"].to_numpy(float) / 3600.0)
        if len(x):
            lo = min(lo, x[x > 0].min() if (x > 0).any() else 1e-3)
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=a, color=colors[a])
    ax.set_xscale("log")
    ax.set(xlabel="JCT (hours, log scale)", ylabel="fraction of jobs", title="JCT CDF (all seeds pooled)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _png(fig)


def _bucket(n: int) -> str:
    for lo, hi in SIZE_BUCKETS:
        if lo <= n <= hi:
            return str(lo) if lo == hi else (f"{lo}-{hi}" if hi < 10**9 else f"{lo}+")
    return str(n)


def fig_jct_by_size(out: Path, base: pd.DataFrame, agents: Sequence[str], colors) -> bytes:
    plt = _plt()
    per: dict[str, dict[str, list[float]]] = {}
    labels_all: list[str] = []
    for a in agents:
        per[a] = {}
        for r in base.loc[base["agent"] == a, "run_dir"]:
            j = _read(out, r, "jobs.csv")
            if j is None:
                continue
            j = j[j["status"] == "done"]
            for b, g in j.groupby(j["num_gpus"].map(_bucket)):
                per[a].setdefault(b, []).append(float(g["jct_s"].mean()) / 3600.0)
    order = [_bucket(lo) for lo, _ in SIZE_BUCKETS]
    labels_all = [b for b in order if any(b in per[a] for a in agents)]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels_all) * max(1, len(agents)) / 2), 4))
    w = 0.8 / max(1, len(agents))
    x = np.arange(len(labels_all))
    for i, a in enumerate(agents):
        stats = [ci95(per[a].get(b, [])) for b in labels_all]
        ax.bar(x + i * w - 0.4 + w / 2, [s[0] for s in stats], w, yerr=[0 if not np.isfinite(s[1]) else s[1] for s in stats],
               capsize=2, label=a, color=colors[a])
    ax.set_xticks(x, labels_all)
    ax.set_ylim(bottom=0)
    ax.set(xlabel="job size (GPUs)", ylabel="mean JCT (h)", title="JCT by job size (mean over seeds, 95% CI)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _png(fig)


def fig_timeline(out: Path, base: pd.DataFrame, agents: Sequence[str], colors, gpus: int) -> bytes:
    plt = _plt()
    seed = int(base["seed"].min())
    fig, ax = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for a in agents:
        rows = base[(base["agent"] == a) & (base["seed"] == seed)]
        if not len(rows):
            continue
        c = _read(out, rows["run_dir"].iloc[0], "cluster.csv")
        if c is None or not len(c):
            continue
        t = np.append(c["start_s"].to_numpy(float), c["end_s"].to_numpy(float)[-1]) / 3600.0
        dur = np.maximum(c["end_s"].to_numpy(float) - c["start_s"].to_numpy(float), 1e-12)
        util = c["allocated_gpu_s"].to_numpy(float) / (gpus * dur)
        q = c["queued"].to_numpy(float)
        ax[0].stairs(q, t, label=a, color=colors[a])
        ax[1].stairs(util, t, label=a, color=colors[a])
    ax[0].set(ylabel="jobs waiting", title=f"queue length and allocated GPU utilization over time (seed {seed})")
    ax[1].set(xlabel="time (h)", ylabel="allocated GPU utilization", ylim=(0, 1.05))
    for x in ax:
        x.grid(alpha=0.3)
    ax[0].legend(fontsize=8)
    return _png(fig)


def fig_bars(summary: pd.DataFrame, agents: Sequence[str], colors) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(1, 3, figsize=(max(10, 1.9 * len(agents) + 4), 3.8))
    s = summary.set_index("agent").reindex(agents)
    for k, (col, title, scale) in enumerate((("saturated_efficiency", "saturated efficiency", 1.0),
                                              ("cluster_efficiency", "cluster efficiency", 1.0),
                                              ("avg_jct_s", "mean JCT (h)", 1 / 3600))):
        m = s[col].to_numpy(float) * scale
        e = s[col + "_ci"].to_numpy(float) * scale
        # no bar where the interval is undefined (one seed): a zero-width bar would claim certainty
        ax[k].bar(range(len(agents)), m, yerr=np.where(np.isfinite(e), e, np.nan) if np.isfinite(e).any() else None,
                  capsize=4, color=[colors[a] for a in agents])
        if not np.isfinite(e).all():
            ax[k].text(0.99, 0.99, "CI n/a (one seed)", transform=ax[k].transAxes, ha="right", va="top", fontsize=8)
        ax[k].set_xticks(range(len(agents)), agents, rotation=20, ha="right")
        ax[k].set(title=f"{title} (mean, 95% CI)")
        ax[k].set_ylim(bottom=0)
        ax[k].grid(alpha=0.3, axis="y")
    return _png(fig)


def fig_spb_levels(out: Path, base: pd.DataFrame, agents: Sequence[str], max_level: int) -> bytes | None:
    plt = _plt()
    if not agents:
        return None
    seed = int(base["seed"].min())
    fig, axes = plt.subplots(len(agents), 1, figsize=(8, 2.4 * len(agents) + 0.6), sharex=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, a in zip(axes[:, 0], agents):
        rows = base[(base["agent"] == a) & (base["seed"] == seed)]
        c = _read(out, rows["run_dir"].iloc[0], "cluster.csv") if len(rows) else None
        if c is None or not len(c):
            ax.set_title(f"{a}: no log")
            continue
        t = c["start_s"].to_numpy(float) / 3600.0
        L = max(1, max_level)
        ys = [c[f"level{lv}"].to_numpy(float) for lv in range(L + 1) if f"level{lv}" in c.columns]
        ax.stackplot(t, *ys, step="post", labels=[f"level {lv}" for lv in range(len(ys))],
                     colors=[cmap(lv / max(1, len(ys) - 1)) for lv in range(len(ys))])
        tot = sum(y.sum() for y in ys)
        spb = sum(y.sum() for y in ys[1:])
        ax.set(ylabel="running jobs", title=f"{a}: jobs per SPB level (seed {seed}); "
                                            f"{(100 * spb / tot) if tot else 0:.1f}% of job-rounds at level > 0")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right", ncol=len(ys))
    axes[-1, 0].set_xlabel("time (h)")
    return _png(fig)


def fig_sweep(df: pd.DataFrame, agents: Sequence[str], colors, by: str, fixed: dict, xlabel: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    sub = df
    for k, v in fixed.items():
        sub = sub[(sub[k].astype(str) == str(v))] if not (isinstance(v, float) and math.isnan(v)) else sub[sub[k].isna()]
    for a in agents:
        g = sub[sub["agent"] == a]
        xs = sorted(_num(g[by]).dropna().unique())
        for k, (col, title, scale) in enumerate((("avg_jct_s", "mean JCT (h)", 1 / 3600),
                                                  ("cluster_efficiency", "cluster efficiency", 1.0))):
            st = [ci95(_num(g.loc[_num(g[by]) == x, col]).tolist()) for x in xs]
            ax[k].errorbar(xs, [s[0] * scale for s in st], yerr=[0 if not np.isfinite(s[1]) else s[1] * scale for s in st],
                           marker="o", capsize=3, label=a, color=colors[a])
            ax[k].set(xlabel=xlabel, title=f"{title} vs {xlabel} (mean, 95% CI)")
    for x in ax:
        x.grid(alpha=0.3)
    ax[0].legend(fontsize=8)
    return _png(fig)


# ----------------------------------------------------------------------------------------------- html
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;font-size:0.9em}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #eee;margin:0.3em 0}code,pre{background:#f6f6f6;padding:1px 4px}
pre{padding:8px;overflow-x:auto;font-size:0.85em}.note{color:#555;font-size:0.9em}"""


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _summary_html(summary: pd.DataFrame, show_load: bool, show_eta: bool) -> str:
    head = ["agent"] + (["load"] if show_load else []) + (["eta"] if show_eta else []) + ["seeds"]
    head += [label for col, label, _ in SUMMARY_METRICS if col in summary.columns]
    rows = []
    for _, r in summary.iterrows():
        cells = [html.escape(str(r["agent"]))]
        if show_load:
            cells.append(_fmt(float(r["load"])) if pd.notna(r["load"]) else "trace")
        if show_eta:
            cells.append(html.escape(str(r["eta"])))
        cells.append(str(int(r["seeds"])))
        for col, _, scale in SUMMARY_METRICS:
            if col in summary.columns:
                cells.append(_fmt(r[col], scale, r.get(col + "_ci"), integer=col == "jobs_completed"))
        rows.append("<tr>" + "".join(f"<td class=n>{c}</td>" if i else f"<td>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>"


def _meta_html(meta: dict) -> str:
    items = [
        ("git commit", meta.get("git_commit")),
        ("created", meta.get("created")),
        ("command", meta.get("command")),
        ("package versions", ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())),
        ("trace", f"{meta['trace']['spec']} (digest {meta['trace']['digest']}; {len(meta['trace']['job_sets'])} job sets; "
                  f"{meta['trace']['selection']})"),
        ("seeds", ", ".join(map(str, meta.get("seeds", [])))),
        ("load", f"{', '.join('trace' if v is None else f'{v:g}' for v in meta['load']['values'])} — {meta['load']['meaning']}"),
        ("efficiency window form", f"{meta['efficiency_form']['form']}: {meta['efficiency_form']['definition']}"),
        ("eta values", ", ".join(str(v) for v in meta["eta"]["values"])),
        ("eta source", meta["eta"]["source"]),
        ("cluster", json.dumps(meta.get("cluster"))),
        ("cost tables (sha256/16)", ", ".join(f"{k}: {v}" for k, v in meta.get("cost_tables", {}).items())),
    ]
    for label, info in meta.get("learned_agents", {}).items():
        items.append((f"learned agent {label}", json.dumps(info)))
    rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in items)
    return f"<table>{rows}</table>"


def _failed_runs_html(meta: dict) -> list[str]:
    """The runs that raised (``meta["failed_runs"]``, written by ``jigsaw evaluate``), first in the
    report: the summary and the figures cover only the runs that finished."""
    failed = meta.get("failed_runs") or []
    if not failed:
        return []
    total = (meta.get("runs") or {}).get("total", "?")
    rows = "".join(f"<tr><td>{html.escape(str(f['agent']))}</td><td>{f['seed']}</td>"
                   f"<td>{'' if f.get('load') is None else format(f['load'], 'g')}</td>"
                   f"<td>{'table' if f.get('eta') is None else format(f['eta'], 'g')}</td>"
                   f"<td>{html.escape(str(f['error']))}</td></tr>" for f in failed)
    return [f"<h2>Failed runs</h2><p class=note><b>{len(failed)} of {total} runs failed</b>; the summary and the "
            f"figures below cover only the runs that finished (metadata.json lists the failures under "
            f"failed_runs).</p><table><tr><th>agent</th><th>seed</th><th>load</th><th>eta</th><th>error</th></tr>"
            f"{rows}</table>"]


def _ray_html(meta: dict) -> list[str]:
    """Where the runs ran (``meta["ray"]``, ``jigsaw evaluate --ray``) and the runs Ray reran after
    losing their node, or nothing for a local evaluation."""
    info = meta.get("ray")
    if not info:
        return []
    per_node = ", ".join(f"{html.escape(str(n))}: {c}" for n, c in info.get("runs_per_node", {}).items())
    parts = [f"<h2>Ray</h2><p class=note>Runs were Ray tasks on {len(info.get('nodes', []))} node(s) "
             f"({html.escape(str(info.get('address')))}); runs finished per node: {per_node}. Job sets, cost tables "
             f"and RUN_DIRs were shipped through the object store (digests in metadata.json ray.shipped).</p>"]
    rerun = info.get("rerun") or []
    if rerun:
        rows = "".join(f"<tr><td>{html.escape(str(r['agent']))}</td><td>{r['seed']}</td>"
                       f"<td>{'' if r.get('load') is None else format(r['load'], 'g')}</td>"
                       f"<td>{'table' if r.get('eta') is None else format(r['eta'], 'g')}</td>"
                       f"<td>{html.escape(', '.join(r['lost_on']))}</td><td>{html.escape(str(r['finished_on']))}</td></tr>"
                       for r in rerun)
        lost = ", ".join(info.get("nodes_lost") or []) or "none"
        parts.append(f"<p class=note><b>{len(rerun)} run(s) were lost with their node or worker process and rerun</b> (nodes lost "
                     f"during the sweep: {html.escape(lost)}); their results are those of the rerun.</p><table><tr>"
                     f"<th>agent</th><th>seed</th><th>load</th><th>eta</th><th>lost on</th><th>finished on</th></tr>"
                     f"{rows}</table>")
    return parts


def write_report(out: Path, df: pd.DataFrame, meta: dict, specs) -> Path:
    """Write OUT/report.html (and OUT/figures/*.png); return the report's path."""
    out = Path(out)
    agents = list(dict.fromkeys(df["agent"]))
    colors = _colors(agents)
    loads = list(pd.unique(pd.to_numeric(df["load"], errors="coerce")))
    etas = list(dict.fromkeys(df["eta"].astype(str).tolist()))
    base_load, base_eta = loads[0], etas[0]
    is_base = (df["eta"].astype(str) == base_eta) & ((df["load"] == base_load) if pd.notna(base_load) else df["load"].isna())
    base = df[is_base]
    summary = summarize(df)
    gpus = int(meta["cluster"]["num_gpus"])
    max_level = int(meta["sim_config"]["spb"]["max_level"])
    spb_agents = []
    by_label = {s.label: s for s in specs}
    for a in agents:
        used = 0.0
        for r in base.loc[base["agent"] == a, "run_dir"]:
            c = _read(out, r, "cluster.csv")
            if c is not None:
                used += float(sum(c[f"level{lv}"].sum() for lv in range(1, 8) if f"level{lv}" in c.columns))
        if used > 0 or (a in by_label and by_label[a].spb_aware):
            spb_agents.append(a)

    figs: list[tuple[str, str, bytes | None]] = [
        ("jct_cdf", "JCT CDF", fig_jct_cdf(out, base, agents, colors)),
        ("jct_by_size", "JCT by job size", fig_jct_by_size(out, base, agents, colors)),
        ("timeline", "Queue length and GPU utilization over time", fig_timeline(out, base, agents, colors, gpus)),
        ("bars", "Cluster efficiency and mean JCT, 95% confidence intervals over seeds",
         fig_bars(summarize(base), agents, colors)),
        ("spb_levels", "SPB-level usage over time (SPB-aware agents)", fig_spb_levels(out, base, spb_agents, max_level)),
    ]
    if len(loads) > 1:
        figs.append(("jct_vs_load", "JCT and efficiency vs offered load",
                     fig_sweep(df, agents, colors, "load", {"eta": base_eta}, "load")))
    if len(etas) > 1 or (etas and etas[0] != "table"):
        figs.append(("eta_sweep", "Sensitivity to eta (statistical efficiency of an SPB iteration)",
                     fig_sweep(df[df["eta"].astype(str) != "table"], agents, colors, "eta",
                               {"load": base_load} if pd.notna(base_load) else {}, "eta")))
    figdir = out / "figures"
    figdir.mkdir(exist_ok=True)
    for name, _, png in figs:
        if png is not None:
            (figdir / f"{name}.png").write_bytes(png)

    cond = f"load {base_load:g}" if pd.notna(base_load) else "the trace's own load"
    cond += f", eta {base_eta}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>jigsaw evaluation</title><style>{CSS}</style></head><body>",
             "<h1>jigsaw evaluation</h1>",
             *_failed_runs_html(meta),
             *_ray_html(meta),
             f"<p>{len(agents)} agents × {df['seed'].nunique()} seeds"
             + (f" × {len(loads)} loads" if len(loads) > 1 else "") + (f" × {len(etas)} eta values" if len(etas) > 1 else "")
             + f" on the same job sets; {meta['cluster']['num_gpus']} GPUs. Efficiency form: "
             f"<b>{html.escape(meta['efficiency_form']['form'])}</b>. Load: <b>{html.escape(', '.join('trace' if v is None else f'{v:g}' for v in meta['load']['values']))}</b>. "
             f"eta: <b>{html.escape(', '.join(str(v) for v in meta['eta']['values']))}</b>.</p>",
             "<h2>Summary</h2>", "<p class=note>mean ± half-width of the 95% confidence interval over seeds: "
             "mean ± t<sub>0.975, n−1</sub> · sd / √n. Metrics as defined in docs/design.md section 5 "
             "(docs/evaluation.md).</p>",
             _summary_html(summary, len(loads) > 1, len(etas) > 1 or etas[0] != "table"),
             *_paired_html(meta),
             f"<h2>Figures</h2><p class=note>Figures 1–5 show the condition {html.escape(cond)}.</p>"]
    for i, (name, title, png) in enumerate(figs, 1):
        parts.append(f"<h3>{i}. {html.escape(title)}</h3>")
        if png is None:
            parts.append("<p class=note>No SPB-aware agent in this evaluation.</p>")
        else:
            parts.append(_img(png, title))
    parts += ["<h2>Run metadata</h2>", _meta_html(meta),
              "<details><summary>metadata.json</summary><pre>" + html.escape(json.dumps(meta, indent=1, default=str))
              + "</pre></details>", "</body></html>"]
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path


def _paired_html(meta: dict) -> list[str]:
    """The paired-difference table of ``meta["paired"]`` (evaluate --baseline), or nothing."""
    paired = meta.get("paired")
    if not paired:
        return []
    head = "".join(f"<th>{h}</th>" for h in ("agent", "load", "eta", "metric", "mean difference", "95% CI", "seeds"))
    label_scale = {c: (lb, sc) for c, lb, sc in PAIRED_METRICS}
    body = []
    for r in paired["rows"]:
        label, scale = label_scale.get(r["metric"], (r["metric"], 1.0))
        load = "trace" if r["load"] is None or not np.isfinite(r["load"]) else f"{r['load']:g}"
        ci = "n/a" if r["ci95"] is None or not np.isfinite(r["ci95"]) else f"± {r['ci95'] * scale:,.3f}"
        body.append(f"<tr><td>{html.escape(r['agent'])}</td><td>{load}</td><td>{html.escape(str(r['eta']))}</td>"
                    f"<td>{html.escape(label)}</td><td>{_fmt(r['mean_diff'], scale)}</td><td>{ci}</td>"
                    f"<td>{r['seeds']}</td></tr>")
    return [f"<h2>Paired differences from {html.escape(paired['baseline'])}</h2>",
            "<p class=note>Per seed, the agent's metric minus the baseline's on the same job set; mean over seeds "
            "± half-width of the 95% confidence interval (t distribution); n/a with one seed.</p>",
            f"<table><tr>{head}</tr>{''.join(body)}</table>"]


# ----------------------------------------------------------------------------------------------- stdout
def print_summary(df: pd.DataFrame, meta: dict, file=None) -> None:
    summary = summarize(df)
    show_load = df["load"].nunique(dropna=False) > 1
    show_eta = df["eta"].astype(str).nunique() > 1 or str(df["eta"].iloc[0]) != "table"
    t = Table(title=f"{meta['trace']['spec']} · {meta['cluster']['num_gpus']} GPUs · "
                    f"{meta['efficiency_form']['form']} efficiency · mean ± 95% CI over seeds")
    t.add_column("agent")
    if show_load:
        t.add_column("load", justify="right")
    if show_eta:
        t.add_column("eta", justify="right")
    t.add_column("seeds", justify="right")
    cols = [("avg_jct_s", "mean JCT (h)", 1 / 3600, True), ("p95_jct_s", "p95 JCT (h)", 1 / 3600, False),
            ("makespan_s", "makespan (h)", 1 / 3600, False), ("saturated_efficiency", "sat. eff.", 1.0, True),
            ("cluster_efficiency", "efficiency", 1.0, True),
            ("gpu_utilization", "GPU util", 1.0, False), ("avg_queue_s", "queue (h)", 1 / 3600, False),
            ("jobs_completed", "done", 1.0, False)]
    for _, label, _, _ in cols:
        t.add_column(label, justify="right")
    for _, r in summary.iterrows():
        cells = [str(r["agent"])]
        if show_load:
            cells.append(_fmt(float(r["load"])) if pd.notna(r["load"]) else "trace")
        if show_eta:
            cells.append(str(r["eta"]))
        cells.append(str(int(r["seeds"])))
        for col, _, scale, with_ci in cols:
            cells.append(_fmt(r.get(col), scale, r.get(col + "_ci") if with_ci else None, integer=col == "jobs_completed"))
        t.add_row(*cells)
    console = Console(file=file or sys.stdout, width=200)
    console.print(t)
    if meta.get("paired"):
        console.print(_paired_table(meta["paired"], show_load, show_eta))


def _paired_table(paired: dict, show_load: bool, show_eta: bool):
    """The terminal table of the paired differences from the baseline (one row per agent and
    condition, one column per metric)."""
    t = Table(title=f"paired difference from {paired['baseline']} · per seed, mean ± 95% CI")
    t.add_column("agent")
    if show_load:
        t.add_column("load", justify="right")
    if show_eta:
        t.add_column("eta", justify="right")
    for _, label, _ in PAIRED_METRICS:
        t.add_column(f"Δ {label}", justify="right")
    cells: dict[tuple, dict] = {}
    for r in paired["rows"]:
        cells.setdefault((r["agent"], r["load"], str(r["eta"])), {})[r["metric"]] = r
    for (agent, load, eta), by_metric in cells.items():
        row = [agent]
        if show_load:
            row.append("trace" if load is None or not np.isfinite(load) else f"{load:g}")
        if show_eta:
            row.append(eta)
        for col, _, scale in PAIRED_METRICS:
            r = by_metric.get(col)
            ci = None if r is None or r["ci95"] is None else r["ci95"]
            row.append("n/a" if r is None else _fmt(r["mean_diff"], scale, float("nan") if ci is None else ci))
        t.add_row(*row)
    return t
