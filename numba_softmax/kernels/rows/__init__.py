"""The machinery the softmax kernels share: a row as chunks a team of threads holds.

``chunk``         a chunk of a row: the values one team holds in registers at a time
``vector_chunk``  a thread's whole chunk of 16-byte vectors, from one address
``pairs``         values held as stored: float16 / bfloat16 two to a register
``reduce``        warp and block combine of (m, ℓ) states, on chip
``epilogue``      what a kernel writes once it knows a row's (m, ℓ): softmax, log_softmax, LSE
``sync``          blocks waiting for blocks: a group barrier through a counter
``dsmem``         thread-block clusters: distributed shared memory (sm_90)
"""
