"""The benchmark runner works end to end in its quick mode (sizes tiny; the numbers are not checked:
speed targets live in bench/results.md, measured side by side, never in timed unit tests)."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_quick_mode_writes_every_part(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["errors"] == {}
    for part in ("env", "train", "onnx", "replay", "scaling", "instructions"):
        assert part in res, part
    ins = res["instructions"]
    # the instruction counts are skipped exactly when valgrind is missing, and say so
    assert ("skipped" in ins) == (shutil.which("valgrind") is None)
    if "skipped" not in ins:
        assert [r["jobs"] for r in ins["rows"]] == [50, 200]
        assert all(0 < r["instructions"] < r["instructions"] + r["instructions_load"] for r in ins["rows"])
        assert math.isfinite(ins["exponent"])
        (env,) = ins["env"]["rows"]
        assert (env["gpus"], env["jobs"], env["seed"]) == (16, 20, 0)
        assert env["steps"] == env["decisions"] + env["rounds"] > 0
        assert env["per_step"] == pytest.approx(env["instructions"] / env["steps"]) and env["instructions"] > 0
        assert ins["env"]["median_per_step"] == env["per_step"]
        from bench.env_speed import measure
        same = measure(16, 16, 1, 20, 1.0, 0)  # the episode counted is the env part's episode for that seed
        assert (same["steps"], same["decisions"], same["rounds"]) == (env["steps"], env["decisions"], env["rounds"])
    assert all(row["steps_per_s"] > 0 and row["steps"] > 0 for row in res["env"])
    assert {row["agent"] for row in res["replay"]} == {"fifo", "tiresias", "jigsaw"}
    assert all(row["jobs_completed"] == row["jobs"] for row in res["replay"])
    assert all(0.0 <= row["gc_s"] <= row["run_s"] for row in res["replay"])
    assert res["onnx"]["median_ms"] > 0
    assert len(res["scaling"]["rows"]) == 3 and math.isfinite(res["scaling"]["exponent"])
    st = res["scaling"]["stationary"]
    assert [r["jobs"] for r in st["rows"]] == [50, 100, 200]
    for r in st["rows"]:
        assert r["ms_per_job"] == pytest.approx(1000.0 * r["run_s"] / r["jobs"])
    md = (tmp_path / "results.md").read_text()
    for heading in ("Env steps per second", "MaskablePPO training throughput", "Exported-policy decision latency",
                    "Whole-trace replay", "Replay time against job count"):
        assert heading in md
    if "skipped" not in ins:
        assert "Env instructions per step" in md and "python -m bench.instructions --env" in md
    assert "python -m bench.replay" in md  # every number comes with its command


def test_replay_reports_its_own_peak_memory_not_its_parents():
    """A replay started by a parent holding 600 MiB reports its own peak (ru_maxrss would carry
    the parent's across exec, as the bench runner's torch-loaded process showed)."""
    fat = bytearray(600 * 2**20)
    fat[::4096] = b"\x01" * len(fat[::4096])  # touch every page: resident
    r = subprocess.run([sys.executable, "-m", "bench.replay", "--trace", "synthetic:jobs=40,load=1.0,seed=1",
                        "--gpus", "16", "--agent", "fifo"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    peak = json.loads(r.stdout)["peak_rss_mib"]
    del fat
    assert 20 < peak < 400  # numpy and pandas loaded, a few MiB of trace: well under the parent


def test_gc_timer_counts_the_collections_inside_its_block_only():
    import gc

    from bench.replay import GcTimer

    with GcTimer() as t:
        gc.collect(2)
        gc.collect(2)
    assert t.collections[2] == 2 and t.seconds[2] > 0.0
    gc.collect(2)  # after the block: the callback is gone
    assert t.collections[2] == 2 and t._cb not in gc.callbacks


def test_bench_rejects_an_unknown_part(tmp_path):
    r = subprocess.run([sys.executable, "-m", "bench", "--only", "env,warp", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "unknown part(s) ['warp']" in r.stderr and "Traceback" not in r.stderr


def test_env_speed_with_no_episode_builds_the_env_and_plays_nothing():
    """bench.instructions subtracts this run from an episode's count."""
    from bench.env_speed import measure
    assert (measure(16, 16, 0, 20, 1.0, 0)["steps"], measure(16, 16, 0, 20, 1.0, 0)["rounds"]) == (0, 0)
    one = measure(16, 16, 1, 20, 1.0, 0)
    assert one["steps"] == one["decisions"] + one["rounds"] and one["rounds"] > 0


def test_instructions_part_without_valgrind_says_why(monkeypatch, tmp_path):
    from bench import instructions
    from bench.__main__ import part_instructions, write_markdown

    monkeypatch.setattr(instructions, "valgrind", lambda: None)
    res = {"machine": {"cpu": "x", "cores": 2, "memory_gib": 1, "python": "3", "numpy": "2", "commit": "c",
                       "date": "d", "load_avg_at_start": 0.0}, "instructions": part_instructions(True)}
    assert res["instructions"] == {"skipped": "valgrind is not installed (Debian/Ubuntu: apt install valgrind)"}
    write_markdown(res, tmp_path / "results.md", quick=True)
    assert "Not measured: valgrind is not installed" in (tmp_path / "results.md").read_text()
    with pytest.raises(RuntimeError, match="valgrind is not on PATH"):
        instructions.count_instructions(["/bin/true"])


@pytest.mark.skipif(__import__("shutil").which("valgrind") is None, reason="valgrind is not installed")
def test_count_instructions_counts_and_names_a_failing_command():
    from bench.instructions import count_instructions

    n, out = count_instructions(["/bin/true"])
    assert n > 0 and out == ""
    with pytest.raises(RuntimeError, match=r"/bin/false under valgrind failed \(1\)"):
        count_instructions(["/bin/false"])


def test_fit_exponent_recovers_a_known_power_law():
    from bench.__main__ import _fit_exponent

    b, a = _fit_exponent([1000, 10000, 82247], [2e-3 * n ** 1.25 for n in (1000, 10000, 82247)])
    assert b == pytest.approx(1.25) and a == pytest.approx(2e-3)


