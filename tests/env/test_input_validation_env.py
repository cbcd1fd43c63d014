"""Bad input to the job-table reader, the Gymnasium env, ``synthetic:`` specs and ``--seed``:
each gets one clear ValueError naming the table / argument / key / flag and what was expected,
and valid input gives exactly what it gave before."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from jigsaw_env.actions import InvalidAction
from jigsaw_env.cli import main
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.cost_table import default_batch_size, get_table
from jigsaw_env.env import JigsawClusterEnv
from jigsaw_env.simulator import SimConfig, Simulator, check_job_table, jobs_from_table
from jigsaw_env.spb import SPBConfig
from jigsaw_env.state import CostModel, JobState
from traces import load_trace, offered_load, to_canonical_csv
from traces.synthetic import generate, parse_params

GPUS = 64


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    """Six synthetic jobs as the loaders produce them."""
    return load_trace("synthetic:jobs=6,seed=0", cluster_gpus=GPUS).jobs


def _bad(table: pd.DataFrame, column: str, row: int, value, dtype=None) -> pd.DataFrame:
    df = table.copy()
    if dtype is not None:
        df[column] = df[column].astype(dtype)
    df.loc[row, column] = value
    return df


def _run_fifo(df: pd.DataFrame) -> Simulator:
    from agents import make_scheduler

    sim = Simulator(ClusterSpec.from_gpus(GPUS), df, SimConfig())
    sim.run(make_scheduler("fifo"))
    return sim


# ------------------------------------------------------------------------ 1. the job table
BAD_TABLES = [
    # (column, row, value, dtype, message after "<origin>: ")
    ("arrival_s", 0, np.nan, None,
     "column 'arrival_s': job_id 0: missing value, got nan; expected a finite number >= 0"),
    ("arrival_s", 0, -100.0, None, "column 'arrival_s': job_id 0: must be a finite number >= 0, got -100.0"),
    ("arrival_s", 2, np.inf, None, "column 'arrival_s': job_id 2: must be a finite number >= 0, got inf"),
    ("num_gpus", 0, 2.5, float, "column 'num_gpus': job_id 0: must be an integer >= 1, got 2.5"),
    ("num_gpus", 0, "x", object, "column 'num_gpus': job_id 0: not a number, got 'x'"),
    ("num_gpus", 1, 0, None, "column 'num_gpus': job_id 1: must be an integer >= 1, got 0"),
    ("num_gpus", 2, np.inf, float, "column 'num_gpus': job_id 2: must be an integer >= 1, got inf"),
    ("job_id", 0, 1.7, float, "column 'job_id': job_id 1.7: must be an integer, got 1.7"),
    ("job_id", 3, 1, None, "column 'job_id': job_id 1: duplicate job_id, got 1"),
    ("job_id", 2, 1e300, float, "column 'job_id': job_id at row 2: must be an integer, got 1e+300"),
    ("iterations", 4, -5.0, None, "column 'iterations': job_id 4: must be a finite number > 0 (or empty), got -5.0"),
    ("batch_size", 5, 0.5, float, "column 'batch_size': job_id 5: must be an integer >= 1 (or empty), got 0.5"),
]


@pytest.mark.parametrize("column,row,value,dtype,message", BAD_TABLES,
                         ids=[f"{c}={v!r}" for c, _, v, _, _ in BAD_TABLES])
def test_a_bad_table_is_refused_by_the_simulator_and_the_env(table, column, row, value, dtype, message):
    df = _bad(table, column, row, value, dtype)
    before = df.copy()
    with pytest.raises(ValueError) as e:
        Simulator(ClusterSpec.from_gpus(GPUS), df, SimConfig())
    assert str(e.value) == f"job table: {message}"
    with pytest.raises(ValueError) as e:
        jobs_from_table(df, ClusterSpec.from_gpus(GPUS))
    assert str(e.value) == f"job table: {message}"
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(gpus=GPUS, trace=df)
    assert str(e.value) == f"trace (DataFrame): {message}"
    pd.testing.assert_frame_equal(df, before)  # the caller's table is left as it was


def test_nan_arrival_is_refused_before_anything_runs(table):
    """A NaN arrival is refused before anything runs (unchecked, Simulator.run would never end)."""
    df = _bad(table, "arrival_s", 0, np.nan)
    with pytest.raises(ValueError, match=r"^job table: column 'arrival_s': job_id 0: missing value, got nan"):
        _run_fifo(df)
    env = JigsawClusterEnv(gpus=GPUS, trace=table)  # a valid table: the episode ends
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"^job table: column 'arrival_s': job_id 0: missing value"):
        env.reset(seed=0, options={"jobs": df})


def test_missing_columns_are_named(table):
    cluster = ClusterSpec.from_gpus(GPUS)
    have = [c for c in table.columns if c != "arrival_s"]
    msg = ("is missing column 'arrival_s' (it needs job_id, arrival_s, num_gpus, model and iterations or "
           f"duration_s; it has {have})")
    with pytest.raises(ValueError) as e:
        jobs_from_table(table.drop(columns="arrival_s"), cluster)
    assert str(e.value) == f"job table {msg}"
    with pytest.raises(ValueError) as e:  # was a raw KeyError from the env's window slicing
        JigsawClusterEnv(gpus=GPUS, trace=table.drop(columns="arrival_s"), max_jobs=3)
    assert str(e.value) == f"trace (DataFrame) {msg}"
    with pytest.raises(ValueError) as e:
        jobs_from_table(table.drop(columns=["iterations", "duration_s"]), cluster)
    assert str(e.value) == "job table: needs a 'duration_s' or an 'iterations' column"
    with pytest.raises(ValueError, match=r"^job table: column\(s\) \['num_gpus'\] appear more than once$"):
        jobs_from_table(pd.concat([table, table[["num_gpus"]]], axis=1), cluster)
    with pytest.raises(ValueError, match=r"^the trace has no jobs \(empty job table\)$"):
        jobs_from_table(table.iloc[:0], cluster)


def test_row_errors_name_the_row_the_job_and_the_field(table):
    cluster = ClusterSpec.from_gpus(GPUS)
    df = table.copy()
    df.loc[3, "model"] = "gpt5"
    with pytest.raises(ValueError) as e:
        jobs_from_table(df, cluster)
    assert str(e.value).startswith("job table row 3 (job_id 3): field 'model' / 'batch_size': unknown model 'gpt5'; "
                                   "allowed: [")
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(gpus=GPUS, trace=df)
    assert str(e.value).startswith("trace (DataFrame) row 3 (job_id 3): field 'model' / 'batch_size': unknown model")
    df = table.copy()
    df.loc[2, "num_gpus"] = 128
    with pytest.raises(ValueError) as e:
        jobs_from_table(df, cluster)
    assert str(e.value) == ("job table row 2 (job_id 2): needs 128 GPUs but the cluster has 64; cap GPUs per job "
                            "(--max-gpus-per-job) or use a larger cluster")


def _reference_jobs(df: pd.DataFrame, cluster: ClusterSpec) -> list[JobState]:
    """A plain reference for jobs_from_table: the job states built row by row without the
    table's validation (valid tables only)."""
    costs = CostModel(cluster, SPBConfig())
    out = []
    iters = df["iterations"] if "iterations" in df.columns else pd.Series(np.nan, index=df.index)
    dur = df["duration_s"] if "duration_s" in df.columns else pd.Series(np.nan, index=df.index)
    bss = df["batch_size"] if "batch_size" in df.columns else pd.Series(np.nan, index=df.index)
    for jid, arr, ng, it, d, m, bs in zip(df["job_id"], df["arrival_s"], df["num_gpus"], iters, dur, df["model"], bss):
        bs = int(bs) if pd.notna(bs) else default_batch_size(m)
        get_table(m, bs, cluster.main_gpu_type)
        j = JobState(job_id=int(jid), arrival_s=float(arr), num_gpus=int(ng), model=m, batch_size=bs,
                     iterations=float("nan"), duration_s=float(d) if pd.notna(d) else float("nan"))
        if pd.notna(it) and float(it) > 0:
            j.iterations = float(it)
        else:
            j.iterations = max(1.0, float(d) / costs.isolated_iteration_s(j))
        out.append(j)
    return out


