"""The co-location interference model (jigsaw_env/interference.py, docs/colocation.md): hand-computed
rates and GPU times for two and three workers, the engine's use of them against time-slicing, the
fit's reproducibility from Gavel's file, the validation table's counts, and `jigsaw colocation`."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from data_helpers import require_data
from jigsaw_env.cli import main
from jigsaw_env.cluster import ClusterSpec
from jigsaw_env.engine import Component, Member
from jigsaw_env.free_running import FreeRunner, free_running
from jigsaw_env.interference import (COEF_NAMES, FIT_FILE, InterferenceModel, SharingModel, WorkerLoad,
                                     concurrent_time, fitted_model)
from jigsaw_env.simulator import SimConfig, Simulator
from jigsaw_env.spb import JobProfile, Pattern
from jigsaw_env.state import JobState


def constant_model(rate_with_one: float) -> InterferenceModel:
    """A model whose every pair term is exp(c0): a worker beside one other runs at ``rate_with_one``."""
    c0 = math.log(1.0 / rate_with_one - 1.0)
    return InterferenceModel((c0,) + (0.0,) * (len(COEF_NAMES) - 1))


def one_gpu_profile(compute_s: list[float], batch: int = 32) -> JobProfile:
    c = np.asarray(compute_s, dtype=float).reshape(-1, 1)
    return JobProfile(level=0, pattern=Pattern.ROTATING, slots=(0,), period=c.shape[0], compute_s=c,
                      comm_s=np.zeros(c.shape[0]), bytes=np.zeros(c.shape[0]), peak_bytes=np.zeros(1), eta=1.0,
                      batch_size=batch)


# ----- eqs. I1-I2 by hand
def test_rates_of_two_and_three_workers_by_hand():
    m = constant_model(0.8)  # exp(c0) = 0.25
    w = WorkerLoad(0.1, 32)
    assert m.rates([w], "v100") == [1.0]
    assert m.rates([w, w], "v100") == pytest.approx([0.8, 0.8])
    # three: 1 / (1 + 2 * 0.25) = 2/3 each
    assert m.rates([w, w, w], "v100") == pytest.approx([2 / 3] * 3)


def test_log_odds_uses_each_feature_as_eq_I1_writes_it():
    coef = (0.1, -0.2, 0.3, -0.4, 0.5, -0.6)
    m = InterferenceModel(coef)
    a, b = WorkerLoad(0.05, 16), WorkerLoad(0.2, 64)
    ta, tb, ba, bb = math.log(0.05), math.log(0.2), math.log(16), math.log(64)
    want = 0.1 - 0.2 * math.log(15.7) + 0.3 * ta - 0.4 * ba + 0.5 * tb - 0.6 * bb
    assert m.log_odds(a, b, "v100") == pytest.approx(want, rel=1e-12)
    x = m.rates([a, b], "v100")
    assert x[0] == pytest.approx(1 / (1 + math.exp(want)), rel=1e-12)


def test_concurrent_time_two_workers_by_hand():
    # 1 s and 3 s of work at 0.8 each: the first is done at 1.25 s, the second has done 1 s of its
    # 3 and runs alone for the other 2: 3.25 s. Time-slicing (1/2 each) gives the sum, 4 s.
    m = constant_model(0.8)
    loads = [WorkerLoad(1.0, 32), WorkerLoad(3.0, 32)]
    assert concurrent_time(loads, lambda ls: m.rates(ls, "v100")) == pytest.approx(3.25)
    assert concurrent_time(loads, lambda ls: [1 / len(ls)] * len(ls)) == pytest.approx(4.0)


def test_concurrent_time_three_workers_by_hand():
    # rates 2/3 with three, 0.8 with two. Work 1, 2, 4 s: all three until t = 1.5 (the 1 s worker
    # done; the others have done 1 s each), then two at 0.8 until the 2 s worker is done (1/0.8 =
    # 1.25 s more), the last has 2 s left alone: 1.5 + 1.25 + 2 = 4.75 s
    m = constant_model(0.8)
    loads = [WorkerLoad(1.0, 32), WorkerLoad(2.0, 32), WorkerLoad(4.0, 32)]
    assert concurrent_time(loads, lambda ls: m.rates(ls, "v100")) == pytest.approx(4.75)


def test_sharing_model_modes_and_cpu():
    m = constant_model(0.8)
    loads = [WorkerLoad(1.0, 32), WorkerLoad(3.0, 32)]
    fitted = SharingModel("fitted", ("v100", "cpu"), model=m)
    assert fitted.time_on(0, loads) == pytest.approx(3.25)
    assert fitted.time_on(1, loads) == 4.0  # a CPU slot time-slices
    assert SharingModel("timeslice", ("v100",)).time_on(0, loads) == 4.0
    with pytest.raises(ValueError, match="sharing must be one of fitted, timeslice, got 'both'"):
        SharingModel("both")
    with pytest.raises(ValueError, match="knows GPU types k80, p100, v100 .* not 'a100'; use sharing 'timeslice'"):
        SharingModel("fitted", ("a100",), model=m)


# ----- the engine
def test_component_step_uses_the_fitted_time_and_timeslice_the_sum():
    x, y = one_gpu_profile([1.0]), one_gpu_profile([3.0])
    members = [Member(1, x, (0,), 0), Member(2, y, (0,), 0)]
    fitted = Component(members, 0.0, sharing=SharingModel("fitted", ("v100",), model=constant_model(0.8)))
    assert fitted.step.tolist() == pytest.approx([3.25])
    assert fitted.loads.ravel().tolist() == pytest.approx([3.25])  # the GPU computes for 3.25 s of the step
    assert Component(members, 0.0).step.tolist() == [4.0]


def test_component_follows_the_spb_cycle_through_the_rates():
    # job X: 1 s every iteration; job Y's phases 3 s and 1 s. With rates 0.8 beside one other:
    # step 0 as above 3.25 s; step 1 two 1 s workers together: 1 / 0.8 = 1.25 s
    x, y = one_gpu_profile([1.0]), one_gpu_profile([3.0, 1.0])
    comp = Component([Member(1, x, (0,), 0), Member(2, y, (0,), 0)], 0.0,
                     sharing=SharingModel("fitted", ("v100",), model=constant_model(0.8)))
    assert comp.step.tolist() == pytest.approx([3.25, 1.25])


def test_three_jobs_on_one_gpu_in_a_component():
    profs = [one_gpu_profile([1.0]), one_gpu_profile([2.0]), one_gpu_profile([4.0])]
    comp = Component([Member(i, p, (0,), 0) for i, p in enumerate(profs)], 0.0,
                     sharing=SharingModel("fitted", ("v100",), model=constant_model(0.8)))
    assert comp.step.tolist() == pytest.approx([4.75])


def test_simulator_sharing_option_checks():
    with pytest.raises(ValueError, match="sharing must be one of fitted, timeslice, got 'mps'"):
        SimConfig(sharing="mps")
    jobs = [JobState(job_id=0, arrival_s=0.0, num_gpus=1, model="resnet18", batch_size=64, iterations=10.0)]
    cluster = ClusterSpec.from_gpus(8, gpu_type="cpu")
    assert Simulator(cluster, jobs, SimConfig()).config.sharing == "fitted"


def test_free_running_pair_with_constant_rates():
    # two 1-GPU jobs without syncs always compute: each runs at 0.8 beside the other whatever its
    # phase (eq. F1 with d = 1), so every phase takes 1 / 0.8 of its time alone; time-sliced, 2x
    s = SharingModel("fitted", ("v100",), model=constant_model(0.8))
    a, b = one_gpu_profile([0.1, 0.05]), one_gpu_profile([0.3], 64)
    fr = free_running([FreeRunner(a, (0,)), FreeRunner(b, (0,))], s)
    assert fr.profiles[0].compute_s.ravel().tolist() == pytest.approx([0.125, 0.0625], rel=1e-12)
    assert fr.profiles[1].compute_s.ravel().tolist() == pytest.approx([0.375], rel=1e-12)
    assert fr.duty == ((1.0,), (1.0,))
    fr = free_running([FreeRunner(a, (0,)), FreeRunner(b, (0,))], SharingModel("timeslice", ("v100",)))
    assert fr.profiles[0].compute_s.ravel().tolist() == pytest.approx([0.2, 0.1], rel=1e-12)
    # the GPU is busy all the time, credited half to each job (eq. F4)
    assert fr.busy_rate == ((0.5,), (0.5,))


def test_free_running_two_jobs_with_syncs_by_hand():
    # two 2-GPU jobs on the same two GPUs of one node, time-sliced, each 1 s of compute per worker
    # and 1 s of sync alone (2 s a step). Free: c = 1 x ((1 - d) + 2 d), s = 1 x (1 + u) with the
    # other's shares d = c / T, u = s / T; by symmetry c = s = 1.5 s, T = 3 s (lockstep: 2 + 2 = 4 s)
    sharing = SharingModel("timeslice", ("v100",) * 8, gpus_per_node=4)
    p = two_node_profile(1.0, 1.0)
    fr = free_running([FreeRunner(p, (0, 1)), FreeRunner(p, (0, 1))], sharing)
    for q in fr.profiles:
        assert q.compute_s.tolist() == [[pytest.approx(1.5, rel=1e-9)] * 2]
        assert q.comm_s.tolist() == [pytest.approx(1.5, rel=1e-9)]
    # each GPU busy 1 - (1 - 1/2)^2 = 3/4 of the time, 3/8 credited to each job
    assert fr.busy_rate == ((pytest.approx(0.375), pytest.approx(0.375)),) * 2
    lock = Component([Member(1, p, (0, 1), 0), Member(2, p, (0, 1), 0)], 0.0, sharing=sharing)
    assert lock.step.tolist() == [4.0]


def test_free_running_three_jobs_on_one_gpu_and_a_gpu_to_itself():
    # three 1-GPU jobs on GPU 0, time-sliced: each at 1/3 while both others compute (always)
    sharing = SharingModel("timeslice", ("v100",) * 2)
    p = one_gpu_profile([1.0])
    fr = free_running([FreeRunner(p, (0,))] * 3, sharing)
    assert [q.compute_s.item() for q in fr.profiles] == [pytest.approx(3.0)] * 3
    # a 2-GPU job (1 s compute, no sync) sharing GPU 0 with a 1-GPU job of 1 s: on GPU 0 both
    # always compute (2 s each), GPU 1 is the 2-GPU job's alone; its step waits for GPU 0
    q = JobProfile(level=0, pattern=Pattern.ROTATING, slots=(0,), period=1, compute_s=np.array([[1.0, 1.0]]),
                   comm_s=np.zeros(1), bytes=np.zeros(1), peak_bytes=np.zeros(2), eta=1.0, batch_size=32)
    fr = free_running([FreeRunner(q, (0, 1)), FreeRunner(p, (0,))], sharing)
    assert fr.profiles[0].compute_s.tolist() == [[pytest.approx(2.0), 1.0]]
    assert fr.profiles[1].compute_s.item() == pytest.approx(2.0)
    # GPU 1 computes 1 s of every 2 s step; GPU 0 always
    assert fr.duty[0] == (pytest.approx(1.0), pytest.approx(0.5))
    assert fr.busy_rate[0] == (pytest.approx(0.5), pytest.approx(0.5))


# ----- the fit
def test_refit_reproduces_the_committed_coefficients():
    path = require_data("gavel/simulation_throughputs.json")
    from jigsaw_env.colocation_fit import data_digest, fit_record

    committed = json.loads(FIT_FILE.read_text())
    rec = fit_record(path)
    assert rec["data"] == committed["data"]
    assert committed["data"]["sha256_16"] == data_digest(path)
    for name in COEF_NAMES:
        assert rec["coefficients"][name] == pytest.approx(committed["coefficients"][name], rel=1e-7, abs=1e-9)
    assert fitted_model().coef == tuple(committed["coefficients"][n] for n in COEF_NAMES)


def test_pairs_and_validation_counts_match_gavels_file():
    path = require_data("gavel/simulation_throughputs.json")
    from jigsaw_env.colocation_fit import load_pairs, validate

    pairs = load_pairs(path)
    # unordered, measured, single-GPU pairs of the five zoo-mapped job types
    counts = {g: sum(p.gpu_type == g for p in pairs) for g in ("k80", "p100", "v100")}
    assert counts == {"k80": 259, "p100": 290, "v100": 282}
    assert all(p.together_a > 0 or p.together_b > 0 for p in pairs)  # [0, 0] left out
    table = {(s.split, s.gpu_type): s for s in validate(path)}
    p100 = table[("held-out GPU type", "p100")]
    assert p100.pairs == 290
    assert p100.median_combined == pytest.approx(1.136, abs=5e-4)
    assert p100.constant_median_err == pytest.approx(0.136, abs=5e-4)
    assert sum(s.pairs for (split, _), s in table.items() if split.startswith("leave out")) > 282  # pairs of two held-out models count twice


def test_zoo_gavel_jobs_are_the_zoo_models_gavel_measured():
    from jigsaw_env.colocation_fit import ZOO_GAVEL_JOBS
    from jigsaw_env.zoo import MODELS

    assert set(ZOO_GAVEL_JOBS) == {c.gavel_job for c in MODELS.values() if c.gavel_job}


# ----- the command line
def test_predict_json_matches_the_model_on_anchored_tables(capsys):
    assert main(["colocation", "predict", "--gpu-type", "v100", "--pair", "resnet18:64,lstm_lm:20", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)
    a, b = out["jobs"]
    assert (a["model"], a["batch_size"], a["level"], b["model"], b["batch_size"]) == ("resnet18", 64, 0, "lstm_lm", 20)
    # level 0 has one phase: the rates are eq. I2 at the tables' alone iteration times
    wa, wb = WorkerLoad(1 / a["alone_it_s"], 64), WorkerLoad(1 / b["alone_it_s"], 20)
    assert [a["normalized_rate"], b["normalized_rate"]] == pytest.approx(fitted_model().rates([wa, wb], "v100"))
    assert out["combined"] == pytest.approx(a["normalized_rate"] + b["normalized_rate"])
    assert a["rate_it_s"] == pytest.approx(a["normalized_rate"] * a["alone_it_s"])


def test_predict_timeslice_adds_up_to_one(capsys):
    assert main(["colocation", "predict", "--gpu-type", "p100", "--pair", "resnet50:32,transformer_small:64",
                 "--levels", "0,3", "--sharing", "timeslice", "--json"]) == 0
    (out,) = json.loads(capsys.readouterr().out)
    assert out["lockstep"]["combined"] == pytest.approx(1.0)


def test_predict_refuses_a_pair_that_does_not_fit_and_every_measured_pair_fits():
    """The memory test is the ledger's: two resnet50:128 workers (11.02 GiB each at their peak)
    exceed a 16 GiB V100; every pair Gavel measured fits, on its GPU type, so predict answers it."""
    from jigsaw_env.colocation_cli import predict
    from jigsaw_env.colocation_fit import load_pairs
    from jigsaw_env.zoo import MODELS

    with pytest.raises(ValueError, match=r"do not fit on one v100 \(11\.02 \+ 11\.02 GiB > 16\.00 GiB"):
        predict((("resnet50", 128), ("resnet50", 128)), "v100")
    zoo_of = {c.gavel_job: name for name, c in MODELS.items() if c.gavel_job}
    pairs = load_pairs(require_data("gavel/simulation_throughputs.json"))
    kinds = {(p.gpu_type, (zoo_of[p.job_a], p.batch_a), (zoo_of[p.job_b], p.batch_b)) for p in pairs}
    for gpu, a, b in sorted(kinds):
        assert predict((a, b), gpu)["combined"] > 0


def test_check_json_and_plot(tmp_path, capsys):
    require_data("gavel/simulation_throughputs.json")
    assert main(["colocation", "check", "--json", "--out", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["split"] for r in rows][:2] == ["held-out GPU type", "leave out ResNet-18"]
    for r in rows:
        assert {"pairs", "combined_median_err", "combined_p90_err", "rate_median_err", "constant_median_err",
                "timeslice_median_err", "target", "meets_target"} <= set(r)
    assert (tmp_path / "colocation_check.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "colocation_check.json").read_text()) == rows


# ----- the schedulers' pairing search sees the simulator's sharing
@pytest.mark.parametrize("sharing", ["fitted", "timeslice"])
@pytest.mark.parametrize("levels", [(0, 0), (3, 2)])
def test_pairing_search_scores_a_pair_as_the_engine_times_it(sharing, levels):
    from agents.common import best_pairing

    cluster = ClusterSpec.from_gpus(8, gpu_type="v100")
    jobs = [JobState(job_id=1, arrival_s=0.0, num_gpus=1, model="resnet18", batch_size=64, iterations=100.0),
            JobState(job_id=2, arrival_s=0.0, num_gpus=1, model="lstm_lm", batch_size=20, iterations=100.0)]
    sim = Simulator(cluster, jobs, SimConfig(sharing=sharing, pace="lockstep"))
    state = sim.state
    host, guest = state.jobs[1], state.jobs[2]
    hc, gc = (levels[0], Pattern.ROTATING), (levels[1], Pattern.ROTATING)
    plan = best_pairing(state, host, (0,), guest, [hc], [gc])
    members = [Member(1, state.costs.profile(host, hc[0], hc[1], (0,)), (0,), 0),
               Member(2, state.costs.profile(guest, gc[0], gc[1], (0,)), (0,), 0)]
    comp = Component(members, 0.0, sharing=state.sharing)
    assert state.sharing.mode == sharing
    assert plan.step_s == pytest.approx(comp.cycle / comp.H, rel=1e-12)


# ----- shared links (eq. L1)
def test_linked_sync_by_hand():
    from jigsaw_env.interference import linked_sync_s

    nic = lambda *nodes: frozenset(("nic", n) for n in nodes)  # noqa: E731
    fab = lambda n: frozenset({("fabric", n)})  # noqa: E731
    # two jobs spanning nodes 0 and 1: their syncs share both NICs: 2 + 3 s
    assert linked_sync_s([2.0, 3.0], [nic(0, 1), nic(0, 1)]) == 5.0
    # one spans nodes 0-1, the other 1-2: node 1's NIC carries both
    assert linked_sync_s([2.0, 3.0], [nic(0, 1), nic(1, 2)]) == 5.0
    # a cross-node job and an intra-node one share no link: the longer
    assert linked_sync_s([2.0, 3.0], [nic(0, 1), fab(0)]) == 3.0
    # three on one node's fabric, one of them a 1-GPU job without sync
    assert linked_sync_s([1.0, 0.0, 0.5], [fab(0), fab(0), fab(0)]) == 1.5


def two_node_profile(compute_s: float, comm_s: float) -> JobProfile:
    c = np.full((1, 2), compute_s)
    return JobProfile(level=0, pattern=Pattern.ROTATING, slots=(0,), period=1, compute_s=c,
                      comm_s=np.array([comm_s]), bytes=np.zeros(1), peak_bytes=np.zeros(2), eta=1.0, batch_size=32)


def test_two_jobs_spanning_the_same_two_nodes_sync_slower_together():
    # GPUs 0 and 4 on nodes 0 and 1 (4 GPUs a node); both jobs on both GPUs, time-sliced compute:
    # alone each steps 1 + 2 = 3 s and 2 + 3 = 5 s; together the GPUs compute 1 + 2 = 3 s and the
    # syncs share both NICs: 2 + 3 = 5 s, a step of 8 s (free syncs would give 3 + 3 = 6 s)
    sharing = SharingModel("timeslice", ("v100",) * 8, gpus_per_node=4)
    a, b = two_node_profile(1.0, 2.0), two_node_profile(2.0, 3.0)
    pair = Component([Member(1, a, (0, 4), 0), Member(2, b, (0, 4), 0)], 0.0, sharing=sharing)
    assert pair.step.tolist() == [8.0]
    assert Component([Member(1, a, (0, 4), 0), Member(2, b, (0, 4), 0)], 0.0).step.tolist() == [6.0]
    assert Component([Member(1, a, (0, 4), 0)], 0.0, sharing=sharing).step.tolist() == [3.0]
    # on one node the syncs share its fabric the same way
    one_node = Component([Member(1, a, (0, 1), 0), Member(2, b, (0, 1), 0)], 0.0, sharing=sharing)
    assert one_node.step.tolist() == [8.0]


@pytest.mark.parametrize("sharing", ["fitted", "timeslice"])
def test_pairing_search_times_a_cross_node_pair_as_the_engine(sharing):
    from agents.common import best_pairing

    cluster = ClusterSpec.from_gpus(8, gpus_per_node=4, gpu_type="v100")
    jobs = [JobState(job_id=1, arrival_s=0.0, num_gpus=2, model="resnet18", batch_size=64, iterations=100.0),
            JobState(job_id=2, arrival_s=0.0, num_gpus=2, model="transformer_small", batch_size=64, iterations=100.0)]
    state = Simulator(cluster, jobs, SimConfig(sharing=sharing, pace="lockstep")).state
    host, guest = state.jobs[1], state.jobs[2]
    lvl = (0, Pattern.ROTATING)
    plan = best_pairing(state, host, (0, 4), guest, [lvl], [lvl])
    members = [Member(1, state.costs.profile(host, 0, lvl[1], (0, 4)), (0, 4), 0),
               Member(2, state.costs.profile(guest, 0, lvl[1], plan.guest_gpus), plan.guest_gpus, 0)]
    comp = Component(members, 0.0, sharing=state.sharing)
    assert plan.step_s == pytest.approx(comp.cycle / comp.H, rel=1e-12)
    sync = [m.profile.comm_s[0] for m in members]
    assert min(sync) > 0
    loads = comp.loads.max()
    assert comp.step[0] == pytest.approx(loads + sum(sync), rel=1e-12)  # the NICs carry both syncs


class _Costs:
    """A stand-in CostModel: the pairing search's caches are keyed by its identity."""


