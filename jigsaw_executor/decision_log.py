"""The live executor's decision log, and its replay through the simulator (docs/design.md section 3).

``decision_log.jsonl``: one JSON object per line.

* ``{"kind": "header", ...}``: format, cluster (slots, memory, links), SPB and simulator settings,
  the job list, the scheduler (heuristic name and arguments, or the policy file and its layout),
  the cost tables' digests.
* ``{"kind": "round", ...}`` per round: ``round``, ``t_start`` / ``t_end`` (seconds since the
  run's epoch; a round's live length is ``t_end - t_start``), ``state`` (the
  :class:`~jigsaw_env.state.ClusterState` the scheduler saw, complete: jobs, time, round),
  ``policy_decision`` (what the scheduler returned), ``decision`` (what was applied: the policy's,
  unless a documented scenario hook changed it; ``forced`` says how), ``steps`` for a learned
  policy (per decision step: the encoded observation and exact action mask, base64 of float32 /
  packed bits, and the action taken), ``scheduler_s``, and ``outcome`` per job (iterations,
  stepping seconds, mean iteration time, bytes, loss, whether and when it finished, the
  incarnation and its start-up time).
* ``{"kind": "end", ...}`` when the run is complete.

:func:`replay_decision_log` reads it back and

1. **decisions**: re-runs the scheduler on the logged states in order (a fresh heuristic of the
   same name and arguments, which rebuilds its own memory from the same sequence of states) and
   checks it returns the logged ``policy_decision`` every round; for a learned policy it re-feeds
   every logged observation and mask and checks the same action comes back;
2. **outcomes**: runs the :class:`~jigsaw_env.simulator.Simulator` (the log's cluster, SPB
   settings and cost tables: the CPU tables unless ``tables`` points elsewhere) with the logged
   decisions, each round as long as it lasted live, and puts the simulated per-iteration time and
   JCT next to the measured ones (docs/deploy.md section 5).
"""
from __future__ import annotations

import base64
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agents import make_scheduler
from jigsaw_env import cost_table as ct
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.network import LINK_FILE, Link, load_link
from jigsaw_env.placement import GpuLedger
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import Pattern, SPBConfig
from jigsaw_env.state import ClusterState, CostModel, Decision, JobDecision, JobState, JobStatus

from .demo_scenario import DemoScenario
from .lockstep import lockstep_in_tables
from .policies import idle_guard, load_policy

FORMAT = "jigsaw-decision-log/1"

__all__ = ["FORMAT", "state_to_dict", "state_from_dict", "decision_to_dict", "decision_from_dict",
           "cluster_to_dict", "cluster_from_dict", "DecisionLogWriter", "read_decision_log", "ReplayResult", "check_decisions", "simulate_log",
           "replay_decision_log", "encode_array", "decode_array", "encode_mask", "decode_mask"]


# --------------------------------------------------------------------------------------------
# (de)serialisation
# --------------------------------------------------------------------------------------------
def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _unnum(x) -> float:
    return float("nan") if x is None else float(x)


def cluster_to_dict(c: ClusterSpec) -> dict:
    return {"num_nodes": c.num_nodes, "gpus_per_node": c.gpus_per_node, "gpu_types": list(c.gpu_types),
            "gpu_memory_bytes": {k: int(v) for k, v in c.gpu_memory_bytes.items()},
            "intra": [c.intra.alpha_s, c.intra.bandwidth_Bps], "cross": [c.cross.alpha_s, c.cross.bandwidth_Bps]}


def cluster_from_dict(d: dict) -> ClusterSpec:
    return ClusterSpec(num_nodes=int(d["num_nodes"]), gpus_per_node=int(d["gpus_per_node"]),
                       gpu_types=tuple(d["gpu_types"]), gpu_memory_bytes={k: int(v) for k, v in d["gpu_memory_bytes"].items()},
                       intra=Link(*d["intra"]), cross=Link(*d["cross"]))


def spb_to_dict(s: SPBConfig) -> dict:
    return {"max_level": s.max_level, "num_slots": s.num_slots, "average_over": s.average_over,
            "eta_prior_slope": s.eta_prior_slope}


def spb_from_dict(d: dict) -> SPBConfig:
    return SPBConfig(**d)


_JOB_FLOATS = ("arrival_s", "iterations", "duration_s", "progress", "attained_gpu_s", "run_s", "first_start_s",
               "finish_s", "restart_until_s", "status_since_s", "last_run_s")
