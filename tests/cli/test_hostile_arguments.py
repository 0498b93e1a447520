"""Every ``orbit`` command with odd values in each argument slot: a status, never a traceback.

Lone surrogates (what a shell's undecodable bytes become), empty and huge
strings, numbers past every range, bad store URLs of every scheme. The command
may refuse (exit 2 for usage, 1 for a failing store or fleet) but must answer
with a status and a line, as the README promises.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from orbitive.cli import main

VALUES = [
    "\udcff", "a\udc80b", "", "x" * 5000, "-1", "1e400", "nan", "inf", "9" * 30, "0",
    "..", ".", "a b", "\t", "%ff", "\u2028", "1e-400", "-0", "0x10",
]  # fmt: skip
URLS = [
    "redis://[::1", "redis://\udcff/0", "redis://127.0.0.1:1/0?prefix=\udcff", "rediss://[",
    "redis://127.0.0.1:1/0?prefix=%ff%fe", "redis://[zz]:1/0", "redis://" + "a" * 64 + "/0",
    "redis://127.0.0.1:99999/0", "redis://127.0.0.1:1/0?timeout=\udcff", "unix://\udcff",
    "postgresql://[::1", "postgresql://\udcff@127.0.0.1:1/db", "postgres://127.0.0.1:99999/db",
    "postgresql://" + "a" * 64 + "/db", "shm://[x", "shm://\udcff", "shm://a?capacity=\udcff",
    "shm://ok?capacity=" + "9" * 30, "sqlite:\udcff.db", "sqlite:///\udcff", "sqlite:",
    "file:///etc/passwd", "\udcff://x", "redis://127.0.0.1:1/0?timeout=1&timeout=2",
]  # fmt: skip
STORE = "--store=sqlite:///{tmp}/probe.db"
COMMANDS = [
    ["list", "{}"], ["list", "--kind", "{}"], ["list", "FLEET", "--kind", "{}"],
    ["clear", "{}", "--all", "--yes"], ["clear", "FLEET", "--kind", "{}"],
    ["locks", "{}"], ["locks", "--store", "{url}"],
    ["inspect", "{}"], ["inspect", "--store", "{url}", "name"], ["inspect", STORE, "{}"],
    ["watch", "{}", "--seconds", "0.01"], ["watch", "FLEET", "--seconds", "{}"],
    ["force-release", "{}"], ["force-release", "--store", "{url}", "n"],
    ["force-release", "FLEET", "{}", "label"], ["force-release", "FLEET", "ns", "{}"],
    ["force-release", STORE, "{}"],
    ["run", "--lock", "{}", STORE, "--", "true"],
    ["run", "--lock", "n", "--ttl", "{}", STORE, "--", "true"],
    ["run", "--lock", "n", "--wait", "{}", STORE, "--", "true"],
    ["run", "--lock", "n", "--store", "{url}", "--", "true"],
    ["run", "--lock", "n", STORE, "--", "{}"],
    ["pool", "{}"], ["pool", "FLEET", "--kind", "{}"],
    ["budget", "{url}", "main-db"], ["budget", "postgresql://127.0.0.1:1/db?timeout=1", "{}"],
    ["demo", "--workers", "{}", "--seconds", "0"], ["demo", "--workers", "1", "--seconds", "{}"],
]  # fmt: skip


@pytest.mark.parametrize("template", COMMANDS, ids=" ".join)
def test_every_argument_slot_takes_odd_values_and_answers_with_a_status(
    template: list[str], fleet_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where a relative sqlite: path lands
    for value in URLS if "{url}" in template else VALUES:
        argv = [
            part.replace("{url}", value)
            .replace("{}", value)
            .replace("FLEET", fleet_name)
            .replace("{tmp}", str(tmp_path))
            for part in template
        ]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status: object = main(argv)
            except SystemExit as exit_:  # argparse's usage errors
                status = exit_.code
        assert type(status) is int, (argv, status)
        assert "Traceback" not in err.getvalue(), argv


@pytest.mark.parametrize("url", ["redis://[::1", "redis://\udcff/0"], ids=ascii)
def test_a_redis_url_urllib_or_idna_refuses_is_one_line_and_exit_2(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["locks", "--store", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orbit locks: store URL ") and err.count("\n") == 1, err
