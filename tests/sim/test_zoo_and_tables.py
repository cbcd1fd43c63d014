"""Zoo models, the cost-table builder, the shipped tables and `jigsaw calibrate`.

Fast: only tiny models run real forward/backward passes; big zoo models are checked on the
``meta`` device (shapes without compute).
"""
from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn as nn

from jigsaw_env import table_builder as tb
from jigsaw_env.calibrate import SHIPPED, SHIP_DEVICES, calibrate
from jigsaw_env.cost_table import TABLES_DIR, CostTable, LayerGroup, get_table, table_filename
from jigsaw_env.zoo import MODELS, ZooModel, build_model, model_names

torch.set_num_threads(1)

FIELDS = ("param_bytes", "activation_bytes", "forward_s", "backward_weight_s", "backward_input_s",
          "optimizer_s", "fixed_memory_bytes", "anchor")
TINY = ("tiny_cnn", "tiny_mlp", "tiny_transformer")


def _gavel_file_or_skip():
    p = tb.data_dir() / tb.GAVEL_FILE
    if not p.exists():
        msg = f"reference data folder absent: {p} not found (set JIGSAW_DATA)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg + " -- required under CI=true")
        pytest.skip(msg)
    return p


# --------------------------------------------------------------------------------------------
# hand-built toys
# --------------------------------------------------------------------------------------------
class Toy(ZooModel):
    """group 0: Linear(4, 8) + ReLU; group 1: Linear(8, 3); loss = sum of the outputs."""

    name = "toy"

    def __init__(self) -> None:
        super().__init__()
        self.add_group("g0", nn.Sequential(nn.Linear(4, 8), nn.ReLU()))
        self.add_group("g1", nn.Sequential(nn.Linear(8, 3)))

    def make_batch(self, batch_size, generator=None, device=None):
        return torch.randn(batch_size, 4, generator=generator), torch.zeros(batch_size)

    def loss(self, output, targets):
        return output.sum()  # saves nothing for backward


def test_param_bytes_hand_count():
    m = Toy()
    frozen = nn.Parameter(torch.zeros(100), requires_grad=False)  # not trainable: not counted
    m.groups[1].register_parameter("frozen", frozen)
    assert tb.param_bytes_per_group(m) == [(4 * 8 + 8) * 4, (8 * 3 + 3) * 4]  # [160, 108]
    m64 = Toy().double()
    assert tb.param_bytes_per_group(m64) == [(4 * 8 + 8) * 8, (8 * 3 + 3) * 8]


def test_activation_bytes_hand_count():
    B = 5
    m = Toy()
    x, y = m.make_batch(B)
    got = tb.activation_bytes_per_group(m, x, y)
    # group 0: Linear keeps its input x (B*4 floats) for the weight gradient; its weight is a
    # parameter (not counted). The ReLU output (B*8 floats) is saved by the ReLU and again by
    # group 1's Linear: one storage, counted once, in the highest group that saves it (1).
    assert got == [B * 4 * 4, B * 8 * 4]  # [80, 160]


def test_activation_bytes_loss_and_integer_input():
    # an embedding keeps its int64 indices; cross entropy keeps log-softmax output + targets
    class Emb(ZooModel):
        input_is_index = True

        def __init__(self):
            super().__init__()
            self.add_group("emb", nn.Embedding(10, 6))
            self.add_group("head", nn.Sequential(nn.Flatten(), nn.Linear(12, 5)))

    B = 3
    m = Emb()
    x = torch.randint(0, 10, (B, 2))
    y = torch.randint(0, 5, (B,))
    got = tb.activation_bytes_per_group(m, x, y)
    assert got[0] == B * 2 * 8                      # indices, int64
    # head: Linear input (B*12 floats, a view of the embedding output) + log_softmax output
    # (B*5 floats) + int64 targets (B*8) + nll_loss's scalar total_weight (4 bytes)
    assert got[1] == B * 12 * 4 + B * 5 * 4 + B * 8 + 4


