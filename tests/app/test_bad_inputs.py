"""Every row of docs/bad_inputs.md is a test: the command, run through ``jigsaw_env.cli.main``,
exits with status 2 and prints exactly the row's one line on stderr, with no traceback.

The table is read from the doc, so rows and tests cannot drift apart. Placeholders in a row:
``{tmp}`` the test's temporary folder, ``{fix}`` tests/fixtures/traces, ``{cores}`` this
machine's physical cores, ``{models}`` the models that have cost tables (shipped and registered); ``…`` in a message stands for text that a third-party library writes
(onnxruntime, pickle, stable-baselines3) and that changes with its version. Every file a row names
under ``{tmp}`` is made by the builder of that name below (names starting with ``missing`` are never
made, ``out`` names outputs); a test checks that the rows and the builders match one to one. Rows under the "Known gaps"
heading are strict xfails: the message is the one line the command should print, so a command that
prints it turns the test into a failure that asks for the row to move up to its section.
"""
from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from jigsaw_env.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bad_inputs.md"
FIX = ROOT / "tests" / "fixtures" / "traces"
GAPS_HEADING = "Known gaps"


# ----------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class Row:
    id: str
    input: str
    command: str
    message: str
    gap: bool
    section: str


def _cell(text: str) -> str:
    """A table cell's text: code-span delimiters removed (`x` or `` x ``), \\| unescaped."""
    t = text.strip()
    if t.startswith("``") and t.endswith("``"):
        t = t[2:-2].strip()
    elif t.startswith("`") and t.endswith("`"):
        t = t[1:-1]
    return t.replace("\\|", "|")


def parse_table(text: str) -> list[Row]:
    """The rows of every table whose header is ``| id | input | command | error message ... |``."""
    rows, section, in_table = [], "", False
    for line in text.splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
        if not line.startswith("|"):
            in_table = False
            continue
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        first = cells[0].strip() if cells else ""
        if first == "id":
            in_table = len(cells) == 4 and cells[2].strip() == "command"
            continue
        if not in_table or set(first) <= set("-: "):
            continue
        if len(cells) != 4:
            raise AssertionError(f"docs/bad_inputs.md: a table row needs 4 cells, got {len(cells)}: {line}")
        rows.append(Row(_cell(cells[0]), cells[1].strip(), _cell(cells[2]), _cell(cells[3]),
                        section.startswith(GAPS_HEADING), section))
    return rows


ROWS = parse_table(DOC.read_text())


def _physical_cores() -> int:
    from jigsaw_executor.cluster_ray import physical_cores
    return physical_cores()


def substitute(text: str, tmp: Path) -> str:
    out = text.replace("{tmp}", str(tmp)).replace("{fix}", str(FIX))
    if "{cores}" in out:
        out = out.replace("{cores}", str(_physical_cores()))
    if "{models}" in out:  # shipped and registered (e.g. test) cost-table models
        from jigsaw_env.cost_table import available_models
        out = out.replace("{models}", str(list(available_models())))
    return out


def matches(expected: str, got: str) -> bool:
    """Exact, except that "…" in ``expected`` stands for any text."""
    pattern = ".*".join(re.escape(p) for p in expected.split("…"))
    return re.fullmatch(pattern, got) is not None


_FILE = re.compile(r"\{tmp\}/([A-Za-z0-9_.\-]+)")


def files_of(row: Row) -> list[str]:
    """The names under {tmp} a row's command uses (to be built): missing* (must not exist) and
    out* (outputs) excluded."""
    return sorted({m for m in _FILE.findall(row.command) if not m.startswith(("missing", "out"))})


# ----------------------------------------------------------------------------------------------- builders
BUILDERS: dict[str, Callable[[Path, "Assets"], None]] = {}


def builder(*names: str):
    def deco(fn):
        for n in names:
            BUILDERS[n] = fn
        return fn
    return deco


