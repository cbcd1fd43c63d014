"""How closely a heuristic translated into env actions follows the heuristic, on training episodes.

    python -m bench.translation_gap --out bench/results/translation_gap     # 100 episodes per size (~10 min)
    python -m bench.translation_gap --seeds 318-319 --cluster-sizes 16      # one episode

The imitation warm start of ``jigsaw train`` learns from the expert translated into env actions
(``agents.imitation.HeuristicExpert``) on the training split's episodes. This plays those episodes
(``TrainingEnv`` as ``jigsaw train --preset learned`` draws them: Philly, 80 jobs, load 1.0,
holdout 0.2, validation 0.1, work-conserving masks) once per window order of the env
(``window_order``), and the heuristic itself in the simulator on the same jobs, cluster and
``SimConfig``. Per cluster size and window order it reports the mean JCT (h), the share of
episodes where the translation lands within 0.1 % of the heuristic, and the worst ratio.

Writes ``OUT/results.json`` (every episode) and ``OUT/results.md``.
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Sequence

from bench.results_folder import portable_text, run_line, run_record, write_results

#: an episode "matches" when the translation's mean JCT is within this relative distance
MATCH_REL = 1e-3


def play_episode(env, expert_name: str, seed: int) -> dict:
    """One training episode of ``env`` (a ``TrainingEnv``) with the translated expert, and the
    expert in the simulator on the same jobs: their mean JCTs (h) and the episode's steps."""
    from agents import make_scheduler
    from agents.imitation import HeuristicExpert
    from jigsaw_env.simulator import Simulator

    env.reset(seed=seed)
    expert = HeuristicExpert(expert_name)
    steps = 0
    while True:
        _, _, term, trunc, _ = env.step(expert.act(env))
        steps += 1
        if term or trunc:
            break
    jobs = env.sim.jobs_frame()[["job_id", "arrival_s", "num_gpus", "model", "batch_size", "iterations"]]
    ref = Simulator(env.cluster, jobs, env.sim_config)
    ref.run(make_scheduler(expert_name))
    return {"gpus": env.cluster.num_gpus, "seed": seed, "steps": steps, "truncated": bool(trunc),
            "translated_h": float(env.sim.metrics()["avg_jct_s"]) / 3600.0,
            "expert_h": float(ref.metrics()["avg_jct_s"]) / 3600.0}


def measure(seeds: Sequence[int], cluster_sizes: Sequence[int], orders: Sequence[str], expert: str = "jigsaw",
            trace: str = "philly", progress: bool = True) -> dict:
    """Every (cluster size, window order, seed) episode of :func:`play_episode`, and per size and
    order the summary of :func:`summarize`."""
    from tqdm import tqdm

    from agents.rl_env import TrainingEnv

    episodes = []
    bar = tqdm(total=len(seeds) * len(cluster_sizes) * len(orders), desc="episodes", disable=not progress)
    for gpus in cluster_sizes:
        for order in orders:
            env = TrainingEnv(split="train", holdout=0.2, val=0.1, loads=[1.0], cluster_sizes=[gpus], trace=trace,
                              gpus=64, max_jobs=80, load=1.0, work_conserving=True, window_order=order)
            for seed in seeds:
                episodes.append({"window_order": order, **play_episode(env, expert, seed)})
                bar.update(1)
    bar.close()
    return {"expert": expert, "trace": portable_text(trace), "seeds": [min(seeds), max(seeds)], "cluster_sizes": list(cluster_sizes),
            "orders": list(orders), "episodes": episodes, "summary": summarize(episodes)}