# --------------------------------------------------------------------------------------------
# the zoo
# --------------------------------------------------------------------------------------------
EXPECTED_OUT = {
    "resnet18": lambda b: (b, 10), "resnet50": lambda b: (b, 1000), "vgg16": lambda b: (b, 1000),
    "bert_base": lambda b: (b, 2), "transformer_small": lambda b: (b, 52, 10000),
    "lstm_lm": lambda b: (b, 35, 33278), "recommendation": lambda b: (b,),
    "tiny_cnn": lambda b: (b, 10), "tiny_mlp": lambda b: (b, 10), "tiny_transformer": lambda b: (b, 10),
}
EXPECTED_GROUPS = {"resnet18": 10, "resnet50": 18, "vgg16": 8, "bert_base": 14, "transformer_small": 8,
                   "lstm_lm": 4, "recommendation": 5}


def test_registry_and_unknown_model():
    assert set(model_names()) == set(EXPECTED_OUT)
    with pytest.raises(ValueError, match="allowed.*resnet18"):
        build_model("alexnet")


@pytest.mark.parametrize("name", sorted(EXPECTED_OUT))
def test_zoo_model_groups(name):
    with torch.device("meta"):  # shapes only: no weights initialised, no compute
        m = build_model(name)
    assert isinstance(m.groups, nn.ModuleList) and len(m.groups) == len(m.group_names) >= 3
    if name in EXPECTED_GROUPS:
        assert len(m.groups) == EXPECTED_GROUPS[name]
    assert m.__doc__ and "Input" in m.__doc__
    # groups cover all parameters exactly once
    all_ids = [id(p) for p in m.parameters()]
    group_ids = [id(p) for g in m.groups for p in g.parameters()]
    assert len(group_ids) == len(set(group_ids)) == len(all_ids)
    assert set(group_ids) == set(all_ids)
    # chaining the groups gives model(x)'s shape
    x, y = m.make_batch(2, generator=torch.Generator().manual_seed(0))
    assert (x.dtype == torch.long) == m.input_is_index
    x, y = x.to("meta"), y.to("meta")
    h = x
    for g in m.groups:
        h = g(h)
    out = m(x)
    assert tuple(h.shape) == tuple(out.shape) == EXPECTED_OUT[name](2)
    assert m.loss(out, y).shape == ()


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_run(name):
    torch.manual_seed(0)
    m = build_model(name).eval()
    x, y = m.make_batch(8, generator=torch.Generator().manual_seed(1))
    h = x
    for g in m.groups:
        h = g(h)
    assert torch.equal(h, m(x))
    m.train()
    opt = m.make_optimizer()
    before = [p.detach().clone() for p in m.parameters()]
    loss = m.loss(m(x), y)
    loss.backward()
    m.optimizer_step(opt)
    assert math.isfinite(loss.item())
    # the step moved the weights, downhill on this batch
    assert any(not torch.equal(b, p) for b, p in zip(before, m.parameters()))
    with torch.no_grad():
        assert m.loss(m(x), y).item() < loss.item()


# --------------------------------------------------------------------------------------------
# anchoring formulas (synthetic Gavel file: no data folder needed)
# --------------------------------------------------------------------------------------------
def _fake_table(model, bs, job, t_fwd=0.1):
    groups = tuple(LayerGroup(f"g{i}", 100, 200, t_fwd, 2 * t_fwd, t_fwd if i else 0.0) for i in range(3))
    return CostTable(model=model, batch_size=bs, device="cpu", groups=groups, optimizer_s=0.05,
                     fixed_memory_bytes=10_000, sources={f: "test" for f in FIELDS},
                     meta={"gavel_job": job, "weights_bytes": 300, "gradient_bytes": 300,
                           "optimizer_state_bytes": 300, "framework_overhead_bytes": 9100})


