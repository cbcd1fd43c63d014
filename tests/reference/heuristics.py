"""Plain from-scratch versions of the heuristics' fast paths, which tests/agents/test_scheduler_speed.py
holds them to: 2D-LAS's order, quiet time and observation per job, the pairs in force, the
pairing search without prepared candidates, and Jigsaw's exclusive pass written over boolean GPU
masks instead of placement tables (``MaskJigsaw``, a frozen copy of the pass at commit 8337649). References: slow, written for clarity, never
used by the package.
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from agents.common import (LASQueues, best_solo, consolidated_gpus, job_decision, placement_sig,
                           profile_summary)
from agents.jigsaw import Jigsaw, nodes_spanned
from jigsaw_env.placement import GpuLedger
from jigsaw_env.spb import Pattern
from jigsaw_env.state import JobDecision, JobState, JobStatus


def plain_order(las: LASQueues, jobs):
    return sorted(jobs, key=lambda j: (bisect.bisect_right(las.thresholds, j.attained_gpu_s - las._base.get(j.job_id, 0.0)),
                                       j.arrival_s, j.job_id))


def plain_quiet(las: LASQueues, state) -> float:
    t, th = float("inf"), las.thresholds
    for j in state.active():
        if j.status is JobStatus.RUNNING:
            s = las.service(j)
            k = bisect.bisect_right(th, s)
            if k < len(th):
                t = min(t, state.time_s + (th[k] - s) / j.num_gpus)
        elif las.starve_factor is not None and j.job_id in las._wait_since:
            t = min(t, las._wait_since[j.job_id] + las.starve_factor * las._last_run[j.job_id])
    return t


def plain_observe(las: LASQueues, state) -> None:
    now = state.time_s
    for j in state.active():
        jid = j.job_id
        if j.status is JobStatus.RUNNING:
            las._run_since.setdefault(jid, now)
            las._wait_since.pop(jid, None)
            continue
        start = las._run_since.pop(jid, None)
        if start is not None:
            las._last_run[jid] = max(now - start, 1e-9)
            las._wait_since[jid] = now
        if las.starve_factor is not None and jid in las._wait_since:
            if now - las._wait_since[jid] >= las.starve_factor * las._last_run[jid]:
                las._base[jid] = j.attained_gpu_s
                las._wait_since[jid] = now
                las.promotions += 1


def plain_pairs(state, host_memory=None):
    owners: dict[int, list[int]] = {}
    for j in state.running():
        for g in j.placement:
            owners.setdefault(g, []).append(j.job_id)
    partners: dict[int, set[int]] = {}
    for jids in owners.values():
        if len(jids) > 1:
            for a in jids:
                partners.setdefault(a, set()).update(x for x in jids if x != a)
    out: dict[int, int] = {}
    for a, ps in partners.items():
        if len(ps) != 1:
            continue
        b = next(iter(ps))
        if len(partners.get(b, ())) != 1 or a in out or b in out:
            continue
        ja, jb = state.jobs[a], state.jobs[b]
        if host_memory and host_memory.get(a) == b and set(ja.placement) <= set(jb.placement):
            out[a] = b
        elif host_memory and host_memory.get(b) == a and set(jb.placement) <= set(ja.placement):
            out[b] = a
        else:
            sa, sb = set(ja.placement), set(jb.placement)
            if sa <= sb and (len(sa) < len(sb) or (ja.first_start_s, a) > (jb.first_start_s, b)):
                out[a] = b
            elif sb <= sa:
                out[b] = a
    return out


def plain_search(state, host, host_gpus, guest, host_cfgs, guest_cfgs, orders, capacity, i_host, i_guest):
    """The search as first written: every candidate's loads built worker by worker."""
    costs = state.costs
    wa, wb = len(host_gpus), guest.num_gpus
    iso_h, iso_g = costs.isolated_iteration_s(host), costs.isolated_iteration_s(guest)
    cols = np.asarray(orders, dtype=np.int64)
    groups: dict[tuple, list[int]] = {}
    for i, o in enumerate(orders):
        groups.setdefault(placement_sig(state, [host_gpus[c] for c in o]), []).append(i)
    cands = []
    for hc in host_cfgs:
        ph = costs.profile(host, hc[0], hc[1], host_gpus)
        th, mh, ch = profile_summary(costs, ph)
        for gc in guest_cfgs:
            for idx in groups.values():
                pg = costs.profile(guest, gc[0], gc[1], tuple(host_gpus[c] for c in orders[idx[0]]))
                tg, mg, cg = profile_summary(costs, pg)
                lb = max((th + tg) / wa, mh, mg) + max(ch, cg)
                ub = (wa * ph.eta * iso_h + wb * pg.eta * iso_g) / lb if lb > 0 else float("inf")
                cands.append((-ub, len(cands), hc, gc, idx, ph, pg))
    cands.sort(key=lambda c: (c[0], c[1]))
    best = None
    for neg_ub, rank, hc, gc, idx, ph, pg in cands:
        if best is not None and -neg_ub < best[3] - 1e-12:
            break
        sub = cols[idx]
        n = len(idx)
        sa = np.arange(n)
        mem = np.broadcast_to(ph.peak_bytes, (n, wa)).copy()
        for w in range(wb):
            mem[sa, sub[:, w]] += pg.peak_bytes[w]
        ok = np.all(mem <= capacity[None, :], axis=1)
        if not ok.any():
            continue
        H = math.lcm(ph.period, pg.period)
        ks = np.arange(H)
        pha = (i_host + ks) % ph.period
        phb = (i_guest + ks) % pg.period
        la = ph.compute_s[pha]
        lb = pg.compute_s[phb]
        loads = np.broadcast_to(la, (n, H, wa)).copy()
        for w in range(wb):
            loads[sa, :, sub[:, w]] += lb[:, w][None, :]
        comm = np.maximum(ph.comm_s[pha], pg.comm_s[phb])
        step = (loads.max(axis=2) + comm[None, :]).mean(axis=1)
        step = np.where(ok, step, np.inf)
        k = int(np.argmin(step))
        if not np.isfinite(step[k]):
            continue
        s = float(step[k])
        xh, xg = ph.eta * iso_h / s, pg.eta * iso_g / s
        value = wa * xh + wb * xg
        if best is None or value > best[3] + 1e-12 or (abs(value - best[3]) <= 1e-12 and rank < best[7]):
            best = (hc, gc, idx[k], value, xh, xg, s, rank)
    return None if best is None else best[:7]


