"""Peak memory of preparing observations for behaviour cloning: chunked against whole-array float64.

    python -m bench.bc_memory --rows 300000 --features 658 --way chunked
    python -m bench.bc_memory --rows 300000 --features 658 --way whole

Each run is one process (its peak resident set, ``ru_maxrss``, only grows); it prints the peak
above what it held once the observations were made (random float32, the size of the env's
default observation). ``chunked`` is what ``agents.imitation.behaviour_clone`` does
(``observation_statistics`` then ``normalized_observations``); ``whole`` is the same arithmetic on
one float64 copy of all the observations.
"""
from __future__ import annotations

import argparse
import json
import resource

import numpy as np


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--features", type=int, default=658)
    p.add_argument("--way", choices=("chunked", "whole"), required=True)
    a = p.parse_args(argv)
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    from agents.imitation import normalized_observations, observation_statistics

    obs = np.random.default_rng(0).random((a.rows, a.features), dtype=np.float32)
    base = peak_mib()
    if a.way == "whole":
        whole = obs.astype(np.float64)
        rms = RunningMeanStd(shape=(a.features,))
        rms.update(whole)
        out = np.clip((whole - rms.mean) / np.sqrt(rms.var + 1e-8), -10.0, 10.0).astype(np.float32)
    else:
        rms = observation_statistics(obs, RunningMeanStd(shape=(a.features,)))
        out = normalized_observations(obs, rms.mean, rms.var, 1e-8, 10.0)
    print(json.dumps({"way": a.way, "rows": a.rows, "features": a.features, "observations_mib": obs.nbytes / 2**20,
                      "result_mib": out.nbytes / 2**20, "peak_above_observations_mib": peak_mib() - base}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
