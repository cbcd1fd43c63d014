"""Where does a cloned policy disagree with its expert? Follow the expert through held-out windows
and score the policy's masked argmax at every state the expert visits.

    python -m bench.clone_accuracy RUN_DIR [RUN_DIR ...] --windows 2,7,8 --out DIR
    python -m bench.clone_accuracy RUN_DIR --split val --windows 0,1,2,3,4,5   # choose on these

The windows are the PPO study's (``bench/ppo_study.py``: the same held-out split, offsets, window
length, load and evaluation cluster); ``--split val`` cuts them from the validation split instead
(``--val``, default 0.1, the jobs just before the held-out ones), which is where choices between
training settings belong: the held-out windows only report. Each window is played once by the expert (``--expert``,
default jigsaw, its actions in the env's learnable slot order, as the warm start records them);
at every state it visits, each policy is asked what it would do, and the expert's action is
applied. Per window and policy:

- ``states``, ``acting``: states, and those where the expert does not advance the round;
- ``exact``: the policy's action does what the expert's next action does (the same job paused,
  or run at the same SPB level and pattern on as many nodes, shared or not, restarted or not:
  actions are compared by effect, :func:`action_effect`, so two placement options that give
  the same kind of GPUs agree);
- ``in_round``: it does what the expert does at some step from this state to the end of the
  round (the same decision in another order; advancing counts only where the expert advances);
- each of the two for all states, for the acting states, and for the states whose widest
  undecided job in the window has at least ``--wide`` GPUs (default 32);
- where it departs from the round on acting states, by kind (:func:`mistake_kind`): advancing
  early, pausing a running job the expert keeps or changes (a preemption), pausing a waiting job
  or keeping a running one as it runs (no change), changing a running job the expert keeps,
  starting a job the expert leaves waiting, running a job the expert pauses, or running one the
  expert runs in another way.

Writes ``DIR/clone_accuracy.json`` and ``DIR/clone_accuracy.md`` and prints the table. The scores
are about the expert's own trajectory: where a policy's mistakes take it is not measured here (the
study's JCTs are).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable, Hashable, Sequence

import numpy as np

from bench.results_folder import command_line, portable_text

Policy = Callable[[np.ndarray, np.ndarray], int]


ADVANCE = ("advance",)


def round_sets(effects: Sequence[Hashable], advance: Hashable = ADVANCE) -> list[set]:
    """For each step, what the expert does from that step to the end of its round (a round ends
    with ``advance``; a last, unfinished round ends with the data). ``advance`` is in a step's set
    only where the expert advances at that step: advancing earlier drops the rest of the round."""
    out: list[set] = []
    start = 0
    n = len(effects)
    for i in range(n + 1):
        if i == n or effects[i] == advance:
            end = min(i + 1, n)
            for j in range(start, end):
                s = set(effects[j:end])
                if effects[j] != advance:
                    s.discard(advance)
                out.append(s)
            start = end
    return out


def action_effect(env, action: int) -> tuple:
    """What ``action`` would do to the round's decision in ``env``'s current state, up to which
    interchangeable GPUs it picks: ``("advance",)``, ``("pause", job)``, or ``("run", job, level,
    pattern, nodes, shared, restart)`` for the placement ``RoundBuilder.candidate`` gives, with the
    number of nodes it spans, whether any of its GPUs holds another job's worker, and whether a
    running job leaves its GPUs (a restart). Two actions with the same effect are the same
    decision: placement options often give the same GPUs, and the same option taken later in the
    round gives other GPUs of the same shape."""
    kind, slot, option, level, pattern = env.codec.decode(int(action))
    if kind == "advance":
        return ADVANCE
    b = env.builder
    jid = int(b.window[slot])
    if kind == "pause":
        return ("pause", jid)
    jd = b.candidate(slot, option, level, pattern)
    if jd is None:  # not for a feasible action
        return ("run", jid, int(level), pattern.value, None, None, None)
    gpn = env.cluster.gpus_per_node
    own = b.ledger.decision.get(jid)
    mine = set(own.gpus) if own is not None else set()
    workers = b.ledger.workers
    shared = any(int(workers[g]) - (1 if g in mine else 0) > 0 for g in jd.gpus)
    job = env.sim.state.jobs[jid]
    restart = bool(job.placement) and tuple(jd.gpus) != tuple(job.placement)
    return ("run", jid, int(level), pattern.value, len({g // gpn for g in jd.gpus}), shared, restart)


def job_now(env, effect: tuple) -> tuple | None:
    """``(running, level, pattern)`` of the job an effect names, as it is in force now (None for
    advance): what :func:`mistake_kind` needs to tell a preemption from a no-op."""
    if effect == ADVANCE:
        return None
    job = env.sim.state.jobs[effect[1]]
    from jigsaw_env.state import JobStatus

    return (job.status is JobStatus.RUNNING, int(job.level), job.pattern.value)


def follow_expert(env, expert, jobs, policies: dict[str, Policy], seed: int = 0) -> dict:
    """Play ``jobs`` (a job table; None: the episode ``env`` draws from ``seed``) in ``env`` with
    ``expert`` (an ``agents.imitation.HeuristicExpert``). At every state record the effect
    (:func:`action_effect`) of the expert's action and of each policy's action on that state's
    observation and mask, the job a policy's action names as it is now (:func:`job_now`), and the
    widest undecided job's GPUs. Returns lists ``expert``, ``policy[name]`` of effects and
    ``policy_jobs[name]``, the array ``widths`` and the expert's mean JCT (s)."""
    from agents.imitation import _state_width

    obs, _ = env.reset(seed=seed, options={"jobs": jobs})
    acts: list[tuple] = []
    widths: list[int] = []
    chosen: dict[str, list[tuple]] = {k: [] for k in policies}
    their_jobs: dict[str, list[tuple | None]] = {k: [] for k in policies}
    while True:
        mask = env.action_masks()
        a = expert.act(env)
        for name, pol in policies.items():
            eff = action_effect(env, int(pol(obs, mask)))
            chosen[name].append(eff)
            their_jobs[name].append(job_now(env, eff))
        acts.append(action_effect(env, a))
        widths.append(_state_width(env))
        obs, _, term, trunc, _ = env.step(a)
        if term or trunc:
            break
    return {"expert": acts, "widths": np.asarray(widths), "policy": chosen, "policy_jobs": their_jobs,
            "expert_avg_jct_s": float(env.sim.metrics()["avg_jct_s"])}