def _free_state(gpus: int = 8, gpus_per_node: int = 4):
    """What the pairing search reads of a state: a time-sliced sharing model under the free pace."""
    from types import SimpleNamespace

    return SimpleNamespace(sharing=SharingModel("timeslice", ("v100",) * gpus, gpus_per_node=gpus_per_node),
                           costs=_Costs())


def test_free_pace_one_step_estimate_by_hand():
    from jigsaw_env.pairing import _free_candidate_values, free_value_bound, profile_summary

    # host: 2 workers, phases (1.0, 0.5) s and (0.5, 0.5) s of compute, 1 s sync each: alone cycle
    # T0 = 2 + 1.5 = 3.5 s, duties 1.5/3.5 = 3/7 and 1/3.5 = 2/7; guest: 1 worker, 2 s, no sync
    # (duty 1). Time-sliced, x = 1/2, so beside a computing co-runner a phase takes 2x.
    host = JobProfile(level=0, pattern=Pattern.ROTATING, slots=(0,), period=2,
                      compute_s=np.array([[1.0, 0.5], [0.5, 0.5]]), comm_s=np.array([1.0, 1.0]), bytes=np.zeros(2),
                      peak_bytes=np.zeros(2), eta=1.0, batch_size=32)
    guest = one_gpu_profile([2.0])
    sub = np.array([[0], [1]])
    values, t_h, t_g = _free_candidate_values(_free_state(), (0, 1), sub, np.full(2, 1e12), host, guest, 1.0, 1.0)
    # guest on GPU 0: host there 2x (the guest always computes): phases 2 and 1 s, plus the sync
    # (the guest syncs nothing: u = 0): T_h = (3 + 2) / 2; guest 2 x (4/7 + 3/7 x 2) = 20/7 s
    # guest on GPU 1: host's GPU 1 at 1 and 1 s, GPU 0 still the slowest or equal: T_h = 2;
    # guest 2 x (5/7 + 2/7 x 2) = 18/7 s
    assert t_h.tolist() == pytest.approx([2.5, 2.0], rel=1e-12)
    assert t_g.tolist() == pytest.approx([20 / 7, 18 / 7], rel=1e-12)
    assert values.tolist() == pytest.approx([1 / 2.5 + 7 / 20, 1 / 2.0 + 7 / 18], rel=1e-12)
    # the bound: the guest beside a host worker of duty >= 2/7 takes >= 2 x 9/7 s; the host's
    # lightest worker (0.5 s a phase) beside the guest >= 2 x 0.5 s, so >= 1 + 1 s a step: the
    # second order's value, reached exactly (iso 1/2 s: the host's 2 workers do 1 s of work)
    state = _free_state()
    bound = free_value_bound(state, (0, 1), 1, host, guest, 0.5, 1.0, profile_summary(state.costs, host),
                             profile_summary(state.costs, guest), True)
    assert bound == pytest.approx(1 / 2.0 + 7 / 18, rel=1e-12)
    # an order that does not fit in memory is -inf
    heavy = dataclasses.replace(host, peak_bytes=np.array([5.0, 1.0]))
    values, t_h, _ = _free_candidate_values(_free_state(), (0, 1), sub, np.full(2, 5.5), heavy,
                                            dataclasses.replace(guest, peak_bytes=np.array([1.0])), 1.0, 1.0)
    assert values[0] == -np.inf and t_h[0] == np.inf and np.isfinite(values[1])


