#!/usr/bin/env bash
# Runs the node agent on a real NVIDIA machine and checks what it prints against nvidia-smi:
#   * the output is one valid inventory document (the same format check the webhook applies);
#   * as many GPUs as `nvidia-smi -L` lists, with the same UUIDs, names (GFD spelling) and memory;
#   * nvlink and pcie are square, one row per GPU;
#   * every pair that `nvidia-smi topo -m` shows as NV# has that many links, every other pair none,
#     and its PCIe level is the one topo shows.
# Exits 0 when everything matches, 1 on any mismatch, 3 when the agent finds no NVML.
#
# Usage: benchmarks/agent_real_gpu.sh            (from the repository root)
#   GPU_ADMISSION="python3 -m webhook.cli"      the command to run (default: gpu-admission if on PATH)
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
REPO="$(pwd)"
if [[ -n "${GPU_ADMISSION:-}" ]]; then
  read -r -a CMD <<<"$GPU_ADMISSION"
elif command -v gpu-admission >/dev/null 2>&1; then
  CMD=(gpu-admission)
else
  CMD=(python3 -m webhook.cli)
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
fi
command -v nvidia-smi >/dev/null 2>&1 || { echo "agent_real_gpu: nvidia-smi not found: not an NVIDIA machine" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

nvidia-smi -L >"$WORK/list.txt" || { echo "agent_real_gpu: nvidia-smi -L failed" >&2; exit 1; }
nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits >"$WORK/query.csv" || exit 1
nvidia-smi topo -m >"$WORK/topo.txt" 2>/dev/null || : >"$WORK/topo.txt"
nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1 | sed 's/^/driver: /'

start=$(date +%s.%N)
"${CMD[@]}" agent --print --once --node-name "$(hostname | tr '[:upper:]_' '[:lower:]-')" >"$WORK/out.json" 2>"$WORK/err.txt"
rc=$?
end=$(date +%s.%N)
echo "agent: exit $rc in $(python3 -c "print(f'{$end - $start:.2f}')") s"
if [[ -s "$WORK/err.txt" ]]; then
  echo "agent stderr:"
  sed 's/^/  /' "$WORK/err.txt"
fi
if [[ $rc -ne 0 ]]; then
  echo "agent_real_gpu: FAIL: the agent exited $rc" >&2
  exit "$rc"
fi

PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python3 - "$WORK" <<'PY'
import json
import re
import sys
from pathlib import Path

from webhook.core.inventory import InventoryError, inventory_from_json

work = Path(sys.argv[1])
problems: list[str] = []
raw = (work / "out.json").read_text()
lines = [line for line in raw.splitlines() if line.strip()]
if len(lines) != 1:
    problems.append(f"expected one line of JSON on stdout, got {len(lines)}")
try:
    spec = json.loads(lines[0] if lines else "")
except ValueError as err:
    print(f"agent_real_gpu: FAIL: stdout is not JSON: {err}\n{raw[:500]}")
    sys.exit(1)
print(json.dumps(spec, indent=2)[:4000])

try:
    gpus, nvlink, pcie = inventory_from_json(spec)
except InventoryError as err:
    problems.append(f"inventory format: {err}")
    gpus, nvlink, pcie = (), (), ()

listed = [line for line in (work / "list.txt").read_text().splitlines() if line.startswith("GPU ")]
if len(spec.get("gpus", [])) != len(listed):
    problems.append(f"GPU count: agent {len(spec.get('gpus', []))}, nvidia-smi -L {len(listed)}")
for name in ("nvlink", "pcie"):
    matrix = spec.get(name, [])
    size = len(spec.get("gpus", []))
    if len(matrix) != size or any(len(row) != size for row in matrix):
        problems.append(f"{name} is not a {size}x{size} matrix")

for row in (work / "query.csv").read_text().splitlines():
    parts = [part.strip() for part in row.split(",")]
    if len(parts) != 4:
        continue
    index, uuid, name, memory = int(parts[0]), parts[1], parts[2], parts[3]
    found = [gpu for gpu in spec.get("gpus", []) if gpu.get("index") == index]
    if not found:
        problems.append(f"GPU {index}: missing from the inventory")
        continue
    gpu = found[0]
    if gpu.get("uuid") != uuid:
        problems.append(f"GPU {index}: uuid {gpu.get('uuid')!r}, nvidia-smi {uuid!r}")
    if gpu.get("model") != re.sub(r"\s+", "-", name.strip()):
        problems.append(f"GPU {index}: model {gpu.get('model')!r}, nvidia-smi {name!r}")
    if memory.isdigit() and gpu.get("memoryMiB") != int(memory):
        problems.append(f"GPU {index}: memoryMiB {gpu.get('memoryMiB')}, nvidia-smi {memory}")

# nvidia-smi topo -m: a header of column names, then one row per GPU; cells are X, NV#, PIX, PXB, ...
topo = [line for line in (work / "topo.txt").read_text().splitlines() if line.strip()]
header = next((line.split("\t") for line in topo if "GPU0" in line and not line.startswith("GPU0")), None)
checked_pairs = 0
if header:
    columns = {i: cell.strip() for i, cell in enumerate(header)}
    position = {int(spec_gpu["index"]): n for n, spec_gpu in enumerate(spec.get("gpus", []))}
    for line in topo:
        cells = line.split("\t")
        row = re.fullmatch(r"GPU(\d+)", cells[0].strip())
        if not row:
            continue
        i = int(row.group(1))
        for k, cell in enumerate(cells[1:], start=1):
            column = re.fullmatch(r"GPU(\d+)", columns.get(k, ""))
            if not column or i not in position or int(column.group(1)) not in position:
                continue
            j = int(column.group(1))
            a, b = position[i], position[j]
            cell = cell.strip()
            links = spec["nvlink"][a][b]
            level = spec["pcie"][a][b]
            checked_pairs += 1
            if cell == "X":
                if i != j:
                    problems.append(f"topo GPU{i}-GPU{j}: X off the diagonal")
            elif cell.startswith("NV"):
                if links != int(cell[2:] or 0):
                    problems.append(f"GPU{i}-GPU{j}: agent nvlink {links}, nvidia-smi topo {cell}")
            else:
                if links != 0:
                    problems.append(f"GPU{i}-GPU{j}: agent nvlink {links}, nvidia-smi topo {cell} (no NVLink)")
                if cell != level:
                    problems.append(f"GPU{i}-GPU{j}: agent pcie {level}, nvidia-smi topo {cell}")
print(f"checked: {len(spec.get('gpus', []))} GPUs, {checked_pairs} topo cells")
if problems:
    print("agent_real_gpu: FAIL")
    for problem in problems:
        print(f"  {problem}")
    sys.exit(1)
print("agent_real_gpu: OK")
PY