MISTAKES = ("advances early", "pauses a running job the expert keeps", "pauses a running job the expert changes",
            "pauses a waiting job (no change)", "keeps a running job as it is (no change)",
            "changes a running job the expert keeps", "runs a waiting job the expert leaves waiting",
            "runs a job the expert pauses", "runs a job the expert runs, otherwise")


def mistake_kind(in_round: set, effect: tuple, job: tuple | None, advance: Hashable = ADVANCE) -> str | None:
    """What kind of departure from the expert's round ``effect`` is (None: it is in the round's
    set, :func:`round_sets`). ``job``: :func:`job_now` of the job it names. The kinds
    (:data:`MISTAKES`) separate what changes the next round (a preemption, a start the expert
    does not make) from what leaves it as it is (pausing a job that waits, keeping a running job
    as it runs: steps the expert does not spend, but no other decision)."""
    if effect in in_round:
        return None
    if effect == advance:
        return MISTAKES[0]
    running, level, pattern = job
    theirs = {e[0] for e in in_round if e != advance and e[1] == effect[1]}
    if effect[0] == "pause":
        if not running:
            return MISTAKES[3]
        return MISTAKES[2] if "run" in theirs else MISTAKES[1]
    if "pause" in theirs:
        return MISTAKES[7]
    if "run" in theirs:
        return MISTAKES[8]
    if running:
        same = not effect[6] and (effect[2], effect[3]) == (level, pattern)
        return MISTAKES[4] if same else MISTAKES[5]
    return MISTAKES[6]


def mistakes(expert: Sequence[Hashable], policy: Sequence[Hashable], jobs: Sequence[tuple | None], select: np.ndarray,
             advance: Hashable = ADVANCE) -> dict[str, int]:
    """Counts of each :func:`mistake_kind` over the states ``select`` picks (a boolean array)."""
    out = {k: 0 for k in MISTAKES}
    for st, e, p, j, sel in zip(round_sets(expert, advance), expert, policy, jobs, select):
        if sel:
            k = mistake_kind(st, p, j, advance)
            if k is not None:
                out[k] += 1
    return out


