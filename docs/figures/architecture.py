"""The package drawn from its own imports: ``python docs/figures/architecture.py``.

Every module of ``numba_softmax`` is parsed with :mod:`ast` (nothing is imported, so no
GPU, numba or torch is needed); every import of another module of the package — at the
top of a file or inside a function, absolute or relative — is one edge.  Modules are
gathered into groups (a folder of ``kernels/``, ``arrays/``, ``runtime/`` …, or a few
top-level modules together), and the edges into one arrow from group to group, labelled
with how many module → module imports it stands for.  The SVG is written by hand (no
matplotlib, no graphviz): the same bytes on every run, so ``git diff`` shows only a real
change of the imports.

The docs build runs :func:`write` (``docs/conf.py``), so ``docs/figures/architecture.svg``
follows the code; ``docs/architecture.md`` shows it.
"""

import ast
import collections
import re
import sys
from pathlib import Path
from xml.sax.saxutils import escape

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PACKAGE = "numba_softmax"
OUT = HERE / "architecture.svg"
TABLE = HERE / "architecture_folders.txt"  # MyST text that docs/architecture.md includes

# Top-level modules outside the box of the public API: the command line's, and three
# with a box of their own.
CLI = {"cli", "__main__", "_tour_attention"}
OWN_BOX = {"combine", "draws", "plans"}

# Rows, top to bottom: who imports sits above what it imports.  A group no row names goes
# to the top row (a new folder), the first row of the kernels/ frame (a new kernels/
# folder) or the row of ``api`` (anything else).
ROWS = [
    ["ring/", "cli", "bench/"],
    ["api", "textbook/", "integrations/"],
    ["reference/", "plans", "arrays/"],
    ["kernels/topk", "kernels/softmax", "kernels/backward", "kernels/decode"],
    ["kernels/rows", "kernels/attention"],
    ["kernels/hw"],
    ["combine", "draws", "runtime/"],
]

CAPTION = {
    "api": "the public functions",
    "cli": "numba-softmax …",
    "bench/": "the benchmark",
    "ring/": "ring attention",
    "textbook/": "the ladder a reader walks",
    "integrations/": "optional integrations",
    "reference/": "NumPy, float64",
    "plans": "launch plans",
    "arrays/": "NumPy · CuPy · torch · Numba",
    "kernels/softmax": "softmax of rows",
    "kernels/topk": "softmax + top-k, sampling",
    "kernels/backward": "gradients",
    "kernels/decode": "split-KV, paged cache",
    "kernels/rows": "a row in chunks, reductions",
    "kernels/attention": "FlashAttention forward",
    "kernels/hw": "hardware primitives",
    "draws": "seeded random draws",
    "combine": "the (m, ℓ) monoid",
    "runtime/": "launch, replay, simulator",
}


# --- the imports -----------------------------------------------------------------------

def modules(root=ROOT):
    """``{dotted name: (path, is_package)}`` for every module of the package."""
    out = {}
    for path in sorted((Path(root) / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _absolute(name, package, node):
    """The module an ``import`` / ``from … import`` names, relative levels resolved."""
    if not node.level:
        return node.module
    base = name.split(".") if package else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root=ROOT):
    """Every (importer, imported) pair of modules of the package, each pair once."""
    mods = modules(root)
    pairs = set()
    for name, (path, package) in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(name, package, node)
                named = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                         for a in node.names]
            else:
                continue
            for target in named:
                if not target or target.split(".")[0] != PACKAGE:
                    continue
                while target not in mods:  # an attribute of a module: the module
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    pairs.add((name, target))
    return sorted(pairs)


def group(name, package=False):
    """The box a module is drawn in (``package``: the module is a folder's ``__init__``)."""
    parts = name.split(".")[1:]
    if not parts:
        return "api"
    if parts[0] == "kernels":
        return "kernels" if len(parts) == 1 else "kernels/" + parts[1]
    if len(parts) > 1 or package:
        return parts[0] + "/"
    if parts[0] in CLI:
        return "cli"
    return parts[0] if parts[0] in OWN_BOX else "api"


