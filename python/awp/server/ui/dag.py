"""A layered ("Sugiyama-style") layout of a run's task graph, computed on the server and drawn as inline SVG.

Why on the server: the graph is known in full when the page is rendered (``awp.run_tasks`` gives every task
with its ``depends_on``), it never changes shape during a run (only statuses change, which the page patches
in place), and a layout in Python needs no JavaScript library, no build step and no vendored code. The
browser receives plain SVG with fixed coordinates, so even a slow machine draws it at once.

The steps, each linear (or near) in tasks + edges:

1. **Layers** by longest path from the roots (a task's layer is one more than its deepest dependency): the
   roots come first and every edge points to a later layer.
2. **Order within a layer** by a few barycenter sweeps (down, then up): a task is placed near the mean
   position of its neighbours in the other layers, which removes most edge crossings of real DAGs
   (fan-out / fan-in, chains). Definition order breaks ties, so the layout is stable from render to render.
3. **Coordinates**: layers are columns, left to right. A layer taller than ``rows`` tasks wraps into several
   sub-columns. Up to ``wrap_after`` columns stay in one row (the drawing scrolls sideways in its box), so a
   graph of a few layers (the demo's seven, examples/demo-etl.yaml) has every edge going left to right; past
   that they wrap into bands of ``columns`` below each other, so the drawing stays about a screen wide whatever
   the shape (a 300-task chain or a 300-task fan-out), an edge into a later band coming back from the right.

Dynamic workflows (docs/dynamic.md): the instances of a ``for_each`` task (``each[0]``, ``each[1]``, ... up to
10,000 of them, rows with ``mapped_task`` set) are not nodes: :func:`tasks_from_rows` leaves them out, and the mapped
task's node carries their count instead (:attr:`Node.badge`, "succeeded/instances"); the task panel lists them, a
page at a time (python/awp/server/ui/runview.py). So the graph is the definition's, whatever the lists hold.

A run with more tasks than fit one drawing is *paged*: the tasks, in layered order, are cut into pages of at
most ``page_size``, each page drawn on its own (edges whose other end is on another page are counted, not
drawn), and :func:`overview` collapses the whole graph into one box per layer (or band of layers) with the
number of tasks by status. A page whose tasks are joined by more than ``MAX_EDGES`` dependencies is drawn
without its edges (the page says so): what one page weighs and costs to render stays bounded whatever the
density (a 300-task page of a dense run drew 17,000 edges: 6.6 MB of HTML).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NODE_W = 150
NODE_H = 28
COL_GAP = 48
ROW_GAP = 8
BAND_GAP = 36
PAD = 10
ROWS = 16  # tasks per sub-column before a layer wraps
COLUMNS = 6  # columns per band once the drawing wraps
WRAP_AFTER = 12  # columns drawn in one row, scrolling sideways, before the drawing wraps into bands of COLUMNS
PAGE_SIZE = 300  # tasks drawn at most on one page
MAX_EDGES = 2000  # dependencies drawn at most on one page; past that the page draws its tasks alone


@dataclass(frozen=True)
class Task:
    key: str
    status: str
    depends_on: tuple[str, ...] = ()
    attempts: int = 0
    wait: str = ""  # what holds it while it waits: "reason: detail" (awp.run_tasks wait_reason / wait_detail)
    skip_reason: str = ""  # a skipped task's: condition_false or dependency_failed (awp.run_tasks skip_reason)
    item_count: int | None = None  # a mapped (for_each) task's instances, once created (None before, or not mapped)
    instances_succeeded: int = 0  # ...and how many of them succeeded


@dataclass
class Node:
    key: str
    status: str
    layer: int
    x: int
    y: int
    attempts: int = 0
    w: int = NODE_W
    h: int = NODE_H
    wait: str = ""
    skip_reason: str = ""
    item_count: int | None = None
    instances_succeeded: int = 0

    @property
    def badge(self) -> str:
        """A mapped task's count, "succeeded/instances" (e.g. "12/40"); "" before its instances exist."""
        return "" if self.item_count is None else f"{self.instances_succeeded}/{self.item_count}"

    @property
    def label(self) -> str:
        room = label_room(self.item_count)
        return self.key if len(self.key) <= room else self.key[: room - 1] + "…"


