"""Per-model cost tables: the layer-group cut and what each group costs.

A :class:`CostTable` describes one model at one per-worker batch size on one device type
(``k80``, ``p100``, ``v100`` or ``cpu``). Layer groups are ordered from the input (index 0) to the
output (index ``B-1``), as in docs/design.md section 2.

Units: bytes for memory and parameters, seconds for times. Times are per iteration of one worker
at the table's batch size, on an otherwise idle device.

Every number carries a source: ``sources`` maps a field name (``"param_bytes"``,
``"activation_bytes"``, ``"forward_s"``, ``"backward_weight_s"``, ``"backward_input_s"``,
``"optimizer_s"``, ``"fixed_memory_bytes"``, ``"anchor"``, ``"executor_overhead_s"``) to a sentence
naming where it came from (measured here with which command, a data file and column, or a paper).

``executor_overhead_s`` (seconds per iteration, default 0) is the live executor's own cost of one
iteration beyond the plain training loop the other times measure (SPB trainer bookkeeping, the
control read, the per-iteration command broadcast): every worker iteration pays it, whatever its
start group (docs/spb_model.md eq. C1). It is 0 in every table that measures a plain training loop
(all shipped tables) and is filled by ``jigsaw calibrate --device cpu --executor`` (docs/deploy.md
section 5). A table with overhead 0 is written without the field, so a plain training loop's
table has one JSON form and one digest.

Shipped tables live in ``jigsaw_env/tables/<model>-bs<batch>-<device>.json``.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .jsonfile import read_json_file
from .network import LINK_FILE

TABLES_DIR = Path(__file__).parent / "tables"
DEVICE_TYPES = ("k80", "p100", "v100", "cpu")
_GROUP_NUMBERS = ("param_bytes", "activation_bytes", "forward_s", "backward_weight_s", "backward_input_s")


def _is_number(v: Any) -> bool:
    """A real number (Python or numpy), not a bool."""
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))


def _finite(v: Any) -> bool:
    """``v`` (a number) is finite; a Python int too large for a float is not."""
    try:
        return bool(np.isfinite(float(v)))
    except OverflowError:
        return False


def _json_type(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _short(v: Any) -> str:
    """``repr(v)``, cut to 80 characters (a message stays one readable line)."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _check_number(origin: str, what: str, v: Any) -> None:
    """``v`` must be a finite number >= 0; else ValueError naming ``origin`` and ``what``."""
    if not _is_number(v) or not _finite(v) or v < 0:
        raise ValueError(f"{origin}: {what} must be a finite number >= 0, got {_short(v)}")


# a table's model and device name its file (<model>-bs<N>-<device>.json) and match cluster GPU types
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# keys of meta.eta (jigsaw_env.spb.eta_key): "<level>/<pattern>" or "<level>/<pattern>/w<workers>"
_ETA_KEY = re.compile(r"([1-9][0-9]*)/(rotating|static)(/w[1-9][0-9]*)?")


def _check_meta_eta(origin: str, meta: dict) -> None:
    """Measured statistical efficiencies (``meta.eta``, read by ``jigsaw_env.spb.eta_for``) and the
    worker count they were measured at (``meta.eta_source.workers``): an object of
    ``"<level>/<pattern>[/w<W>]"`` keys (level >= 1) to numbers in (0, 1] (eta is at most 1 by
    definition, docs/spb_model.md eq. E1); else ValueError naming the key and what was expected."""
    eta = meta.get("eta")
    if eta is None:
        return
    if not isinstance(eta, dict):
        raise ValueError(f"{origin}: field meta.eta must be a JSON object of \"<level>/<pattern>\" keys to numbers in "
                         f"(0, 1], got {_json_type(eta)}")
    for key, v in eta.items():
        if not _ETA_KEY.fullmatch(key):
            raise ValueError(f"{origin}: field meta.eta has key {key!r}; expected \"<level>/<pattern>\" or "
                             f"\"<level>/<pattern>/w<workers>\" with level >= 1 and pattern rotating or static "
                             f"(e.g. \"2/rotating\")")
        if not _is_number(v) or not _finite(v) or not 0 < v <= 1:
            raise ValueError(f"{origin}: field meta.eta[{key!r}] must be a number in (0, 1] (statistical efficiency "
                             f"relative to full backprop), got {_short(v)}")
    src = meta.get("eta_source")
    if isinstance(src, dict) and "workers" in src:
        _check_integer(origin, "field meta.eta_source.workers", src["workers"], 1)