def edited(fixture: str, old: str, new: str, count: int = 1) -> Callable[[Path, "Assets"], None]:
    """A builder: the fixture file with ``old`` replaced by ``new`` (which must occur)."""
    def build(dest: Path, _assets) -> None:
        text = (FIX / fixture).read_text()
        assert old in text, (fixture, old)
        dest.write_text(text.replace(old, new, count))
    return build


def text_file(content: str) -> Callable[[Path, "Assets"], None]:
    def build(dest: Path, _assets) -> None:
        dest.write_text(content)
    return build


def folder(files: dict[str, str]) -> Callable[[Path, "Assets"], None]:
    def build(dest: Path, _assets) -> None:
        dest.mkdir()
        for name, content in files.items():
            (dest / name).write_text(content)
    return build


def ali20(job_old: str = "", job_new: str = "", task_old: str = "", task_new: str = "", task: bool = True):
    def build(dest: Path, _assets) -> None:
        dest.mkdir()
        job = (FIX / "alibaba2020" / "pai_job_table.csv").read_text()
        tasks = (FIX / "alibaba2020" / "pai_task_table.csv").read_text()
        assert job_old in job and task_old in tasks
        (dest / "pai_job_table.csv").write_text(job.replace(job_old, job_new, 1) if job_old else job)
        if task:
            (dest / "pai_task_table.csv").write_text(tasks.replace(task_old, task_new, 1) if task_old else tasks)
    return build


PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
HELIOS_HEADER = ("job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,"
                 "duration,queue\n")
ALI23_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                "scheduled_time\n")
CANON_HEADER = "job_id,arrival_s,num_gpus,duration_s,iterations,model,batch_size\n"
LIVE_HEADER = "job_id,model,num_gpus,iterations\n"