def groups(root=ROOT):
    """``{group: [module names]}`` and ``{(group, group): module → module imports}``."""
    mods = modules(root)
    members = collections.defaultdict(list)
    for name, (_, package) in mods.items():
        g = group(name, package)
        if g != "kernels":  # kernels/__init__.py: the folders' table of contents, no code
            members[g].append("__init__" if package else name.split(".")[-1])
    edges = collections.Counter()
    for a, b in imports(root):
        ga, gb = group(a, mods[a][1]), group(b, mods[b][1])
        if ga != gb and "kernels" not in (ga, gb):
            edges[(ga, gb)] += 1
    for g in members:
        members[g].sort(key=lambda m: (m != "__init__", m))
    return dict(members), dict(edges)


# --- the drawing -----------------------------------------------------------------------

BOX_W, GAP_X, GAP_Y, MARGIN, PAD = 210, 30, 78, 20, 12
LANE, LANE_IN, STEP = 76, 34, 9  # the side lanes of the figure and of the kernels/ frame
LINE, HEAD = 14, 30  # a text line; a box's title and caption
FILL = {"kernels/": "#dcefdc", "runtime/": "#dde6f2", "arrays/": "#dde6f2", "plans": "#dde6f2",
        "combine": "#fbe3c2", "draws": "#fbe3c2", "reference/": "#eeeeee"}
INKS = ["#1f5f9e", "#b35a1f", "#2a7f62", "#7a4b94", "#a23b5a", "#6b6b1f", "#1f7f8f",
        "#8c4a2f", "#4a4aa8", "#3f7f2a", "#9e1f6f", "#555555"]


def _fill(g):
    return next((c for key, c in FILL.items() if g.startswith(key)), "#ffffff")


def _wrap(names, width, char=6.7):
    """Module names in lines of at most ``width`` pixels, joined by a middle dot."""
    lines, line = [], ""
    for n in names:
        trial = f"{line} · {n}" if line else n
        if line and len(trial) * char > width:
            lines.append(line)
            line = n
        else:
            line = trial
    return lines + ([line] if line else [])


def _rows(members):
    """The rows of the figure: lists of groups, and the kernels/ frame's rows in place of
    ``"kernels"``; a group no row names goes to the row of its kind."""
    outer = [list(r) for r in ROWS if not r[0].startswith("kernels/")]
    outer.insert(3, "kernels")
    inner = [list(r) for r in ROWS if r[0].startswith("kernels/")]
    known = {g for row in ROWS for g in row}
    for g in sorted(set(members) - known):
        (inner[0] if g.startswith("kernels/") else outer[1 if "/" not in g else 0]).append(g)
    outer = [r if r == "kernels" else [g for g in r if g in members] for r in outer]
    inner = [[g for g in r if g in members] for r in inner]
    return [r for r in outer if r], [r for r in inner if r]


def _layout(members):
    """Boxes (x, y, w, h, row, container, lines) and the kernels/ frame, in pixels."""
    outer, inner = _rows(members)

    def span(n, w=BOX_W):
        return n * w + (n - 1) * GAP_X

    inner_w = max(span(len(r)) for r in inner)
    frame_w = inner_w + 2 * (PAD + LANE_IN)
    content = max([frame_w] + [span(len(r)) for r in outer if r != "kernels"])
    left = MARGIN + LANE
    boxes, frame = {}, None

    def place(row, y, x0, width, index, container, wide):
        w = (width - GAP_X * (len(row) - 1)) / len(row) if wide else BOX_W
        texts = {g: _wrap([m for m in members[g] if m != "__init__" or g == "api"], w - 14)
                 for g in row}
        h = HEAD + LINE * max(len(t) for t in texts.values()) + 12
        x = x0 + (width - span(len(row), w)) / 2
        for g in row:
            boxes[g] = dict(x=x, y=y, w=w, h=h, row=index, box=container, lines=texts[g])
            x += w + GAP_X
        return y + h

    y = MARGIN + 26
    for index, row in enumerate(outer):
        if row == "kernels":
            fx = left + (content - frame_w) / 2
            yy = y + 24
            for k, r in enumerate(inner):
                yy = place(r, yy, fx + PAD + LANE_IN, inner_w, k, "kernels",
                           wide=k == len(inner) - 1 and len(r) == 1) + GAP_Y
            frame = dict(x=fx, y=y, w=frame_w, h=yy - GAP_Y + PAD - y, row=index, box="figure")
            y = frame["y"] + frame["h"]
        else:
            y = place(row, y, left, content, index, "figure", wide=index == len(outer) - 1)
        y += GAP_Y
    size = (2 * MARGIN + 2 * LANE + content, y - GAP_Y + MARGIN + 30)
    return boxes, frame, size