def test_only_keeps_the_earlier_parts_with_their_date(tmp_path):
    """--only reruns some parts; the others come from the earlier full run, and results.md says when."""
    import bench.__main__ as bench_main
    from bench.__main__ import keep_earlier_parts, write_markdown

    old_machine = {"cpu": "x", "cores": 2, "memory_gib": 1.0, "python": "3.11", "numpy": "2", "commit": "aaaaaaa",
                   "date": "2026-11-01 10:00", "load_avg_at_start": 0.1}
    onnx = {"median_ms": 0.03, "p99_ms": 0.07, "observation": 266, "actions": 465, "calls_per_repeat": 10,
            "repeats": 1, "command": "jigsaw export RUN_DIR --out policy.onnx --bench 10"}
    prev = {"machine": old_machine, "quick": False, "errors": {}, "onnx": onnx,
            "env": [{"gpus": 64}]}  # env is rerun below: the earlier value must not survive
    res = {"machine": dict(old_machine, commit="bbbbbbb", date="2026-11-25 13:00"), "quick": False, "errors": {},
           "measured": {}, "env": [{"gpus": 64, "jobs": 200, "steps_per_s": 1.0, "decisions_per_s": 1.0,
                                    "rounds_per_s": 1.0, "sim_s_per_wall_s": 1.0, "repeats": 1, "command": "c"}]}
    keep_earlier_parts(res, prev, ["env"])
    assert res["onnx"] == onnx and res["measured"]["onnx"] == {"date": "2026-11-01 10:00", "commit": "aaaaaaa", "cpu": "x"}
    assert res["env"][0]["steps_per_s"] == 1.0 and res["merged"]
    res["measured"]["env"] = {"date": "2026-11-25 13:00", "commit": "bbbbbbb"}
    write_markdown(res, tmp_path / "results.md", quick=False)
    md = (tmp_path / "results.md").read_text()
    onnx_sec = md[md.index("## Exported-policy decision latency"):]
    env_sec = md[md.index("## Env steps per second"):md.index("## Exported-policy")]
    assert "Measured on 2026-11-01 10:00 (commit aaaaaaa), kept from an earlier run." in onnx_sec
    assert "kept from an earlier run" not in env_sec
    # a part kept from another CPU says which
    res["machine"]["cpu"] = "y"
    write_markdown(res, tmp_path / "results.md", quick=False)
    md = (tmp_path / "results.md").read_text()
    assert "Measured on 2026-11-01 10:00 (commit aaaaaaa, on x), kept from an earlier run." in md
    assert md.count("Machine of this run: y,") == 1
    # a quick run's numbers are never kept beside full-size ones
    res2 = {"machine": res["machine"], "quick": False, "errors": {}, "measured": {}}
    keep_earlier_parts(res2, dict(prev, quick=True), ["env"])
    assert "onnx" not in res2
    # a rerun part that fails keeps the earlier numbers, dated (nothing measured is lost)
    res3 = {"machine": res["machine"], "quick": False, "errors": {"onnx": "FileNotFoundError: x"}, "measured": {}}
    assert bench_main.keep_earlier_part(res3, prev, "onnx") and res3["onnx"] == onnx
    assert res3["measured"]["onnx"]["date"] == "2026-11-01 10:00"
    assert not bench_main.keep_earlier_part(res3, None, "env") and not bench_main.keep_earlier_part(res3, prev, "train")
    write_markdown(res3, tmp_path / "results.md", quick=False)
    md = (tmp_path / "results.md").read_text()
    assert "Measured on 2026-11-01 10:00 (commit aaaaaaa, on x), kept from an earlier run." in md
    assert "- onnx: FileNotFoundError: x" in md


def test_replay_counts_the_jobs_in_the_system_at_each_round_start():
    """active_job_rounds: jobs waiting or running at each round's start, summed over rounds; here
    counted independently by stepping the same replay by hand."""
    from agents import make_scheduler
    from bench.replay import load_replay_jobs, replay, replay_simulator

    trace, gpus = "synthetic:jobs=40,load=1.5,seed=2", 16
    out = replay(trace, gpus, "tiresias")
    sim = replay_simulator(*load_replay_jobs(trace, gpus))
    sched = make_scheduler("tiresias")
    counts = []
    while not sim.done:
        counts.append(len(sim.state.active_ids))
        sim.step(sched(sim.state))
    assert out["rounds"] == len(counts) and out["jobs_completed"] == 40
    assert out["active_job_rounds"] == sum(counts) > len(counts)  # a queue formed at load 1.5


def test_scaling_series_reports_the_time_per_job_round_in_the_system(monkeypatch):
    """Hand-made replay outputs: the rows' mean jobs in the system and microseconds per job-round,
    and the exponent of the latter against jobs (flat here: the time follows the job-rounds)."""
    import bench.__main__ as bench_main

    fake = {100: (2.0, 400, 20_000), 1000: (30.0, 3_000, 300_000), 10000: (400.0, 20_000, 4_000_000)}

    calls = []

    def run_json(cmd):
        n = int(cmd[cmd.index("--max-jobs") + 1])
        calls.append(n)
        run_s, rounds, ajr = fake[n]
        return {"jobs": n, "run_s": run_s, "rounds": rounds, "quiet_rounds": 0, "active_job_rounds": ajr,
                "peak_rss_mib": 100.0}

    monkeypatch.setattr(bench_main, "_run_json", run_json)
    ser = bench_main._scaling_series(lambda n: "synthetic", (100, 1000, 10000), 16, None, "tiresias", 2)
    assert calls == [100, 1000, 10000, 100, 1000, 10000]  # repeats interleaved across the sizes
    assert [r["mean_active"] for r in ser["rows"]] == [50.0, 100.0, 200.0]
    assert [r["us_per_active_job_round"] for r in ser["rows"]] == pytest.approx([100.0, 100.0, 100.0])
    assert ser["per_active_job_round_exponent"] == pytest.approx(0.0, abs=1e-12)
    assert ser["exponent"] > 1.0  # the replay time itself grows faster than the job count