def _check_integer(origin: str, what: str, v: Any, low: int) -> None:
    """``v`` must be a whole number >= ``low`` (4096 or 4096.0); else ValueError naming ``origin`` and ``what``."""
    if not _is_number(v) or not _finite(v) or v != int(v) or v < low:
        raise ValueError(f"{origin}: {what} must be an integer >= {low}, got {_short(v)}")


@dataclass(frozen=True)
class LayerGroup:
    """One layer group of a model.

    Attributes:
        name: human-readable name ("stem", "layer1.0", "encoder.3", "head", ...).
        param_bytes: bytes of trainable parameters in the group (= bytes of its gradient).
        activation_bytes: bytes of tensors saved for backward while the group's forward runs
            with gradients enabled, per worker iteration at the table's batch size.
        forward_s: forward time of the group, seconds.
        backward_weight_s: backward time spent on weight gradients, seconds.
        backward_input_s: backward time spent on the gradient w.r.t. the group's input, seconds.
            Not spent by the lowest group a worker backpropagates through (its start group).
    """

    name: str
    param_bytes: int
    activation_bytes: int
    forward_s: float
    backward_weight_s: float
    backward_input_s: float


@dataclass(frozen=True)
class CostTable:
    """Costs of one model at one batch size on one device type. See module docstring."""

    model: str
    batch_size: int
    device: str
    groups: tuple[LayerGroup, ...]
    optimizer_s: float
    fixed_memory_bytes: int
    sources: dict[str, str] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    executor_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        x = self.executor_overhead_s
        if not _is_number(x) or not _finite(x) or x < 0:
            raise ValueError(f"cost table {self.model}: field executor_overhead_s must be a finite number >= 0 "
                             f"(seconds per iteration), got {x!r}")
        object.__setattr__(self, "executor_overhead_s", float(x))
        if not self.groups:
            raise ValueError(f"cost table {self.model}: needs at least one layer group")
        b = self.batch_size
        if not _is_number(b) or not _finite(b) or b != int(b) or b <= 0:
            raise ValueError(f"cost table {self.model}: batch_size must be an integer > 0, got {b!r}")
        for name in ("optimizer_s", "fixed_memory_bytes"):
            v = getattr(self, name)
            if not _is_number(v) or not _finite(v) or v < 0:
                raise ValueError(f"cost table {self.model}: field {name} must be a finite number >= 0, got {v!r}")
        for g in self.groups:
            if not isinstance(g, LayerGroup):
                raise ValueError(f"cost table {self.model}: groups must be LayerGroup objects, got "
                                 f"{type(g).__name__}")
            for name in _GROUP_NUMBERS:
                v = getattr(g, name)
                if not _is_number(v) or not _finite(v) or v < 0:
                    raise ValueError(
                        f"cost table {self.model}: group {g.name!r} field {name} must be a finite number >= 0, got {v!r}"
                    )

    # ----- derived arrays (cached on first use) -----
    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def arrays(self) -> dict[str, np.ndarray]:
        """Per-group numpy arrays keyed by field name (float64)."""
        cache = self.__dict__.get("_arrays")
        if cache is None:
            cache = {
                name: np.array([getattr(g, name) for g in self.groups], dtype=np.float64)
                for name in ("param_bytes", "activation_bytes", "forward_s", "backward_weight_s", "backward_input_s")
            }
            object.__setattr__(self, "_arrays", cache)
        return cache

    @property
    def param_bytes_total(self) -> int:
        return int(sum(g.param_bytes for g in self.groups))

    def compute_s(self, start: int) -> float:
        """Compute time (s) of one worker iteration that backpropagates groups ``start..B-1``.

        forward of every group + weight-gradient time of groups >= start + input-gradient time of
        groups > start + optimizer step + executor overhead (docs/design.md section 2; docs/spb_model.md
        eq. C1). With ``executor_overhead_s = 0`` (every plain-loop table) the last term is 0.
        """
        return float(self.compute_by_start()[start])

    def compute_by_start(self) -> np.ndarray:
        """Array of :meth:`compute_s` for every start group 0..B-1 (seconds)."""
        cache = self.__dict__.get("_compute")
        if cache is None:
            a = self.arrays()
            fwd = a["forward_s"].sum()
            bw_w_suffix = np.cumsum(a["backward_weight_s"][::-1])[::-1]
            bw_i = a["backward_input_s"]
            # input-gradient time of groups strictly above `start`
            bw_i_above = np.concatenate([np.cumsum(bw_i[::-1])[::-1][1:], [0.0]])
            cache = fwd + bw_w_suffix + bw_i_above + self.optimizer_s
            if self.executor_overhead_s:
                cache = cache + self.executor_overhead_s
            object.__setattr__(self, "_compute", cache)
        return cache

    def activation_peak_bytes(self, start: int) -> int:
        """Activation bytes kept by a worker that backpropagates groups ``start..B-1``."""
        return int(self.arrays()["activation_bytes"][start:].sum())

    def process_peak_bytes(self, start: int) -> int:
        """Peak memory (bytes) of one worker process whose deepest backprop starts at ``start``."""
        return int(self.fixed_memory_bytes + self.activation_peak_bytes(start))

    def iteration_time_s(self) -> float:
        """Full-backprop compute time of one worker iteration (seconds), no communication; includes
        ``executor_overhead_s``."""
        return self.compute_s(0)

    def plain_compute_s(self, start: int) -> float:
        """:meth:`compute_s` without the executor overhead: the plain training loop (seconds)."""
        return self.compute_s(start) - self.executor_overhead_s

    # ----- serialisation -----
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["groups"] = [asdict(g) for g in self.groups]
        if not self.executor_overhead_s:  # plain-loop tables keep their pre-field JSON and digest
            d.pop("executor_overhead_s")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, origin: str = "<dict>") -> "CostTable":
        """The table a JSON object describes. Every field is checked first; a bad one raises
        ValueError ``"{origin}: field NAME must be ..., got VALUE"`` (``groups[i].NAME`` for a
        group's field), so a file's error names the file, the field and what was expected."""
        if not isinstance(d, dict):
            raise ValueError(f"{origin}: expected a JSON object (a cost table), got {_json_type(d)}")
        required = ("model", "batch_size", "device", "groups", "optimizer_s", "fixed_memory_bytes")
        missing = [k for k in required if k not in d]
        if missing:
            raise ValueError(f"{origin}: cost table is missing field(s) {missing}; expected {list(required)}")
        for k in ("model", "device"):
            if not isinstance(d[k], str) or not d[k].strip():
                raise ValueError(f"{origin}: field {k} must be a non-empty string, got {_short(d[k])}")
        _check_integer(origin, "field batch_size", d["batch_size"], 1)
        _check_number(origin, "field optimizer_s", d["optimizer_s"])
        _check_integer(origin, "field fixed_memory_bytes", d["fixed_memory_bytes"], 0)
        for k in ("model", "device"):
            if not _NAME.fullmatch(d[k]):
                raise ValueError(f"{origin}: field {k} must be a name of letters, digits, '_', '.' and '-', not "
                                 f"starting with '.' or '-' (it names the table's file, <model>-bs<N>-<device>.json), "
                                 f"got {_short(d[k])}")
        for k in ("sources", "meta"):
            if k in d and not isinstance(d[k], dict):
                raise ValueError(f"{origin}: field {k} must be a JSON object, got {_json_type(d[k])}")
        _check_meta_eta(origin, d.get("meta", {}))
        x = d.get("executor_overhead_s", 0.0)
        if not _is_number(x) or not _finite(x) or x < 0:
            raise ValueError(f"{origin}: field executor_overhead_s must be a finite number >= 0 (seconds per "
                             f"iteration), got {_short(x)}")
        raw_groups = d["groups"]
        fields = list(LayerGroup.__dataclass_fields__)
        if not isinstance(raw_groups, list) or not raw_groups:
            raise ValueError(f"{origin}: field groups must be a non-empty list of layer groups (objects with "
                             f"fields {fields}), got {_short(raw_groups)}")
        groups = []
        for i, g in enumerate(raw_groups):
            where = f"groups[{i}]"
            if not isinstance(g, dict):
                raise ValueError(f"{origin}: {where} must be a JSON object with fields {fields}, got {_json_type(g)}")
            missing = [f for f in fields if f not in g]
            if missing:
                raise ValueError(f"{origin}: {where} is missing field(s) {missing}; expected fields {fields}")
            unknown = [f for f in g if f not in fields]
            if unknown:
                raise ValueError(f"{origin}: {where} has unknown field(s) {unknown}; expected fields {fields}")
            if not isinstance(g["name"], str):
                raise ValueError(f"{origin}: {where}.name must be a string, got {_short(g['name'])}")
            for f in ("param_bytes", "activation_bytes"):
                _check_integer(origin, f"{where}.{f}", g[f], 0)
            for f in ("forward_s", "backward_weight_s", "backward_input_s"):
                _check_number(origin, f"{where}.{f}", g[f])
            groups.append(LayerGroup(**g))
        table = cls(
            model=str(d["model"]), batch_size=int(d["batch_size"]), device=str(d["device"]),
            groups=tuple(groups), optimizer_s=float(d["optimizer_s"]),
            fixed_memory_bytes=int(d["fixed_memory_bytes"]),
            sources=dict(d.get("sources", {})), meta=dict(d.get("meta", {})),
            executor_overhead_s=float(x),
        )
        # a full-backprop iteration (eq. C1 at start 0) must take time: the simulator divides by it
        if not table.iteration_time_s() > 0:
            raise ValueError(f"{origin}: a full-backprop iteration takes 0 seconds (forward_s and backward_weight_s of "
                             f"every group, backward_input_s of groups >= 1, optimizer_s and executor_overhead_s are "
                             f"all 0); expected times whose sum is > 0")
        return table

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        p = Path(path)
        if p.is_dir():
            raise IsADirectoryError(f"cost table file is a folder, expected a JSON file: {p}")
        return cls.from_dict(read_json_file(p, "cost table file"), origin=str(p))

    def digest(self) -> str:
        """Short sha256 of the table's canonical JSON (used in report metadata)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def table_filename(model: str, batch_size: int, device: str) -> str:
    return f"{model}-bs{batch_size}-{device}.json"


_REGISTERED: dict[tuple[str, int, str], CostTable] = {}


def register_table(table: CostTable) -> None:
    """Make ``table`` available to :func:`get_table` (overrides a shipped table of the same key).

    Used for user-calibrated tables (``--tables DIR``) and for hand-built tables in tests.
    """
    _REGISTERED[(table.model, table.batch_size, table.device)] = table
    get_table.cache_clear()


def registered_table(model: str, batch_size: int, device: str) -> CostTable | None:
    """The table :func:`register_table` registered under this key, or None (shipped tables aside)."""
    return _REGISTERED.get((model, batch_size, device))


def unregister_table(model: str, batch_size: int, device: str) -> None:
    _REGISTERED.pop((model, batch_size, device), None)
    get_table.cache_clear()


# the lockstep barrier that ``jigsaw calibrate --executor`` writes next to its tables
# (:mod:`jigsaw_executor.lockstep`); not a cost table
LOCKSTEP_FILE = "lockstep.json"


def table_files(folder: str | Path) -> list[Path]:
    """The cost-table files of a folder: every ``*.json`` except ``link.json`` (the fitted link;
    :mod:`jigsaw_env.network`) and ``lockstep.json`` (the lockstep barrier), which ``jigsaw
    calibrate --executor`` writes next to its tables."""
    return [f for f in sorted(Path(folder).glob("*.json")) if f.name not in (LINK_FILE, LOCKSTEP_FILE)]


def register_tables_dir(path: str | Path) -> int:
    """Register every ``*.json`` cost table in ``path``; returns how many."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise NotADirectoryError(f"cost-table folder is a file, not a folder: {p} (expected a folder of *.json "
                                 f"cost tables)")
    if not p.is_dir():
        raise FileNotFoundError(f"cost-table folder not found: {p}")
    # load every table before registering any: a bad file leaves the registry as it was
    tables = [CostTable.load(f) for f in table_files(p)]
    for t in tables:
        register_table(t)
    return len(tables)