def _cubic(p0, p1, p2, p3, t):
    return tuple((1 - t) ** 3 * a + 3 * (1 - t) ** 2 * t * b + 3 * (1 - t) * t * t * c
                 + t ** 3 * d for a, b, c, d in zip(p0, p1, p2, p3))


def _curve(p0, p1, p2, p3, move=True):
    """A cubic Bézier as SVG path text (with its ``M`` start when ``move``)."""
    text = "C{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}".format(*p1, *p2, *p3)
    return ("M{:.1f},{:.1f} ".format(*p0) if move else "") + text


def _routes(nodes, edges, lanes):
    """One path (SVG ``d``), label point and dash flag per edge of one container.  An edge
    to the next row is a curve; one that skips rows runs down a side lane, outside every
    box; one within a row goes side to side; one that points up is dashed."""
    def cx(g):
        return nodes[g]["x"] + nodes[g]["w"] / 2

    left, right, in_frame = lanes
    kind, lane_x = {}, {}
    for a, b in edges:
        ra, rb = nodes[a]["row"], nodes[b]["row"]
        kind[a, b] = ("down" if rb == ra + 1 else "lane" if rb > ra else
                      "side" if rb == ra else "up")
    for on_left in (True, False):
        mine = [e for e in edges if kind[e] == "lane"
                and ((cx(e[0]) + cx(e[1])) / 2 < (left + right) / 2) == on_left]
        mine.sort(key=lambda e: (-nodes[e[1]]["row"], nodes[e[0]]["row"], cx(e[0])))
        step = min(STEP, ((LANE_IN if in_frame else LANE) - 10) / max(1, len(mine)))
        for k, e in enumerate(mine):  # the outermost lane for the edge that goes lowest
            lane_x[e] = left + 6 + k * step if on_left else right - 6 - k * step
    # ports: spread along the top and the bottom of each box, ordered by where the other
    # end (or the lane) lies, so that arrows do not cross at a box
    sides = collections.defaultdict(list)
    for a, b in edges:
        if kind[a, b] in ("down", "lane"):
            sides[a, "bottom"].append((lane_x.get((a, b), cx(b)), "out", b))
            sides[b, "top"].append((lane_x.get((a, b), cx(a)), "in", a))
        elif kind[a, b] == "up":
            sides[a, "top"].append((cx(b), "out", b))
            sides[b, "bottom"].append((cx(a), "in", a))
    port = {}
    for (g, side), ends in sides.items():  # two arrows between the same boxes: no cross
        ends.sort(key=lambda e: (e[0], (e[1] == "in") == (side == "bottom"), e[2]))
        for k, (_, role, other) in enumerate(ends):
            port[role, g, other] = nodes[g]["x"] + nodes[g]["w"] * (k + 1) / (len(ends) + 1)
    routes = {}
    for a, b in edges:
        sa, sb, how = nodes[a], nodes[b], kind[a, b]
        if how == "side":
            to_right = sb["x"] > sa["x"]
            x0 = sa["x"] + (sa["w"] if to_right else 0)
            x1 = sb["x"] + (0 if to_right else sb["w"])
            y = max(sa["y"], sb["y"]) + min(sa["h"], sb["h"]) / 2
            routes[a, b] = (f"M{x0:.1f},{y:.1f} L{x1:.1f},{y:.1f}", ((x0 + x1) / 2, y - 8), False)
            continue
        x0, x1 = port["out", a, b], port["in", b, a]
        if how == "up":
            y0, y1 = sa["y"], sb["y"] + sb["h"]
            c = (x0, y0), (x0, y0 - GAP_Y / 2), (x1, y1 + GAP_Y / 2), (x1, y1)
            routes[a, b] = (_curve(*c), _cubic(*c, 0.7), True)
            continue
        y0, y1 = sa["y"] + sa["h"], sb["y"]
        if how == "down":
            c = (x0, y0), (x0, (y0 + y1) / 2), (x1, (y0 + y1) / 2), (x1, y1)
            d = _curve(*c)
        else:  # into the lane below the source's row, down it, out above the target's
            lx, g = lane_x[a, b], GAP_Y
            into = (x0, y0), (x0, y0 + g * 0.45), (lx, y0 + g * 0.2), (lx, y0 + g * 0.6)
            c = (lx, y1 - g * 0.6), (lx, y1 - g * 0.2), (x1, y1 - g * 0.45), (x1, y1)
            d = f"{_curve(*into)} L{lx:.1f},{y1 - g * 0.6:.1f} {_curve(*c, move=False)}"
        routes[a, b] = (d, _cubic(*c, 0.72), False)
    return routes


