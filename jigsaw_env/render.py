"""The env's ``rgb_array`` frame: the cluster drawn with numpy alone (rectangles into an array).

A frame is an ``(H, W, 3)`` uint8 array whose size depends only on the cluster's shape (nodes,
GPUs per node, workers per GPU), so every frame of an episode (and of a video) has the same size;
both sides are multiples of 16 pixels, as video encoders want. From top to bottom:

* a header: the simulated clock (``T h:mm:ss``), the round, and the counts of running, waiting
  and finished jobs;
* one row per node (``N0``, ``N1``, ...; rows wrap into further columns after
  :data:`NODES_PER_COLUMN` nodes), one cell per GPU. A free GPU is a dark grey cell; each worker
  on a GPU is a band in its job's colour (:func:`job_colour`), up to ``max_workers_per_gpu``
  bands per cell. The bottom of a band is a bar as long as the job's SPB level over the
  maximum level (no bar at level 0, full backprop), black for the rotating pattern and white for
  the static one. A GPU that holds workers of more than one job (shared) has a white border;
* the waiting queue: every waiting job in arrival order as a block in its colour, as wide as
  :data:`QUEUE_PX_PER_GPU` pixels per GPU it asks for, and its length (``WAIT n``).

The GPUs show the decision being built for the next round (what the agent has decided so far,
the running jobs it has not touched kept as they are); once the episode is over, the allocation
in force. Text uses a built-in 3x5 bitmap font drawn at twice its size.
"""
from __future__ import annotations

import colorsys
from collections.abc import Iterable, Mapping

import numpy as np

from .spb import Pattern
from .state import ClusterState, JobDecision

#: pixel sizes of the layout
SCALE = 2                                  # font pixels per glyph pixel
CHAR_W, CHAR_H = 3 * SCALE, 5 * SCALE      # one glyph
ADVANCE = CHAR_W + SCALE                   # glyph plus spacing
MARGIN = 8
HEADER_H = CHAR_H + 2 * MARGIN
LABEL_W = 5 * ADVANCE                      # "N127" plus a gap
CELL_W = 40
CELL_GAP = 4
BORDER = 2
BAND_H = 12
BAND_GAP = 2
LEVEL_BAR_H = 4
NODES_PER_COLUMN = 16
QUEUE_PX_PER_GPU = 6
QUEUE_BLOCK_H = 10
QUEUE_ROWS = 3
MIN_WIDTH = 512

#: colours (RGB)
BACKGROUND = (16, 16, 16)
FREE_GPU = (56, 56, 56)
CELL_EDGE = (32, 32, 32)
SHARED_EDGE = (255, 255, 255)
TEXT = (230, 230, 230)
ROTATING_BAR = (0, 0, 0)
STATIC_BAR = (255, 255, 255)

_GOLDEN = 0.618033988749895

_FONT_ROWS = {
    "0": ("111", "101", "101", "101", "111"), "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"), "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"), "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"), "7": ("111", "001", "010", "010", "010"),
    "8": ("111", "101", "111", "101", "111"), "9": ("111", "101", "111", "001", "111"),
    "A": ("010", "101", "111", "101", "101"), "B": ("110", "101", "110", "101", "110"),
    "C": ("011", "100", "100", "100", "011"), "D": ("110", "101", "101", "101", "110"),
    "E": ("111", "100", "110", "100", "111"), "F": ("111", "100", "110", "100", "100"),
    "G": ("011", "100", "101", "101", "011"), "H": ("101", "101", "111", "101", "101"),
    "I": ("111", "010", "010", "010", "111"), "J": ("001", "001", "001", "101", "010"),
    "K": ("101", "101", "110", "101", "101"), "L": ("100", "100", "100", "100", "111"),
    "M": ("101", "111", "111", "101", "101"), "N": ("110", "101", "101", "101", "101"),
    "O": ("010", "101", "101", "101", "010"), "P": ("110", "101", "110", "100", "100"),
    "Q": ("010", "101", "101", "110", "011"), "R": ("110", "101", "110", "101", "101"),
    "S": ("011", "100", "010", "001", "110"), "T": ("111", "010", "010", "010", "010"),
    "U": ("101", "101", "101", "101", "111"), "V": ("101", "101", "101", "101", "010"),
    "W": ("101", "101", "111", "111", "101"), "X": ("101", "101", "010", "101", "101"),
    "Y": ("101", "101", "010", "010", "010"), "Z": ("111", "001", "010", "100", "111"),
    ":": ("000", "010", "000", "010", "000"), "/": ("001", "001", "010", "100", "100"),
    "+": ("000", "010", "111", "010", "000"), "-": ("000", "000", "111", "000", "000"),
    ".": ("000", "000", "000", "000", "010"), ",": ("000", "000", "000", "010", "100"),
    "=": ("000", "111", "000", "111", "000"), " ": ("000", "000", "000", "000", "000"),
}