def test_free_pace_estimate_of_one_cost_model_is_kept_per_sharing_mode():
    from types import SimpleNamespace

    from jigsaw_env.pairing import _free_candidate_values

    # the profiles of test_free_pace_one_step_estimate_by_hand, on one CostModel serving a fitted
    # and a time-sliced simulator: the tables kept for the pair under one mode are not read
    # under the other
    host = JobProfile(level=0, pattern=Pattern.ROTATING, slots=(0,), period=2,
                      compute_s=np.array([[1.0, 0.5], [0.5, 0.5]]), comm_s=np.array([1.0, 1.0]), bytes=np.zeros(2),
                      peak_bytes=np.zeros(2), eta=1.0, batch_size=32)
    guest = one_gpu_profile([2.0])
    sub, cap = np.array([[0], [1]]), np.full(2, 1e12)
    costs = _Costs()
    fitted = SimpleNamespace(sharing=SharingModel("fitted", ("v100",) * 8, gpus_per_node=4), costs=costs)
    sliced = SimpleNamespace(sharing=SharingModel("timeslice", ("v100",) * 8, gpus_per_node=4), costs=costs)
    first = _free_candidate_values(fitted, (0, 1), sub, cap, host, guest, 1.0, 1.0)
    _, t_h, t_g = _free_candidate_values(sliced, (0, 1), sub, cap, host, guest, 1.0, 1.0)
    assert t_h.tolist() == pytest.approx([2.5, 2.0], rel=1e-12)  # the hand-computed time-sliced times
    assert t_g.tolist() == pytest.approx([20 / 7, 18 / 7], rel=1e-12)
    assert first[1].tolist() != pytest.approx([2.5, 2.0], rel=1e-6)  # (the fitted rates differ from 1/2)
    again = _free_candidate_values(fitted, (0, 1), sub, cap, host, guest, 1.0, 1.0)
    cold = SimpleNamespace(sharing=fitted.sharing, costs=_Costs())  # nothing kept yet
    fresh = _free_candidate_values(cold, (0, 1), sub, cap, host, guest, 1.0, 1.0)
    for kept, computed in ((first, again), (first, fresh)):
        assert [a.tolist() for a in kept] == [a.tolist() for a in computed]


