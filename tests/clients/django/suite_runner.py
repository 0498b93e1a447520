"""A Django test runner that records each test's outcome, for two runs to compare.

Outcomes are ``passed``, ``skipped``, ``expected failure``, ``unexpected
success``, or ``failed``/``error`` followed by the exception's class name;
a failing subtest is recorded under its own id, and its test as ``subtests
failed``. The runner writes them as
JSON to the path in ``ORBIT_SUITE_RESULTS`` once the suite has run.
"""

from __future__ import annotations

import json
import os
import unittest
from types import TracebackType
from typing import Any

from django.test.runner import DiscoverRunner

ErrorInfo = tuple[type[BaseException], BaseException, TracebackType | None]


class RecordingResult(unittest.TextTestResult):
    """unittest's text result, which also keeps every test's outcome by its id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, str] = {}

    def addSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802 - unittest's names
        super().addSuccess(test)
        self.outcomes[test.id()] = "passed"

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:  # noqa: N802
        super().addSkip(test, reason)
        self.outcomes[test.id()] = "skipped"

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addFailure(test, err)
        self.outcomes[test.id()] = f"failed {err[0].__name__}"

    def addError(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addError(test, err)
        self.outcomes[test.id()] = f"error {err[0].__name__}"

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:  # noqa: N802
        super().addExpectedFailure(test, err)
        self.outcomes[test.id()] = "expected failure"

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:  # noqa: N802
        super().addUnexpectedSuccess(test)
        self.outcomes[test.id()] = "unexpected success"

    def addSubTest(  # noqa: N802
        self, test: unittest.TestCase, subtest: unittest.TestCase, err: Any
    ) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            failed = "failed" if issubclass(err[0], test.failureException) else "error"
            self.outcomes[subtest.id()] = f"{failed} {err[0].__name__}"
            self.outcomes[test.id()] = "subtests failed"  # unittest reports no outcome of its own


class RecordingRunner(DiscoverRunner):
    """Django's runner with :class:`RecordingResult`; writes the outcomes at the end."""

    def get_resultclass(self) -> Any:
        return RecordingResult

    def run_suite(self, suite: unittest.TestSuite, **kwargs: Any) -> Any:
        result = super().run_suite(suite, **kwargs)
        assert isinstance(result, RecordingResult)
        with open(os.environ["ORBIT_SUITE_RESULTS"], "w") as out:
            json.dump(result.outcomes, out, indent=1, sort_keys=True)
        return result
