"""Softmax of rows, one chapter a module (the docs' softmax track, s2 … s8):

``three_pass``       s2 — safe softmax in three passes over memory: max, sum, write
``online``           s3 — two-pass online softmax: the (m, ℓ) fold, then the write
``fused``            s4 — the row held in registers: one read, one write
``split``            s5 — several blocks a row, their states merged by the combiner
``onchip``           s6 — one block a row, the row parked in shared memory
``group``            s7 — a group of blocks a row, held on chip, through a counter barrier
``cluster``          s8 — a thread-block cluster a row (sm_90), through distributed shared memory
``methods``          the one map from a method's name to its launches, and ``auto``'s rule
``crossover_table``  the row sizes at which ``auto`` changes kernel (data: ``crossovers.json``)
``fold``             the combiner itself on the device, under any chunking and tree (for tests)
"""