def test_free_pace_one_step_estimate_slows_linked_syncs():
    from jigsaw_env.pairing import _free_candidate_values

    # two 2-GPU jobs on GPUs 0 and 1 of one node, 1 s compute per worker and 1 s sync: alone
    # d = u = 1/2, so c = 1 x (1/2 + 1/2 x 2) = 1.5 s and s = 1 x (1 + 1/2) = 1.5 s (eqs. F1, F2
    # one step from the alone times, here the fixed point of test_free_running_two_jobs_with_syncs_by_hand)
    p = two_node_profile(1.0, 1.0)
    values, t_h, t_g = _free_candidate_values(_free_state(), (0, 1), np.array([[0, 1], [1, 0]]), np.full(2, 1e12),
                                              p, p, 2.0, 2.0)
    assert t_h.tolist() == pytest.approx([3.0, 3.0], rel=1e-12)
    assert t_g.tolist() == pytest.approx([3.0, 3.0], rel=1e-12)
    assert values.tolist() == pytest.approx([4 / 3, 4 / 3], rel=1e-12)
    # a host and a guest both on GPUs 0 and 4 (two nodes) share the two NICs: the same times
    _, t_h, _ = _free_candidate_values(_free_state(), (0, 4), np.array([[0, 1]]), np.full(2, 1e12), p, p, 2.0, 2.0)
    assert t_h.tolist() == pytest.approx([3.0], rel=1e-12)


