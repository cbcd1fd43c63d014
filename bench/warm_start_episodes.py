"""The expert on the episodes a run's DAgger rounds played: is a round's learner worse, or were its
episodes harder?

    python -m bench.warm_start_episodes --run runs/learned_200 --out DIR

Each DAgger round of ``jigsaw train --warm-start`` plays the learner on training episodes of its
own, and ``config.json`` records their mean JCT (``warm_start.dagger[i].policy_mean_avg_jct_s``).
Those means move with the episodes drawn as much as with the learner. This replays the run's
expert on the same episodes (same split, env options and reset seeds: the round's
``first_episode_seed``, or for a run that does not record it the seeds its warm start used then,
``seed + 100000 * round``) and reports, per round, the learner's mean, the expert's mean and their
ratio. Where the run records each episode's JCT (``policy_avg_jct_s``), the ratio is over the
episodes the learner finished; otherwise it is the ratio of the two means, the expert's over all
the round's episodes.

Writes ``OUT/results.json`` and ``OUT/results.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.results_folder import run_line, write_and_show

UNRECORDED_ROUND_STRIDE = 100_000  # first episode seed of round r in runs without first_episode_seed


def round_seeds(cfg: dict) -> list[tuple[int, int, int]]:
    """(round, first episode seed, episodes) of every DAgger round the run's config records."""
    ws = cfg.get("warm_start") or {}
    seed = int(cfg["seed"])
    return [(int(r["round"]), int(r.get("first_episode_seed", seed + UNRECORDED_ROUND_STRIDE * int(r["round"]))),
             int(r["episodes"])) for r in ws.get("dagger") or []]


def measure(run_dir: Path, log=print) -> dict:
    from agents.imitation import HeuristicExpert, collect
    from train_agent import warm_start_env_factory

    cfg_path = run_dir / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"--run: {run_dir} has no config.json (not a jigsaw train run folder)")
    cfg = json.loads(cfg_path.read_text())
    ws = cfg.get("warm_start") or {}
    if not ws.get("dagger"):
        raise ValueError(f"--run: {cfg_path} records no DAgger rounds (warm_start.dagger is empty)")
    make = warm_start_env_factory(cfg)
    expert = HeuristicExpert(ws["expert"], order=ws.get("order", "slot"))
    rows = []
    for (rnd, first, n), rec in zip(round_seeds(cfg), ws["dagger"]):
        t0 = time.perf_counter()
        played = collect(make, expert, episodes=n, seed=first)
        exp = [float(e["avg_jct_s"]) for e in played.episodes]
        exp_mean = sum(exp) / len(exp)
        per_ep = rec.get("policy_avg_jct_s")
        if per_ep is not None:
            pairs = [(p, e) for p, e in zip(per_ep, exp) if p is not None]
            ratio = sum(p for p, _ in pairs) / sum(e for _, e in pairs)
        else:
            ratio = float(rec["policy_mean_avg_jct_s"]) / exp_mean
        rows.append({"round": rnd, "first_episode_seed": first, "episodes": n,
                     "learner_mean_jct_s": rec["policy_mean_avg_jct_s"], "expert_mean_jct_s": exp_mean,
                     "expert_max_jct_s": max(exp), "learner_over_expert": ratio, "paired": per_ep is not None})
        log(f"round {rnd}: {n} episodes from seed {first}; learner {rec['policy_mean_avg_jct_s']:,.0f} s, "
            f"expert {exp_mean:,.0f} s, ratio {ratio:.2f} ({time.perf_counter() - t0:.0f} s)")
    return {"run": str(run_dir), "expert": ws["expert"], "rounds": rows}


def write_md(path: Path, res: dict) -> None:
    lines = [f"# The {res['expert']} expert on the DAgger rounds' episodes of `{res['run']}`", "",
             run_line(res), "",
             "| round | first episode seed | episodes | learner mean JCT (s) | expert mean JCT (s) | expert max (s) "
             "| learner / expert |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rounds"]:
        lines.append(f"| {r['round']} | {r['first_episode_seed']} | {r['episodes']} | {r['learner_mean_jct_s']:,.0f} "
                     f"| {r['expert_mean_jct_s']:,.0f} | {r['expert_max_jct_s']:,.0f} | {r['learner_over_expert']:.2f}"
                     f"{'' if r['paired'] else ' (of the means)'} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, type=Path, help="a jigsaw train RUN_DIR trained with --warm-start")
    p.add_argument("--out", required=True, help="write results.json and results.md here")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    try:
        res = measure(a.run)
    except ValueError as e:
        p.error(str(e))
    write_and_show(a.out, res, write_md, "bench.warm_start_episodes", argv, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
