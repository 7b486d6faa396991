"""The table ``auto`` chooses by: row sizes in bytes, per device and item size, up to which
each on-chip kernel wins (:func:`.methods.choose` holds the rule, this module the numbers).

    entry(limits, itemsize)         the entry for a device: its own (measured here, or
                                    shipped), else the default, scaled to its shared memory
    fit(measurements, limits, choose)  the entry that makes ``choose`` best on measured
                                    cases
    save(device_name, entries)      keep a fitted entry for this machine's ``auto``

Two files, read once a process: the table shipped with the package (``crossovers.json``
beside this module: the default entry and entries of other devices, measured with the
project's GPUs), and the *user's* table — written by
``numba-softmax bench --crossovers`` on the user's own GPU — whose entries take
precedence.  It lives at ``$NUMBA_SOFTMAX_CROSSOVERS`` if set, else
``$XDG_CACHE_HOME/numba_softmax/crossovers.json`` (``~/.cache/…``); delete it to go back to
the shipped table.  ``docs/algorithms/auto.md`` explains the rule and the measurements.
"""

import functools
import itertools
import json
import os

import numpy as np

PACKAGED = os.path.join(os.path.dirname(__file__), "crossovers.json")
ENV = "NUMBA_SOFTMAX_CROSSOVERS"
KEYS = ("fused", "onchip", "cluster")


def user_path():
    """Where ``numba-softmax bench --crossovers`` keeps this machine's entries."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "numba_softmax", "crossovers.json")


def _read(path):
    try:
        with open(path) as f:
            table = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"the crossover table {path} cannot be read ({e}); delete it or "
                         f"rerun numba-softmax bench --crossovers") from None
    if not isinstance(table, dict):
        raise ValueError(f"the crossover table {path} is not a JSON object; delete it")
    return table


@functools.lru_cache(maxsize=1)
def table():
    """{device name or "default": {item size: entry}}: the shipped table, the user's on top
    (each device's entries replaced item size by item size)."""
    merged = _read(PACKAGED)
    for name, sizes in _read(user_path()).items():
        if not name.startswith("_") and isinstance(sizes, dict):
            merged[name] = {**merged.get(name, {}), **sizes}
    return merged


def entry(limits, itemsize=4):
    """The entry for values of ``itemsize`` bytes on the device ``limits`` describe, and
    where it came from: (entry, "measured") — the device's own — or (entry, "default"),
    the default with ``onchip`` scaled to the device's shared memory per multiprocessor."""
    t = table()
    own = t.get(limits.name, {}).get(str(itemsize))
    if own is not None:
        try:
            return {k: int(own[k]) for k in KEYS}, "measured"
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"the crossover entry of {limits.name!r} for {itemsize}-byte "
                             f"values needs integers {', '.join(KEYS)}; got {own!r} (from "
                             f"{user_path()} or the shipped table): delete it or rerun "
                             f"numba-softmax bench --crossovers") from None
    default = t["default"]
    e = {k: int(default[str(itemsize)][k]) for k in KEYS}
    e["onchip"] = e["onchip"] * limits.shared_per_sm // default["shared_per_sm"]
    return e, "default"


def score(cases, limits, choose, itemsize, candidate):
    """The mean, over ``cases`` of one item size, of the GB/s of the kernel ``choose``
    picks with the entry ``candidate``, as a share of the case's best (0 where the pick
    was not measured: it could not take the shape)."""
    dtype = {2: np.float16, 4: np.float32, 8: np.float64}[int(itemsize)]
    total = 0.0
    for (rows, n), rates in cases.items():
        pick = choose(rows, n, dtype, limits, candidate)
        total += rates.get(pick, 0.0) / max(rates.values())
    return total / max(len(cases), 1)


def fit(measurements, limits, choose):
    """Entries, one an item size, from benchmark rows (dicts with ``rows``, ``n``,
    ``itemsize``, ``method``, ``gbps``): of every entry whose thresholds are measured row
    sizes (or 0, or the current entry's own), the one under which ``choose(rows, n,
    dtype, limits, entry)`` — the rule itself — runs the measured cases fastest on average
    (:func:`score`); of equal ones, the one that changes the current entry least.
    Returns {item size: entry with its ``score`` over its number of ``cases``, and the
    entry it would replace: ``before`` (its thresholds), ``before_score``, ``source``
    (:func:`entry`'s)}."""
    by_size = {}
    for r in measurements:
        cases = by_size.setdefault(str(int(r["itemsize"])), {})
        cases.setdefault((int(r["rows"]), int(r["n"])), {})[r["method"]] = float(r["gbps"])
    fitted = {}
    for size, cases in sorted(by_size.items()):
        current, source = entry(limits, int(size))
        lengths = sorted({n * int(size) for _, n in cases})
        options = {k: sorted(set(lengths) | {0, current[k]}) for k in KEYS}

        def rank(candidate):  # the best score; then the fewest, smallest changes
            changed = [abs(candidate[k] - current[k]) for k in KEYS if candidate[k] != current[k]]
            return (-round(score(cases, limits, choose, size, candidate), 9), len(changed),
                    sum(changed))

        candidates = [dict(zip(KEYS, values)) for values in itertools.product(*options.values())]
        best = min(candidates, key=rank)
        fitted[size] = dict(best, score=round(-rank(best)[0], 4), cases=len(cases),
                            before=current, before_score=round(-rank(current)[0], 4),
                            source=source)
    return fitted


def save(device_name, entries, path=None):
    """Write ``entries`` (from :func:`fit`) under ``device_name`` into the user's table
    (``path``, default :func:`user_path`), keeping its other devices; returns the path."""
    path = path or user_path()
    t = _read(path)
    t["_about"] = ("Crossovers measured on this machine by numba-softmax bench --crossovers "
                   "(numba_softmax/kernels/softmax/crossover_table.py); they replace the shipped "
                   "table's entries for these devices. Delete this file to go back.")
    t[device_name] = {size: {k: int(e[k]) for k in KEYS} for size, e in entries.items()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(t, f, indent=2, sort_keys=True)
        f.write("\n")
    table.cache_clear()
    return path
