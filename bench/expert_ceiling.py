"""How much of a heuristic the env's action space keeps: the heuristic translated into env actions.

    python -m bench.expert_ceiling                         # Jigsaw, the 12 held-out study windows (~1 min)
    python -m bench.expert_ceiling --expert tiresias --window-k 16,32 --orders slot,heuristic
    python -m bench.expert_ceiling --window-order las      # the env window in 2D-LAS order
    python -m bench.expert_ceiling --pause leave           # a paused job leaves the round (the env's default)
    python -m bench.expert_ceiling --expert jigsaw-srtf --window-order remaining --spill   # against jigsaw-srtf-spill

A learned policy that imitates an expert can at best play the expert's decisions as the env's
actions express them (``agents.imitation.HeuristicExpert``: a window of K jobs, five placement
options and one pair-with-host option per host slot; by default an env whose paused jobs can be
placed again later in the round, ``pause="requeue"``). This plays the translated expert on the
held-out windows of ``python -m bench.ppo_study``
(same split, same windows, same load) for every window size K and action order given, next to the
expert and Tiresias run by the simulator directly on the same cluster and ``SimConfig`` as the env.
With ``--spill`` the env spills what the translated expert leaves waiting on every advance
(``JigsawClusterEnv(spill=True)``), and the expert's spilling form (``EXPERT-spill``, where one is
registered) runs beside it: what the translation can reach is that scheduler.
Prints per-window and mean JCTs (hours) and writes them as JSON (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.results_folder import command_line, portable_text


def measure(trace: str, gpus: int, holdout: float, windows: int, window_jobs: int, load: float | None,
            expert: str, window_ks: list[int], orders: list[str], log=print,
            window_order: str = "attained", pause: str = "requeue", spill: bool = False) -> dict:
    import numpy as np

    from agents import available_schedulers, make_scheduler
    from agents.imitation import HeuristicExpert, play_expert
    from bench.ppo_study import build_windows, heldout_split
    from jigsaw_env.env import JigsawClusterEnv
    from jigsaw_env.simulator import Simulator

    _, held = heldout_split(trace, gpus, holdout)
    wins = build_windows(held, window_jobs, windows, gpus, load)
    refs = list(dict.fromkeys(["tiresias", expert]))
    if spill and f"{expert}-spill" in available_schedulers():
        refs.append(f"{expert}-spill")
    jct: dict[str, list[float]] = {}
    for w, info in wins:
        env = JigsawClusterEnv(gpus=gpus, window_k=window_ks[0])
        for name in refs:
            sim = Simulator(env.cluster, w, env.sim_config)
            sim.run(make_scheduler(name))
            jct.setdefault(name, []).append(sim.metrics()["avg_jct_s"] / 3600)
        for k in window_ks:
            for order in orders:
                e = JigsawClusterEnv(gpus=gpus, window_k=k, window_order=window_order, pause=pause, spill=spill)
                s = play_expert(e, HeuristicExpert(expert, order=order), w)
                jct.setdefault(f"{expert} as actions, K={k}, {order} order", []).append(s.metrics()["avg_jct_s"] / 3600)
        log(f"window {info['window']} (max {info['max_gpus']} GPUs per job): "
            + ", ".join(f"{k} {v[-1]:.3f}" for k, v in jct.items()))
    return {"trace": portable_text(trace), "gpus": gpus, "holdout": holdout, "windows": [i for _, i in wins], "load": load,
            "expert": expert, "window_order": window_order, "pause": pause, "spill": spill, "jct_h": jct,
            "mean_jct_h": {k: float(np.mean(v)) for k, v in jct.items()}}


def main(argv=None) -> int:
    from bench.ppo_study import _default_trace, add_study_window_arguments
    from jigsaw_env.actions import PAUSE_MODES, WINDOW_ORDERS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_study_window_arguments(p)
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--expert", default="jigsaw")
    p.add_argument("--window-k", default="16", help="comma-separated window sizes K (default 16)")
    p.add_argument("--orders", default="slot,heuristic", help="comma-separated action orders (default slot,heuristic)")
    p.add_argument("--window-order", choices=WINDOW_ORDERS, default="attained",
                   help="the env window's order of waiting jobs (default attained)")
    p.add_argument("--pause", choices=PAUSE_MODES, default="requeue",
                   help="the env's pause mode: requeue (a paused job can be placed again later in the round, "
                        "which some of Jigsaw's rounds need) or leave (the env's default) (default requeue)")
    p.add_argument("--spill", action="store_true",
                   help="the env spills what the decision leaves waiting on advance; EXPERT-spill runs beside it")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        ks = [int(x) for x in a.window_k.split(",") if x]
    except ValueError:
        p.error(f"--window-k must be comma-separated integers, got {a.window_k!r}")
    orders = [x for x in a.orders.split(",") if x]
    bad = [o for o in orders if o not in ("slot", "heuristic")]
    if bad or not orders or not ks or min(ks) < 1:
        p.error(f"--orders takes slot and/or heuristic, --window-k positive integers; got {a.orders!r}, {a.window_k!r}")
    t0 = time.perf_counter()
    res = measure(a.trace or _default_trace(), a.gpus, a.holdout, a.windows, a.window_jobs, a.load, a.expert, ks,
                  orders, window_order=a.window_order, pause=a.pause, spill=a.spill)
    res["wall_s"] = time.perf_counter() - t0
    res["date_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["command"] = command_line("bench.expert_ceiling", argv)
    print("mean JCT over the windows (h): " + ", ".join(f"{k} {v:.3f}" for k, v in res["mean_jct_h"].items()))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