def label_room(item_count: int | None) -> int:
    """Characters of a node's key shown: 19, fewer beside a count badge as wide as it can grow ("40/40": 10). The
    key and the badge share 113 px (the node's width but the glyph, the margins and a gap): about 7 px a character of
    the badge (11 px digits, app.css) and 7.5 of the key (12.5 px, DejaVu Sans, Chromium's on Debian: its widest).
    python/awp/server/ui/static/app.js computes the same for a badge that appears while the page is open."""
    if item_count is None:
        return 19
    digits = len(str(item_count))
    return max(4, int((113 - 7 * (2 * digits + 1)) / 7.5))


@dataclass
class Edge:
    source: str
    target: str
    d: str  # the SVG path


@dataclass
class Drawing:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int
    hidden_edges: int = 0  # edges with one end on another page
    omitted_edges: int = 0  # edges within the page, not drawn: more than MAX_EDGES


@dataclass
class Layered:
    """The layers of a whole run: ``order`` is every task key, layer by layer, in drawing order."""

    layer_of: dict[str, int]
    layers: list[list[str]]
    tasks: dict[str, Task]
    dependants: dict[str, list[str]] = field(default_factory=dict)

    @property
    def order(self) -> list[str]:
        return [key for layer in self.layers for key in layer]


def tasks_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Task]:
    """Tasks from ``awp.run_tasks`` rows, without the instances of mapped tasks (rows with ``mapped_task``)."""
    return [
        Task(
            r["task_key"],
            r["status"],
            tuple(r.get("depends_on") or ()),
            int(r.get("attempts") or 0),
            f"{r['wait_reason']}: {r.get('wait_detail') or ''}".rstrip(": ") if r.get("wait_reason") else "",
            r.get("skip_reason") or "",
            r.get("item_count"),
            int(r.get("instances_succeeded") or 0),
        )
        for r in rows
        if r.get("mapped_task") is None
    ]


def layer(tasks: Sequence[Task], sweeps: int | None = None) -> Layered:
    """Longest-path layers, then barycenter ordering within each layer (``sweeps`` down+up passes)."""
    by_key = {t.key: t for t in tasks}
    deps = {t.key: [d for d in t.depends_on if d in by_key and d != t.key] for t in tasks}
    dependants: dict[str, list[str]] = {t.key: [] for t in tasks}
    for key, ds in deps.items():
        for d in ds:
            dependants[d].append(key)
    # Kahn's algorithm in definition order; the layer is the longest path from a root.
    remaining = {key: len(ds) for key, ds in deps.items()}
    layer_of: dict[str, int] = {}
    queue = [t.key for t in tasks if remaining[t.key] == 0]
    head = 0
    while head < len(queue):
        key = queue[head]
        head += 1
        layer_of[key] = max((layer_of[d] + 1 for d in deps[key]), default=0)
        for child in dependants[key]:
            remaining[child] -= 1
            if remaining[child] == 0:
                queue.append(child)
    if len(layer_of) < len(tasks):  # a cycle (the database refuses them): put what is left after the rest
        last = max(layer_of.values(), default=-1) + 1
        for t in tasks:
            layer_of.setdefault(t.key, last)
    layers: list[list[str]] = [[] for _ in range(max(layer_of.values(), default=-1) + 1)]
    for t in tasks:
        layers[layer_of[t.key]].append(t.key)
    if sweeps is None:
        sweeps = 4 if len(tasks) <= 2000 else 1
    _barycenter(layers, deps, dependants, sweeps)
    return Layered(layer_of, layers, by_key, dependants)