def _glyph(rows: tuple[str, ...]) -> np.ndarray:
    """A glyph's boolean mask at :data:`SCALE` times its 3x5 size."""
    small = np.array([[c == "1" for c in r] for r in rows], dtype=bool)
    return np.kron(small, np.ones((SCALE, SCALE), dtype=bool)).astype(bool)


GLYPHS = {ch: _glyph(rows) for ch, rows in _FONT_ROWS.items()}


def job_colour(job_id: int) -> tuple[int, int, int]:
    """A job's RGB colour: hues spaced by the golden ratio, so jobs with close ids differ; always
    saturated and bright, so never the grey of a free GPU."""
    hue = (job_id * _GOLDEN) % 1.0
    sat = 0.55 + 0.35 * ((job_id * 7) % 3) / 2  # 0.55, 0.725 or 0.9
    r, g, b = colorsys.hsv_to_rgb(hue, sat, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def draw_text(img: np.ndarray, x: int, y: int, text: str, colour=TEXT) -> None:
    """Write ``text`` (upper-cased; characters without a glyph are skipped) with its top-left at
    pixel (x, y), clipped at the frame's right edge."""
    width = img.shape[1]
    for ch in text.upper():
        if x + CHAR_W > width:
            return
        mask = GLYPHS.get(ch)
        if mask is not None:
            img[y:y + CHAR_H, x:x + CHAR_W][mask] = colour
        x += ADVANCE


def clock_text(time_s: float) -> str:
    """Simulated seconds as ``h:mm:ss`` (hours unbounded)."""
    s = int(time_s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _round_up(v: int, to: int = 16) -> int:
    return -(-v // to) * to


class FrameRenderer:
    """Draws :class:`~jigsaw_env.state.ClusterState` frames for one cluster shape. The empty
    frame (labels, free GPUs) is drawn once; each frame copies it and draws the jobs."""

    def __init__(self, num_nodes: int, gpus_per_node: int, max_workers_per_gpu: int, max_level: int):
        self.gpus_per_node = gpus_per_node
        self.max_workers = max_workers_per_gpu
        self.max_level = max_level
        self.cell_h = 2 * BORDER + 2 + max_workers_per_gpu * (BAND_H + BAND_GAP)
        self.row_h = self.cell_h + CELL_GAP
        rows = min(num_nodes, NODES_PER_COLUMN)
        columns = -(-num_nodes // NODES_PER_COLUMN)
        self.column_w = LABEL_W + gpus_per_node * (CELL_W + CELL_GAP) + MARGIN
        width = max(MIN_WIDTH, MARGIN + columns * self.column_w)
        self.queue_y = HEADER_H + rows * self.row_h + MARGIN
        self.queue_blocks_y = self.queue_y + CHAR_H + MARGIN // 2
        height = self.queue_blocks_y + QUEUE_ROWS * (QUEUE_BLOCK_H + BAND_GAP) + MARGIN
        self.shape = (_round_up(height), _round_up(width), 3)
        self.cell_xy = np.array([self._cell_origin(g) for g in range(num_nodes * gpus_per_node)])
        self._empty = self._draw_empty(num_nodes)
        self._colours: dict[int, tuple[int, int, int]] = {}

    def _cell_origin(self, gpu: int) -> tuple[int, int]:
        """Top-left pixel (x, y) of a GPU's cell."""
        node, slot = divmod(gpu, self.gpus_per_node)
        column, row = divmod(node, NODES_PER_COLUMN)
        x = MARGIN + column * self.column_w + LABEL_W + slot * (CELL_W + CELL_GAP)
        return x, HEADER_H + row * self.row_h

    def _draw_empty(self, num_nodes: int) -> np.ndarray:
        img = np.empty(self.shape, dtype=np.uint8)
        img[:] = BACKGROUND
        for node in range(num_nodes):
            column, row = divmod(node, NODES_PER_COLUMN)
            label_y = HEADER_H + row * self.row_h + (self.cell_h - CHAR_H) // 2
            draw_text(img, MARGIN + column * self.column_w, label_y, f"N{node}")
        for x, y in self.cell_xy:
            img[y:y + self.cell_h, x:x + CELL_W] = CELL_EDGE
            img[y + BORDER:y + self.cell_h - BORDER, x + BORDER:x + CELL_W - BORDER] = FREE_GPU
        return img

    def colour(self, job_id: int) -> tuple[int, int, int]:
        c = self._colours.get(job_id)
        if c is None:
            c = self._colours[job_id] = job_colour(job_id)
        return c

    def band_box(self, gpu: int, index: int) -> tuple[int, int, int, int]:
        """Pixel box (y0, y1, x0, x1) of the ``index``-th worker band of a GPU's cell."""
        x, y = self.cell_xy[gpu]
        y0 = y + BORDER + 1 + index * (BAND_H + BAND_GAP)
        return y0, y0 + BAND_H, x + BORDER + 1, x + CELL_W - BORDER - 1

    def frame(self, state: ClusterState, decision: Mapping[int, JobDecision], num_finished: int) -> np.ndarray:
        """The frame of ``state`` with the GPUs as ``decision`` places the jobs."""
        img = self._empty.copy()
        workers = [0] * len(self.cell_xy)
        owners: list[set[int] | None] = [None] * len(self.cell_xy)
        for jid, jd in decision.items():
            self._draw_job(img, jid, jd, workers, owners)
        for gpu, jobs in enumerate(owners):
            if jobs is not None and len(jobs) > 1:
                self._draw_shared_edge(img, gpu)
        waiting = [state.jobs[j] for j in state.active_ids if j not in decision]
        header = (f"T {clock_text(state.time_s)}  ROUND {state.round}  RUN {len(decision)}  "
                  f"WAIT {len(waiting)}  DONE {num_finished}/{len(state.jobs)}")
        draw_text(img, MARGIN, MARGIN, header)
        self._draw_queue(img, ((j.job_id, j.num_gpus) for j in waiting), len(waiting))
        return img

    def _draw_job(self, img: np.ndarray, jid: int, jd: JobDecision, workers: list[int],
                  owners: list[set[int] | None]) -> None:
        colour = self.colour(jid)
        bar = STATIC_BAR if jd.pattern is Pattern.STATIC else ROTATING_BAR
        for gpu in jd.gpus:
            index = workers[gpu]
            workers[gpu] = index + 1
            if owners[gpu] is None:
                owners[gpu] = {jid}
            else:
                owners[gpu].add(jid)
            if index >= self.max_workers:
                continue  # more workers than the cap allows cannot be placed; nothing to draw
            y0, y1, x0, x1 = self.band_box(gpu, index)
            img[y0:y1, x0:x1] = colour
            if jd.level and self.max_level:
                length = max(1, round((x1 - x0) * jd.level / self.max_level))
                img[y1 - LEVEL_BAR_H:y1, x0:x0 + length] = bar

    def _draw_shared_edge(self, img: np.ndarray, gpu: int) -> None:
        x, y = self.cell_xy[gpu]
        h = self.cell_h
        img[y:y + BORDER, x:x + CELL_W] = SHARED_EDGE
        img[y + h - BORDER:y + h, x:x + CELL_W] = SHARED_EDGE
        img[y:y + h, x:x + BORDER] = SHARED_EDGE
        img[y:y + h, x + CELL_W - BORDER:x + CELL_W] = SHARED_EDGE

    def _draw_queue(self, img: np.ndarray, jobs: Iterable[tuple[int, int]], count: int) -> None:
        """Waiting jobs as blocks (job id, GPUs asked for), wrapped into :data:`QUEUE_ROWS` rows."""
        right = img.shape[1] - MARGIN
        x, row, shown = MARGIN, 0, 0
        for jid, gpus in jobs:
            w = min(right - MARGIN, gpus * QUEUE_PX_PER_GPU)
            if x + w > right:
                row, x = row + 1, MARGIN
                if row == QUEUE_ROWS:
                    break
            y = self.queue_blocks_y + row * (QUEUE_BLOCK_H + BAND_GAP)
            img[y:y + QUEUE_BLOCK_H, x:x + w] = self.colour(jid)
            x += w + BAND_GAP
            shown += 1
        hidden = f" (+{count - shown} NOT SHOWN)" if shown < count else ""
        draw_text(img, MARGIN, self.queue_y, f"WAIT {count}{hidden}")