def test_anchor_and_extrapolation_formulas(tmp_path):
    gavel = {"v100": {str(("LM (batch size 20)", 1)): {"null": 50.0},
                      str(("ResNet-18 (batch size 64)", 1)): {"null": 20.0}}}
    path = tmp_path / "thr.json"
    path.write_text(json.dumps(gavel))
    lm = _fake_table("lstm_lm", 20, "LM", 0.1)
    rn = _fake_table("resnet18", 64, "ResNet-18", 0.3)
    a = tb.anchor_table(lm, "v100", gavel_path=path)
    assert a.device == "v100" and a.meta["kind"] == "anchored"
    assert a.compute_s(0) == pytest.approx(1 / 50.0, rel=1e-12)
    k = (1 / 50.0) / lm.compute_s(0)
    for g0, g1 in zip(lm.groups, a.groups):
        assert g1.forward_s == pytest.approx(k * g0.forward_s)
        assert g1.backward_input_s == pytest.approx(k * g0.backward_input_s)
        assert g1.activation_bytes == g0.activation_bytes and g1.param_bytes == g0.param_bytes
    assert a.fixed_memory_bytes == 900 + tb.ASSUMED_CUDA_OVERHEAD_BYTES
    # no Gavel entry: geometric mean of the anchored models' ratios
    tiny = _fake_table("tiny_mlp", 32, None, 0.01)
    e = tb.anchor_table(tiny, "v100", gavel_path=path, reference_tables=[lm, rn])
    geo = math.sqrt(((1 / 50.0) / lm.compute_s(0)) * ((1 / 20.0) / rn.compute_s(0)))
    assert e.meta["kind"] == "extrapolated"
    assert e.compute_s(0) == pytest.approx(geo * tiny.compute_s(0), rel=1e-12)
    assert "EXTRAPOLATION" in e.sources["anchor"]
    with pytest.raises(ValueError, match="cannot extrapolate"):
        tb.anchor_table(tiny, "v100", gavel_path=path, reference_tables=[])


# --------------------------------------------------------------------------------------------
# shipped tables
# --------------------------------------------------------------------------------------------
def _shipped(model, bs, device) -> CostTable:
    """The shipped file itself (get_table may return a table another test registered)."""
    return CostTable.load(TABLES_DIR / table_filename(model, bs, device))


SHIPPED_CASES = [(m, b, d) for m, b in SHIPPED.items() for d in SHIP_DEVICES]


@pytest.mark.parametrize("model,bs,device", SHIPPED_CASES)
def test_shipped_table(model, bs, device):
    path = TABLES_DIR / table_filename(model, bs, device)
    assert path.exists(), f"missing shipped table {path.name}"
    assert path.stat().st_size < 50_000
    t = CostTable.load(path)
    assert (t.model, t.batch_size, t.device) == (model, bs, device)
    assert get_table(model, bs, device).num_groups == t.num_groups  # loadable by the simulator's API
    for f in FIELDS:
        assert t.sources.get(f, "").strip(), f"{path.name}: no source for {f}"
    a = t.arrays()
    assert (a["forward_s"] > 0).all()
    assert t.optimizer_s > 0 and t.compute_s(0) > 0 and t.fixed_memory_bytes > t.param_bytes_total
    assert (a["backward_weight_s"][a["param_bytes"] > 0] > 0).all()
    assert a["backward_input_s"][0] == 0.0
    assert (a["activation_bytes"] > 0).all()
    # parameter bytes and group names agree with the zoo model (exact count)
    with torch.device("meta"):
        m = build_model(model)
    assert [g.name for g in t.groups] == m.group_names
    assert [g.param_bytes for g in t.groups] == tb.param_bytes_per_group(m)
    for k in ("torch_version", "date_utc", "repeats", "threads", "processor"):
        assert k in t.meta