def scores(expert: Sequence[Hashable], policy: Sequence[Hashable], widths: np.ndarray, wide: int,
           advance: Hashable = ADVANCE) -> dict:
    """Exact and in-round agreement (fractions; NaN where a group is empty) of the policy's
    effects with the expert's, for all states, the acting states (the expert does not advance)
    and the states with a job of ``wide`` GPUs or more undecided."""
    sets = round_sets(expert, advance)
    exact = np.array([p == e for p, e in zip(policy, expert)], dtype=bool)
    in_round = np.array([p in s for p, s in zip(policy, sets)], dtype=bool)
    acting = np.array([e != advance for e in expert], dtype=bool)
    wide_s = np.asarray(widths) >= wide

    def frac(x, sel):
        return float(x[sel].mean()) if sel.any() else float("nan")

    out = {"states": int(len(expert)), "acting": int(acting.sum()), "wide_states": int(wide_s.sum()),
           "wide_acting": int((wide_s & acting).sum())}
    every = np.ones_like(acting)
    for name, x in (("exact", exact), ("in_round", in_round)):
        out[name] = frac(x, every)
        out[f"{name}_acting"] = frac(x, acting)
        out[f"{name}_wide"] = frac(x, wide_s)
        out[f"{name}_wide_acting"] = frac(x, wide_s & acting)
    return out


def policy_labels(run_dirs: Sequence[str]) -> list[str]:
    """One label per RUN_DIR: its path below the folder all of them share (a lone RUN_DIR: its last
    two parts, so ``runs/seed0/warm_start`` reads ``seed0/warm_start``). Raises ValueError when a
    RUN_DIR is given twice."""
    paths = [Path(d).resolve() for d in run_dirs]
    if len(set(paths)) != len(paths):
        raise ValueError(f"a RUN_DIR is given twice: {[str(d) for d in run_dirs]}")
    if len(paths) == 1:
        return [str(Path(*paths[0].parts[-2:]))]
    common = Path(os.path.commonpath(paths))
    return [str(p.relative_to(common)) for p in paths]


def measure(run_dirs: list[str], windows: list[int], trace: str, gpus: int, holdout: float, n_windows: int,
            window_jobs: int, load: float | None, expert_name: str, wide: int, split: str = "heldout",
            val: float = 0.1, log=print) -> dict:
    from agents.imitation import HeuristicExpert
    from agents.rl import LearnedAgent
    from bench.ppo_study import build_windows, evaluation_setup, study_splits

    agents = {label: LearnedAgent(d) for label, d in zip(policy_labels(run_dirs), run_dirs)}
    ks = {a.window_k for a in agents.values()}
    if len(ks) != 1:
        raise ValueError(f"the RUN_DIRs have different window sizes K {sorted(ks)}; expected one")
    parts = study_splits(trace, gpus, holdout, val=val if split == "val" else 0.0)
    wins = build_windows(parts["val" if split == "val" else "eval"], window_jobs, n_windows, gpus, load)
    bad = [w for w in windows if not 0 <= w < len(wins)]
    if bad:
        raise ValueError(f"--windows {bad}: expected window numbers in 0..{len(wins) - 1}")
    cluster_kwargs, cfg = evaluation_setup(gpus)
    first = next(iter(agents.values()))
    rows = []
    for w in windows:
        jobs, info = wins[w]
        env = first.make_env(cluster_kwargs=cluster_kwargs, sim_config=cfg)
        res = follow_expert(env, HeuristicExpert(expert_name), jobs, {k: a.act for k, a in agents.items()})
        acting = np.array([e != ADVANCE for e in res["expert"]], dtype=bool)
        for label in agents:
            sc = scores(res["expert"], res["policy"][label], res["widths"], wide)
            wrong = {f"mistakes_{part}": mistakes(res["expert"], res["policy"][label], res["policy_jobs"][label], sel)
                     for part, sel in (("acting", acting), ("wide_acting", acting & (res["widths"] >= wide)))}
            rows.append({"window": w, "policy": label, "max_gpus": info["max_gpus"],
                         "expert_avg_jct_h": res["expert_avg_jct_s"] / 3600, **sc, **wrong})
            log(f"window {w} {label}: exact {sc['exact']:.3f} (acting {sc['exact_acting']:.3f}), in-round "
                f"{sc['in_round']:.3f} (acting {sc['in_round_acting']:.3f}; with a job of >= {wide} GPUs undecided: "
                f"{sc['in_round_wide_acting']:.3f} over {sc['wide_acting']} acting states)")
    return {"trace": portable_text(trace), "gpus": gpus, "holdout": holdout, "split": split, "val": val if split == "val" else None,
            "windows": windows, "window_jobs": window_jobs,
            "load": load, "expert": expert_name, "wide": wide, "run_dirs": [str(Path(d).resolve()) for d in run_dirs],
            "rows": rows}