def available_tables() -> tuple[tuple[str, int, str], ...]:
    """(model, batch_size, device) of every shipped or registered table."""
    return tuple(sorted(set(_shipped_tables()) | set(_REGISTERED)))


@lru_cache(maxsize=None)
def _shipped_tables() -> tuple[tuple[str, int, str], ...]:
    out = []
    for p in sorted(TABLES_DIR.glob("*.json")):
        stem = p.stem
        try:
            model, rest = stem.rsplit("-bs", 1)
            bs, device = rest.split("-", 1)
            out.append((model, int(bs), device))
        except ValueError:
            continue
    return tuple(out)


def available_models() -> tuple[str, ...]:
    return tuple(sorted({m for m, _, _ in available_tables()}))


def check_table_exists(model: str, batch_size: int, device: str) -> None:
    """ValueError (one line, the allowed values) unless a table exists for ``model`` at
    ``batch_size`` on ``device``: the wording of the command lines that name a table
    (``jigsaw tables show``, ``jigsaw colocation predict``)."""
    tables = available_tables()
    models = sorted({m for m, _, _ in tables})
    if model not in models:
        raise ValueError(f"unknown model {model!r}; allowed: {models}")
    devices = sorted({d for m, _, d in tables if m == model})
    if device not in devices:
        raise ValueError(f"no cost table for model {model!r} on {device!r}; allowed GPU types: {devices}")
    batches = sorted({b for m, b, d in tables if m == model and d == device})
    if batch_size not in batches:
        raise ValueError(f"no cost table for model {model!r} at batch size {batch_size} on {device}; "
                         f"allowed: {batches}")