@pytest.mark.data
@pytest.mark.parametrize("model", [m for m in SHIPPED if MODELS[m].gavel_job])
@pytest.mark.parametrize("gpu", ["k80", "p100", "v100"])
def test_shipped_anchor_equals_gavel(model, gpu):
    path = _gavel_file_or_skip()
    data = json.loads(path.read_text())
    bs = SHIPPED[model]
    key = str((f"{MODELS[model].gavel_job} (batch size {bs})", 1))
    thr = data[gpu][key]["null"]
    t = _shipped(model, bs, gpu)
    assert t.meta["kind"] == "anchored" and t.meta["gavel_key"] == key
    assert t.compute_s(0) == pytest.approx(1.0 / thr, rel=1e-6)


@pytest.mark.parametrize("gpu", ["k80", "p100", "v100"])
def test_shipped_extrapolation_is_geomean(gpu):
    anchored = [m for m in SHIPPED if MODELS[m].gavel_job]
    ratios = [_shipped(m, SHIPPED[m], gpu).compute_s(0) / _shipped(m, SHIPPED[m], "cpu").compute_s(0)
              for m in anchored]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    for m in SHIPPED:
        if MODELS[m].gavel_job or m in tb.GPU_RATIO_FAMILY:  # vgg16, bert_base: tests/sim/test_tables_per_batch.py
            continue
        t, c = _shipped(m, SHIPPED[m], gpu), _shipped(m, SHIPPED[m], "cpu")
        assert t.meta["kind"] == "extrapolated" and "EXTRAPOLATION" in t.sources["anchor"]
        assert t.compute_s(0) / c.compute_s(0) == pytest.approx(geo, rel=1e-9)


# --------------------------------------------------------------------------------------------
# calibrate: API and CLI
# --------------------------------------------------------------------------------------------
@pytest.fixture
def cli_main(monkeypatch):
    """``jigsaw_env.cli.main`` with only the calibrate subcommand registered, so these tests do not
    depend on the other subcommand modules (they have their own tests)."""
    from jigsaw_env import cli

    monkeypatch.setattr(cli, "SUBCOMMAND_MODULES", ("jigsaw_env.calibrate",))
    return cli.main


def test_calibrate_cli_writes_loadable_table(tmp_path, cli_main):
    main = cli_main
    out = tmp_path / "t.json"
    rc = main(["calibrate", "--model", "tiny_mlp", "--batch-size", "16", "--device", "cpu",
               "--out", str(out), "--repeats", "3", "--no-progress"])
    assert rc == 0
    t = CostTable.load(out)
    assert (t.model, t.batch_size, t.device, t.num_groups) == ("tiny_mlp", 16, "cpu", 5)
    assert all(t.sources.get(f) for f in FIELDS)
    assert t.compute_s(0) > 0
    # fc1 keeps its [16, 64] float input; the ReLU output of fc1 ([16, 128]) counts in fc2
    assert t.groups[0].activation_bytes == 16 * 64 * 4
    assert t.groups[1].activation_bytes == 16 * 128 * 4
    assert t.meta["optimizer_state_bytes"] == t.param_bytes_total  # SGD momentum buffers


def test_calibrate_cli_user_errors(tmp_path, capsys, cli_main):
    main = cli_main
    rc = main(["calibrate", "--model", "nope", "--batch-size", "16", "--out", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "allowed" in err and "tiny_mlp" in err and "resnet18" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["calibrate", "--model", "tiny_mlp", "--batch-size", "0"]) == 2
    assert "batch size" in capsys.readouterr().err
    assert main(["calibrate", "--model", "tiny_mlp", "--batch-size", "4", "--device", "tpu"]) == 2
    assert "allowed" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_calibrate_api_validation():
    with pytest.raises(ValueError, match="allowed"):
        calibrate("nope", 4)
    with pytest.raises(ValueError, match="batch size"):
        calibrate("tiny_mlp", -1)
    with pytest.raises(ValueError, match="device"):
        calibrate("tiny_mlp", 4, device="a100")
    with pytest.raises(ValueError, match="conflicts"):
        calibrate("tiny_mlp", 4, device="k80", anchor_device="v100")