def summarize(episodes: list[dict]) -> list[dict]:
    """Per (cluster size, window order): episodes, mean JCTs (h), mean gap (h), the share within
    :data:`MATCH_REL` of the expert, the worst translated / expert ratio, and truncated episodes."""
    import numpy as np

    out = []
    for gpus in sorted({e["gpus"] for e in episodes}):
        for order in dict.fromkeys(e["window_order"] for e in episodes):
            part = [e for e in episodes if e["gpus"] == gpus and e["window_order"] == order]
            if not part:
                continue
            t = np.array([e["translated_h"] for e in part])
            x = np.array([e["expert_h"] for e in part])
            out.append({"gpus": gpus, "window_order": order, "episodes": len(part), "expert_h": float(x.mean()),
                        "translated_h": float(t.mean()), "gap_h": float((t - x).mean()),
                        "matched": float(np.mean(np.abs(t - x) <= MATCH_REL * x)), "worst_ratio": float((t / x).max()),
                        "truncated": int(sum(e["truncated"] for e in part))})
    return out


def write_md(path: Path, res: dict) -> None:
    lines = [f"# {res['expert'].capitalize()} translated into env actions, on training episodes", "",
             run_line(res), "",
             f"Seeds {res['seeds'][0]}-{res['seeds'][1]} of the training split of `{res['trace']}` (80 jobs, load 1.0, "
             "work-conserving masks), per cluster size and window order. Mean JCT in hours; *matched*: episodes "
             f"where the translation lands within {MATCH_REL:.1%} of {res['expert']}; *worst*: the largest "
             "translated / expert ratio.", "",
             f"| GPUs | window order | episodes | {res['expert']} | translated | gap | matched | worst | truncated |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in res["summary"]:
        lines.append(f"| {s['gpus']} | {s['window_order']} | {s['episodes']} | {s['expert_h']:.3f} | "
                     f"{s['translated_h']:.3f} | {s['gap_h']:+.3f} | {s['matched']:.0%} | {s['worst_ratio']:.2f}x | "
                     f"{s['truncated']} |")
    path.write_text("\n".join(lines) + "\n")


def _seed_range(text: str) -> range:
    try:
        lo, _, hi = text.partition("-")
        r = range(int(lo), int(hi or lo) + 1)
    except ValueError:
        r = range(0)
    if not r or r.start < 0:
        raise argparse.ArgumentTypeError(f"expected a seed range FIRST-LAST of integers >= 0, got {text!r}")
    return r


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated GPU counts >= 1, got {text!r}")
    return sizes


def main(argv=None) -> int:
    from jigsaw_env.actions import WINDOW_ORDERS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=_seed_range, default=range(0, 100), help="episode seeds FIRST-LAST (default 0-99)")
    p.add_argument("--cluster-sizes", type=_sizes, default=[16, 32, 64], help="GPUs per cluster (default 16,32,64)")
    p.add_argument("--orders", default=",".join(WINDOW_ORDERS),
                   help=f"comma-separated window orders, from {','.join(WINDOW_ORDERS)} (default both)")
    p.add_argument("--expert", default="jigsaw", help="the heuristic translated (default jigsaw)")
    p.add_argument("--trace", default="philly", help="the training trace (default philly, from JIGSAW_DATA)")
    p.add_argument("--out", default=None, help="write results.json and results.md here")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    orders = [o for o in a.orders.split(",") if o]
    bad = [o for o in orders if o not in WINDOW_ORDERS]
    if bad or not orders:
        p.error(f"--orders takes some of {','.join(WINDOW_ORDERS)}; got {a.orders!r}")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    res = measure(a.seeds, a.cluster_sizes, orders, a.expert, a.trace, progress=not a.no_progress)
    res.update(run_record("bench.translation_gap", argv, t0))
    for s in res["summary"]:
        print(f"{s['gpus']:>4} GPUs {s['window_order']:<9} {a.expert} {s['expert_h']:.3f} h, translated "
              f"{s['translated_h']:.3f} h ({s['gap_h']:+.3f}), matched {s['matched']:.0%}, worst {s['worst_ratio']:.2f}x")
    if a.out:
        out = write_results(a.out, res, write_md)
        print(f"wrote {out}/results.json and results.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