#: model -> the batch size of its reference tables: the one batch size every device type has a
#: measured (cpu) or anchored/extrapolated (k80/p100/v100) table at, and the batch size of a job of
#: that model whose trace gives none (docs/cost_tables.md section 6)
REFERENCE_BATCH_SIZES: dict[str, int] = {
    "resnet18": 64,
    "resnet50": 32,
    "transformer_small": 64,
    "lstm_lm": 20,
    "recommendation": 1024,
    "vgg16": 32,
    "bert_base": 8,
    "tiny_cnn": 32,
    "tiny_mlp": 32,
    "tiny_transformer": 32,
}
#: a job's batch size may be at most this factor from the nearest batch size with a table (either
#: way) for :func:`scale_to_batch` to stand in for a measurement (docs/cost_tables.md section 9)
MAX_BATCH_RATIO = 4.0


def nearest_batch_size(batch_size: int, sizes: list[int] | tuple[int, ...]) -> int:
    """The batch size of ``sizes`` nearest to ``batch_size`` in ratio (smallest ``|ln(b / batch_size)|``;
    a tie goes to the larger one)."""
    if not sizes:
        raise ValueError("nearest_batch_size needs at least one batch size")
    return min(sorted(sizes, reverse=True), key=lambda b: abs(np.log(b / batch_size)))


