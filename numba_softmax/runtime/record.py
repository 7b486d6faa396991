"""What a call allocates, noted while a launch plan is being recorded (this thread only).

:mod:`numba_softmax.plans` records a call's kernel launches (through
:func:`numba_softmax.runtime.launcher.recording`) and, through this module, the buffers
the array layer allocated for it (outputs and temporaries), so that a replay can
allocate their like again, and the device values it made *from* an array for one launch
(a tensor map of it: :func:`derived`), so that a replay can make them again from the new
array.  Outside a recording these functions only pass values through.
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


def derived(ptr, source_ptr, remake):
    """Note that the device pointer ``ptr`` a launch is handed was made from the array at
    ``source_ptr`` for this call: a replay calls ``remake(new_source_ptr, stream, taken)``
    → (device pointer, ``done``), and ``done(stream)`` once the launch is queued.
    ``taken``: a list the launch's remakes share (what one has claimed, the next keeps)."""
    notes = getattr(_state, "notes", None)
    if notes is not None:
        notes.derived[ptr] = (source_ptr, remake)


def spoil(why):
    """Mark the recording in progress (if any) as not replayable."""
    notes = getattr(_state, "notes", None)
    if notes is not None:
        notes.spoiled = why


class Notes:
    def __init__(self):
        self.allocations = []
        self.derived = {}  # device pointer -> (source array's pointer, remake)
        self.spoiled = None


class recording:
    """``with recording() as notes:`` collects the allocations made inside it."""

    def __enter__(self):
        self.notes = _state.notes = Notes()
        return self.notes

    def __exit__(self, *exc):
        _state.notes = None