def _fields(jobs: list[JobState]) -> list[tuple]:
    return [(type(j.job_id), j.job_id, j.arrival_s, j.num_gpus, j.model, j.batch_size,
             j.iterations if not math.isnan(j.iterations) else "nan",
             j.duration_s if not math.isnan(j.duration_s) else "nan") for j in jobs]


def _hand_table(n: int = 12, seed: int = 0) -> pd.DataFrame:
    """A user's table: int arrival seconds, no batch_size, durations for some jobs only, an
    extra column of the user's own."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"job_id": np.arange(n) * 3, "arrival_s": np.sort(rng.integers(0, 500, n)),
                         "num_gpus": rng.choice([1, 2, 4], n), "model": rng.choice(["resnet18", "lstm_lm"], n),
                         "iterations": np.where(np.arange(n) % 3 == 0, np.nan, rng.integers(50, 400, n)),
                         "duration_s": rng.uniform(100, 900, n).round(), "note": "mine"})


@pytest.mark.parametrize("which", ["loader", "hand", "shuffled"])
def test_valid_tables_give_exactly_the_jobs_they_gave_before(table, which):
    cluster = ClusterSpec.from_gpus(GPUS)
    df = {"loader": lambda: load_trace("synthetic:jobs=300,seed=4", cluster_gpus=GPUS).jobs,
          "hand": _hand_table,
          "shuffled": lambda: load_trace("synthetic:jobs=300,seed=4", cluster_gpus=GPUS).jobs.sample(
              frac=1.0, random_state=2)}[which]()
    assert _fields(jobs_from_table(df, cluster)) == _fields(_reference_jobs(df, cluster))


def test_a_valid_table_runs_as_its_loaded_csv_runs(table, tmp_path):
    """The same jobs through the DataFrame path and through the csv: loader give the same
    jobs_frame (and metrics)."""
    path = to_canonical_csv(table, tmp_path / "jobs.csv")
    loaded = load_trace(f"csv:{path}", cluster_gpus=GPUS, max_gpus=GPUS).jobs
    a, b = _run_fifo(table), _run_fifo(loaded)
    pd.testing.assert_frame_equal(a.jobs_frame(), b.jobs_frame())
    assert a.metrics().keys() == b.metrics().keys()
    # the table's own row order is kept (the simulator sorts arrivals itself)
    shuffled = table.sample(frac=1.0, random_state=0)
    assert [j.job_id for j in jobs_from_table(shuffled, ClusterSpec.from_gpus(GPUS))] == shuffled["job_id"].tolist()
    pd.testing.assert_frame_equal(_run_fifo(shuffled).jobs_frame(), a.jobs_frame())


def test_check_job_table_normalizes_text_numbers_in_the_tables_order():
    df = pd.DataFrame({"job_id": ["2", "1"], "arrival_s": ["5.5", "0"], "num_gpus": ["1", "2.0"],
                       "model": "resnet18", "iterations": [10, 20]})
    t = check_job_table(df)
    assert t["job_id"].tolist() == [2, 1] and t["arrival_s"].tolist() == [5.5, 0.0]
    assert t["num_gpus"].tolist() == [1, 2] and t["model"].tolist() == ["resnet18", "resnet18"]
    env = JigsawClusterEnv(gpus=8, trace=df, max_jobs=1)  # text numbers: windows work too
    env.reset(seed=0)
    assert len(env.sim.state.jobs) == 1
    with pytest.raises(ValueError, match=r"^job table: expected a pandas DataFrame, got list$"):
        check_job_table([1, 2])


def test_a_valid_table_gives_the_env_the_same_episodes_as_before():
    """A DataFrame trace's windows: the same rows, arrivals shifted to 0 (as before)."""
    df = _hand_table(30)
    env = JigsawClusterEnv(gpus=16, trace=df, max_jobs=7)
    env.reset(seed=5)
    jobs = sorted(env.sim.state.jobs.values(), key=lambda j: j.job_id)
    ids = [j.job_id for j in jobs]
    pos = df.index[df["job_id"].isin(ids)]
    assert len(ids) == 7 and list(pos) == list(range(pos[0], pos[0] + 7))  # consecutive rows of the table
    window = df.iloc[pos[0]:pos[0] + 7]
    expect = window["arrival_s"] - window["arrival_s"].min()
    assert [j.arrival_s for j in jobs] == [float(x) for x in expect]


