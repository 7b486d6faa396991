"""What a call allocates, noted while a launch plan is being recorded (this thread only).

:mod:`numba_softmax.plans` records a call's kernel launches (through
:func:`numba_softmax.runtime.launcher.recording`) and, through this module, the buffers
the array layer allocated for it (outputs and temporaries), so that a replay can
allocate their like again.  Outside a recording these functions only pass values through.
"""

import threading

_state = threading.local()


def allocated(buf, dev, recipe):
    """Note a new buffer (user-kind ``buf``, device view ``dev``, ``recipe`` to make another);
    returns ``(buf, dev)``."""
    notes = getattr(_state, "notes", None)
    if notes is not None:
        notes.allocations.append((buf, dev, recipe))
    return buf, dev


def staged(dev, host):
    """Note a host → device copy: a call that makes one cannot be replayed (its data is
    the call's own), so the recording is spoiled."""
    notes = getattr(_state, "notes", None)
    if notes is not None:
        notes.spoiled = "the call copies host data to the device"
    return dev


def spoil(why):
    """Mark the recording in progress (if any) as not replayable."""
    notes = getattr(_state, "notes", None)
    if notes is not None:
        notes.spoiled = why


class Notes:
    def __init__(self):
        self.allocations = []
        self.spoiled = None


class recording:
    """``with recording() as notes:`` collects the allocations made inside it."""

    def __enter__(self):
        self.notes = _state.notes = Notes()
        return self.notes

    def __exit__(self, *exc):
        _state.notes = None