def svg(members, edges):
    """The figure, as SVG text."""
    boxes, frame, (width, height) = _layout(members)
    nodes = dict(boxes)
    inner_edges, outer_edges = {}, collections.Counter()
    detail = collections.defaultdict(list)
    for (a, b), n in sorted(edges.items()):
        if boxes[a]["box"] == boxes[b]["box"] == "kernels":
            inner_edges[a, b] = n
            continue
        key = tuple("kernels" if boxes[g]["box"] == "kernels" else g for g in (a, b))
        outer_edges[key] += n
        detail[key].append(f"{a} → {b}: {n}")
    if frame:
        nodes["kernels"] = frame
    outer_nodes = {g: v for g, v in nodes.items() if v["box"] == "figure"}
    routes = _routes(outer_nodes, list(outer_edges), (MARGIN, width - MARGIN, False))
    if frame:
        inside = {g: v for g, v in boxes.items() if v["box"] == "kernels"}
        lanes = (frame["x"] + 2, frame["x"] + frame["w"] - 2, True)
        routes.update(_routes(inside, list(inner_edges), lanes))
    counts = {**outer_edges, **inner_edges}
    sources = sorted({a for a, _ in counts}, key=lambda g: (nodes[g]["y"], nodes[g]["x"]))
    ink = {g: INKS[k % len(INKS)] for k, g in enumerate(sources)}

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" '
           'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">', "<defs>"]
    for g in sources:
        out.append(f'<marker id="to-{sources.index(g)}" viewBox="0 0 10 10" refX="9" refY="5" '
                   'markerUnits="userSpaceOnUse" markerWidth="9" markerHeight="9" orient="auto">'
                   f'<path d="M0,0 L10,5 L0,10 z" fill="{ink[g]}"/></marker>')
    out += ["</defs>", f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
            f'<text x="{MARGIN}" y="{MARGIN + 6}" font-size="13" fill="#222">'
            "numba_softmax from its imports: a box a group of modules, an arrow a group's "
            "imports of another (the number: module → module imports)</text>"]
    if frame:
        out.append(f'<rect x="{frame["x"]:.1f}" y="{frame["y"]:.1f}" width="{frame["w"]:.1f}" '
                   f'height="{frame["h"]:.1f}" rx="8" fill="#f3faf3" stroke="#2a7f62" '
                   'stroke-width="1.2" stroke-dasharray="6,3"/>')
        out.append(f'<text x="{frame["x"] + 10:.1f}" y="{frame["y"] + 17:.1f}" font-size="13" '
                   'font-weight="bold" fill="#2a7f62">kernels/ <tspan font-weight="normal" '
                   'font-style="italic" font-size="11">a folder a concept; arrows in and out '
                   'of the frame sum its folders</tspan></text>')
    labels = []
    for (a, b), n in sorted(counts.items(), key=lambda e: (nodes[e[0][0]]["y"], e[0])):
        d, (lx, ly), dashed = routes[a, b]
        tip = "; ".join(detail[a, b]) if "kernels" in (a, b) else ""  # the frame's sums
        out.append(f'<path d="{d}" fill="none" stroke="{ink[a]}" '
                   f'stroke-width="{1.0 + 0.3 * min(n, 10):.1f}"'
                   + (' stroke-dasharray="5,3"' if dashed else "")
                   + f' marker-end="url(#to-{sources.index(a)})">'
                   f'<title>{escape(a)} → {escape(b)}: {n}'
                   f'{escape(" (" + tip + ")") if tip else ""}</title></path>')
        labels.append((lx, ly, n, ink[a]))
    for lx, ly, n, colour in labels:
        w = 6.5 * len(str(n)) + 7
        out.append(f'<rect x="{lx - w / 2:.1f}" y="{ly - 7:.1f}" width="{w:.1f}" height="13" '
                   f'rx="3" fill="#ffffff" stroke="{colour}" stroke-width="0.7"/>')
        out.append(f'<text x="{lx:.1f}" y="{ly + 3.5:.1f}" font-size="10" text-anchor="middle" '
                   f'fill="{colour}">{n}</text>')
    for g, b in boxes.items():
        cx = b["x"] + b["w"] / 2
        out += [f"<g><title>{escape(g)}</title>",
                f'<rect x="{b["x"]:.1f}" y="{b["y"]:.1f}" width="{b["w"]:.1f}" '
                f'height="{b["h"]:.1f}" rx="5" fill="{_fill(g)}" stroke="#333" stroke-width="1"/>',
                f'<text x="{cx:.1f}" y="{b["y"] + 15:.1f}" font-size="13" font-weight="bold" '
                f'text-anchor="middle" fill="#222">{escape(g)}</text>',
                f'<text x="{cx:.1f}" y="{b["y"] + 27:.1f}" font-size="10.5" font-style="italic" '
                f'text-anchor="middle" fill="#444">{escape(CAPTION.get(g, ""))}</text>']
        for k, line in enumerate(b["lines"]):
            out.append(f'<text x="{cx:.1f}" y="{b["y"] + HEAD + 10 + LINE * k:.1f}" font-size="11" '
                       'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" '
                       f'text-anchor="middle" fill="#222">{escape(line)}</text>')
        out.append("</g>")
    out.append(f'<text x="{MARGIN}" y="{height - 14:.0f}" font-size="11" fill="#444">'
               "An arrow points from the importer to the imported; a dashed one points up, "
               "against the rows.  Drawn by docs/figures/architecture.py from the source.</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def folders(root=ROOT):
    """``[(folder, summary)]``: every folder of the package and the first paragraph of its
    ``__init__`` docstring (its table of contents starts there)."""
    out = []
    for name, (path, package) in modules(root).items():
        if not package or name == PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        first = " ".join(doc.split("\n\n")[0].split()).rstrip(":")
        first = re.sub(r":(\w+):`", r"{\1}`", first)  # reStructuredText roles, as MyST
        out.append((name.split(".", 1)[1].replace(".", "/") + "/", first))
    return sorted(out, key=lambda f: (f[0].count("/") > 1, f[0]))


def table(root=ROOT):
    """The folders as a MyST table."""
    rows = ["| folder | what it holds: the first lines of its `__init__` |", "|---|---|"]
    bar = "\\|"  # a | inside a cell
    rows += [f"| `{f}` | {summary.replace('|', bar)} |" for f, summary in folders(root)]
    return "\n".join(rows) + "\n"


def _update(path, text):
    path = Path(path)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def write(path=OUT, root=ROOT, table_path=TABLE):
    """Draw the figure into ``path`` and the folders' table into ``table_path``; a file is
    rewritten only if its bytes change (so an unchanged build touches nothing)."""
    _update(table_path, table(root))
    return _update(path, svg(*groups(root)))


if __name__ == "__main__":
    print("wrote", write(*sys.argv[1:2]), "and", TABLE)
