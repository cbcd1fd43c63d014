"""Benchmark (not a test): how long loading the whole Philly CSV takes.

    python -m traces.benchmark [PATH] [--repeat N]

Target: under 3 s on a 2-core machine (docs/traces.md). Prints one JSON line per variant:
parse + validate only (``map_models=False``), and with the model mapping and iterations
(a constant stand-in throughput, so the number does not depend on the cost tables).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from . import data_dir, load_trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traces.benchmark")
    ap.add_argument("path", nargs="?", default=None)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    path = a.path or str(data_dir() / "philly" / "philly.csv")
    variants = {
        "parse+validate": dict(map_models=False),
        "with model mapping": dict(throughput_fn=lambda m, b, g, t: 10.0 * g, batch_size_fn=lambda m: 32),
    }
    for name, kw in variants.items():
        times = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            tr = load_trace(f"philly:{path}", **kw)
            times.append(time.perf_counter() - t)
        print(json.dumps({"benchmark": "load philly.csv", "variant": name, "jobs": len(tr),
                          "min_s": round(min(times), 3), "median_s": round(statistics.median(times), 3),
                          "target_s": 3.0}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