# ------------------------------------------------------------------------ 2. load and conflicts
def test_load_rescales_a_dataframe_trace_as_a_csv_trace_is_rescaled(table, tmp_path):
    for df in (table, _hand_table(20).drop(columns="note")):
        path = to_canonical_csv(df, tmp_path / "jobs.csv")
        for load in (0.5, 2.0):
            want = load_trace(f"csv:{path}", cluster_gpus=GPUS, max_gpus=GPUS, load_scale=load).jobs
            env = JigsawClusterEnv(gpus=GPUS, trace=df, load=load, max_jobs=len(df))
            got = env._full_trace.sort_values("arrival_s", kind="stable")
            a0 = float(df["arrival_s"].min())  # the loader starts the trace at 0; the env keeps the first arrival
            assert got["arrival_s"].min() == a0
            np.testing.assert_allclose(got["arrival_s"].to_numpy() - a0, want["arrival_s"].to_numpy(), rtol=1e-12)
            assert got["job_id"].tolist() == want["job_id"].tolist()
            env.reset(seed=0)
            arr = sorted(j.arrival_s - a0 for j in env.sim.state.jobs.values())
            np.testing.assert_allclose(arr, np.sort(want["arrival_s"].to_numpy()), rtol=1e-12, atol=1e-9)
    # load=None keeps the table's own arrival times
    env = JigsawClusterEnv(gpus=GPUS, trace=table, max_jobs=len(table))
    assert env._full_trace["arrival_s"].tolist() == table["arrival_s"].tolist()
    assert offered_load(JigsawClusterEnv(gpus=GPUS, trace=table, load=1.5)._full_trace, GPUS) == pytest.approx(1.5)


