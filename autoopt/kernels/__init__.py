"""Stage 2, kernels: the vocabulary of work and the cost of doing it on a given GPU.

``ops`` (what to compute: ``OpSpec``), ``config`` (how: ``KernelConfig`` with Triton's keys),
``template`` (the interface a kernel family implements), ``constraints`` (hard limits: shared
memory, registers, TMA/WGMMA rules), ``cost`` (the calibrated roofline model), ``vendor`` (cuBLAS's
fitted roofline, to compare a ranked config with the vendor library), ``pruning
(bounds that let the search skip whole groups of configs), ``choices`` (the built-in execution
path and implementation per GPU family) and ``suite`` (named op suites). Reads only ``hardware``.
"""