_JOB_INTS = ("job_id", "num_gpus", "batch_size", "iteration", "level", "preemptions", "migrations", "level_changes",
             "last_round_run")


def job_to_dict(j: JobState) -> dict:
    d = {k: int(getattr(j, k)) for k in _JOB_INTS}
    d.update({k: _num(getattr(j, k)) for k in _JOB_FLOATS})
    d.update(model=j.model, status=j.status.value, placement=[int(g) for g in j.placement], pattern=j.pattern.value)
    return d


def job_from_dict(d: dict) -> JobState:
    kw = {k: int(d[k]) for k in _JOB_INTS}
    # logs written before a field existed keep the JobState default for it
    kw.update({k: _unnum(d[k]) for k in _JOB_FLOATS if k in d})
    kw.update(model=d["model"], status=JobStatus(d["status"]), placement=tuple(int(g) for g in d["placement"]),
              pattern=Pattern.parse(d["pattern"]))
    return JobState(**kw)


def state_to_dict(st: ClusterState) -> dict:
    """Everything of a ClusterState but its cost model (rebuilt from cluster + SPB settings)."""
    return {"time_s": float(st.time_s), "round": int(st.round), "active_ids": [int(x) for x in st.active_ids],
            "max_workers_per_gpu": int(st.max_workers_per_gpu),
            "jobs": [job_to_dict(j) for j in sorted(st.jobs.values(), key=lambda j: j.job_id)]}


def state_from_dict(d: dict, cluster: ClusterSpec, costs: CostModel) -> ClusterState:
    jobs = [job_from_dict(x) for x in d["jobs"]]
    return ClusterState(cluster=cluster, costs=costs, time_s=float(d["time_s"]), round=int(d["round"]),
                        jobs={j.job_id: j for j in jobs}, active_ids=[int(x) for x in d["active_ids"]],
                        max_workers_per_gpu=int(d["max_workers_per_gpu"]))


def decision_to_dict(dec: dict) -> dict:
    return {str(int(j)): {"gpus": [int(g) for g in jd.gpus], "level": int(jd.level), "pattern": jd.pattern.value}
            for j, jd in sorted(dec.items())}


def decision_from_dict(d: dict) -> Decision:
    return Decision({int(j): JobDecision(tuple(v["gpus"]), int(v["level"]), Pattern.parse(v["pattern"]))
                     for j, v in d.items()})


def encode_array(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.float32).tobytes()).decode("ascii")


def decode_array(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=np.float32).copy()


def encode_mask(m: np.ndarray) -> str:
    return base64.b64encode(np.packbits(np.asarray(m, dtype=bool)).tobytes()).decode("ascii")


def decode_mask(s: str, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(base64.b64decode(s), dtype=np.uint8))[:n].astype(bool)


