# Sourced by scripts/demo and scripts/test: make .venv and install orbitive into it.
# EXTRAS names the optional dependency group to install with it ("" for none).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "setting up .venv (first run only)..." >&2
    "$PY" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since this group was last installed.
STAMP=".venv/.orbitive-installed-${EXTRAS:-core}"
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "installing orbitive${EXTRAS:+[$EXTRAS]} into .venv..." >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${EXTRAS:+[$EXTRAS]}"
    touch "$STAMP"
fi
