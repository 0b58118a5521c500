"""Module loggers that import logging on first use (autoopt._log)."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from autoopt._log import get_logger

ROOT = Path(__file__).resolve().parents[1]


def test_a_deferred_logger_is_the_named_logger():
    log = get_logger("autoopt.test_log.named")
    assert log.name == "autoopt.test_log.named"
    assert log.getEffectiveLevel() == logging.getLogger("autoopt.test_log.named").getEffectiveLevel()


def test_records_reach_handlers_under_the_module_name(caplog):
    log = get_logger("autoopt.test_log.records")
    with caplog.at_level(logging.INFO, logger="autoopt.test_log.records"):
        log.info("ranked %d ops", 23)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("autoopt.test_log.records", "INFO", "ranked 23 ops")]


def test_a_level_set_through_it_is_the_real_loggers():
    log = get_logger("autoopt.test_log.level")
    log.setLevel(logging.ERROR)
    assert logging.getLogger("autoopt.test_log.level").level == logging.ERROR


def test_logging_is_imported_only_when_a_logger_is_used():
    code = ("import sys, json\n"
            "from autoopt._log import get_logger\n"
            "log = get_logger('x')\n"
            "before = 'logging' in sys.modules\n"
            "log.debug('hello')\n"
            "print(json.dumps([before, 'logging' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert json.loads(out.stdout) == [False, True]
