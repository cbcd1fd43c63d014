"""The observation's ``proposal`` block: a heuristic's decision for the round, shown per job slot.

A policy that sees what a heuristic (by default Jigsaw, ``agents.jigsaw``) would run this round
can copy it where it is right and learn where to differ; without it, a clone has to rebuild the
heuristic's pairing and SPB choices from the job features alone. The *proposer* is any callable
``state -> Decision`` (a :class:`~agents.base.Scheduler`), asked once per round on the round's
state; the env (``JigsawClusterEnv(proposer=...)``) and the learned scheduler pass its decision to
:meth:`ObservationEncoder.encode <jigsaw_env.encoder.ObservationEncoder.encode>`, which appends
this block after the cluster features when the encoder has the ``proposal`` feature group.

The block holds ``PROPOSAL_FEATURES + H`` values for each of the K window slots and then each of
the H host slots, in the order the observation shows those jobs (zeros for an empty slot):

 0 the proposal runs the job this round
 1 its SPB level there / L
 2 its pattern there is static
 3 it shares a GPU there: one of its GPUs holds another job's worker in the proposal
 4 the proposal keeps it as it runs now (running, on the same GPUs, level and pattern)
 5 log2(1 + nodes its GPUs span there) / log2(1 + nodes of the cluster)
 6 the decision being built agrees with the proposal on the job: it holds the job exactly as
   proposed, or does not hold it when the proposal does not run it (set at every step)
 7 + r  host slot r holds a job that the proposal puts on one of this job's GPUs (set at every
   step, since the host slots follow the decision being built)

Features 0-5 depend on the round's state and proposal only and are made once per round.
"""
from __future__ import annotations

import math

import numpy as np

from .spb import Pattern
from .state import ClusterState, Decision, JobStatus

#: values per slot before the host slots' partner columns
PROPOSAL_FEATURES = 7


def proposal_slot_features(host_slots: int) -> int:
    """Values per job slot in the proposal block: the fixed features and one column per host slot."""
    return PROPOSAL_FEATURES + host_slots


class ProposalBlock:
    """Writes the proposal block (module docstring) for one encoder; ``host_slots`` is the
    encoder's H."""

    def __init__(self, host_slots: int):
        self.host_slots = host_slots
        #: values per job slot
        self.per_slot = proposal_slot_features(host_slots)
        self._proposal: Decision | None = None
        self._state: ClusterState | None = None
        self._round: tuple | None = None
        self._fixed: dict[int, tuple] = {}        # job id -> features 0-5 of the round
        self._partners: dict[int, tuple] = {}     # job id -> jobs on its GPUs in the proposal

    def size(self, window_k: int) -> int:
        """Values in the block for ``window_k`` window slots and this block's host slots."""
        return (window_k + self.host_slots) * self.per_slot

    def _set_round(self, state: ClusterState, proposal: Decision) -> None:
        """Features 0-5 of every job the proposal runs, and who shares its GPUs there."""
        key = (state.round, state.time_s)
        if self._proposal is proposal and self._state is state and self._round == key:
            return
        self._proposal, self._state, self._round = proposal, state, key
        on_gpu: dict[int, list[int]] = {}
        for jid, jd in proposal.items():
            for g in jd.gpus:
                on_gpu.setdefault(g, []).append(jid)
        per_node = state.cluster.gpus_per_node
        node_scale = math.log2(1 + state.cluster.num_nodes)
        max_level = max(1, state.spb.max_level)
        jobs = state.jobs
        fixed = self._fixed = {}
        partners = self._partners = {}
        for jid, jd in proposal.items():
            others = {x for g in jd.gpus for x in on_gpu[g] if x != jid}
            partners[jid] = tuple(sorted(others))
            job = jobs[jid]
            keeps = (job.status is JobStatus.RUNNING and tuple(job.placement) == jd.gpus
                     and job.level == jd.level and job.pattern is jd.pattern)
            nodes = len({g // per_node for g in jd.gpus})
            fixed[jid] = (1.0, jd.level / max_level, 1.0 if jd.pattern is Pattern.STATIC else 0.0,
                          1.0 if others else 0.0, 1.0 if keeps else 0.0, math.log2(1 + nodes) / node_scale)

    def write(self, out: np.ndarray, state: ClusterState, proposal: Decision, slots, decision: Decision,
              hosts) -> None:
        """Write the block into ``out`` (zeros on entry, ``size`` values) for the jobs of ``slots``
        (the window's, then the host slots', None for an empty slot), with ``decision`` the
        decision being built and ``hosts`` the host slots' jobs in slot order (at most H)."""
        self._set_round(state, proposal)
        host_slot = {hid: r for r, hid in enumerate(hosts)}
        o = 0
        p = self.per_slot
        for jid in slots:
            if jid is not None:
                jd = proposal.get(jid)
                held = decision.get(jid)
                if jd is None:
                    out[o + 6] = 1.0 if held is None else 0.0
                else:
                    out[o:o + 6] = self._fixed[jid]
                    out[o + 6] = 1.0 if held == jd else 0.0
                    for x in self._partners[jid]:
                        r = host_slot.get(x)
                        if r is not None:
                            out[o + PROPOSAL_FEATURES + r] = 1.0
            o += p