def test_load_on_a_dataframe_that_cannot_be_scaled_is_refused():
    burst = pd.DataFrame({"job_id": [0, 1], "arrival_s": 0.0, "num_gpus": 1, "model": "resnet18",
                          "iterations": 100.0})
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(gpus=8, trace=burst, load=1.0)
    assert str(e.value) == "trace (DataFrame): cannot scale to load=1.0: all jobs arrive at the same time"
    JigsawClusterEnv(gpus=8, trace=burst)  # without a load it is a valid burst


def test_synthetic_spec_conflicts_like_the_command_line():
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(trace="synthetic:load=0.5,jobs=20", load=4.0, max_jobs=5)
    assert str(e.value) == "conflicting loads: the spec says load=0.5, the load argument says 4.0"
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(trace="synthetic:load=0.5,jobs=20", max_jobs=5)
    assert str(e.value) == ("conflicting job counts: the spec says jobs=20, the max_jobs argument says 5; "
                            "give one of them")
    # agreeing values, or max_jobs left at its default: the spec's jobs
    env = JigsawClusterEnv(trace="synthetic:load=0.5,jobs=20", load=0.5, max_jobs=20)
    env.reset(seed=0)
    assert len(env.sim.state.jobs) == 20
    env = JigsawClusterEnv(trace="synthetic:jobs=20")
    env.reset(seed=0)
    assert len(env.sim.state.jobs) == 20 and env.max_jobs == 50