def batch_exponent(batch_size: int, times: dict[int, float]) -> tuple[float, tuple[int, int] | None]:
    """``(alpha, pair)``: the exponent of eq. B1 for ``batch_size`` from ``times`` (batch size ->
    full-backprop seconds of the tables one model has on one device type):
    ``alpha = ln(T(b2) / T(b1)) / ln(b2 / b1)`` over the pair ``(b1, b2)`` of neighbouring batch
    sizes with a table that brackets ``batch_size`` (below the smallest: the two smallest; above the
    largest: the two largest). With one table, ``(1.0, None)``: time proportional to the batch."""
    sizes = sorted(times)
    if len(sizes) < 2:
        return 1.0, None
    k = int(np.searchsorted(sizes, batch_size))
    k = min(max(k, 1), len(sizes) - 1)
    b1, b2 = sizes[k - 1], sizes[k]
    return float(np.log(times[b2] / times[b1]) / np.log(b2 / b1)), (b1, b2)


def scale_to_batch(table: CostTable, batch_size: int, exponent: float = 1.0,
                   exponent_source: str = "1 (one table: time proportional to the batch)") -> CostTable:
    """The table of the same model at ``batch_size``, from ``table`` at batch ``b*`` by the
    batch-scaling rule (docs/cost_tables.md eq. B1): with ``r = batch_size / b*``, every time
    (``forward_s``, ``backward_weight_s``, ``backward_input_s`` of every group, ``optimizer_s``)
    times ``r ** exponent`` (so ``compute_s(0)`` too, and the per-group split is ``table``'s), every
    group's ``activation_bytes`` times ``r`` (they are per sample: measured, bench/batch_split.py);
    ``param_bytes``, ``fixed_memory_bytes`` and ``executor_overhead_s`` as they are."""
    _check_integer(f"cost table {table.model}", "batch_size", batch_size, 1)
    if not (_is_number(exponent) and _finite(exponent)):
        raise ValueError(f"cost table {table.model}: batch exponent must be a finite number, got {exponent!r}")
    r = batch_size / table.batch_size
    f = r ** float(exponent)
    groups = tuple(LayerGroup(name=g.name, param_bytes=g.param_bytes,
                              activation_bytes=int(round(g.activation_bytes * r)),
                              forward_s=g.forward_s * f, backward_weight_s=g.backward_weight_s * f,
                              backward_input_s=g.backward_input_s * f) for g in table.groups)
    rule = (f"batch-scaled (docs/cost_tables.md eq. B1) from {table_filename(table.model, table.batch_size, table.device)}"
            f" (digest {table.digest()}) at batch {table.batch_size} to {batch_size}: r = {r:.6g}, exponent "
            f"alpha = {exponent_source}")
    sources = dict(table.sources)
    for k in ("forward_s", "backward_weight_s", "backward_input_s", "optimizer_s"):
        if k in sources:
            sources[k] = f"{sources[k]} [then x r^alpha = {f:.6g}, eq. B1]"
    if "activation_bytes" in sources:
        sources["activation_bytes"] = f"{sources['activation_bytes']} [then x r = {r:.6g}, eq. B1]"
    sources["batch_scaling"] = (f"{rule}; every time x r^alpha = {f:.6g}, activation_bytes x r; param_bytes and "
                                f"fixed_memory_bytes unchanged")
    meta = dict(table.meta, kind="batch-scaled", scaled_from_batch_size=table.batch_size, batch_ratio=r,
                batch_exponent=float(exponent), scaled_from_digest=table.digest())
    return CostTable(model=table.model, batch_size=int(batch_size), device=table.device, groups=groups,
                     optimizer_s=table.optimizer_s * f, fixed_memory_bytes=table.fixed_memory_bytes,
                     sources=sources, meta=meta, executor_overhead_s=table.executor_overhead_s)