def _f(x: float) -> str:
    return "n/a" if x != x else f"{x:.3f}"


def write_md(path: Path, res: dict, command: str) -> str:
    w = res["wide"]
    L = ["# Clone accuracy along the expert's trajectory", "",
         f"Expert `{res['expert']}` on {'validation' if res.get('split') == 'val' else 'held-out'} windows "
         f"{res['windows']} of `{res['trace']}` ({res['gpus']} GPUs, "
         f"{res['window_jobs']} jobs per window, load {res['load']}). `exact`: the policy's action does what the expert's "
         f"next one does; `in round`: what the expert does before the round ends (actions compared by effect). `wide`: states with a job of >= {w} GPUs "
         "undecided.", "",
         "| window | max GPUs | policy | states | acting | exact | exact, acting | in round | in round, acting | "
         "wide acting states | in round, wide acting |",
         "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        L.append(f"| {r['window']} | {r['max_gpus']} | {r['policy']} | {r['states']} | {r['acting']} | {_f(r['exact'])} | "
                 f"{_f(r['exact_acting'])} | {_f(r['in_round'])} | {_f(r['in_round_acting'])} | {r['wide_acting']} | "
                 f"{_f(r['in_round_wide_acting'])} |")
    L += ["", "Where the policy departs from the expert's round, on acting states (counts; the three most frequent "
          "kinds, `bench.clone_accuracy.MISTAKES`; states with a wide job undecided in brackets):", "",
          "| window | policy | acting | departures | most frequent kinds |", "|---:|---|---:|---:|---|"]
    for r in res["rows"]:
        m, mw = r.get("mistakes_acting"), r.get("mistakes_wide_acting", {})
        if not m:
            continue
        top = sorted((k for k in m if m[k]), key=lambda k: -m[k])[:3]
        L.append(f"| {r['window']} | {r['policy']} | {r['acting']} | {sum(m.values())} | "
                 + "; ".join(f"{k}: {m[k]} [{mw.get(k, 0)}]" for k in top) + " |")
    L += ["", f"`{command}`", ""]
    text = "\n".join(L)
    path.write_text(text)
    return text


def main(argv=None) -> int:
    from bench.ppo_study import _default_trace

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="trained policies (a RUN_DIR or RUN_DIR/warm_start)")
    p.add_argument("--windows", default="2", help="comma-separated held-out window numbers (default 2)")
    p.add_argument("--trace", default=None, help="KIND:PATH (default philly:$JIGSAW_DATA/philly/philly.csv)")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--holdout", type=float, default=0.2)
    p.add_argument("--split", choices=("heldout", "val"), default="heldout",
                   help="cut the windows from the held-out split (default; report only) or the validation split")
    p.add_argument("--val", type=float, default=0.1, help="validation fraction for --split val (default 0.1)")
    p.add_argument("--n-windows", type=int, default=12, help="windows the held-out split is cut into (default 12)")
    p.add_argument("--window-jobs", type=int, default=80)
    p.add_argument("--load", type=float, default=1.0)
    p.add_argument("--expert", default="jigsaw")
    p.add_argument("--wide", type=int, default=32, help="GPUs of a 'wide' job (default 32)")
    p.add_argument("--out", default=None, help="write clone_accuracy.json and .md here")
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        windows = [int(x) for x in a.windows.split(",") if x.strip()]
    except ValueError:
        p.error(f"--windows must be comma-separated integers, got {a.windows!r}")
    if not windows:
        p.error("--windows: expected at least one window number")
    t0 = time.perf_counter()
    try:
        res = measure(a.run_dirs, windows, a.trace or _default_trace(), a.gpus, a.holdout, a.n_windows,
                      a.window_jobs, a.load, a.expert, a.wide, a.split, a.val)
    except ValueError as e:
        p.error(str(e))
    res["wall_s"] = time.perf_counter() - t0
    command = command_line("bench.clone_accuracy", argv)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "clone_accuracy.json").write_text(json.dumps(res, indent=1))
        print(write_md(out / "clone_accuracy.md", res, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
