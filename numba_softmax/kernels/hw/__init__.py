"""The hardware primitives every kernel is built from, each with its simulator twin.

``jit``       how every kernel is compiled: options, accumulator and storage types
``vector``    16-byte loads and stores
``widths``    how wide a vector an array allows (values per load, the rows' common width)
``ptx``       PTX instructions Numba does not emit (``max.NaN.f32``, ``cvt.rn.bf16.f32`` …)
``mma``       tensor cores: ``mma.sync`` m16n8k16, ``ldmatrix``, ``cp.async``
``_mma_sim``  the simulator's lane-by-lane twin of ``mma``
``wgmma``     warpgroup tensor cores (sm_90a): ``wgmma`` m64nNk16, descriptors, swizzle
``_wgmma_sim`` the simulator's thread-by-thread twin of ``wgmma``
``tma``       tile loads by the copy engine (``cp.async.bulk.tensor``), ``mbarrier``
``_tma_sim``  the simulator's twin of ``tma``
``tma_maps``  tensor maps on the device for a launch: cached, uploaded without a wait
``warp``      warp votes and shuffles from any lane
``shuffle``   shuffles of whole register arrays
"""