def _barycenter(
    layers: list[list[str]], deps: dict[str, list[str]], dependants: dict[str, list[str]], sweeps: int
) -> None:
    pos: dict[str, float] = {}

    def place(keys: list[str]) -> None:
        n = len(keys)
        for i, key in enumerate(keys):
            pos[key] = (i + 0.5) / n

    for keys in layers:
        place(keys)

    def sort(keys: list[str], neighbours: dict[str, list[str]]) -> None:
        def weight(key: str) -> float:
            ns = neighbours[key]
            return sum(pos[n] for n in ns) / len(ns) if ns else pos[key]

        keys.sort(key=weight)  # stable: ties keep the previous order
        place(keys)

    for _ in range(sweeps):
        for keys in layers[1:]:
            sort(keys, deps)
        for keys in reversed(layers[:-1]):
            sort(keys, dependants)


def pages(layered: Layered, page_size: int = PAGE_SIZE, keys: Sequence[str] | None = None) -> list[list[str]]:
    """``keys`` (default: every task, in layered order) cut into pages of at most ``page_size``."""
    order = list(keys) if keys is not None else layered.order
    return [order[i : i + page_size] for i in range(0, len(order), page_size)] or [[]]


def draw(
    layered: Layered,
    keys: Sequence[str] | None = None,
    rows: int = ROWS,
    columns: int = COLUMNS,
    max_edges: int = MAX_EDGES,
    wrap_after: int = WRAP_AFTER,
) -> Drawing:
    """Coordinates and edge paths for ``keys`` (default: every task; must be in layered order); no edge at all
    when more than ``max_edges`` join them (a dense page would weigh megabytes and take the browser seconds to
    draw, for a tangle nobody could follow; the task panel lists each task's dependencies)."""
    keys = layered.order if keys is None else list(keys)
    on_page = set(keys)
    # Group by layer (keys are in layered order), then cut each layer into sub-columns of `rows` tasks.
    sub_columns: list[list[str]] = []
    current_layer = None
    for key in keys:
        lay = layered.layer_of[key]
        if lay != current_layer or len(sub_columns[-1]) >= rows:
            sub_columns.append([])
            current_layer = lay
        sub_columns[-1].append(key)
    if len(sub_columns) <= max(wrap_after, columns):
        columns = max(len(sub_columns), 1)  # one row: no edge runs backwards
    pitch_x, pitch_y = NODE_W + COL_GAP, NODE_H + ROW_GAP
    nodes: dict[str, Node] = {}
    y0 = PAD
    width = 0
    for band_start in range(0, len(sub_columns), columns):
        band = sub_columns[band_start : band_start + columns]
        tallest = max(len(c) for c in band)
        for i, col in enumerate(band):
            x = PAD + i * pitch_x
            offset = (tallest - len(col)) * pitch_y // 2  # centre short columns
            for row, key in enumerate(col):
                t = layered.tasks[key]
                nodes[key] = Node(
                    key,
                    t.status,
                    layered.layer_of[key],
                    x,
                    y0 + offset + row * pitch_y,
                    t.attempts,
                    wait=t.wait,
                    skip_reason=t.skip_reason,
                    item_count=t.item_count,
                    instances_succeeded=t.instances_succeeded,
                )
            width = max(width, x + NODE_W + PAD)
        y0 += tallest * pitch_y - ROW_GAP + BAND_GAP
    height = max(y0 - BAND_GAP + PAD, 2 * PAD)
    links: list[tuple[str, str]] = []
    hidden = 0
    for key in keys:
        for dep in layered.tasks[key].depends_on:
            if dep not in layered.tasks or dep == key:
                continue
            if dep not in on_page:
                hidden += 1
                continue
            links.append((dep, key))
    # Edges to tasks on other pages, seen from the dependency's side.
    for key in keys:
        hidden += sum(1 for child in layered.dependants.get(key, ()) if child not in on_page)
    omitted = len(links) if len(links) > max_edges else 0
    edges = [] if omitted else [Edge(dep, key, _path(nodes[dep], nodes[key])) for dep, key in links]
    return Drawing(list(nodes.values()), edges, max(width, 2 * PAD), height, hidden, omitted)


