# Sourced by scripts/demo and scripts/test: make .venv and install orbitive into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last install.
STAMP=.venv/.orbitive-installed
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[${EXTRAS}]"
    touch "$STAMP"
fi
