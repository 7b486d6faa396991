"""The runtime layer: how kernels are launched, replayed and emulated — no algorithm here.

``launcher``    the one place every kernel is launched, and what a launch may ask of a device
``workspaces``  scratch device memory kept from call to call, per tag, dtype and stream
``driver``      the few CUDA driver calls the package makes itself (contexts, kernel attributes)
``replay``      recorded launches whose pointer arguments can be swapped (launch plans)
``record``      what a call allocates while its launch plan is recorded
``counters``    device memory kept from call to call (tickets, placeholders)
``copy``        a strided device copy: any layout into any other
``sim``         what the CUDA simulator lacks, supplied only when it is on
``sim_blocks``  how the simulator runs blocks and cooperative grids
``sim_calls``   the simulator's device-function calls: its fake ``cuda`` swapped in once a launch

Nothing here imports :mod:`numba_softmax.kernels`: the kernels sit on top of this layer.
"""