BUILDERS.update({
    # plain files and folders
    "a_file": text_file("not a folder\n"),
    "tables_bad_json": folder({"x.json": "{not json\n"}),
    "tables_incomplete": folder({"x.json": json.dumps({"model": "x"})}),
    "tables_bad_lockstep": folder({"lockstep.json": json.dumps({"lockstep_s": -1})}),
    "run_exists": folder({"config.json": "{}\n"}),
    "bad_option.toml": text_file("[train]\nmax_job = 5\n"),
    "not_a_run": folder({}),
    # philly (CSV)
    "philly_bad_duration.csv": edited("philly_small.csv", "66.0,1,66.0", "abc,1,66.0"),
    "philly_extra_field.csv": edited("philly_small.csv", "2951.0,1,2951.0,6214e9", "2951.0,1,2951.0,6214e9,x"),
    "philly_no_timestamp.csv": edited("philly_small.csv", "timestamp,", "time,"),
    "philly_bad_time.csv": edited("philly_small.csv", "2017-10-09 07:01:55", "2017-13-45 07:01:55"),
    "philly_fraction_gpus.csv": edited("philly_small.csv", "2759.0,2,", "2759.0,2.5,"),
    "philly_empty.csv": text_file(""),
    "philly_header_only.csv": text_file(PHILLY_HEADER),
    # philly-json
    "pj_truncated.json": lambda d, a: d.write_text((FIX / "philly_cluster_job_log.json").read_text()[:300]),
    "pj_bad_status.json": edited("philly_cluster_job_log.json", '"status": "Killed"', '"status": "Exploded"'),
    "pj_end_before_start.json": edited("philly_cluster_job_log.json", '"end_time": "2017-10-07 00:40:00"',
                                       '"end_time": "2017-10-07 00:00:00"'),
    "pj_not_records.json": text_file("[1, 2]\n"),
    "pj_empty.json": text_file("[]\n"),
    # alibaba2020 (a folder with the job and the task table)
    "ali20_bad_status": ali20("u2,Failed,", "u2,Exploded,"),
    "ali20_task_end_before_start": ali20(task_old="j2_half_gpu,tensorflow,1.0,Failed,60.0,300.0",
                                         task_new="j2_half_gpu,tensorflow,1.0,Failed,360.0,300.0"),
    "ali20_wrong_columns": ali20("u2,Failed,50.0,300.0", "u2,Failed,50.0"),
    "ali20_no_task_table": ali20(task=False),
    "ali20_empty": folder({"pai_job_table.csv": "", "pai_task_table.csv": ""}),
    # alibaba2023
    "ali23_bad_gpus.csv": edited("alibaba2023_pods.csv", "32768,1,1000", "32768,one,1000"),
    "ali23_bad_phase.csv": edited("alibaba2023_pods.csv", "BE,Running", "BE,Evicted"),
    "ali23_end_before_start.csv": edited("alibaba2023_pods.csv", "1400,1700,1400", "1400,1300,1400"),
    "ali23_header_only.csv": text_file(ALI23_HEADER),
    # helios
    "helios_bad_duration.csv": edited("helios_cluster_log.csv", ",249,0", ",249s,0"),
    "helios_bad_state.csv": edited("helios_cluster_log.csv", "TIMEOUT", "EXPLODED"),
    "helios_no_duration_column.csv": edited("helios_cluster_log.csv", ",duration,", ",runtime,"),
    "helios_header_only.csv": text_file(HELIOS_HEADER),
    # gavel
    "gavel_extra_field.trace": edited("gavel_7col.trace", "\t2721260.000000\t1\n", "\t2721260.000000\t1\textra\n"),
    "gavel_bad_steps.trace": edited("gavel_7col.trace", "\t112521\t", "\tmany\t"),
    "gavel_zero_scale.trace": edited("gavel_10col.trace", "\t205707\t1\t", "\t205707\t0\t"),
    "gavel_empty.trace": text_file(""),
    "gavel_far_batch.trace": edited("gavel_7col.trace", "ResNet-18 (batch size 32)\t", "ResNet-18 (batch size 2048)\t"),
    # canonical csv
    "jobs_unknown_column.csv": edited("canonical_jobs.csv", "src_note", "note"),
    "jobs_duplicate_id.csv": edited("canonical_jobs.csv", "7,5.0,4", "10,5.0,4"),
    "jobs_no_work.csv": edited("canonical_jobs.csv", "5.0,4,3600.5,,", "5.0,4,,,"),
    "jobs_bad_status.csv": edited("canonical_jobs.csv", ",completed,", ",done,"),
    "jobs_negative_arrival.csv": edited("canonical_jobs.csv", "10,5.0,1", "10,-5.0,1"),
    "jobs_empty.csv": text_file(""),
    "jobs_header_only.csv": text_file(CANON_HEADER),
    "jobs_zero_duration.csv": text_file(CANON_HEADER + "1,0,2,0,,resnet18,\n"),
    "jobs_unknown_model.csv": text_file(CANON_HEADER + "1,0,1,100,,gpt5,8\n"),
    "jobs_vgg16.csv": text_file(CANON_HEADER + "1,0,1,100,,vgg16,\n2,10,2,100,,tiny_mlp,\n"),
    "jobs_bad_batch.csv": text_file(CANON_HEADER + "1,0,1,100,,resnet18,1\n"),
    # live job lists (jigsaw deploy --jobs)
    "live_too_big.csv": text_file(LIVE_HEADER + "0,tiny_mlp,4,100\n"),
    "live_no_iterations.csv": text_file("job_id,model,num_gpus\n0,tiny_mlp,1\n"),
    "live_unknown_model.csv": text_file(LIVE_HEADER + "0,gpt5,1,100\n"),
    "live_header_only.csv": text_file(LIVE_HEADER),
    "live_negative.csv": text_file(LIVE_HEADER + "0,tiny_mlp,1,-5\n"),
    "live_duplicate.csv": text_file(LIVE_HEADER + "0,tiny_mlp,1,100\n0,tiny_cnn,1,100\n"),
    "live_bad_gpus.csv": text_file(LIVE_HEADER + "0,tiny_mlp,1,100\n1,tiny_cnn,two,100\n"),
    "live_bad.json": text_file('[{"job_id": 0'),
    "live_fraction_gpus.csv": text_file(LIVE_HEADER + "0,tiny_mlp,1.5,20\n"),
    "live_fraction_id.csv": text_file(LIVE_HEADER + "0,tiny_mlp,1,20\n1.9,tiny_mlp,1,20\n"),
    "live_blank_lines.csv": text_file(LIVE_HEADER + "\n0,tiny_mlp,1,20\n\n1,tiny_mlp,x,20\n"),
    # deploy --resume folders
    "resume_truncated": folder({"scheduler_state.json": '{"format": "jigsaw-live'}),
    "resume_not_object": folder({"scheduler_state.json": "[1, 2]"}),
    "resume_pickled": folder({"scheduler_state.json": json.dumps(
        {"format": "jigsaw-live-state/1", "scheduler_pickle": "gASVAAAAAAAAAAA="})}),
    # canonical csv, read exactly
    "jobs_huge_id.csv": text_file("job_id,arrival_s,num_gpus,duration_s\n99999999999999999999,0,1,100\n"),
    "jobs_duplicate_column.csv": text_file("job_id,arrival_s,num_gpus,duration_s,arrival_s\n1,0,1,100,5\n"),
    "jobs_bad.csv.gz": text_file("not gzip"),
})