def mask_consolidated(state, ledger, job, free):
    gpus = consolidated_gpus(free, state.cluster.gpus_per_node, job.num_gpus)
    if gpus is None:
        return None
    jd = JobDecision(tuple(gpus), 0)
    return jd if ledger.fits(job.job_id, jd) else None


class MaskJigsaw(Jigsaw):
    """Jigsaw with a frozen copy of the exclusive pass at commit 8337649 (the same code but for the
    docstring and the ``settled`` argument, which it leaves empty: rule 2 then visits every job)."""

    def _exclusive(self, state, chosen, rest, pairs, rank, settled=None) -> tuple[GpuLedger, list[JobState]]:
        """A plain reference for the exclusive pass: free GPUs found from numpy masks of every GPU
        instead of per-node counts."""
        cl = state.cluster
        ledger = GpuLedger(state)
        # GPUs held by chosen running jobs not yet placed (a list of bools, turned into an array
        # only when a job needs placing)
        reserved = [False] * cl.num_gpus
        for j in chosen:
            if j.status is JobStatus.RUNNING and j.placement:
                for g in j.placement:
                    reserved[g] = True
        deferred: list[JobState] = []
        for j in chosen:
            own = j.status is JobStatus.RUNNING and bool(j.placement)
            if own:
                for g in j.placement:  # its own reservation no longer blocks anyone
                    reserved[g] = False
                wl = ledger._wl
                still_free = not any(wl[g] for g in j.placement)
                # a running job's own configuration on GPUs nobody else holds yet always fits: the
                # simulator validated it in force with at least these workers on them (so the
                # ledger's check is skipped here and below; it would return True)
                cur = job_decision(j.placement, j.level, j.pattern) if still_free else None
                if cur is not None and self._spread_ok(state, j, cur.gpus):
                    ledger.add(j.job_id, cur, checked=True)
                    continue
            free = (ledger.workers == 0) & ~np.array(reserved, dtype=bool)
            jd = mask_consolidated(state, ledger, j, free)
            if self.displace and (jd is None or not self._spread_ok(state, j, jd.gpus)):
                # displace lower-priority running jobs if that gives a good placement
                alt = mask_consolidated(state, ledger, j, ledger.workers == 0)
                if alt is not None and self._spread_ok(state, j, alt.gpus):
                    jd = alt
            if own and cur is not None:
                # a running job on too many nodes: move only if it pays for the restart
                if jd is not None and nodes_spanned(state, jd.gpus) < nodes_spanned(state, cur.gpus):
                    _, x_old = best_solo(state, j, cur.gpus, None, 0.0)
                    _, x_new = best_solo(state, j, jd.gpus, None, 0.0)
                    if (x_new - x_old) * self.horizon_s <= x_new * self.restart_s:
                        jd = None
                else:
                    jd = None
                if jd is None:  # cur: its GPUs are still free (nothing was added since), so it fits
                    ledger.add(j.job_id, cur, checked=True)
                    continue
            if jd is None or not self._spread_ok(state, j, jd.gpus):
                deferred.append(j)
                continue
            ledger.add(j.job_id, jd, checked=True)
        # backfill free GPUs with lower-priority jobs that fit them well
        left = []
        nfree = int((ledger.workers == 0).sum())
        # a job that cannot take consolidated free GPUs: with the ledger unchanged, neither can
        # another job of the same model, batch size and width (the outcome depends on nothing else)
        no_fit: set[tuple] = set()
        # consolidated free GPUs per width, on the ledger as it is (they depend on nothing else)
        cons: dict[int, list[int] | None] = {}
        for j in rest:
            if j.num_gpus <= nfree:
                jd = None
                wl = ledger._wl
                stays = j.status is JobStatus.RUNNING and j.placement and not any(wl[g] for g in j.placement)
                if stays:  # stays where it is: no restart (its own configuration on free GPUs fits)
                    jd = job_decision(j.placement, j.level, j.pattern)
                kind = (j.model, j.batch_size, j.num_gpus)
                if jd is None and kind not in no_fit:
                    n = j.num_gpus
                    gpus = cons[n] if n in cons else cons.setdefault(
                        n, consolidated_gpus(ledger.workers == 0, cl.gpus_per_node, n))
                    if gpus is not None:
                        jd = job_decision(tuple(gpus), 0, Pattern.ROTATING)
                        if not ledger.fits(j.job_id, jd):
                            jd = None
                    if jd is None or not self._spread_ok(state, j, jd.gpus):
                        no_fit.add(kind)
                if jd is not None and self._spread_ok(state, j, jd.gpus):
                    ledger.add(j.job_id, jd, checked=True)
                    nfree -= j.num_gpus
                    no_fit.clear()
                    cons.clear()
                    continue
            left.append(j)
        if deferred:  # both lists are in priority order already
            left = deferred + left
            left.sort(key=lambda j: rank[j.job_id])
        return ledger, left

    @staticmethod
    def _consolidated(state, ledger: GpuLedger, job: JobState, free: np.ndarray) -> JobDecision | None:
        gpus = consolidated_gpus(free, state.cluster.gpus_per_node, job.num_gpus)
        if gpus is None:
            return None
        jd = JobDecision(tuple(gpus), 0)
        return jd if ledger.fits(job.job_id, jd) else None
