"""Stage 1, hardware: what machine is this?

``detection`` reads the CPU (``cpu``), NVML (``nvml``) and ``torch.cuda`` (``torch_cuda``), merges
the known-hardware ``library`` (the YAML files in ``profiles/``) and, on request, measured rates
(``probes``) into a ``profile.HardwareProfile``. ``features`` derives what an architecture can do
(TMA, WGMMA, FP8, ...) from its compute capability. Nothing here knows about kernels or models.
"""