def _table_edit(edit: Callable[[dict], None] | None = None, raw: str | None = None):
    """A builder: a folder holding x.json, an edit of the shipped tiny_mlp V100 table (or ``raw``)."""
    def build(dest: Path, _assets) -> None:
        dest.mkdir()
        if raw is not None:
            (dest / "x.json").write_text(raw)
            return
        from jigsaw_env.cost_table import TABLES_DIR
        d = json.loads((TABLES_DIR / "tiny_mlp-bs32-v100.json").read_text())
        edit(d)
        (dest / "x.json").write_text(json.dumps(d))
    return build


def _zero_times(d: dict) -> None:
    d["optimizer_s"] = 0.0
    for g in d["groups"]:
        g["forward_s"] = g["backward_weight_s"] = g["backward_input_s"] = 0.0


BUILDERS.update({
    "tables_not_object": _table_edit(raw="5"),
    "tables_bad_time": _table_edit(lambda d: d["groups"][0].update(forward_s="abc")),
    "tables_negative_optimizer": _table_edit(lambda d: d.update(optimizer_s=-1)),
    "tables_negative_memory": _table_edit(lambda d: d.update(fixed_memory_bytes=-1000000000000)),
    "tables_zero_times": _table_edit(_zero_times),
    "tables_groups_not_list": _table_edit(lambda d: d.update(groups=5)),
    "tables_meta_list": _table_edit(lambda d: d.update(meta=[1, 2])),
    "tables_eta_above_one": _table_edit(lambda d: d["meta"]["eta"].update({"1/static": 1.2})),
    "tables_device_path": _table_edit(lambda d: d.update(device="../v100")),
})


# ----------------------------------------------------------------------------------------------- model and policy files
ENV_KW = dict(gpus=4, gpus_per_node=4, trace="synthetic:models=tiny_mlp+tiny_cnn", max_jobs=4, window_k=4)