# ------------------------------------------------------------------------ 3. env arguments and step
ENV_ARGS = [
    ({"round_s": "abc"}, "round_s must be a finite number of seconds > 0, or None or 'iteration' for iteration "
                         "granularity, got 'abc'"),
    ({"round_s": -3}, "round_s must be a finite number of seconds > 0, or None or 'iteration' for iteration "
                      "granularity, got -3"),
    ({"round_s": True}, "round_s must be a finite number of seconds > 0, or None or 'iteration' for iteration "
                        "granularity, got True"),
    ({"window_k": 2.5}, "window_k must be an integer >= 1, got 2.5"),
    ({"window_k": 0}, "window_k must be an integer >= 1, got 0"),
    ({"reward_scale": "abc"}, "reward_scale must be a finite number > 0, got 'abc'"),
    ({"reward_scale": float("inf")}, "reward_scale must be a finite number > 0, got inf"),
    ({"max_jobs": True}, "max_jobs must be an integer >= 1, got True"),
    ({"max_jobs": 2.0}, "max_jobs must be an integer >= 1, got 2.0"),
    ({"max_stalled_rounds": 0}, "max_stalled_rounds must be None or an integer >= 1, got 0"),
    ({"observe_remaining": "no"}, "observe_remaining must be True or False, got 'no'"),
    ({"backlogged": 1}, "backlogged must be True or False, got 1"),
    ({"log_rounds": "yes"}, "log_rounds must be True or False, got 'yes'"),
    ({"spb_levels": 1.5}, "spb_levels must be an integer >= 0, got 1.5"),
    ({"spb_slots": "4"}, "spb_slots must be an integer >= 1, got '4'"),
    ({"max_workers_per_gpu": 0}, "max_workers_per_gpu must be an integer >= 1, got 0"),
    ({"gpu_memory_gib": "lots"}, "gpu_memory_gib must be None or a finite number > 0, got 'lots'"),
    ({"restart_s": "x"}, "restart_s must be a finite number of seconds >= 0, got 'x'"),
    ({"restart_s": float("inf")}, "restart_s must be a finite number of seconds >= 0, got inf"),
    ({"max_time_s": "x"}, "max_time_s must be None or a number of seconds > 0, got 'x'"),
    ({"eta_scale": "x"}, "eta_scale must be a finite number > 0, got 'x'"),
    ({"eta_scale": -1}, "eta_scale must be a finite number > 0, got -1"),
    ({"eta_override": 5.0}, "eta_override must be None or a number in (0, 1], got 5.0"),
    ({"eta_override": "x"}, "eta_override must be None or a number in (0, 1], got 'x'"),
    ({"load": "x"}, "load must be None or a finite number > 0, got 'x'"),
    ({"sharing": "mps"}, "sharing must be one of fitted, timeslice, got 'mps'"),
    ({"pace": "async"}, "pace must be one of free, lockstep, got 'async'"),
    ({"load": float("inf")}, "load must be None or a finite number > 0, got inf"),
    ({"trace": 5}, "trace must be a trace spec (KIND:PATH or synthetic[:key=value,...]) or a pandas DataFrame "
                   "job table, got int 5"),
    ({"trace": "parquet:x"}, "unknown trace kind 'parquet' in 'parquet:x'; expected KIND:PATH with KIND one of "
                             "['philly', 'philly-json', 'alibaba2020', 'alibaba2023', 'helios', 'gavel', 'csv', "
                             "'synthetic']"),
    ({"trace": "synthetic:size=3"}, "synthetic: unknown parameter 'size'; allowed: ['jobs', 'load', 'seed', 'gpus', "
                                    "'diurnal', 'start_hour', 'models']"),
    ({"trace": "synthetic:jobs=5,jobs=7"}, "synthetic: parameter 'jobs' given twice (jobs=5 and jobs=7); give it once"),
]


@pytest.mark.parametrize("kw,message", ENV_ARGS,
                         ids=[f"{next(iter(k))}={next(iter(k.values()))!r}" for k, _ in ENV_ARGS])
def test_bad_env_arguments_are_refused_in_the_constructor(kw, message):
    with pytest.raises(ValueError) as e:
        JigsawClusterEnv(gpus=8, **kw)
    assert str(e.value) == message


