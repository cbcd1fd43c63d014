"""The live executor's real SPB data-parallel training (jigsaw_executor.spb_worker / launcher).

All on CPU with gloo, 1-4 worker processes of one thread each, tiny models on sklearn digits.
``JIGSAW_TEST_DEVICE=cuda`` runs the same jobs on one GPU (NCCL for a one-rank job, gloo over CUDA
tensors for several ranks); the reference stays on the CPU, so run it with ``NVIDIA_TF32_OVERRIDE=0``
to keep the GPU's float32 products comparable at the same tolerances.
Distributed jobs run once per module (fixtures) and several tests check their results:

* replicas are bit-identical (parameters, buffers and optimizer state) after iterations whose
  level, pattern and starts change every iteration;
* before the sync, a light rank's gradients of the groups below its start are None, and the
  synced gradients equal an independent single-process computation (full backprop of every
  rank's batch, kept for the groups >= its start, averaged over the contributors or over all);
* bytes counted at the collective calls equal ``jigsaw_env.spb.iteration_cost(...).bytes``;
* groups with no contributor keep their parameters and optimizer state;
* a paused and resumed job ends bit-identical to an uninterrupted one;
* a failing, stalling or crashing worker fails the job with its rank and error, within the timeout.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.nn.modules.batchnorm import _NormBase

from jigsaw_env.network import INTRA_NODE, REDUCE_BROADCAST, RING
from jigsaw_env.spb import Pattern, SPBConfig, iteration_cost, worker_starts
from jigsaw_executor.data import DigitsData, default_source, make_batch_fn
from jigsaw_executor.launcher import Decision, JobFailed, run_job_local
from jigsaw_executor.models import build_executor_model, exact_bytes_table
from jigsaw_executor.spb_worker import SPBTrainer, plan_sync, ring_bytes_sent

SEED = 3
DEVICE = os.environ.get("JIGSAW_TEST_DEVICE", "cpu")  # where run_job_local's workers train
BS = 8
SPB = SPBConfig()

# tiny_bn_cnn (B = 4, BatchNorm, SGD momentum + weight decay), 3 ranks: every level, both patterns,
# explicit starts with no contributor for groups 0 and 1 (t = 4), plain data parallel (t = 5).
BN_DECISIONS = [Decision(2, "rotating"), Decision(3, "static"), Decision(3, "rotating"), Decision(1, "rotating"),
                Decision(0, starts=(3, 3, 2)), Decision(0)]
# tiny_transformer (B = 4, Adam), 4 ranks, averaged over all workers; t = 4: only group 3 is trained.
TF_DECISIONS = [Decision(2, "static"), Decision(3, "rotating"), Decision(2, "rotating"), Decision(3, "static"),
                Decision(0, starts=(3, 3, 3, 3))]
# tiny_mlp (B = 5), 2 ranks; t = 2 is level 3 rotating: starts (2, 3), so groups 0 and 1 get no update.
MLP_DECISIONS = [Decision(0), Decision(0), Decision(3, "rotating"), Decision(2, "static"), Decision(1, "rotating")]


def _starts(dec: Decision, world: int, t: int, num_groups: int) -> tuple[int, ...]:
    if dec.starts is not None:
        return dec.starts
    slots = SPB.start_slots(dec.level, num_groups)
    return tuple(int(s) for s in worker_starts(slots, Pattern.parse(dec.pattern), world, t))


def _group_of(model) -> dict[str, int]:
    return {f"groups.{b}.{n}": b for b, g in enumerate(model.groups) for n, _ in g.named_parameters()}


def reference_run(model_name: str, world: int, decisions, average_over: str = "contributors"):
    """Single-process replay of an SPB job, written independently of SPBTrainer: every rank's batch
    gets a plain full forward/backward; its gradients count for the groups >= its start; the sum
    over contributors is divided by |C_b| (or W); groups without contributors get grad None;
    BatchNorm running statistics are averaged over the ranks after the step."""
    torch.manual_seed(SEED)
    model = build_executor_model(model_name).train()
    opt = model.make_optimizer()
    batch = make_batch_fn(default_source(model_name), model, SEED, world, BS)
    group_of = _group_of(model)
    params = dict(model.named_parameters())
    norm_keys = {f"{mn}.{bn}" for mn, m in model.named_modules() if isinstance(m, _NormBase)
                 for bn, b in m.named_buffers(recurse=False) if b.is_floating_point()}
    synced = {}
    for t, dec in enumerate(decisions):
        starts = _starts(dec, world, t, model.num_groups)
        buf0 = {k: v.clone() for k, v in model.named_buffers()}
        sums = {n: torch.zeros_like(p) for n, p in params.items()}
        post = []
        for r in range(world):
            with torch.no_grad():
                for k, v in model.named_buffers():
                    v.copy_(buf0[k])
            model.zero_grad(set_to_none=True)
            x, y = batch(t, r)
            model.loss(model(x), y).backward()
            for n, p in params.items():
                if group_of[n] >= starts[r]:
                    sums[n] += p.grad
            post.append({k: v.clone() for k, v in model.named_buffers()})
        for n, p in params.items():
            c = sum(1 for s in starts if s <= group_of[n])
            p.grad = None if c == 0 else sums[n] / (c if average_over == "contributors" else world)
        synced[t] = {n: (None if p.grad is None else p.grad.clone()) for n, p in params.items()}
        model.optimizer_step(opt)
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(torch.stack([q[k] for q in post]).mean(0) if k in norm_keys else post[0][k])
    return model, synced


# --------------------------------------------------------------------------------------------
# module-scoped jobs
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bn_job():
    res = run_job_local("tiny_bn_cnn", 3, len(BN_DECISIONS), BN_DECISIONS, batch_size=BS, device=DEVICE, seed=SEED,
                        timeout_s=30, job_timeout_s=120, record_grads_at=range(len(BN_DECISIONS)), return_state=True)
    return res


@pytest.fixture(scope="module")
def tf_job():
    return run_job_local("tiny_transformer", 4, len(TF_DECISIONS), TF_DECISIONS, batch_size=BS, device=DEVICE, seed=SEED,
                         average_over="all", timeout_s=30, job_timeout_s=120,
                         record_grads_at=range(len(TF_DECISIONS)), return_state=True)


@pytest.fixture(scope="module")
def pause_resume(tmp_path_factory):
    """tiny_mlp, 2 ranks: 5 iterations straight, and the same as 2 + 1 + 2 with two pauses."""
    ck = tmp_path_factory.mktemp("ckpt")
    kw = dict(batch_size=BS, device=DEVICE, seed=SEED, timeout_s=30, job_timeout_s=120, return_state=True)
    full = run_job_local("tiny_mlp", 2, 5, MLP_DECISIONS, **kw)
    a = run_job_local("tiny_mlp", 2, 2, MLP_DECISIONS, checkpoint_dir=ck, resume=True, **kw)
    b = run_job_local("tiny_mlp", 2, 1, MLP_DECISIONS, checkpoint_dir=ck, resume=True, **kw)
    c = run_job_local("tiny_mlp", 2, 2, MLP_DECISIONS, checkpoint_dir=ck, resume=True, **kw)
    return full, a, b, c


# --------------------------------------------------------------------------------------------
# pure functions
# --------------------------------------------------------------------------------------------
def test_plan_matches_simulator_formulas():
    from jigsaw_env.cost_table import CostTable, LayerGroup

    from jigsaw_env.network import CROSS_NODE

    rng = np.random.default_rng(0)
    # sizes on both sides of N4's crossover (one contributor of 4: 2 alpha beta = 153 kB intra-node)
    pbytes = [400, 4000, 0, 1_200_000, 40, 400_000, 150_000]
    table = CostTable("x", 1, "cpu", tuple(LayerGroup(f"g{i}", m, 0, 0, 0, 0) for i, m in enumerate(pbytes)), 0.0, 0)
    partial = set()  # algorithms chosen for groups with 0 < |C_b| < W
    for i in range(300):
        W = int(rng.integers(1, 7))
        starts = rng.integers(0, len(pbytes), size=W)
        link = INTRA_NODE if i % 2 else CROSS_NODE
        plan = plan_sync(starts, pbytes, link)
        # bytes by the per-call convention of spb_worker: ring 2(W-1)M, reduce (C-1)M, broadcast (W-1)M
        total = sum(2 * (W - 1) * g.nbytes if g.algorithm == RING else
                    ((len(g.contributors) - 1) + (W - 1)) * g.nbytes if g.algorithm == REDUCE_BROADCAST else 0
                    for g in plan)
        cost = iteration_cost(table, starts, link)
        assert total == cost.bytes
        assert tuple(g.algorithm for g in plan) == cost.algorithms
        partial |= {g.algorithm for g in plan if 0 < len(g.contributors) < W and g.nbytes > 0}
        assert [len(g.contributors) for g in plan] == cost.contributors.tolist()
        for g in plan:
            assert g.contributors == tuple(w for w in range(W) if starts[w] <= g.group)
            if g.algorithm == REDUCE_BROADCAST:
                assert g.root == min(g.contributors)
    assert partial == {RING, REDUCE_BROADCAST}  # both are chosen for partly contributed groups


@pytest.mark.parametrize("numel,W", [(1, 2), (7, 3), (100, 4), (101, 4), (3, 5)])
def test_ring_bytes_per_rank_sum_to_simulator_total(numel, W):
    per_rank = [ring_bytes_sent(numel, 4, W, r) for r in range(W)]
    assert sum(per_rank) == 2 * (W - 1) * numel * 4
    assert max(per_rank) - min(per_rank) <= 2 * 4


def test_plan_sync_methods_and_choice():
    # N4 at the intra-node link (alpha 10 us, 7.67 GB/s), W = 4, one contributor: the ring beats
    # reduce+broadcast iff 6 (alpha + M/(4 beta)) < 3 (alpha + M/beta), i.e. M > 2 alpha beta = 153.4 kB
    big, small = 160_000, 140_000
    plan = plan_sync([0, 1, 1, 1], [big, small])
    assert [len(g.contributors) for g in plan] == [1, 4]
    assert plan[0].algorithm == RING and plan[0].root is None
    plan = plan_sync([0, 1, 1, 1], [small, big])
    assert plan[0].algorithm == REDUCE_BROADCAST and plan[0].root == 0
    # forced methods: every group that syncs, whatever the sizes; no contributor stays "none"
    for method in (RING, REDUCE_BROADCAST):
        plan = plan_sync([1, 2, 2], [big, small, 8], method=method)
        assert [g.algorithm for g in plan] == ["none", method, method]
    with pytest.raises(ValueError, match=r"sync method must be one of \['fastest', 'ring', 'reduce_broadcast'\]"):
        plan_sync([0, 1], [8, 8], method="tree")
    with pytest.raises(ValueError, match="sync_method must be one of"):
        run_job_local("tiny_mlp", 2, 1, sync_method="tree")


# groups of a 4-rank sync test: parameter counts not divisible by 4 (uneven ring chunks)
_METHOD_SIZES = (4001, 1000, 37, 502, 9)
# starts -> |C_b| = (1, 2, 3, 4, 4); (0, 1, 1, 1); (0, 0, 1, 1); (0, 1, 1, 4); (0, 0, 4, 4) where groups 0
# and 1 of the last one have two contributors, ranks 2 and 3 sending zeros
_METHOD_STARTS = ((0, 1, 2, 3), (3, 4, 4, 0), (4, 4, 2, 2), (3, 1, 4, 1), (0, 0, 4, 4))


def _method_grad(kind: str, case: int, rank: int, b: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * case + 100 * rank + b)
    if kind == "integer":  # k / 1024 with |k| <= 1000: every sum of four is exact in float32
        return torch.randint(-1000, 1001, (n,), generator=g).float() / 1024
    x = torch.randn(n, generator=g) * torch.exp(3 * torch.randn(n, generator=g))
    x[:: 7] = -0.0  # on every rank: a sum of -0.0s is -0.0, and adding +0.0 would make it +0.0
    return x


def _methods_worker(rank: int, world: int, port: int, q) -> None:
    import torch.distributed as dist
    from datetime import timedelta

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        model = torch.nn.Module()
        model.groups = torch.nn.ModuleList([torch.nn.Linear(n, 1, bias=False) for n in _METHOD_SIZES])
        trainer = SPBTrainer(model, torch.optim.SGD(model.parameters(), lr=0.1), timeout_s=60,
                             sync_initial_state=False, precreate_subgroups=False)
        out = {}
        for case, starts in enumerate(_METHOD_STARTS):
            for kind in ("random", "integer"):
                for method in (RING, REDUCE_BROADCAST):
                    plan = plan_sync(starts, trainer.param_bytes, method=method)
                    trainer._ensure_subgroups(plan)
                    for b, ps in enumerate(trainer.group_params):
                        ps[0].grad = (_method_grad(kind, case, rank, b, _METHOD_SIZES[b]).view_as(ps[0])
                                      if starts[rank] <= b else None)
                    acc = trainer._new_acc()
                    trainer._sync_grads(plan, acc)
                    # numpy arrays travel by value (a tensor would go through shared memory)
                    out[(case, kind, method)] = ([None if ps[0].grad is None else ps[0].grad.reshape(-1).numpy().copy()
                                                  for ps in trainer.group_params], acc["total"])
        q.put((rank, out))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sync_methods_4():
    """Both sync methods on 4 gloo ranks for every case of _METHOD_STARTS: {rank: {(case, kind,
    method): (synced gradient per group, bytes)}}."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_methods_worker, args=(r, 4, port, q)) for r in range(4)]
    for p in procs:
        p.start()
    try:
        res = dict(q.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
    return {r: {k: ([None if g is None else torch.from_numpy(g) for g in grads], total)
                    for k, (grads, total) in out.items()} for r, out in res.items()}


@pytest.mark.slow
def test_sync_methods_bit_identical(sync_methods_4):
    """Ring over all ranks with -0.0 from non-contributors and reduce+broadcast over the
    contributors give bit-identical averaged gradients whenever the sum does not depend on the
    order of the additions: at most two contributors (float addition is commutative), or values
    whose sums are exact (the "integer" cases). Three or more random contributions: gloo's ring and
    reduce add in different orders, so equal up to float32 rounding only."""
    def bits(t):
        return torch.zeros(0, dtype=torch.int32) if t is None else t.view(torch.int32)

    res = sync_methods_4
    for case, starts in enumerate(_METHOD_STARTS):
        contributors = [[r for r in range(4) if starts[r] <= b] for b in range(len(_METHOD_SIZES))]
        for kind in ("random", "integer"):
            ring, ring_bytes = res[0][(case, kind, RING)]
            rb, rb_bytes = res[0][(case, kind, REDUCE_BROADCAST)]
            # bytes: the forced method's N1 / N2 summed over the groups that sync
            m = [4 * n for n in _METHOD_SIZES]
            assert ring_bytes == sum(2 * 3 * m[b] for b, c in enumerate(contributors) if c)
            assert rb_bytes == sum((len(c) - 1 + 3) * m[b] for b, c in enumerate(contributors) if c)
            for r in range(1, 4):  # every rank holds the same bits, per method
                for method in (RING, REDUCE_BROADCAST):
                    assert all(torch.equal(bits(a), bits(b))
                               for a, b in zip(res[r][(case, kind, method)][0], res[0][(case, kind, method)][0]))
            for b, c in enumerate(contributors):
                if not c:  # no contributor: no gradient on any rank, with either method
                    assert ring[b] is None and rb[b] is None
                    continue
                terms = [_method_grad(kind, case, r, b, _METHOD_SIZES[b]) for r in c]
                ref = terms[0]  # not sum(): 0 + (-0.0) is +0.0
                for t in terms[1:]:
                    ref = ref + t
                ref = ref / len(c)
                if len(c) <= 2 or kind == "integer":
                    assert torch.equal(bits(ring[b]), bits(rb[b])), (case, kind, b)
                    assert torch.equal(bits(ring[b]), bits(ref)), (case, kind, b)
                else:
                    assert torch.allclose(ring[b], rb[b], rtol=1e-5, atol=0), (case, kind, b)
                    assert torch.allclose(ring[b], ref, rtol=1e-5, atol=0), (case, kind, b)
            if kind == "random":  # the -0.0 elements of every contribution stay -0.0 through both methods
                for g in ring + rb:
                    assert g is None or (torch.signbit(g[::7]) & (g[::7] == 0)).all()


@pytest.mark.slow
def test_two_rank_jobs_bit_identical_across_sync_methods():
    # W = 2: every group has at most two contributors, so forced ring, forced reduce+broadcast and
    # the simulator's choice train to the same bits (parameters and optimizer state), iteration
    # after iteration of SPB (MLP_DECISIONS: groups with one, two and no contributors)
    kw = dict(batch_size=BS, device=DEVICE, seed=SEED, timeout_s=30, job_timeout_s=120)
    res = {m: run_job_local("tiny_mlp", 2, len(MLP_DECISIONS), MLP_DECISIONS, sync_method=m, **kw)
           for m in ("fastest", RING, REDUCE_BROADCAST)}
    assert len({h for r in res.values() for h in r.state_hashes}) == 1
    algos = {m: {a for rep in r.reports[0] for a in rep.algorithms} for m, r in res.items()}
    assert algos[RING] == {RING, "none"} and algos[REDUCE_BROADCAST] == {REDUCE_BROADCAST, "none"}


def test_digits_sampler_deterministic_disjoint():
    d = DigitsData(seed=1)
    for t in (0, 5, 200):
        idx = [d.indices(t, r, 4, 16) for r in range(4)]
        assert all(len(i) == 16 for i in idx)
        assert len(set(np.concatenate(idx).tolist())) == 64
        assert all((d.indices(t, r, 4, 16) == idx[r]).all() for r in range(4))
    hold = set(d.split()[1].tolist())
    assert not hold & set(np.concatenate([d.indices(t, 0, 4, 16) for t in range(30)]).tolist())


# --------------------------------------------------------------------------------------------
# one process (no torch.distributed)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny_cnn", "tiny_transformer", "tiny_bn_cnn"])
def test_single_worker_spb_skips_bottom_groups(name):
    torch.manual_seed(0)
    model = build_executor_model(name).train()
    table = exact_bytes_table(model, BS)
    trainer = SPBTrainer(model, model.make_optimizer())
    batch = make_batch_fn("digits", model, 0, 1, BS)
    for s in reversed(range(model.num_groups)):
        before = [[p.detach().clone() for p in ps] for ps in trainer.group_params]
        rep = trainer.step(batch(s, 0), s, starts=(s,), record_grads=True)
        assert rep.start_group == s and rep.bytes_sent == 0 and rep.bytes_on_wire_total == 0
        # exact saved-for-backward bytes equal the cost table's activation prediction for start s
        assert rep.peak_activation_bytes == table.activation_peak_bytes(s)
        for b, ps in enumerate(trainer.group_params):
            for p, p0 in zip(ps, before[b]):
                name_ = trainer.param_names[id(p)]
                if b < s:  # SPB is really on: no gradient, no update
                    assert trainer.last_local_grads[name_] is None
                    assert torch.equal(p, p0)
                else:
                    assert trainer.last_local_grads[name_] is not None
        assert not any(torch.equal(p, p0) for p, p0 in zip(trainer.group_params[-1], before[-1]))


def test_trainer_rejects_bad_models():
    with pytest.raises(ValueError, match="groups"):
        SPBTrainer(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    m = build_executor_model("tiny_mlp")
    m.extra = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="outside every layer group"):
        SPBTrainer(m, m.make_optimizer())


# --------------------------------------------------------------------------------------------
# distributed jobs
# --------------------------------------------------------------------------------------------
def _check_job(res, model_name, decisions, world, average_over):
    model = build_executor_model(model_name)
    table = exact_bytes_table(model, BS, with_activations=False)
    ref_model, ref_synced = reference_run(model_name, world, decisions, average_over)
    group_of = _group_of(model)
    # replicas bit-identical: parameters, buffers and optimizer state
    assert res.identical_replicas, res.state_hashes
    for t, dec in enumerate(decisions):
        starts = _starts(dec, world, t, model.num_groups)
        cost = iteration_cost(table, starts, INTRA_NODE)
        reps = [res.reports[r][t] for r in range(world)]
        assert all(rep.starts == starts and rep.start_group == starts[rep.rank] for rep in reps)
        # bytes counted at the collective calls == the simulator's formula, on every rank
        assert sum(rep.bytes_sent for rep in reps) == cost.bytes
        assert all(rep.bytes_on_wire_total == cost.bytes for rep in reps)
        assert all(list(rep.contributors) == cost.contributors.tolist() for rep in reps)
        assert all(rep.algorithms == cost.algorithms for rep in reps)
        for r in range(world):
            local, synced = res.grads[r][t]["local"], res.grads[r][t]["synced"]
            for n, g in local.items():
                # before the sync: groups below this rank's start have no gradient (SPB is on)
                assert (g is None) == (group_of[n] < starts[r]), (t, r, n)
            for n, g in synced.items():
                ref = ref_synced[t][n]
                if ref is None:
                    assert g is None, (t, r, n)
                else:
                    # float32 sums in another order (gloo's reduce vs one process), on weights that
                    # already carry t steps of that noise: CI saw 2.0e-7 on a 1e-2-sized gradient
                    assert torch.allclose(g, ref, rtol=1e-4, atol=1e-6), (t, r, n, (g - ref).abs().max())
            if r > 0:  # bit-identical synced gradients on every rank
                for n, g in synced.items():
                    g0 = res.grads[0][t]["synced"][n]
                    assert (g is None and g0 is None) or torch.equal(g, g0)
    ref_state = ref_model.state_dict()
    for k, v in res.state_dict.items():
        ref = ref_state[k]
        if k.endswith("in_proj_bias"):
            # the key bias has an exactly-zero true gradient (softmax ignores a per-query constant):
            # its float noise differs with summation order, and Adam scales noise up to lr-sized steps
            d = v.numel() // 3
            v, ref = torch.cat([v[:d], v[2 * d:]]), torch.cat([ref[:d], ref[2 * d:]])
        assert torch.allclose(v.float(), ref.float(), rtol=1e-4, atol=1e-6), k


@pytest.mark.slow
def test_bn_job_matches_reference_and_simulator(bn_job):
    _check_job(bn_job, "tiny_bn_cnn", BN_DECISIONS, 3, "contributors")
    # BatchNorm statistics moved and stayed identical (they are in the state hash); buffer bytes apart
    reps = bn_job.reports[0]
    assert all(r.buffer_bytes_on_wire_total > 0 for r in reps)
    assert all(r.bytes_by_collective for r in reps)


@pytest.mark.slow
def test_transformer_job_average_over_all(tf_job):
    _check_job(tf_job, "tiny_transformer", TF_DECISIONS, 4, "all")
    # static level 2 (t = 0): the light ranks keep fewer activations than the full-depth ones
    peaks = [tf_job.reports[r][0].peak_activation_bytes for r in range(4)]
    table = exact_bytes_table(build_executor_model("tiny_transformer").to(DEVICE), BS)  # counted where it ran
    assert peaks == [table.activation_peak_bytes(s) for s in tf_job.reports[0][0].starts]
    assert peaks[2] < peaks[1] < peaks[0] == peaks[3]


def test_reports_are_complete(bn_job):
    for r, reps in enumerate(bn_job.reports):
        assert [x.iteration for x in reps] == list(range(len(BN_DECISIONS)))
        for x in reps:
            assert x.rank == r and x.world_size == 3 and np.isfinite(x.loss)
            assert x.compute_s > 0 and x.sync_s >= 0 and x.step_s >= x.compute_s
            assert x.peak_activation_bytes > 0


@pytest.mark.slow
def test_groups_without_contributors_keep_weights_and_optimizer_state(pause_resume):
    _, a, b, _ = pause_resume
    # a: after iterations 0-1 (full backprop); b: after iteration 2, where starts are (2, 3)
    assert b.reports[0][0].starts == (2, 3) and b.reports[0][0].contributors[:2] == (0, 0)
    sa, sb = a.state_dict, b.state_dict
    for k in sa:
        g = int(k.split(".")[1])
        assert torch.equal(sa[k], sb[k]) == (g < 2), k
    oa, ob = a.optimizer_state["state"], b.optimizer_state["state"]
    model = build_executor_model("tiny_mlp")
    pid_group = [b_ for b_, g in enumerate(model.groups) for _ in g.parameters()]
    for pid, g in enumerate(pid_group):
        assert torch.equal(oa[pid]["momentum_buffer"], ob[pid]["momentum_buffer"]) == (g < 2), pid


def test_pause_and_resume_is_identical(pause_resume):
    full, a, b, c = pause_resume
    assert (a.start_iteration, b.start_iteration, c.start_iteration) == (0, 2, 3)
    assert c.end_iteration == 5
    assert full.identical_replicas and c.identical_replicas
    assert c.state_hashes[0] == full.state_hashes[0]  # weights, buffers and optimizer state
    for k, v in full.state_dict.items():
        assert torch.equal(v, c.state_dict[k])
    resumed = [x.loss for x in a.reports[0] + b.reports[0] + c.reports[0]]
    assert resumed == [x.loss for x in full.reports[0]]


@pytest.mark.slow
def test_buffer_broadcast_mode_and_single_worker_job():
    res = run_job_local("tiny_bn_cnn", 2, 2, Decision(2, "static"), batch_size=BS, device=DEVICE, seed=SEED,
                        buffer_sync="broadcast", timeout_s=30, job_timeout_s=60, evaluate=True)
    assert res.identical_replicas
    assert res.reports[1][0].buffer_bytes_sent == 0 < res.reports[0][0].buffer_bytes_sent
    assert 0.0 <= res.accuracy <= 1.0
    one = run_job_local("tiny_mlp", 1, 2, Decision(3, "rotating"), batch_size=BS, device=DEVICE, timeout_s=30, job_timeout_s=60)
    assert [x.start_group for x in one.reports[0]] == [0, 1]
    assert all(x.bytes_on_wire_total == 0 for x in one.reports[0])


# --------------------------------------------------------------------------------------------
# failures surface as job failures, never as hangs
# --------------------------------------------------------------------------------------------
@pytest.mark.timeout(60)  # a hang fails the test (the job's own bound is 60 s)
@pytest.mark.slow
def test_worker_exception_fails_the_job_with_rank_and_error():
    with pytest.raises(JobFailed, match=r"worker rank 1 failed: RuntimeError: injected failure on rank 1") as ei:
        run_job_local("tiny_mlp", 2, 4, Decision(2, "rotating"), batch_size=BS, device=DEVICE, fail_at=(1, 1),
                      timeout_s=20, job_timeout_s=60)
    assert ei.value.rank == 1


@pytest.mark.timeout(45)  # the 2 s store timeout fails the job, not the 60 s job bound
@pytest.mark.slow
def test_stalled_worker_times_out_instead_of_hanging():
    with pytest.raises(JobFailed, match=r"worker rank 0 failed") as ei:
        run_job_local("tiny_mlp", 2, 4, Decision(0), batch_size=BS, device=DEVICE, fail_at=(1, 1), fail_mode="hang",
                      timeout_s=2, job_timeout_s=60)
    assert ei.value.rank == 0 and "ranks [1] were still running" in str(ei.value)


@pytest.mark.slow
def test_crashed_worker_fails_the_job():
    with pytest.raises(JobFailed, match=r"rank 1 died \(exit code 3\)"):
        run_job_local("tiny_mlp", 2, 3, Decision(0), batch_size=BS, device=DEVICE, fail_at=(1, 0), fail_mode="exit",
                      timeout_s=20, job_timeout_s=60)


def test_job_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown model"):
        run_job_local("nope", 2, 1)
    with pytest.raises(ValueError, match="level"):
        run_job_local("tiny_mlp", 2, 1, Decision(7))
    with pytest.raises(ValueError, match="one start group per worker"):
        run_job_local("tiny_mlp", 2, 1, Decision(0, starts=(0,)))
    with pytest.raises(ValueError, match="global iteration"):
        run_job_local("tiny_mlp", 2, 3, [Decision(0)])


# --------------------------------------------------------------------------------------------
# a job whose process group is part of a larger world
# --------------------------------------------------------------------------------------------
def _sub_job_worker(rank: int, port: int, out: str) -> None:
    """World of 4: job A = ranks 0-2 (tiny_mlp, rotating level 3), job B = rank 3 alone."""
    from datetime import timedelta

    import torch.distributed as dist

    from jigsaw_executor.spb_worker import state_hash

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=4, timeout=timedelta(seconds=30))
    try:
        job_a, job_b = dist.new_group([0, 1, 2]), dist.new_group([3])
        torch.manual_seed(rank)  # different initial weights: the trainer broadcasts job rank 0's
        model = build_executor_model("tiny_mlp").train()
        trainer = SPBTrainer(model, model.make_optimizer(), process_group=job_a if rank < 3 else job_b, timeout_s=30)
        data = DigitsData(seed=SEED)
        reps = [trainer.step(data.batch(t, trainer.rank, trainer.world, BS), t, level=3, pattern="rotating").to_dict()
                for t in range(5)]
        torch.save({"reps": reps, "hash": state_hash(model, trainer.optimizer)}, f"{out}/r{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_job_inside_a_larger_world(tmp_path):
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    from jigsaw_executor.launcher import _mp_context

    ctx = _mp_context()  # the launcher's fork server (torch preloaded)
    procs = [ctx.Process(target=_sub_job_worker, args=(r, store.port, str(tmp_path))) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    for p in procs:
        if p.exitcode is None:
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    res = [torch.load(tmp_path / f"r{r}.pt", weights_only=False) for r in range(4)]
    assert res[0]["hash"] == res[1]["hash"] == res[2]["hash"] != res[3]["hash"]
    table = exact_bytes_table(build_executor_model("tiny_mlp"), BS, with_activations=False)
    for t in range(5):
        reps = [res[r]["reps"][t] for r in range(3)]
        cost = iteration_cost(table, reps[0]["starts"], INTRA_NODE)
        assert sum(x["bytes_sent"] for x in reps) == cost.bytes == reps[0]["bytes_on_wire_total"]
        assert res[3]["reps"][t]["bytes_on_wire_total"] == 0