class Assets:
    """Trained-model files, made once per module and copied into each test's folder: randomly
    initialised PPO policies saved as RUN_DIRs (no training), a real `jigsaw train` config and
    VecNormalize statistics, and ONNX policies written with onnx.helper."""

    def __init__(self, base: Path):
        self.base = base
        self._made: set[str] = set()

    def get(self, name: str) -> Path:
        p = self.base / name
        if name not in self._made:
            getattr(self, "_" + name)(p)
            self._made.add(name)
        return p

    # -- RUN_DIRs
    def _ppo_run(self, p: Path, spb_levels: int = 3) -> None:
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import DummyVecEnv

        from agents.rl import RUN_FORMAT, spaces_signature
        from agents.rl_env import make_env_fn

        env_kw = dict(ENV_KW, spb_levels=spb_levels)
        venv = DummyVecEnv([make_env_fn(env_kw, split="train", rank=0, seed=0, monitor=False)])
        model = PPO("MlpPolicy", venv, seed=0, device="cpu", n_steps=8, batch_size=8,
                    policy_kwargs=dict(net_arch=[8]))
        p.mkdir()
        model.save(str(p / "model.zip"))
        venv.close()
        (p / "config.json").write_text(json.dumps({"format": RUN_FORMAT, "algo": "ppo", "env": env_kw,
                                                   "spaces": spaces_signature(4, spb_levels, 4),
                                                   "normalize_obs": False, "seed": 0}))

    def _run_ppo(self, p: Path) -> None:
        self._ppo_run(p, 3)

    def _run_ppo_l2(self, p: Path) -> None:
        self._ppo_run(p, 2)

    def _train_run(self, p: Path) -> None:
        """A RUN_DIR as `jigsaw train` leaves it (its own config.json and VecNormalize statistics)."""
        from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

        import train_agent
        from agents.rl_env import make_env_fn

        args = train_agent.build_parser().parse_args(
            ["--gpus", "4", "--gpus-per-node", "4", "--trace", "synthetic:models=tiny_mlp+tiny_cnn", "--max-jobs", "4",
             "--window-k", "4", "--algo", "ppo", "--vec", "dummy", "--n-envs", "1", "--run-dir", str(p)])
        cfg = train_agent.config_from_args(args)
        cfg["trained_timesteps"] = 64
        p.mkdir()
        (p / "config.json").write_text(json.dumps(cfg, default=str))
        from agents.vecnorm_file import write_vecnormalize

        venv = VecNormalize(DummyVecEnv([make_env_fn(cfg["env"], split="train", rank=0, seed=0, monitor=False)]))
        with open(p / "vecnormalize.npz", "wb") as f:
            write_vecnormalize(venv, f)
        venv.close()
        shutil.copy(self.get("run_ppo") / "model.zip", p / "model.zip")

    # -- ONNX policies
    def _onnx(self, p: Path, *, spb_levels: int = 3, job_features: int | None = None, meta_obs: int | None = None,
              jigsaw: bool = True) -> None:
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        from agents.rl import spaces_signature

        sig = spaces_signature(4, spb_levels, 4)
        blocks = 4 + sig["host_slots"]  # this encoder's: window and host slots
        if job_features is None:
            job_features = sig["job_features"]
        else:  # an older encoder's: window slots only
            blocks = 4
        sig["job_features"] = job_features
        sig["observation_size"] = d = blocks * job_features + sig["cluster_features"]
        a = sig["n_actions"]
        nodes = [helper.make_node("MatMul", ["obs", "W"], ["logits"]),
                 helper.make_node("Where", ["mask", "logits", "fill"], ["masked"]),
                 helper.make_node("ArgMax", ["masked"], ["action"], axis=1, keepdims=0)]
        graph = helper.make_graph(
            nodes, "policy",
            [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["N", d]),
             helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", a])],
            [helper.make_tensor_value_info("action", TensorProto.INT64, ["N"]),
             helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", a])],
            initializer=[numpy_helper.from_array(np.zeros((d, a), np.float32), "W"),
                         numpy_helper.from_array(np.array(-1e8, np.float32), "fill")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        if jigsaw:
            from jigsaw_executor.onnx_policy import FORMAT
            md = {"format": FORMAT, "algo": "ppo", "spaces": json.dumps(sig), "env": json.dumps(dict(ENV_KW)),
                  "placement_options": json.dumps(sig["placement_options"]),
                  "level_pattern_combos": json.dumps(sig["level_pattern_combos"]), "observe_remaining": "true"}
            for k in ("observation_size", "n_actions", "window_k", "spb_levels", "spb_slots", "job_features",
                      "cluster_features"):
                md[k] = str(sig[k])
            if meta_obs is not None:
                md["observation_size"] = str(meta_obs)
            helper.set_model_props(model, md)
        onnx.save(model, str(p))

    def _policy_ok(self, p: Path) -> None:
        self._onnx(p)

    def _policy_l2(self, p: Path) -> None:
        self._onnx(p, spb_levels=2)

    def _policy_old_encoder(self, p: Path) -> None:
        self._onnx(p, job_features=16)  # the encoder before the job-history features

    def _policy_tampered(self, p: Path) -> None:
        self._onnx(p, meta_obs=90)

    def _policy_not_jigsaw(self, p: Path) -> None:
        self._onnx(p, jigsaw=False)


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Assets:
    return Assets(tmp_path_factory.mktemp("bad_input_assets"))


def copy_of(name: str, edit: Callable[[Path], None] | None = None) -> Callable[[Path, Assets], None]:
    """A builder: a copy of asset ``name``, then ``edit(dest)``."""
    def build(dest: Path, assets: Assets) -> None:
        src = assets.get(name)
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copy(src, dest)
        if edit is not None:
            edit(dest)
    return build


def _config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return apply


def _foreign_zip(d: Path) -> None:
    with zipfile.ZipFile(d / "model.zip", "w") as z:
        z.writestr("data", "not the stable-baselines3 data file")


def _nan_weights(d: Path) -> None:
    """A diverged model: every weight of the saved policy NaN."""
    import torch
    from stable_baselines3 import PPO

    model = PPO.load(str(d / "model.zip"), device="cpu")
    with torch.no_grad():
        for t in model.policy.parameters():
            t.fill_(float("nan"))
    model.save(str(d / "model.zip"))


def _layout_k5(cfg: dict) -> None:
    from agents.rl import spaces_signature
    cfg["spaces"] = spaces_signature(5, 3, 4)


BUILDERS.update({
    "run_ppo": copy_of("run_ppo"),
    "run_ppo_l2": copy_of("run_ppo_l2"),
    "run_bad_zip": copy_of("run_ppo", lambda d: (d / "model.zip").write_bytes(b"PK\x03\x04 not a zip")),
    "run_truncated_zip": copy_of("run_ppo", lambda d: (d / "model.zip").write_bytes(
        (d / "model.zip").read_bytes()[:4000])),
    "run_foreign_zip": copy_of("run_ppo", _foreign_zip),
    "run_no_model": copy_of("run_ppo", lambda d: (d / "model.zip").unlink()),
    "run_bad_config": copy_of("run_ppo", lambda d: (d / "config.json").write_text("{oops\n")),
    "run_bad_vecnormalize": copy_of("run_ppo", lambda d: (
        _config(lambda c: c.update(normalize_obs=True))(d), (d / "vecnormalize.npz").write_bytes(b"\x80\x04garbage"))),
    "run_pickled_vecnormalize": copy_of("run_ppo", lambda d: (
        _config(lambda c: c.update(normalize_obs=True))(d), (d / "vecnormalize.pkl").write_bytes(b"\x80\x04N."))),
    "run_no_vecnormalize": copy_of("run_ppo", _config(lambda c: c.update(normalize_obs=True))),
    "run_layout_k5": copy_of("run_ppo", _config(_layout_k5)),
    "train_run_bad_model": copy_of("train_run", lambda d: (d / "model.zip").write_bytes(b"PK\x03\x04 not a zip")),
    "train_run_bad_vecnormalize": copy_of("train_run", lambda d: (d / "vecnormalize.npz").write_bytes(b"\x80\x04junk")),
    "train_run_pickled_vecnormalize": copy_of("train_run", lambda d: (d / "vecnormalize.npz").rename(
        d / "vecnormalize.pkl")),
    "train_run_bad_json": copy_of("train_run", lambda d: (d / "config.json").write_text("{oops\n")),
    "policy_ok.onnx": copy_of("policy_ok"),
    "policy_l2.onnx": copy_of("policy_l2"),
    "policy_old_encoder.onnx": copy_of("policy_old_encoder"),
    "policy_tampered.onnx": copy_of("policy_tampered"),
    "policy_not_jigsaw.onnx": copy_of("policy_not_jigsaw"),
    "policy_garbage.onnx": text_file("this is not a protobuf\n"),
    "train_run": copy_of("train_run"),
    "train_run_no_sampling": copy_of("train_run", _config(lambda c: c.pop("sampling"))),
    "train_run_spaces_empty": copy_of("train_run", _config(lambda c: c.update(spaces={}))),
    "run_config_null": copy_of("run_ppo", lambda d: (d / "config.json").write_text("null\n")),
    "run_config_env_list": copy_of("run_ppo", _config(lambda c: c.update(env=[]))),
    "run_config_spaces_text": copy_of("run_ppo", _config(lambda c: c.update(spaces="x"))),
    "run_nan": copy_of("run_ppo", _nan_weights),
    "policy_truncated.onnx": copy_of("policy_ok", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
})


# ----------------------------------------------------------------------------------------------- running a row
def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors exit from inside the parser
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def prepare(row: Row, tmp: Path, assets: Assets) -> list[str]:
    for name in files_of(row):
        BUILDERS[name](tmp / name, assets)
    argv = shlex.split(substitute(row.command, tmp))
    assert argv[0] == "jigsaw", row.command
    return argv[1:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_prints_its_one_line(row, tmp_path, capsys, assets, request):
    if row.gap:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"known gap, fix proposed: {row.input}"))
    argv = prepare(row, tmp_path, assets)
    rc, out, err = run_cli(argv, capsys)
    expected = substitute(row.message, tmp_path)
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err, err
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert matches(expected, lines[0]), f"\nexpected: {expected}\ngot:      {lines[0]}"


def test_table_and_builders_match():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids)), "duplicate ids in docs/bad_inputs.md"
    assert len(ROWS) >= 100
    used = {n for r in ROWS for n in files_of(r)}
    assert used - set(BUILDERS) == set(), f"rows name files no builder makes: {sorted(used - set(BUILDERS))}"
    assert set(BUILDERS) - used == set(), f"builders no row uses: {sorted(set(BUILDERS) - used)}"
    for r in ROWS:
        assert r.message.startswith("jigsaw"), r.id
        assert "\n" not in r.message


def test_every_subcommand_and_trace_format_has_rows():
    commands = {shlex.split(r.command)[1] if len(shlex.split(r.command)) > 1 else "" for r in ROWS}
    assert {"simulate", "evaluate", "train", "export", "deploy", "calibrate", "traces"} <= commands
    kinds = {k for r in ROWS for k in re.findall(r"\b(philly-json|philly|alibaba2020|alibaba2023|helios|gavel|csv):",
                                                   r.command)}
    assert {"philly", "philly-json", "alibaba2020", "alibaba2023", "helios", "gavel", "csv"} <= kinds


@pytest.mark.parametrize("row_id", ["sim-out-is-a-file", "philly-bad-duration", "sim-gpus-zero"])
def test_console_script_prints_the_same_line(row_id, tmp_path, assets):
    """The same rows through a real process (``python -m jigsaw_env.cli``): exit status 2, the one
    line on stderr, no traceback."""
    row = next(r for r in ROWS if r.id == row_id)
    argv = prepare(row, tmp_path, assets)
    r = subprocess.run([sys.executable, "-m", "jigsaw_env.cli", *argv], capture_output=True, text=True,
                       cwd=str(ROOT), timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert matches(substitute(row.message, tmp_path), r.stderr.strip()), r.stderr