def test_a_missing_trace_file_is_refused_in_the_constructor(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^trace file not found: .*missing\.csv$"):
        JigsawClusterEnv(gpus=8, trace=f"csv:{tmp_path}/missing.csv")


def test_valid_env_arguments_of_other_types_are_accepted():
    env = JigsawClusterEnv(gpus=np.int64(16), gpus_per_node=np.int32(8), max_jobs=np.int64(5), window_k=np.int64(4),
                           spb_levels=np.int64(1), spb_slots=np.int64(2), max_workers_per_gpu=np.int64(2),
                           max_stalled_rounds=np.int64(9), round_s="iteration", observe_remaining=np.bool_(False),
                           reward_scale=np.float64(60.0), load=np.float64(1.2))
    assert env.max_jobs == 5 and type(env.max_jobs) is int and env.max_stalled_rounds == 9
    assert env.sim_config.round_s is None and env.cluster.num_gpus == 16
    env.reset(seed=0)
    assert len(env.sim.state.jobs) == 5
    assert JigsawClusterEnv(gpus=8, round_s=" Iteration ").sim_config.round_s is None
    assert JigsawClusterEnv(gpus=8, round_s=60).sim_config.round_s == 60


def test_step_takes_integers_and_refuses_other_actions_without_changing_anything():
    env = JigsawClusterEnv(gpus=8, max_jobs=5, window_k=4, invalid_action="noop")
    env.reset(seed=0)
    n = env.action_space.n
    expected = f"action must be an integer in 0..{n - 1} (a Python or numpy integer, or a 0-d integer array), got "
    for action, got in ((3.7, "float 3.7"), ("3", "str '3'"), (True, "bool True"), (None, "NoneType None"),
                        (np.float64(3.0), "float64 3.0"),
                        (np.array(3.0), "an array of shape () and dtype float64"),
                        (np.array([3]), "an array of shape (1,) and dtype int64; pass the scalar (action.item()), "
                                        "not a 1-element array"),
                        (np.array([1, 2]), "an array of shape (2,) and dtype int64")):
        before = (env._steps_in_round, env.sim.state.time_s, dict(env.builder.ledger.decision))
        with pytest.raises(InvalidAction) as e:
            env.step(action)
        assert str(e.value) == expected + got
        assert (env._steps_in_round, env.sim.state.time_s, dict(env.builder.ledger.decision)) == before
    adv = env.codec.advance
    for action in (adv, np.int64(adv), np.int32(adv), np.array(adv), np.uint16(adv)):
        _, _, term, trunc, info = env.step(action)
        assert "round" in info and "invalid_action" not in info
        if term or trunc:
            env.reset(seed=0)
    # an integer out of range is still a masked action: noop with a reason
    _, _, _, _, info = env.step(n + 5)
    assert info["invalid_action"] == f"action {n + 5} is outside 0..{n - 1}"


def test_step_actions_of_any_integer_type_play_the_same_episode():
    def play(cast):
        env = JigsawClusterEnv(gpus=8, max_jobs=6, window_k=4)
        env.reset(seed=3)
        rng = np.random.default_rng(0)
        total, done = 0.0, False
        while not done:
            a = int(rng.choice(np.flatnonzero(env.action_masks())))
            _, r, term, trunc, _ = env.step(cast(a))
            total, done = total + r, term or trunc
        return total, env.sim.metrics()["avg_jct_s"]

    assert play(int) == play(np.int64) == play(np.array)


# ------------------------------------------------------------------------ 4. synthetic: specs
SPECS = [
    ("start_hour=nan", "synthetic: start_hour must be a finite number, got nan"),
    ("start_hour=inf", "synthetic: start_hour must be a finite number, got inf"),
    ("jobs=5,jobs=7", "synthetic: parameter 'jobs' given twice (jobs=5 and jobs=7); give it once"),
    ("load=1, seed=2 ,load=1", "synthetic: parameter 'load' given twice (load=1 and load=1); give it once"),
    ("load=inf", "synthetic: load must be a finite number > 0, got inf"),
    ("load=nan", "synthetic: load must be a finite number > 0, got nan"),
    ("load=0", "synthetic: load must be a finite number > 0, got 0.0"),
    ("seed=-1", "synthetic: seed must be >= 0, got -1"),
]


@pytest.mark.parametrize("spec,message", SPECS, ids=[s for s, _ in SPECS])
def test_bad_synthetic_specs_fail_at_parse_time(spec, message):
    with pytest.raises(ValueError) as e:
        parse_params(spec)
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        load_trace(f"synthetic:{spec}")
    assert str(e.value) == message


def test_generate_checks_the_same_values():
    with pytest.raises(ValueError, match=r"^synthetic: seed must be >= 0, got -1$"):
        generate(jobs=3, seed=-1)
    with pytest.raises(ValueError, match=r"^synthetic: load must be a finite number > 0, got inf$"):
        generate(jobs=3, load=float("inf"))
    with pytest.raises(ValueError, match=r"^synthetic: start_hour must be a finite number, got nan$"):
        generate(jobs=3, diurnal=True, start_hour=float("nan"))


def test_valid_synthetic_specs_are_unchanged():
    assert parse_params(" jobs = 5 , load=0.5,seed=3,start_hour=23.5,diurnal=1,models=resnet18+vgg16") == {
        "jobs": 5, "load": 0.5, "seed": 3, "start_hour": 23.5, "diurnal": True, "models": ("resnet18", "vgg16")}
    a = load_trace("synthetic:jobs=30,load=0.7,seed=0", cluster_gpus=16)
    b = load_trace("synthetic:jobs=30,seed=0", cluster_gpus=16, load_scale=0.7)
    assert a.digest() == b.digest()


def test_load_trace_checks_load_and_seed():
    with pytest.raises(ValueError, match=r"^load must be a finite number > 0, got inf$"):
        load_trace("synthetic:jobs=3", load_scale=float("inf"))
    with pytest.raises(ValueError, match=r"^seed must be an integer >= 0, got -1$"):
        load_trace("synthetic:jobs=3", seed=-1)
    assert len(load_trace("synthetic:jobs=3", seed=np.int64(2))) == 3


# ------------------------------------------------------------------------ 5. the command line
CLI = [
    (["simulate", "--seed", "-1"], "jigsaw simulate: error: argument --seed: --seed must be >= 0, got -1 "
                                   "(see jigsaw simulate --help)"),
    (["simulate", "--seed", "abc"], "jigsaw simulate: error: argument --seed: --seed must be an integer, got 'abc' "
                                    "(see jigsaw simulate --help)"),
    (["simulate", "--trace", "synthetic:seed=-1"], "jigsaw simulate: error: synthetic: seed must be >= 0, got -1"),
    (["simulate", "--trace", "synthetic:jobs=5,jobs=7"],
     "jigsaw simulate: error: synthetic: parameter 'jobs' given twice (jobs=5 and jobs=7); give it once"),
    (["simulate", "--trace", "synthetic:load=inf"],
     "jigsaw simulate: error: synthetic: load must be a finite number > 0, got inf"),
    (["simulate", "--trace", "synthetic:start_hour=nan,diurnal=1"],
     "jigsaw simulate: error: synthetic: start_hour must be a finite number, got nan"),
    (["traces", "describe", "synthetic:jobs=5", "--seed", "-2"],
     "jigsaw traces describe: error: argument --seed: --seed must be >= 0, got -2 "
     "(see jigsaw traces describe --help)"),
]


@pytest.mark.parametrize("argv,message", CLI, ids=[" ".join(a) for a, _ in CLI])
def test_command_line_names_the_flag_or_key(capsys, argv, message):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse errors
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1] == message