@pytest.mark.parametrize("sharing", ["fitted", "timeslice"])
def test_free_pace_search_is_phase_free_and_under_its_bound(sharing):
    from agents.common import best_pairing, spb_configs
    from agents.jigsaw import pairing_bound
    from jigsaw_env.pairing import pair_value_bound, phase_difference, profile_summary

    cluster = ClusterSpec.from_gpus(8, gpus_per_node=4, gpu_type="v100")
    jobs = [JobState(job_id=1, arrival_s=0.0, num_gpus=4, model="resnet18", batch_size=64, iterations=100.0),
            JobState(job_id=2, arrival_s=0.0, num_gpus=2, model="transformer_small", batch_size=64, iterations=100.0)]
    state = Simulator(cluster, jobs, SimConfig(sharing=sharing)).state
    assert state.sharing.pace == "free"
    host, guest = state.jobs[1], state.jobs[2]
    hgpus = (0, 1, 2, 3)
    plan = best_pairing(state, host, hgpus, guest)
    guest.iteration = 7  # the phases drift under the free pace; the score does not read them
    assert phase_difference(state, host, guest, 4) == 0
    again = best_pairing(state, host, hgpus, guest)
    assert (again.guest_gpus, again.value) == (plan.guest_gpus, plan.value)
    assert plan.value <= pairing_bound(state, host, hgpus, guest)
    # the plan's value is the sum of both jobs' useful work, and step_s the host's iteration time
    iso_h = state.costs.isolated_iteration_s(host)
    assert plan.x_host == pytest.approx(state.costs.profile(host, *plan.host_cfg, hgpus).eta * iso_h / plan.step_s)
    assert plan.value == pytest.approx(4 * plan.x_host + 2 * plan.x_guest, rel=1e-12)
    # every candidate is at most the plan's value, and at most its own bound
    iso_g = state.costs.isolated_iteration_s(guest)
    for hc in spb_configs(state, host):
        ph = state.costs.profile(host, hc[0], hc[1], hgpus)
        for gc in spb_configs(state, guest):
            other = best_pairing(state, host, hgpus, guest, [hc], [gc])
            assert other.value <= plan.value + 1e-12
            pg = state.costs.profile(guest, gc[0], gc[1], other.guest_gpus)
            bound = pair_value_bound(state, hgpus, 2, ph, pg, iso_h, iso_g, profile_summary(state.costs, ph),
                                     profile_summary(state.costs, pg), True)
            assert other.value <= bound * (1 + 1e-12)


