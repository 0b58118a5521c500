"""Serving runtimes as data: what vLLM, SGLang, llama.cpp, transformers (and plugins' runtimes) can run,
and the recommendation written in each one's own terms.

- :mod:`~autoopt.runtimes.spec`: :class:`RuntimeSpec`, the rules (formats per GPU, parallelism, KV-cache
  dtypes, memory overheads), read from plain dicts;
- :mod:`~autoopt.runtimes.builtin`: the built-in descriptions, with their sources;
- :mod:`~autoopt.runtimes.registry`: lookup by name, plugins' ``autoopt_runtimes`` included;
- :mod:`~autoopt.runtimes.export`: a recommendation (its ``to_dict()``) as the runtime's arguments.

The planner (:mod:`autoopt.planning`) reads these rules; this stage never imports the planner.
"""

from autoopt.runtimes.registry import get_runtime, runtime_names, runtimes
from autoopt.runtimes.spec import FormatRule, KvRule, RuntimeSpec

__all__ = ["FormatRule", "KvRule", "RuntimeSpec", "get_runtime", "runtime_names", "runtimes"]