def test_per_round_cost_splits_the_scheduler_calls_in_order():
    from bench.per_round_cost import per_round_cost

    r = per_round_cost("synthetic:jobs=60,load=1.0,seed=1", 16, "tiresias", parts=3)
    assert r["jobs"] == 60 and len(r["parts"]) == 3
    assert sum(p["calls"] for p in r["parts"]) == r["scheduler_calls"]
    fin = [p["finished_at_start"] for p in r["parts"]]
    assert fin[0] == 0 and fin == sorted(fin)  # quarters in call order: finished counts never go back
    assert all(p["mean_active"] >= 1 and p["sched_ms_per_call"] > 0 for p in r["parts"])
    # every round belongs to one part (the first call comes at round 0), each timed
    assert r["parts"][0]["rounds"] > 0 and sum(p["rounds"] for p in r["parts"]) == r["rounds"]
    assert all(p["sim_ms_per_round"] > 0 for p in r["parts"])


def test_sim_vs_real_sessions_summary_hand_computed():
    """Two sessions of two jobs: errors, means, ranges and the sessions where every job met the target."""
    from bench.sim_vs_real import summarise_sessions

    def row(jid, ie, je, iok, jok):
        return {"job_id": jid, "model": "m", "num_gpus": 1, "executor_iter_err": ie, "executor_jct_err": je,
                "executor_iter_ok": iok, "executor_jct_ok": jok, "noise_iter_cv": 0.01, "noise_jct_cv": 0.02}

    s1 = {"rows": [row(0, 0.04, -0.02, True, True), row(1, 0.12, 0.30, False, False)],
          "calibration": {"lockstep": {"lockstep_ms": 1.5}}}
    s2 = {"rows": [row(0, 0.08, 0.00, True, True), row(1, 0.06, 0.02, True, True)], "calibration": {}}
    s = summarise_sessions([s1, s2])
    assert s["sessions"] == 2 and s["all_jobs_ok_sessions"] == 1 and s["lockstep_ms"] == [1.5, None]
    j0, j1 = s["jobs"]
    assert j0["iter_err"] == [0.04, 0.08] and j0["iter_err_mean"] == pytest.approx(0.06)
    assert j0["iter_err_range"] == [0.04, 0.08] and j0["iter_ok_sessions"] == 2
    assert j1["jct_err_mean"] == pytest.approx(0.16) and j1["jct_err_range"] == [0.02, 0.30]
    assert j1["iter_ok_sessions"] == 1 and j1["jct_ok_sessions"] == 1
    assert j1["live_jct_noise"] == [0.02, 0.02]


def test_executor_spb_backward_by_start_hand_computed():
    """TOY4: weight and input gradients 1 s per group, 4 groups. A worker starting at group s
    computes the weight gradients of groups s..3 and the input gradients of groups s+1..3:
    7, 5, 3, 1 s."""
    from conftest import BS, DEV, TOY4

    from bench.executor_spb import backward_by_start
    from jigsaw_env.cost_table import get_table

    assert backward_by_start(get_table(TOY4, BS, DEV)) == pytest.approx([7.0, 5.0, 3.0, 1.0])