def test_sharing_model_pace_check():
    assert SharingModel("timeslice", ("v100",)).pace == "free"
    with pytest.raises(ValueError, match="pace must be 'free' or 'lockstep'"):
        SharingModel("timeslice", ("v100",), pace="drift")


def test_the_form_search_tables_each_fitting_gpu_types_pairs_by_job_type():
    from jigsaw_env.colocation_fit import MeasuredPair
    from tools.colocation_form_search import type_medians

    def pair(gpu, a, b, rate_a, rate_b):
        return MeasuredPair(gpu, a, 32, b, 64, 10.0, 5.0, 10.0 * rate_a, 5.0 * rate_b)

    train = [pair("k80", "LM", "ResNet-50", 0.5, 0.5), pair("k80", "ResNet-50", "LM", 0.6, 0.6),
             pair("k80", "LM", "ResNet-50", 0.4, 0.4), pair("v100", "LM", "LM", 0.25, 0.3)]
    text = type_medians(train)
    k80, v100 = text.split("V100:")
    # the pair's order does not matter: (LM, ResNet-50) and (ResNet-50, LM) are one cell, median of 1.0, 1.2, 0.8
    assert "| LM |  | 1.00 (3) |" in k80 and "| ResNet-50 | 1.00 (3) |  |" in k80
    assert "| LM | 0.55 (1) |" in v100 and "ResNet-50" not in v100