# --------------------------------------------------------------------------------------------
# writing and reading
# --------------------------------------------------------------------------------------------
class DecisionLogWriter:
    """Appends JSON lines and flushes each one (a crash loses at most the line being written).
    ``truncate_to``: byte offset to cut the file at first (a restarted scheduler continues from the
    position its last snapshot recorded)."""

    def __init__(self, path: str | Path, truncate_to: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_to is not None and self.path.exists():
            with open(self.path, "r+b") as f:
                f.truncate(int(truncate_to))
        self._f = open(self.path, "ab")

    def write(self, obj: dict) -> int:
        self._f.write((json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode())
        self._f.flush()
        os.fsync(self._f.fileno())
        return self.tell()

    def tell(self) -> int:
        return int(self._f.tell())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_decision_log(path: str | Path) -> tuple[dict, list[dict], dict | None]:
    """(header, rounds, end record or None). ValueError on a file that is not a decision log."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"decision log not found: {p}")
    header, rounds, end = None, [], None
    with open(p) as f:
        for i, line in enumerate(f):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}: line {i + 1} is not JSON ({e})") from None
            kind = rec.get("kind")
            if kind == "header":
                header = rec
            elif kind == "round":
                rounds.append(rec)
            elif kind == "end":
                end = rec
    if header is None or header.get("format") != FORMAT:
        raise ValueError(f"{p}: not a jigsaw decision log (expected a header line with format {FORMAT!r})")
    return header, rounds, end


# --------------------------------------------------------------------------------------------
# replay
# --------------------------------------------------------------------------------------------
@dataclass
class ReplayResult:
    """What :func:`replay_decision_log` found.

    decisions_match: every round's re-computed policy decision equals the logged one (and, for a
        learned policy, every logged observation and mask gives the logged action).
    mismatches: the rounds (and steps) that differ, with both versions.
    jobs: per job, measured (live) vs simulated mean iteration time (over the rounds in which the
        job ran live; ``sim_iter_s_all`` over every simulated round) and JCT, relative errors.
    rounds: per round and job, measured vs simulated iterations and mean iteration time. ``round``
        is the live round whose decision the simulated round ran (a live round the simulator
        jumped over, idle until the next arrival, has no row); rounds the simulator needs after
        the last live one are numbered on from it.
    """

    decisions_match: bool
    rounds_checked: int
    steps_checked: int
    mismatches: list[dict] = field(default_factory=list)
    jobs: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    restart_s: float = 0.0

    def to_dict(self) -> dict:
        return {"decisions_match": self.decisions_match, "rounds_checked": self.rounds_checked,
                "steps_checked": self.steps_checked, "mismatches": self.mismatches, "jobs": self.jobs,
                "rounds": self.rounds, "notes": self.notes, "restart_s": self.restart_s}


def _scheduler_from_header(header: dict):
    sch = header["scheduler"]
    if sch["kind"] == "heuristic":
        s = make_scheduler(sch["name"], **_kwargs_from_json(sch.get("kwargs", {})))
        s.reset()
        return s, None

    return None, load_policy(sch["path"])


def _kwargs_from_json(kw: dict) -> dict:
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in kw.items()}


def check_decisions(header: dict, rounds: list[dict], scenario=None) -> tuple[bool, int, int, list[dict]]:
    """Step 1 of the replay (module docstring). Returns (match, rounds checked, steps checked,
    mismatches)."""
    cluster = cluster_from_dict(header["cluster"])
    spb = spb_from_dict(header["spb"])
    costs = CostModel(cluster, spb)
    sched, policy = _scheduler_from_header(header)
    mismatches: list[dict] = []
    nr = ns = 0
    for rec in rounds:
        if rec.get("idle"):
            continue
        if sched is not None:
            st = state_from_dict(rec["state"], cluster, costs)
            got = decision_to_dict(sched.schedule(st))
            nr += 1
            if got != rec["policy_decision"]:
                mismatches.append({"round": rec["round"], "logged": rec["policy_decision"], "replayed": got})
            dec = scenario(st, decision_from_dict(got))[0] if scenario is not None else decision_from_dict(got)
            applied = decision_to_dict(idle_guard(st, dec, header.get("idle_guard_s"))[0])
            if applied != rec["decision"]:
                mismatches.append({"round": rec["round"], "what": "applied decision (scenario hook)",
                                   "logged": rec["decision"], "replayed": applied})
        else:
            nr += 1
            for i, s in enumerate(rec.get("steps", [])):
                obs = decode_array(s["obs"])
                mask = decode_mask(s["mask"], int(s["n_actions"]))
                a = int(policy.act(obs, mask))
                ns += 1
                if a != int(s["action"]):
                    mismatches.append({"round": rec["round"], "step": i, "logged": int(s["action"]), "replayed": a})
    return not mismatches, nr, ns, mismatches


def _job_state(spec: dict) -> JobState:
    return JobState(job_id=int(spec["job_id"]), arrival_s=float(spec["arrival_s"]), num_gpus=int(spec["num_gpus"]),
                    model=spec["model"], batch_size=int(spec["batch_size"]), iterations=float(spec["iterations"]))


def _rel(a: float, b: float) -> float | None:
    if a is None or b is None or not np.isfinite(a) or not np.isfinite(b) or b == 0:
        return None
    return (a - b) / b


class _tables_registered:
    """Register the cost tables of a folder for the duration of a ``with`` block (then put back
    whatever was registered under the same keys before)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def __enter__(self):
        if not self.folder.is_dir():
            raise FileNotFoundError(f"cost-table folder not found: {self.folder}")
        self.tables = [ct.CostTable.load(f) for f in ct.table_files(self.folder)]
        self.prev = {(t.model, t.batch_size, t.device): ct.registered_table(t.model, t.batch_size, t.device)
                     for t in self.tables}
        for t in self.tables:
            ct.register_table(t)
        return self

    def __exit__(self, *exc):
        for key, old in self.prev.items():
            if old is None:
                ct.unregister_table(*key)
            else:
                ct.register_table(old)


def simulate_log(header: dict, rounds: list[dict], restart_s: float | None = None,
                 tables: str | Path | None = None, link: Link | None = None, lockstep_s: float | None = None,
                 failed: set[int] | frozenset[int] = frozenset()
                 ) -> tuple[list[dict], list[dict], list[str], float]:
    """Step 2 of the replay: the logged decisions through the simulator. Returns (jobs, rounds,
    notes, restart_s used). ``link``: replace the logged slot-to-slot link (e.g. one fitted to
    loopback gloo); ``lockstep_s``: the barrier of a co-located step (``SimConfig.lockstep_s``,
    eq. K3; default: the header's ``sim.lockstep_s``, else 0). With ``tables``, ``tables/link.json`` and ``tables/lockstep.json`` are
    used for whichever of the two is not given, when they exist (what ``jigsaw calibrate
    --executor`` writes). ``failed``: jobs the live run gave up (status ``failed``); the simulator
    runs them only where the logged decisions do, and does not wait for them to finish."""
    if tables:
        lf = Path(tables) / LINK_FILE
        if link is None and lf.is_file():  # `jigsaw calibrate --executor` wrote the link next to its tables
            link = load_link(lf)
        if lockstep_s is None:  # and the lockstep barrier
            lockstep_s = lockstep_in_tables(tables)
        with _tables_registered(tables):
            return simulate_log(header, rounds, restart_s, None, link, lockstep_s, failed)
    notes: list[str] = []
    sim, base, restart_s = _replay_simulator(header, rounds, restart_s, link, lockstep_s, notes)
    failed = {int(x) for x in failed}
    if failed:
        notes.append(f"job(s) {sorted(failed)} failed live (given up): simulated only in the logged rounds")
    live_steps, live_round_of = _replay_rounds(sim, base, rounds, failed, notes)
    live_round_of.update(_run_to_the_end(sim, base, header, rounds, failed, notes))
    jf = sim.jobs_frame().set_index("job_id")
    rf = sim.rounds_frame()
    # the simulator counts its own rounds; a live round it skipped (it had jumped past that
    # round's end to an arrival) has no simulated round, so the two counts drift apart. Every
    # row is labelled with the live round whose decision it ran
    rf["round"] = rf["round"].map(live_round_of)
    return _job_rows(header, rounds, jf, rf, live_steps), _round_rows(rf, live_steps), notes, float(restart_s)


def _replay_simulator(header: dict, rounds: list[dict], restart_s: float | None, link: Link | None,
                      lockstep_s: float | None, notes: list[str]):
    """(the simulator of the logged cluster and jobs, its config, the restart_s used); what it
    assumes is appended to ``notes``."""
    cluster = cluster_from_dict(header["cluster"])
    if link is not None:
        cluster = replace(cluster, intra=link, cross=link)
        notes.append(f"link replaced: alpha {link.alpha_s * 1e6:.1f} us, {link.bandwidth_Bps / 1e9:.2f} GB/s")
    if lockstep_s is None:  # the barrier the run was configured with (0 in logs written before it existed)
        lockstep_s = float(header["sim"].get("lockstep_s") or 0.0)
    if lockstep_s:
        notes.append(f"lockstep barrier: {lockstep_s * 1e3:.3f} ms per co-located step")
    spb = spb_from_dict(header["spb"])
    if restart_s is None:
        ups = [o["startup_s"] for r in rounds for o in r.get("outcome", {}).values()
               if o.get("resumed") and o.get("startup_s") is not None]
        restart_s = float(np.median(ups)) if ups else 0.0
        notes.append(f"restart_s = {restart_s:.3f} s: median measured start-up of the resumed/migrated incarnations "
                     f"({len(ups)})")
    jobs = [_job_state(j) for j in header["jobs"]]
    # the pace the run stepped co-located jobs at (a header without one: the lockstep it then had)
    pace = header["sim"].get("pace", "lockstep")
    notes.append(f"pace: {pace} (as the live run)")
    base = SimConfig(round_s=1.0, restart_s=float(restart_s), max_workers_per_gpu=int(header["sim"]["max_workers_per_gpu"]),
                     spb=spb, lockstep_s=float(lockstep_s or 0.0), pace=pace)
    return Simulator(cluster, jobs, base), base, restart_s


def _sim_finished(sim, failed: set[int]) -> bool:
    """Every job done in the simulator, except those given up live."""
    return sim.done or all(j.status is JobStatus.DONE or j.job_id in failed for j in sim.state.jobs.values())


def _done_live(rec: dict, sim_running) -> set[int]:
    """The jobs the live run had finished when the logged round started (its ``state``). An idle
    round (no state: every job that had arrived was done live) counts every job the simulator
    still runs (``sim_running``) as done live."""
    if rec.get("state") is None:
        return {j.job_id for j in sim_running}
    return {int(j["job_id"]) for j in rec["state"]["jobs"] if j["status"] == JobStatus.DONE.value}


def _replay_rounds(sim, base, rounds: list[dict], failed: set[int], notes: list[str]
                   ) -> tuple[dict[tuple[int, int], dict], dict[int, int]]:
    """Step the simulator through the logged rounds, each as long as the live one, with the logged
    decision. Returns the live outcomes by (live round, job) and, per simulated round, the live
    round it replayed."""
    live_steps: dict[tuple[int, int], dict] = {}
    live_round_of: dict[int, int] = {}
    for rec in rounds:
        if _sim_finished(sim, failed):
            notes.append(f"the simulator finished every job before live round {rec['round']}")
            break
        # the simulated round ends when the live one did (the simulator may have jumped ahead to
        # an arrival while idle; then this round is shorter)
        dur = float(rec["t_end"]) - float(sim.state.time_s)
        if dur <= 1e-9:
            continue
        sim.config = replace(base, round_s=dur)
        want = decision_from_dict(rec["decision"])
        st = sim.state
        dec = Decision()
        for jid, jd in want.items():
            j = st.jobs.get(jid)
            if j is not None and j.active:
                dec[jid] = jd
            elif j is not None and j.status is JobStatus.DONE:
                notes.append(f"round {rec['round']}: job {jid} already done in the simulator; left out")
        # a job the simulator still runs but that finished live keeps its last placement if it fits
        # (a job the live run preempted this round is paused here too, as it was live)
        done_live = _done_live(rec, st.running())
        for j in st.running():
            if j.job_id not in dec and j.job_id in done_live and j.job_id not in failed:
                led = GpuLedger(st, dec)
                jd = JobDecision(j.placement, j.level, j.pattern)
                if led.fits(j.job_id, jd):
                    dec[j.job_id] = jd
                    notes.append(f"round {rec['round']}: job {j.job_id} finished live but not in the simulator; kept")
        live_round_of[sim.step(dec).round] = int(rec["round"])
        for o in rec.get("outcome", {}).values():
            live_steps[(int(rec["round"]), int(o["job_id"]))] = o
    return live_steps, live_round_of


def _run_to_the_end(sim, base, header: dict, rounds: list[dict], failed: set[int], notes: list[str]
                    ) -> dict[int, int]:
    """The simulator is slower than live: keep going with the last decision until it finishes.
    Returns the round numbers these extra rounds are reported under (simulated round -> the
    numbers after the last live round's)."""
    extra = 0
    label = {}
    after = int(rounds[-1]["round"]) if rounds else -1
    last = decision_from_dict(rounds[-1]["decision"]) if rounds else Decision()
    while not _sim_finished(sim, failed):
        st = sim.state
        led = GpuLedger(st)
        for j in st.running():
            if j.job_id not in failed:
                led.add(j.job_id, JobDecision(j.placement, j.level, j.pattern))
        for jid, jd in last.items():
            j = st.jobs.get(jid)
            if j is not None and j.active and jid not in failed and jid not in led.decision and led.fits(jid, jd):
                led.add(jid, jd, checked=True)
        for j in st.active():
            if j.job_id not in led.decision and j.job_id not in failed:
                led.place_and_add(j, "consolidated", 0)
        sim.config = replace(base, round_s=float(header["sim"].get("round_s") or 1.0))
        extra += 1
        label[sim.step(led.decision).round] = after + extra
        if extra > 100_000:
            notes.append("the simulator did not finish within 100000 extra rounds; stopped")
            break
    if extra:
        notes.append(f"the simulator needed {extra} round(s) after the last live one (slower than live)")
    return label


def _round_rows(rf, live_steps: dict[tuple[int, int], dict]) -> list[dict]:
    """Per simulated round and job (``rf``'s rounds labelled with live round numbers): the
    simulator's steps and iteration time beside the live ones."""
    out_rounds = []
    for row in rf.itertuples():
        live = live_steps.get((int(row.round), int(row.job_id)))
        sim_it = row.run_s / row.steps if row.steps else None
        out_rounds.append({"round": int(row.round), "job_id": int(row.job_id), "sim_steps": int(row.steps),
                           "sim_iter_s": sim_it, "live_steps": None if live is None else live["iterations"],
                           "live_iter_s": None if live is None else live["mean_iter_s"],
                           "iter_rel_err": None if live is None else _rel(sim_it, live["mean_iter_s"])})
    return out_rounds


def _job_rows(header: dict, rounds: list[dict], jf, rf, live_steps: dict[tuple[int, int], dict]) -> list[dict]:
    """Per job: live and simulated iterations, iteration time, JCT and bytes per iteration."""
    out_jobs = []
    rfj = rf.groupby("job_id")[["run_s", "steps", "bytes"]].sum()
    # per-iteration time is compared over the rounds in which the job ran live too (the same
    # decisions on both sides); rounds the simulator adds after the job finished live run it under
    # decisions that never held it (e.g. sharing a slot the live run gave another job), so they
    # count in the JCT and in sim_iter_s_all, not in the like-for-like sim_iter_s
    both = np.array([(int(r), int(j)) in live_steps for r, j in zip(rf["round"], rf["job_id"])], dtype=bool) \
        if len(rf) else np.zeros(0, dtype=bool)
    rfb = rf[both].groupby("job_id")[["run_s", "steps"]].sum()
    for spec in header["jobs"]:
        jid = int(spec["job_id"])
        live = [o for r in rounds for o in [r.get("outcome", {}).get(str(jid))] if o]
        live_iters = sum(o["iterations"] for o in live)
        live_step_s = sum(o["stepping_s"] for o in live)
        fin = [o["finish_s"] for o in live if o.get("finished")]
        live_jct = (fin[-1] - float(spec["arrival_s"])) if fin else None
        sim_jct = float(jf.loc[jid, "jct_s"]) if jid in jf.index else None
        if sim_jct is not None and not math.isfinite(sim_jct):  # a job given up live never finishes
            sim_jct = None
        sim_steps = int(rfj.loc[jid, "steps"]) if jid in rfj.index else 0
        sim_iter_all = float(rfj.loc[jid, "run_s"]) / sim_steps if sim_steps else None
        steps_b = int(rfb.loc[jid, "steps"]) if jid in rfb.index else 0
        sim_iter = float(rfb.loc[jid, "run_s"]) / steps_b if steps_b else None
        live_iter = live_step_s / live_iters if live_iters else None
        live_bytes = sum(o["bytes"] for o in live)
        out_jobs.append({
            "job_id": jid, "model": spec["model"], "num_gpus": int(spec["num_gpus"]),
            "live_iterations": live_iters, "sim_iterations": sim_steps,
            "live_iter_s": live_iter, "sim_iter_s": sim_iter, "iter_rel_err": _rel(sim_iter, live_iter),
            "sim_iter_s_all": sim_iter_all,
            "live_jct_s": live_jct, "sim_jct_s": sim_jct, "jct_rel_err": _rel(sim_jct, live_jct),
            "live_bytes_per_iter": live_bytes / live_iters if live_iters else None,
            "sim_bytes_per_iter": float(rfj.loc[jid, "bytes"]) / sim_steps if sim_steps else None,
            "live_preemptions": None, "sim_preemptions": int(jf.loc[jid, "preemptions"]) if jid in jf.index else None,
        })
    return out_jobs


def replay_decision_log(path: str | Path, *, restart_s: float | None = None, tables: str | Path | None = None,
                        scenario=None, link: Link | None = None, lockstep_s: float | None = None) -> ReplayResult:
    """Replay a decision log (module docstring): the same decisions, then the simulated and the
    measured outcome side by side."""
    header, rounds, end = read_decision_log(path)
    if scenario is None and header.get("scenario"):
        scenario = DemoScenario.from_dict(header["scenario"])
    match, nr, ns, mism = check_decisions(header, rounds, scenario)
    failed = {int(k) for k, v in (end or {}).get("jobs", {}).items() if v.get("status") == "failed"}
    jobs, rnds, notes, rs = simulate_log(header, rounds, restart_s, tables, link, lockstep_s, failed)
    if end is None:
        notes.append("the log has no end record: the run did not complete")
    if end is not None:
        live = {int(k): v for k, v in end.get("jobs", {}).items()}
        for j in jobs:
            v = live.get(j["job_id"])
            if v is not None:
                j["live_preemptions"] = v.get("preemptions")
    return ReplayResult(decisions_match=match, rounds_checked=nr, steps_checked=ns, mismatches=mism, jobs=jobs,
                        rounds=rnds, notes=notes, restart_s=rs)