def _path(a: Node, b: Node) -> str:
    x1, y1 = a.x + a.w, a.y + a.h // 2
    x2, y2 = b.x, b.y + b.h // 2
    if x2 > x1:  # the usual case: the next column(s) to the right
        dx = max(16, (x2 - x1) // 2)
        return f"M{x1} {y1} C{x1 + dx} {y1} {x2 - dx} {y2} {x2} {y2}"
    # The target wrapped into a later band (below, further left): leave right, come in from the left.
    return f"M{x1} {y1} C{x1 + 40} {y1} {x2 - 40} {y2} {x2} {y2}"


def status_digits(order: Sequence[str]) -> dict[str, str]:
    """Each status of ``order`` as one character, its index in base 36: how the page's state lists many statuses."""
    return {s: "0123456789abcdefghijklmnopqrstuvwxyz"[i] for i, s in enumerate(order)}


BOX_W = 170
BOX_H = 64


@dataclass
class Band:
    """One box of the overview: the layers ``first``..``last`` and their tasks by status."""

    index: int
    first: int
    last: int
    size: int
    counts: dict[str, int]
    first_page: int  # the page that shows this band's first task
    x: int = 0
    y: int = 0
    w: int = BOX_W
    h: int = BOX_H


@dataclass
class Overview:
    bands: list[Band]
    links: list[tuple[int, int, str]]  # (from band, to band, SVG path): one per pair of linked boxes
    members: list[list[str]]  # the task keys of each band, for the page to keep the counts live
    width: int
    height: int
    statuses: list[list[str]] = field(default_factory=list)  # the status of each member

    def status_codes(self, order: Sequence[str]) -> list[str]:
        """Each band's member statuses as one character each: the index in ``order`` (base 36)."""
        index = status_digits(order)
        return ["".join(index.get(s, "z") for s in band) for band in self.statuses]


def overview(layered: Layered, page_size: int = PAGE_SIZE, max_boxes: int = 24, columns: int = COLUMNS) -> Overview:
    """The whole graph collapsed into at most ``max_boxes`` boxes of consecutive layers."""
    n_layers = len(layered.layers)
    per_box = max(1, math.ceil(n_layers / max_boxes))
    bands: list[Band] = []
    members: list[list[str]] = []
    band_of: dict[str, int] = {}
    seen = 0
    pitch_x, pitch_y = BOX_W + COL_GAP, BOX_H + BAND_GAP
    for b, first in enumerate(range(0, n_layers, per_box)):
        last = min(first + per_box, n_layers) - 1
        counts: dict[str, int] = {}
        keys = [key for lay in range(first, last + 1) for key in layered.layers[lay]]
        for key in keys:
            status = layered.tasks[key].status
            counts[status] = counts.get(status, 0) + 1
            band_of[key] = b
        x, y = PAD + (b % columns) * pitch_x, PAD + (b // columns) * pitch_y
        bands.append(Band(b, first, last, len(keys), counts, seen // page_size, x, y))
        members.append(keys)
        seen += len(keys)
    pairs = sorted(
        {(band_of[d], band_of[k]) for k, t in layered.tasks.items() for d in t.depends_on if d in band_of}
        - {(b, b) for b in range(len(bands))}
    )
    links = []
    for i, j in pairs:
        a, c = bands[i], bands[j]
        x1, y1, x2, y2 = a.x + a.w, a.y + a.h // 2, c.x, c.y + c.h // 2
        dx = max(16, (x2 - x1) // 2) if x2 > x1 else 40
        links.append((i, j, f"M{x1} {y1} C{x1 + dx} {y1} {x2 - dx} {y2} {x2} {y2}"))
    width = PAD + min(len(bands), columns) * pitch_x - COL_GAP + PAD
    height = PAD + math.ceil(len(bands) / columns) * pitch_y - BAND_GAP + PAD
    statuses = [[layered.tasks[k].status for k in keys] for keys in members]
    return Overview(bands, links, members, max(width, 2 * PAD), max(height, 2 * PAD), statuses)
