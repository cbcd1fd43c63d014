"""Property tests: any mix of good and malformed rows is either loaded with every row accounted
for (``skip_bad_rows``) or rejected at its first bad line; any canonical table round-trips
exactly through the canonical CSV."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces import TraceFormatError, load_trace, to_canonical_csv, validate_jobs

GOOD_TS = ["2017-10-09 07:01:55", "2017-10-01 00:00:00", "2017-12-22 08:02:11"]
BAD_TS = ["2017-13-01 00:00:00", "yesterday", ""]
GOOD_NUM = ["1", "66.0", "3600", "2"]
BAD_NUM = ["abc", "-5", "", "1.5e", "inf"]



@st.composite
def philly_line(draw):
    kind = draw(st.sampled_from(["good", "good", "good", "ts", "dur", "gpus", "short", "long", "quote"]))
    ts = draw(st.sampled_from(BAD_TS if kind == "ts" else GOOD_TS))
    dur = draw(st.sampled_from(BAD_NUM if kind == "dur" else GOOD_NUM))
    gpus = draw(st.sampled_from(["x", "0.5", "-1"] if kind == "gpus" else ["0", "1", "2", "8"]))
    fields = [ts, dur, gpus, "10.0", draw(st.sampled_from(["vcA", "vcB", '"v,c"']))]
    if kind == "short":
        fields = fields[:3]
    elif kind == "long":
        fields = fields + ["extra"]
    elif kind == "quote":
        fields[4] = '"vc'
    return ",".join(fields)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(philly_line(), min_size=1, max_size=25), blanks=st.lists(st.integers(0, 25), max_size=3))
def test_every_row_is_accounted_for(tmp_path_factory, lines, blanks):
    body = list(lines)
    for b in sorted(blanks, reverse=True):
        body.insert(min(b, len(body)), "")
    p = tmp_path_factory.mktemp("fuzz") / "philly.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "\n".join(body) + "\n")
    tr = load_trace(f"philly:{p}", skip_bad_rows=True, map_models=False)
    s = tr.summary
    assert s["rows_read"] == len(lines)
    assert s["rows_read"] == s["jobs_read"] + sum(s["bad_rows_skipped"].values())
    assert s["jobs_read"] == s["kept"] + sum(s["filtered"].values()) == len(tr.jobs) + sum(s["filtered"].values())
    if len(tr.jobs):
        assert tr.jobs["arrival_s"].iloc[0] == 0.0 and tr.jobs["arrival_s"].is_monotonic_increasing
    if s["bad_rows_skipped"]:
        first = int(re.match(r"line (\d+):", s["bad_row_examples"][0]).group(1))
        try:
            load_trace(f"philly:{p}", map_models=False)
        except TraceFormatError as e:
            assert e.line == first and e.path == str(p)
        else:  # pragma: no cover
            raise AssertionError("a file with bad rows loaded without --skip-bad-rows")
    else:
        assert load_trace(f"philly:{p}", map_models=False).digest() == tr.digest()


finite = st.floats(min_value=1e-6, max_value=1e9, allow_nan=False, allow_infinity=False)
text = st.text(alphabet=st.one_of(st.characters(blacklist_categories=("Cs", "Cc")),
                                  st.sampled_from([",", '"', " ", "\u2028", "\x85", "\t", "'"])), max_size=12)


@st.composite
def job_table(draw):
    n = draw(st.integers(1, 12))
    dur = draw(st.lists(st.one_of(st.none(), finite), min_size=n, max_size=n))
    its = [draw(st.one_of(st.none(), st.integers(1, 10**9).map(float))) if d is not None
           else draw(st.integers(1, 10**9).map(float)) for d in dur]
    return pd.DataFrame({
        "job_id": draw(st.lists(st.integers(-10**6, 10**6), min_size=n, max_size=n, unique=True)),
        "arrival_s": [0.0] + draw(st.lists(st.floats(0, 1e8, allow_nan=False), min_size=n - 1, max_size=n - 1)),
        "num_gpus": draw(st.lists(st.integers(1, 256), min_size=n, max_size=n)),
        "duration_s": [np.nan if d is None else d for d in dur],
        "iterations": [np.nan if i is None else i for i in its],
        "model": draw(st.lists(st.sampled_from(["", "resnet50", "bert_base"]), min_size=n, max_size=n)),
        "batch_size": pd.array(draw(st.lists(st.one_of(st.none(), st.integers(1, 4096)), min_size=n, max_size=n)),
                               dtype="Int64"),
        "status": draw(st.lists(st.sampled_from(["", "completed", "failed", "killed"]), min_size=n, max_size=n)),
        "vc": draw(st.lists(text, min_size=n, max_size=n)),
        "gpu_type": draw(st.lists(st.sampled_from(["", "v100", "k80"]), min_size=n, max_size=n)),
        "src_free_text": draw(st.lists(text, min_size=n, max_size=n)),
    })


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(df=job_table())
def test_canonical_csv_round_trips_any_table(tmp_path_factory, df):
    v = validate_jobs(df, "gen")
    p = to_canonical_csv(v, tmp_path_factory.mktemp("rt") / "jobs.csv")
    back = load_trace(f"csv:{p}", map_models=False).jobs
    # the loader strips surrounding spaces of canonical text fields, fills gpu_type, re-bases arrivals
    exp = v.copy()
    for c in ("model", "status", "vc", "gpu_type"):
        exp[c] = exp[c].str.strip()
    exp.loc[exp["gpu_type"] == "", "gpu_type"] = "v100"
    pd.testing.assert_frame_equal(back, exp)
