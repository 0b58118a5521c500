"""Stage 3, results: measured kernel timings kept across runs, so a config is tuned once per setup.

``records`` holds the rows (:class:`~autoopt.results.records.StoredResult`, keyed by
:class:`~autoopt.results.records.ResultKey`: the environment and the op), ``keys`` computes the key of
this machine (device fingerprint, driver, torch and triton versions read from the installed
distributions' metadata, never by importing them) and the hash of a kernel's source file, ``store``
is the SQLite file (WAL mode, safe with several writers and against SIGKILL; ``location`` says where it
is without importing SQLite), ``transfer`` the JSON
export/import format (shipped result sets use it too), and ``lookup`` the layered start-up lookup:
in-memory, then the user store, then the shipped results, else ``None`` so the caller falls back
to the cost model. Reads only ``kernels``, ``hardware`` and ``errors``.

Nothing here is imported by ``import autoopt``; importing this package imports no submodule.
"""