def test_command_line_valid_seed_still_runs(capsys):
    assert main(["simulate", "--max-jobs", "5", "--seed", "3", "--json"]) == 0
    assert '"jobs_completed": 5' in capsys.readouterr().out


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_job_list_with_a_bad_arrival_fails_at_construction(bad):
    # jobs given as JobState objects (not a table) are checked too: a NaN arrival would loop for ever
    from jigsaw_env.state import JobState, JobStatus

    jobs = [JobState(job_id=0, arrival_s=0.0, num_gpus=1, model="resnet18", batch_size=64, iterations=100.0,
                     status=JobStatus.QUEUED),
            JobState(job_id=7, arrival_s=bad, num_gpus=1, model="resnet18", batch_size=64, iterations=100.0,
                     status=JobStatus.QUEUED)]
    with pytest.raises(ValueError, match=r"^job 7: arrival_s must be a finite number >= 0, got "):
        Simulator(ClusterSpec.from_gpus(8), jobs)


def test_a_time_too_large_for_the_round_length_fails_instead_of_stalling():
    # at 1e300 s a 300 s round does not move the clock: without the check this would end as "the
    # policy ran nothing for 1000 rounds (an undertrained policy?)", blaming a heuristic for the trace
    from agents import make_scheduler
    from jigsaw_env.state import JobState, JobStatus

    jobs = [JobState(job_id=0, arrival_s=1e300, num_gpus=1, model="resnet18", batch_size=64, iterations=100.0,
                     status=JobStatus.QUEUED)]
    sim = Simulator(ClusterSpec.from_gpus(8), jobs)
    with pytest.raises(ValueError, match=r"^simulated time 1e\+300 s is too large for rounds of 300 s"):
        sim.run(make_scheduler("fifo"))


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_jigsaw_data_means_the_default_folder(monkeypatch, value):
    # an empty JIGSAW_DATA counts as unset, not as the current folder ("trace file not found: philly/philly.csv")
    import traces
    from traces.api import PROJECT_ROOT

    monkeypatch.setenv("JIGSAW_DATA", value)
    assert traces.data_dir() == PROJECT_ROOT.parent / "shared" / "data"


def test_a_missing_default_trace_names_the_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("JIGSAW_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        load_trace("philly", cluster_gpus=64)
    assert str(e.value) == (f"trace file not found: {tmp_path}/philly/philly.csv (the default philly trace of the "
                            f"data folder {tmp_path}; set JIGSAW_DATA to the folder holding philly/philly.csv, "
                            f"or give philly:PATH)")
