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
# Reinstall only when the build inputs (pyproject.toml, setup.py, the C sources)
# changed since this group was last installed; the install compiles the C steps.
STAMP=".venv/.orbitive-installed-${EXTRAS:-core}"
# True when the stamp $1 exists and no build input changed since it was made.
fresh() {
    [ -f "$1" ] && [ -z "$(find pyproject.toml setup.py src \( -name '*.c' -o -name '*.h' \) -newer "$1" -o -name '*.toml' -newer "$1" -o -name setup.py -newer "$1")" ]
}
# The test extra includes the docs extra (on Python 3.11 and later): a fresh install of it
# serves the docs too.
if [ "${EXTRAS:-}" = docs ] && fresh .venv/.orbitive-installed-test \
    && .venv/bin/python -c "import mkdocs, mkdocstrings" 2>/dev/null; then
    STAMP=".venv/.orbitive-installed-test"
fi
if ! fresh "$STAMP"; then
    echo "installing orbitive${EXTRAS:+[$EXTRAS]} into .venv..." >&2
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${EXTRAS:+[$EXTRAS]}"
    touch "$STAMP"
fi
for table in lock pool; do
    if ! .venv/bin/python -c "import orbitive.$table._fastpath" 2>/dev/null; then
        echo "warning: the $table table's C steps (src/orbitive/$table/_fastpath.c) were not" \
            "built; the Python steps run instead, more slowly (a C compiler and the Python" \
            "headers are needed)" >&2
    fi
done