def nearest_scaled_table(model: str, batch_size: int, device: str, sizes: list[int]) -> CostTable:
    """Eq. B1 for a batch size without a table: the table of the nearest batch size of ``sizes``
    (:func:`nearest_batch_size`) scaled by :func:`scale_to_batch` with the exponent of
    :func:`batch_exponent` over the tables of ``sizes``."""
    near = nearest_batch_size(batch_size, sizes)
    times = {b: get_table(model, b, device).plain_compute_s(0) for b in sizes}
    alpha, pair = batch_exponent(batch_size, times)
    how = ("1 (one table: time proportional to the batch)" if pair is None else
           f"ln(T({pair[1]}) / T({pair[0]})) / ln({pair[1]} / {pair[0]}) = ln({times[pair[1]]:.6g} / "
           f"{times[pair[0]]:.6g}) / ln({pair[1] / pair[0]:.6g}) = {alpha:.6g} ({device} tables)")
    return scale_to_batch(get_table(model, near, device), batch_size, alpha, how)


@lru_cache(maxsize=None)
def get_table(model: str, batch_size: int | None = None, device: str = "v100", nearest: bool = False) -> CostTable:
    """Load a shipped table. ``batch_size=None`` takes the model's default (:func:`default_batch_size`).

    ``nearest=True`` (what a trace job gets): a batch size without a table gets the table of the
    nearest batch size with one, scaled by eq. B1 (:func:`nearest_scaled_table`), when it is within a factor
    :data:`MAX_BATCH_RATIO` of it. Raises ValueError naming the allowed values when the model,
    batch size or device is unknown.
    """
    tables = available_tables()
    models = sorted({m for m, _, _ in tables})
    if model not in models:
        raise ValueError(f"unknown model {model!r}; allowed: {models}")
    devices = sorted({d for m, _, d in tables if m == model})
    if device not in devices:
        raise ValueError(f"no cost table for model {model!r} on device {device!r}; allowed devices: {devices}")
    sizes = sorted({b for m, b, d in tables if m == model and d == device})
    if batch_size is None:
        batch_size = default_batch_size(model)
    if batch_size not in sizes:
        if nearest and isinstance(batch_size, (int, np.integer)) and batch_size > 0:
            near = nearest_batch_size(int(batch_size), sizes)
            if max(near / batch_size, batch_size / near) <= MAX_BATCH_RATIO:
                return nearest_scaled_table(model, int(batch_size), device, sizes)
            raise ValueError(f"no cost table for model {model!r} at batch_size {batch_size} on {device}, and the nearest "
                             f"batch size with one ({near}) is more than {MAX_BATCH_RATIO:g}x away; allowed: batch sizes "
                             f"{sizes} and those within {MAX_BATCH_RATIO:g}x of them")
        raise ValueError(f"no cost table for model {model!r} at batch_size {batch_size}; allowed: {sizes}")
    reg = _REGISTERED.get((model, batch_size, device))
    if reg is not None:
        return reg
    return CostTable.load(TABLES_DIR / table_filename(model, batch_size, device))


def batch_scaled(model: str, batch_size: int, device: str) -> bool:
    """True when a job of ``model`` at ``batch_size`` on ``device`` has no table of its own and
    gets a batch-scaled one (:func:`get_table` with ``nearest=True``)."""
    return (model, int(batch_size), device) not in set(available_tables())


def default_batch_size(model: str) -> int:
    """The batch size a job of ``model`` uses when a trace does not say: the model's reference batch
    size (:data:`REFERENCE_BATCH_SIZES`) when it has a table there, else the smallest with one."""
    sizes = sorted({b for m, b, _ in available_tables() if m == model})
    if not sizes:
        raise ValueError(f"unknown model {model!r}; allowed: {sorted(available_models())}")
    ref = REFERENCE_BATCH_SIZES.get(model)
    return ref if ref in sizes else sizes[0]


def isolated_iteration_time_s(model: str, batch_size: int | None, device: str) -> float:
    """Full-backprop compute seconds per iteration of one worker, alone on one ``device``."""
    return get_table(model, batch_size, device).iteration_time_s()