def test_expert_ceiling_rejects_bad_arguments(capsys):
    from bench.expert_ceiling import main

    for argv in (["--window-k", "x"], ["--orders", "random"], ["--window-k", "0"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "--orders takes slot and/or heuristic" in capsys.readouterr().err


def test_expert_ceiling_tiresias_translates_exactly():
    """Tiresias (exclusive, consolidated) is exactly expressible in the env's actions in its own
    order: the translated expert's JCT equals the simulator's on every window."""
    from bench.expert_ceiling import measure

    res = measure("synthetic:jobs=120,load=1.2,seed=3", 16, 0.5, 2, 20, 1.0, "tiresias", [8], ["heuristic"],
                  log=lambda s: None)
    direct, translated = res["jct_h"]["tiresias"], res["jct_h"]["tiresias as actions, K=8, heuristic order"]
    assert len(direct) == 2 and direct == pytest.approx(translated, rel=1e-12)


def test_expert_ceiling_with_spill_reaches_the_spilling_heuristic():
    """With ``spill`` the env spills after the translated jigsaw-srtf, and on these windows that is
    exactly jigsaw-srtf-spill, which differs from jigsaw-srtf on the second window."""
    from bench.expert_ceiling import measure

    res = measure("synthetic:jobs=120,load=3.0,seed=1", 8, 0.5, 2, 20, 3.0, "jigsaw-srtf", [8], ["heuristic"],
                  log=lambda s: None, window_order="remaining", spill=True)
    jct = res["jct_h"]
    assert res["spill"] and jct["jigsaw-srtf as actions, K=8, heuristic order"] == pytest.approx(jct["jigsaw-srtf-spill"],
                                                                                                 rel=1e-12)
    assert jct["jigsaw-srtf-spill"][1] < jct["jigsaw-srtf"][1]


def test_translation_gap_summary_hand_computed():
    from bench.translation_gap import summarize

    eps = [{"gpus": 16, "window_order": "attained", "seed": 0, "translated_h": 2.0, "expert_h": 1.0, "truncated": False},
           {"gpus": 16, "window_order": "attained", "seed": 1, "translated_h": 3.0, "expert_h": 3.0, "truncated": True},
           {"gpus": 16, "window_order": "las", "seed": 0, "translated_h": 1.0005, "expert_h": 1.0, "truncated": False},
           {"gpus": 16, "window_order": "las", "seed": 1, "translated_h": 2.7, "expert_h": 3.0, "truncated": False}]
    att, las = summarize(eps)
    assert (att["window_order"], att["episodes"], att["truncated"]) == ("attained", 2, 1)
    assert (att["expert_h"], att["translated_h"], att["gap_h"]) == pytest.approx((2.0, 2.5, 0.5))
    assert (att["matched"], att["worst_ratio"]) == (0.5, 2.0)
    assert (las["gap_h"], las["matched"], las["worst_ratio"]) == pytest.approx((-0.14975, 0.5, 1.0005))


def test_translation_gap_plays_the_expert_and_refuses_bad_arguments(capsys):
    """A synthetic training episode: Tiresias translated in its own (LAS) window order, and the
    arguments' checks."""
    from bench.translation_gap import main, measure

    res = measure(range(2), [16], ["las"], expert="tiresias", trace="synthetic",
                  progress=False)
    assert [e["seed"] for e in res["episodes"]] == [0, 1] and res["summary"][0]["episodes"] == 2
    for e in res["episodes"]:
        assert e["gpus"] == 16 and e["steps"] > 0 and not e["truncated"] and e["expert_h"] > 0
    for argv, msg in ((["--orders", "arrival"], "--orders takes some of attained,las"),
                      (["--seeds", "5-2"], "expected a seed range"), (["--cluster-sizes", "0"], "GPU counts >= 1")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


# ---------------------------------------------------------------------------------- clone accuracy
def test_clone_accuracy_round_sets_and_scores_hand_computed():
    import numpy as np

    from bench.clone_accuracy import ADVANCE, round_sets, scores

    # two rounds (9 = advance), then an unfinished one
    assert round_sets([3, 1, 9, 2, 9], 9) == [{3, 1}, {1}, {9}, {2}, {9}]
    assert round_sets([9, 4, 5], 9) == [{9}, {4, 5}, {5}]
    run = lambda j, nodes: ("run", j, 0, "rotating", nodes, False, False)  # noqa: E731
    expert = [run(3, 1), ("pause", 1), ADVANCE, run(2, 2), ADVANCE]
    # another order, right, wrong, advances too early, right
    policy = [("pause", 1), ("pause", 1), run(2, 2), ADVANCE, ADVANCE]
    widths = np.array([32, 0, 0, 32, 0])
    sc = scores(expert, policy, widths, wide=32)
    assert (sc["states"], sc["acting"], sc["wide_states"], sc["wide_acting"]) == (5, 3, 2, 2)
    assert sc["exact"] == pytest.approx(2 / 5) and sc["exact_acting"] == pytest.approx(1 / 3)
    assert sc["in_round"] == pytest.approx(3 / 5) and sc["in_round_acting"] == pytest.approx(2 / 3)
    assert sc["exact_wide"] == 0.0 and sc["in_round_wide"] == 0.5 and sc["in_round_wide_acting"] == 0.5
    # the same job on more nodes is another decision
    assert scores([run(3, 1)], [run(3, 2)], np.array([1]), wide=32)["exact"] == 0.0


def test_clone_accuracy_mistake_kinds_hand_computed():
    import numpy as np

    from bench.clone_accuracy import ADVANCE, MISTAKES, mistake_kind, mistakes

    run = lambda j, level=0, restart=False: ("run", j, level, "rotating", 1, False, restart)  # noqa: E731
    # the expert's round: pause running job 1, move running job 2 (a restart), start waiting job 3
    rnd = {("pause", 1), run(2, restart=True), run(3)}  # an acting state's set (round_sets: no advance)
    running = (True, 0, "rotating")
    waiting = (False, 0, "rotating")
    assert mistake_kind(rnd, ("pause", 1), running) is None
    assert mistake_kind(rnd, ADVANCE, None) == "advances early"
    assert mistake_kind(rnd, ("pause", 4), running) == "pauses a running job the expert keeps"
    assert mistake_kind(rnd, ("pause", 2), running) == "pauses a running job the expert changes"
    assert mistake_kind(rnd, ("pause", 5), waiting) == "pauses a waiting job (no change)"
    assert mistake_kind(rnd, run(4), running) == "keeps a running job as it is (no change)"
    assert mistake_kind(rnd, run(4, level=2), running) == "changes a running job the expert keeps"
    assert mistake_kind(rnd, run(4, restart=True), running) == "changes a running job the expert keeps"
    assert mistake_kind(rnd, run(5), waiting) == "runs a waiting job the expert leaves waiting"
    assert mistake_kind(rnd, run(1), running) == "runs a job the expert pauses"
    assert mistake_kind(rnd, run(3, level=1), waiting) == "runs a job the expert runs, otherwise"
    # counted over the selected states only, each state against the rest of its round
    expert = [("pause", 1), run(3), ADVANCE]
    policy = [run(3), run(3), ("pause", 1)]
    jobs = [waiting, waiting, running]
    got = mistakes(expert, policy, jobs, np.array([True, True, True]))
    assert set(got) == set(MISTAKES) and sum(got.values()) == 1
    assert got["pauses a running job the expert keeps"] == 1  # at the advance, job 1 is not paused any more
    assert sum(mistakes(expert, policy, jobs, np.array([True, True, False])).values()) == 0


def test_clone_accuracy_follows_the_expert_and_scores_known_policies():
    import numpy as np

    from agents.imitation import HeuristicExpert
    from bench.clone_accuracy import ADVANCE, action_effect, follow_expert, scores
    from jigsaw_env.env import JigsawClusterEnv

    env = JigsawClusterEnv(gpus=16, window_k=6, trace="synthetic", max_jobs=20, load=1.5)
    twin = HeuristicExpert("jigsaw")  # a second, independent copy of the expert: the same choices
    adv = env.codec.advance
    res = follow_expert(env, HeuristicExpert("jigsaw"), None, {"twin": lambda o, m: twin.act(env),
                                                               "advance": lambda o, m: adv}, seed=1)
    assert len(res["expert"]) > 0 and env.sim.num_finished == 20
    twin_sc = scores(res["expert"], res["policy"]["twin"], res["widths"], wide=8)
    assert twin_sc["exact"] == 1.0 and twin_sc["in_round"] == 1.0
    assert len(res["policy_jobs"]["twin"]) == len(res["expert"])
    assert all((j is None) == (e == ADVANCE) for j, e in zip(res["policy_jobs"]["twin"], res["policy"]["twin"]))
    adv_sc = scores(res["expert"], res["policy"]["advance"], res["widths"], wide=8)
    acting = np.array([e != ADVANCE for e in res["expert"]])
    assert acting.any() and adv_sc["exact_acting"] == 0.0 and adv_sc["in_round_acting"] == 0.0
    assert adv_sc["exact"] == pytest.approx(float(np.mean(~acting)))
    # effects on the first round of a fresh episode (an empty cluster: nothing is shared or
    # restarted): a run action's nodes are those of the placement the builder would give
    env.reset(seed=2)
    b = env.builder
    mask = env.action_masks()
    runs = [a for a in np.flatnonzero(mask) if env.codec.decode(int(a))[0] == "run"]
    assert runs
    gpn = env.cluster.gpus_per_node
    for a in runs:
        kind, slot, option, level, pattern = env.codec.decode(int(a))
        jd = b.candidate(slot, option, level, pattern)
        nodes = len({g // gpn for g in jd.gpus})
        assert action_effect(env, int(a)) == ("run", b.window[slot], level, pattern.value, nodes, False, False)
    assert action_effect(env, adv) == ADVANCE
    # later rounds: keeping a running job where it is is no restart, on its own nodes
    ex = HeuristicExpert("jigsaw")
    checked = 0
    for _ in range(400):
        b = env.builder
        mask = env.action_masks()
        for a in np.flatnonzero(mask):
            kind, slot, option, level, pattern = env.codec.decode(int(a))
            if kind == "run" and option == "keep":
                job = env.sim.state.jobs[b.window[slot]]
                eff = action_effect(env, int(a))
                assert eff[0] == "run" and eff[6] is False
                assert eff[4] == len({g // gpn for g in job.placement})
                checked += 1
        _, _, term, trunc, _ = env.step(ex.act(env))
        if term or trunc:
            break
    assert checked > 0


def test_clone_accuracy_labels_and_bad_arguments(tmp_path, capsys):
    from bench.clone_accuracy import main, policy_labels

    assert policy_labels(["/a/runs/s0/warm_start", "/a/runs/s1/warm_start"]) == ["s0/warm_start", "s1/warm_start"]
    assert policy_labels(["/a/runs/s0/warm_start"]) == ["s0/warm_start"]
    with pytest.raises(ValueError, match="given twice"):
        policy_labels(["/a/r", "/a/r/"])
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--windows", "a"])
    assert "--windows must be comma-separated integers, got 'a'" in capsys.readouterr().err


def test_sync_methods_fit_recovers_a_known_link():
    # medians made exactly by eqs. N1/N2 with alpha 100 us and 1 GB/s: the NNLS fit on relative
    # error gives them back, and N4 with the fitted link picks what these times say is faster
    from bench.sync_methods import fit_link
    from jigsaw_env.network import Link, group_sync

    link = Link(100e-6, 1e9)
    cells = []
    for w in (2, 3, 4):
        for c in range(1, w + 1):
            for m in (4096, 65536, 1 << 20):
                cells.append({"world": w, "contributors": c, "bytes": m,
                              **{k: {"median_s": group_sync(c, w, float(m), link, method=k)[0]}
                                 for k in ("ring", "reduce_broadcast")}})
    alpha, beta = fit_link(cells)
    assert alpha == pytest.approx(100e-6, rel=1e-9) and beta == pytest.approx(1e9, rel=1e-9)
    # W = 4, one contributor: the ring wins above 2 alpha beta = 200 kB (1 MB), r+b below (64 kB)
    assert group_sync(1, 4, float(1 << 20), Link(alpha, beta))[2] == "ring"
    assert group_sync(1, 4, 65536.0, Link(alpha, beta))[2] == "reduce_broadcast"


# ---------------------------------------------------------------------------------- headroom
@pytest.mark.slow
def test_headroom_bound_is_below_every_agent_and_does_not_depend_on_arrivals():
    """The alone bound is a lower bound of every agent's mean JCT on every window, and one
    window's bound is the same at every load (only arrivals change with the load)."""
    from bench.headroom import measure

    res = measure("synthetic:jobs=120,load=1.2,seed=3", 16, 0.5, 2, 20, [1.0, 2.0], ["fifo", "tiresias", "jigsaw"],
                  progress=False)
    by_load = [part["windows"] for part in res["loads"].values()]
    assert len(by_load) == 2 and all(len(rows) == 2 for rows in by_load)
    for rows in by_load:
        for r in rows:
            for agent in ("fifo", "tiresias", "jigsaw"):
                assert r[agent] >= r["bound"] - 1e-9, (r, agent)
    assert [r["bound"] for r in by_load[0]] == [r["bound"] for r in by_load[1]]
    part = res["loads"]["1.0"]
    assert part["gap_h"]["jigsaw"] == pytest.approx(part["mean_jct_h"]["jigsaw"] - part["mean_jct_h"]["bound"])


def test_headroom_lone_job_at_level_0_is_tiresias_and_the_bound_takes_the_best_level():
    """A job alone: the fixed level-0 configuration is what Tiresias plays (consolidated, full
    backprop), and the bound is the smallest JCT over the SPB configurations, so at most that."""
    from bench.headroom import alone_jct_s, fixed_config_scheduler
    from bench.ppo_study import evaluation_setup
    from jigsaw_env.actions import level_pattern_combos
    from jigsaw_env.cluster import ClusterSpec
    from jigsaw_env.simulator import Simulator
    from jigsaw_env.spb import Pattern
    from agents import make_scheduler
    from traces import load_trace

    cluster_kwargs, cfg = evaluation_setup(16)
    cluster = ClusterSpec.from_gpus(**cluster_kwargs)
    jobs = load_trace("synthetic:jobs=30,load=1.0,seed=5", cluster_gpus=16, max_gpus=16).jobs
    one = jobs.iloc[[jobs["num_gpus"].idxmax()]].copy().reset_index(drop=True)
    one["arrival_s"] = 0.0

    def jct(scheduler) -> float:
        sim = Simulator(cluster, one, cfg)
        sim.run(scheduler)
        return float(sim.metrics()["avg_jct_s"])

    level0 = jct(fixed_config_scheduler(0, Pattern.ROTATING))
    assert level0 == pytest.approx(jct(make_scheduler("tiresias")), rel=1e-12)
    every = [jct(fixed_config_scheduler(lv, pat)) for lv, pat in level_pattern_combos(cfg.spb)]
    assert alone_jct_s(cluster, cfg, one) == pytest.approx(min(every), rel=1e-12)
    assert min(every) <= level0 and len(set(round(x, 6) for x in every)) > 1  # the levels do differ


def test_headroom_rejects_bad_arguments(capsys):
    from bench.headroom import main

    for argv, msg in ((["--agents", "nosuch"], "allowed:"), (["--loads", "x"], "--loads must be"),
                      (["--loads", "1.0,-1"], "--loads must be"), (["--windows", "0"], "must be positive"),
                      (["--round-s", "0"], "must be positive")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


# ---------------------------------------------------------------------------------- lookahead
def _small_window(gpus: int = 16):
    from bench.ppo_study import evaluation_setup
    from jigsaw_env.cluster import ClusterSpec
    from traces import load_trace

    cluster_kwargs, cfg = evaluation_setup(gpus)
    jobs = load_trace("synthetic:jobs=10,load=2.0,seed=1", cluster_gpus=gpus, max_gpus=gpus).jobs
    return ClusterSpec.from_gpus(**cluster_kwargs), cfg, jobs


def _jigsaw_from_the_start():
    """Jigsaw run through the small window (the reference), and a fresh simulator and Jigsaw at its start."""
    from agents import make_scheduler
    from jigsaw_env.simulator import Simulator

    cluster, cfg, jobs = _small_window()
    ref = Simulator(cluster, jobs, cfg)
    ref.run(make_scheduler("jigsaw"))
    sim = Simulator(cluster, jobs, cfg)
    sched = make_scheduler("jigsaw")
    sched.reset()
    return ref, sim, sched, jobs


def test_lookahead_rollout_of_the_base_decision_reproduces_the_base_run():
    """A rollout copies the simulator and the scheduler: playing Jigsaw's own first decision and
    then Jigsaw gives exactly the JCT of Jigsaw run from the start."""
    from bench.lookahead import rollout_jct_s

    ref, sim, sched, jobs = _jigsaw_from_the_start()
    for _ in range(2):  # a few rounds in, with the scheduler's memory
        sim.step(sched.schedule(sim.state))
    assert rollout_jct_s(sim, sched, sched.schedule(sim.state)) == pytest.approx(ref.metrics()["avg_jct_s"], rel=1e-12)


def test_lookahead_time_in_system_counts_each_job_between_its_arrival_and_finish_inside_the_horizon():
    from types import SimpleNamespace as J

    from bench.lookahead import time_in_system_s

    jobs = [J(arrival_s=0.0, finish_s=100.0),    # finished at the horizon's start: 0
            J(arrival_s=50.0, finish_s=None),    # waiting throughout: 400 - 100
            J(arrival_s=200.0, finish_s=300.0),  # arrives and finishes inside: 100
            J(arrival_s=350.0, finish_s=900.0),  # finishes after the horizon: 400 - 350
            J(arrival_s=500.0, finish_s=None)]   # arrives after it: 0
    assert time_in_system_s(jobs, 100.0, 400.0) == 300.0 + 100.0 + 50.0


def test_lookahead_rollout_cut_after_every_finish_scores_the_total_jct():
    """From the first round, a rollout whose horizon reaches past the last finish scores the
    job-seconds of the whole run: the mean JCT times the jobs."""
    from bench.lookahead import rollout_jct_s

    ref, sim, sched, jobs = _jigsaw_from_the_start()
    whole = rollout_jct_s(sim, sched, sched.schedule(sim.state), horizon_s=1e9)
    assert whole == pytest.approx(ref.metrics()["avg_jct_s"] * len(jobs), rel=1e-12)
    short = rollout_jct_s(sim, sched, sched.schedule(sim.state), horizon_s=600.0)
    assert 0.0 < short < whole


def test_lookahead_alternatives_change_one_job_and_are_feasible():
    from agents import make_scheduler
    from bench.lookahead import KINDS, alternatives
    from jigsaw_env.simulator import Simulator

    cluster, cfg, jobs = _small_window()
    sim = Simulator(cluster, jobs, cfg)
    sched = make_scheduler("jigsaw")
    sched.reset()
    seen = set()
    while not sim.done and len(seen) < 3:
        d = sched.schedule(sim.state)
        for kind, jid, alt in alternatives(sim, d):
            seen.add(kind)
            assert kind in KINDS
            sim.validate(alt)  # raises when infeasible
            differ = {j for j in set(d) | set(alt) if d.get(j) != alt.get(j)}
            assert differ == {jid}, (kind, differ)
        sim.step(d)
    assert {"defer", "level"} <= seen


def test_lookahead_never_does_worse_than_its_base():
    """The rollout algorithm's cost improvement: each round's chosen rollout is at most the one
    before it (Jigsaw's own decision is always a candidate), so the played JCT is at most Jigsaw's."""
    from bench.lookahead import improve

    cluster, cfg, jobs = _small_window()
    r = improve(cluster, cfg, jobs)
    assert r["improved_h"] <= r["base_h"] + 1e-9
    assert r["checked"] >= 1 and r["rollouts"] > r["checked"]
    assert sum(r["switches"].values()) <= r["checked"]


def test_lookahead_rejects_bad_arguments(capsys):
    from bench.lookahead import main

    for argv in (["--windows", "x"], ["--windows", "12"], ["--load", "0"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    assert "--windows must be" in capsys.readouterr().err
    for bad in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as e:
            main(["--horizon-h", bad])
        assert e.value.code == 2
        assert f"--horizon-h must be a positive number of hours, got {float(bad)}" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- validation choice
def test_validation_choice_picks_the_lowest_mean_over_every_window_and_never_a_stalled_one():
    from bench.validation_choice import choose

    jct = {"80 jobs, load 1": {"a": [1.0, 3.0], "b": [2.0, 2.5], "c": [0.5, float("nan")]},
           "200 jobs, load 1": {"a": [4.0], "b": [3.0], "c": [0.1]}}
    chosen, means = choose(jct, ["a", "b", "c"])
    assert means["a"] == pytest.approx(8.0 / 3) and means["b"] == pytest.approx(7.5 / 3)
    assert math.isnan(means["c"]) and chosen == "b"
    assert choose({"s": {"c": [float("nan")]}}, ["c"])[0] is None


def test_validation_choice_shows_run_dirs_inside_the_working_folder_relative(tmp_path, monkeypatch):
    from bench.validation_choice import _shown_path

    monkeypatch.chdir(tmp_path)
    assert _shown_path(str(tmp_path / "runs" / "a")) == "runs/a"
    assert _shown_path("/elsewhere/run") == "/elsewhere/run" and _shown_path("jigsaw") == "jigsaw"


def test_validation_choice_plays_validation_windows_and_pairs_with_the_baseline(tmp_path):
    """Windows come from the validation split (job ids between the training and held-out
    splits'); an agent played twice differs from itself by exactly 0 on every window."""
    from bench.ppo_study import study_splits
    from bench.validation_choice import measure

    trace = "synthetic:jobs=600,seed=3"
    res = measure("jigsaw,jigsaw,learned", trace, gpus=16, holdout=0.2, val=0.1, window_jobs=[20], loads=[1.0],
                  windows=2, baseline="jigsaw", workers=1)
    parts = study_splits(trace, 16, 0.2, val=0.1)
    lo, hi = int(parts["val"]["job_id"].min()), int(parts["val"]["job_id"].max())
    infos = res["window_info"]["20 jobs, load 1"]
    assert len(infos) == 2 and all(lo <= i["first_job_id"] and i["last_job_id"] <= hi for i in infos)
    same = res["vs_baseline"]["20 jobs, load 1"]["jigsaw-2"]
    assert (same["mean"], same["ties"]) == (0.0, 2)
    assert res["learned"] == ["learned"] and res["chosen"] == "learned"
    jct = res["per_window_jct_h"]["20 jobs, load 1"]
    assert all(x > 0 for x in jct["jigsaw"] + jct["learned"])


def test_validation_choice_refuses_bad_arguments(capsys):
    from bench.validation_choice import main

    for argv, msg in ((["--agents", "jigsaw,learned", "--baseline", "fifo"], "--baseline 'fifo' is not among --agents"),
                      (["--agents", "jigsaw,tiresias"], "holds no learned agent"),
                      (["--agents", "jigsaw,learned", "--val", "0"], "--val must be in (0, 1)"),
                      (["--agents", "jigsaw,learned", "--loads", "x"], "--loads must be comma-separated numbers")):
        with pytest.raises(SystemExit) as e:
            main([*argv, "--out", "unused", "--trace", "synthetic:jobs=600,seed=3", "--gpus", "16"])
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_results_commands_name_the_data_folder_by_its_variable(monkeypatch, tmp_path):
    from bench import __main__ as bench_main

    monkeypatch.setenv("JIGSAW_DATA", str(tmp_path))
    cmd = [sys.executable, "-m", "bench.replay", "--trace", f"philly:{tmp_path}/philly/philly.csv", "--gpus", "512"]
    assert bench_main._shown_command(cmd) == \
        "python -m bench.replay --trace philly:$JIGSAW_DATA/philly/philly.csv --gpus 512"


def test_warm_start_episodes_finds_each_rounds_episodes_and_refuses_a_run_without_rounds(tmp_path, capsys):
    """Round r's first episode seed: as recorded, else seed + 100000 r (what runs that do not
    record it used); a folder without config.json or without DAgger rounds is one line."""
    from bench.warm_start_episodes import main, round_seeds

    cfg = {"seed": 3, "warm_start": {"dagger": [{"round": 1, "episodes": 7}, {"round": 2, "episodes": 4},
                                                {"round": 3, "episodes": 5, "first_episode_seed": 991}]}}
    assert round_seeds(cfg) == [(1, 100_003, 7), (2, 200_003, 4), (3, 991, 5)]
    with pytest.raises(SystemExit):
        main(["--run", str(tmp_path), "--out", str(tmp_path / "o")])
    assert f"{tmp_path} has no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"seed": 0, "warm_start": {"dagger": []}}))
    with pytest.raises(SystemExit):
        main(["--run", str(tmp_path), "--out", str(tmp_path / "o")])
    assert "records no DAgger rounds" in capsys.readouterr().err


def test_warm_start_episodes_replays_each_rounds_episodes_and_pairs_the_finished_ones(tmp_path):
    """A run whose one DAgger round records per-episode JCTs of exactly twice what the expert
    scores on that round's episodes (the second cut short): the bench replays those episodes (the
    warm start's env, from the recorded first seed) and finds the ratio 2 over the finished ones
    and the expert's mean over all three."""
    import train_agent
    from agents.imitation import HeuristicExpert, collect, episode_seed_base
    from bench.warm_start_episodes import measure
    from jigsaw_env.cli import build_parser

    args = build_parser().parse_args(["train", "--trace", "synthetic", "--gpus", "8", "--max-jobs", "6",
                                      "--window-k", "4", "--spb-levels", "1", "--seed", "4"])
    cfg = train_agent.config_from_args(args)
    first = episode_seed_base(4, 1)
    played = collect(train_agent.warm_start_env_factory(cfg), HeuristicExpert("tiresias"), episodes=3, seed=first)
    jcts = [e["avg_jct_s"] for e in played.episodes]
    learner = [2 * jcts[0], None, 2 * jcts[2]]
    cfg["warm_start"] = {"expert": "tiresias", "dagger": [
        {"round": 1, "episodes": 3, "first_episode_seed": first, "policy_avg_jct_s": learner,
         "policy_mean_avg_jct_s": (learner[0] + learner[2]) / 2}]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (row,) = measure(tmp_path, log=lambda *_: None)["rounds"]
    assert row["paired"] and row["learner_over_expert"] == pytest.approx(2.0, rel=1e-12)
    assert row["expert_mean_jct_s"] == pytest.approx(sum(jcts) / 3, rel=1e-12) and row["first_episode_seed"] == first


# ---------------------------------------------------------------------------------- saturated rounds
def test_saturated_rounds_pool_hand_computed_logs():
    """Two windows' cluster logs by hand: only rounds with a job waiting count, the pooled
    efficiency weighs rounds by their seconds, the window mean weighs windows equally."""
    import pandas as pd

    from bench.saturated_rounds import saturated_summary, saturated_totals

    def log(rows):
        return pd.DataFrame(rows, columns=["start_s", "end_s", "queued", "allocated_gpus", "useful_gpu_s",
                                           "allocated_gpu_s"])

    # 4 GPUs. Window a: a saturated 100 s round, 3 GPUs allocated, useful 360 (pairs), then an idle-queue round.
    a = log([(0, 100, 2, 3, 360.0, 300.0), (100, 200, 0, 4, 400.0, 400.0)])
    # window b: a saturated 300 s round on every GPU, useful 1200 (no pairs)
    b = log([(0, 300, 1, 4, 1200.0, 1200.0)])
    ta, tb = saturated_totals(a, 4), saturated_totals(b, 4)
    assert ta == {"seconds": 100.0, "gpu_s": 400.0, "useful_gpu_s": 360.0, "allocated_gpu_s": 300.0,
                  "queued_s": 200.0, "free_s": 100.0}
    s = saturated_summary([ta, tb])
    assert s["saturated_h"] == pytest.approx(400 / 3600)
    assert s["efficiency"] == pytest.approx((360 + 1200) / (400 + 1200))
    assert s["mean_window_efficiency"] == pytest.approx((0.9 + 1.0) / 2)
    assert s["allocated_share"] == pytest.approx(1500 / 1600)
    assert s["useful_per_allocated"] == pytest.approx(1560 / 1500)
    assert s["mean_queued"] == pytest.approx((2 * 100 + 1 * 300) / 400)
    assert s["free_share"] == pytest.approx(100 / 400)
    assert s["windows_saturated"] == 2
    empty = saturated_summary([saturated_totals(log([(0, 10, 0, 1, 5.0, 10.0)]), 4)])
    assert empty["saturated_h"] == 0 and empty["windows_saturated"] == 0 and empty["efficiency"] != empty["efficiency"]


def test_saturated_rounds_rejects_bad_arguments(capsys):
    from bench.saturated_rounds import main

    for argv, msg in ((["--agents", "nosuch", "--out", "x"], "unknown agent 'nosuch'"), (["--loads", "0", "--out", "x"], "--loads must be"),
                      (["--windows", "0", "--out", "x"], "must be positive"), ([], "--out")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_saturated_rounds_agree_with_the_simulators_metric():
    """On small windows, each window's saturated efficiency recomputed from its cluster log is the
    one the simulator reports, so the mean of windows is theirs; the pooled numbers are in range."""
    from bench.saturated_rounds import measure

    res = measure("synthetic:jobs=80,load=3.0,seed=1", 8, 0.5, 2, 20, [3.0], "fifo,jigsaw", progress=False)
    part = res["loads"]["3.0"]
    assert set(part) == {"fifo", "jigsaw"}
    for row in part.values():
        reported = [x for x in row["reported_efficiency"] if x is not None]
        assert len(reported) == row["windows_saturated"] > 0
        assert row["mean_window_efficiency"] == pytest.approx(sum(reported) / len(reported), rel=1e-9)
        assert 0 < row["allocated_share"] <= 1 + 1e-9 and 0 <= row["free_share"] <= 1
        assert row["mean_queued"] >= 1  # every saturated round has a job waiting


def test_saturated_rounds_pair_jct_by_window_and_read_the_validation_split(tmp_path):
    """The JCT difference is per window (hand-computed t-interval), and ``split="val"`` plays the
    validation part of the trace: other windows, so other JCTs than the held-out ones."""
    from scipy import stats

    from bench.saturated_rounds import measure, paired_jct, write_md

    part = {"a": {"jct_h": [1.0, 2.0, 3.0]}, "b": {"jct_h": [0.5, 2.0, 2.0]}}
    got = paired_jct(part, "a")
    assert got["a"] == (0.0, 0.0)
    # d = -0.5, 0, -1: mean -0.5, sample sd 0.5
    assert got["b"][0] == pytest.approx(-0.5) and got["b"][1] == pytest.approx(stats.t.ppf(0.975, 2) * 0.5 / 3 ** 0.5)
    spec = "synthetic:jobs=120,load=3.0,seed=1"
    held = measure(spec, 8, 0.3, 2, 20, [3.0], "fifo,jigsaw", progress=False)
    val = measure(spec, 8, 0.3, 2, 20, [3.0], "fifo,jigsaw", progress=False, split="val", val=0.3)
    assert val["split"] == "val" and held["split"] == "heldout"
    assert val["loads"]["3.0"]["fifo"]["jct_h"] != held["loads"]["3.0"]["fifo"]["jct_h"]
    write_md(tmp_path / "r.md", {**val, "command": "c", "git_commit": "g", "machine": "m", "wall_s": 1.0})
    text = (tmp_path / "r.md").read_text()
    assert "validation (the 0.3 of the trace before the held-out part) windows" in text and "minus fifo (h)" in text
    with pytest.raises(ValueError, match=r"split must be one of \['heldout', 'val'\], got 'train'"):
        measure(spec, 8, 0.3, 2, 20, [3.0], "fifo", progress=False, split="train")
