"""Stage 3, plugins: where templates and choices come from.

``hookspecs`` declares the hooks (entry-point group ``autoopt``); ``manager`` discovers plugins,
calls each hook implementation in isolation (a faulty plugin is reported and skipped) and holds the
process-wide manager; ``choices`` asks plugins for an execution path or implementation before the
built-in default. The built-in templates (``autoopt.templates``) register through this same path.
"""

from autoopt.plugins.manager import (
    AUTOLOAD_ENV,
    BUILTIN,
    PluginManager,
    get_plugin_manager,
    list_plugins,
    reset_plugin_manager,
)

__all__ = ["AUTOLOAD_ENV", "BUILTIN", "PluginManager", "get_plugin_manager", "list_plugins",
           "reset_plugin_manager"]
