"""The openb trace loader: units, model memory, PCIe links, and errors naming file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.errors import UserError
from webhook.simulate.trace import MODEL_MEMORY_MIB, TracePod, load_nodes, load_pods, to_request

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-0,96000,393216,8,G2
n-1,16000,122880,2,P100
n-2,32000,65536,0,
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p-0,12000,16384,1,1000,,LS,Running,0,10,0
p-1,6000,12288,1,470,,LS,Running,0,10,0
p-2,64000,262144,8,1000,,LS,Running,0,10,0
p-3,4000,0,0,0,,BE,Running,0,10,0
p-4,8000,30517,1,250,V100M16|V100M32,LS,Running,0,10,0
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nodes_get_cards_of_their_model_with_pcie_links(tmp_path: Path) -> None:
    nodes = load_nodes(write(tmp_path, "nodes.csv", NODES))
    assert [n.name for n in nodes] == ["n-0", "n-1", "n-2"]
    g2, p100, cpu_only = nodes
    assert (g2.cpu_milli, g2.memory_mib, len(g2.gpus)) == (96000, 393216, 8)
    assert {g.model for g in g2.gpus} == {"G2"}
    assert {g.memory_mib for g in p100.gpus} == {MODEL_MEMORY_MIB["P100"]}
    assert [g.uuid for g in p100.gpus] == ["n-1-gpu0", "n-1-gpu1"]
    assert p100.nvlink == ((0, 0), (0, 0))
    assert p100.pcie == (("X", "NODE"), ("NODE", "X"))
    assert cpu_only.gpus == () and cpu_only.cpu_milli == 32000


def test_pods_keep_trace_units_and_allowed_models(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "pods.csv", PODS))
    assert pods[1] == TracePod("p-1", 6000, 12288, 1, 470)
    assert pods[2].gpu_milli == 8000
    assert pods[3].gpu_milli == 0
    assert pods[4].models == ("V100M16", "V100M32")


def test_multigpu_files_without_gpu_spec_column_load(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-0,1000,10,2,1000\n"
    assert load_pods(write(tmp_path, "pods.csv", text)) == [TracePod("p-0", 1000, 10, 2, 1000)]


def test_share_becomes_the_same_percentage_of_compute_and_memory() -> None:
    request = to_request(TracePod("p", 6000, 12288, 1, 470, ("T4",)))
    assert (request.gpus, request.cores, request.memory_pct, request.memory_mib) == (1, 47, 47, None)
    assert request.shared and request.is_gpu_pod and request.vendor == "nvidia"
    assert (request.cpu_milli, request.memory_mib_host, request.models_include) == (6000, 12288, ("T4",))


def test_share_rounds_up_to_a_whole_percent() -> None:
    assert to_request(TracePod("p", 0, 0, 1, 55)).cores == 6


def test_whole_cards_ask_for_no_share() -> None:
    request = to_request(TracePod("p", 1000, 10, 8, 1000))
    assert (request.gpus, request.cores, request.memory_pct) == (8, None, None)
    assert not request.shared


def test_cpu_only_task_is_not_a_gpu_pod() -> None:
    request = to_request(TracePod("p", 4000, 0, 0, 0))
    assert (request.gpus, request.vendor, request.is_gpu_pod) == (0, "", False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "sn,cpu_milli,memory_mib,gpu,model\nn-0,96000,lots,8,G2\n",
            "{path}:2: column memory_mib: 'lots' is not a whole number",
        ),
        (
            "sn,cpu_milli,memory_mib,gpu,model\nn-0,-1,10,8,G2\n",
            "{path}:2: column cpu_milli: -1 is out of range (>= 0)",
        ),
        ("sn,cpu_milli,memory_mib,gpu,model\nn-0,1,10,2,\n", "{path}:2: column model: empty for a node with 2 GPUs"),
        (
            "sn,cpu_milli,memory_mib,gpu,model\nn-0,1,10,2,T4\nn-0,1,10,2,T4\n",
            "{path}:3: column sn: duplicate node n-0",
        ),
        (
            "sn,cpu_milli,gpu,model\nn-0,1,2,T4\n",
            "{path}:1: missing column memory_mib (header: sn,cpu_milli,gpu,model)",
        ),
        ("sn,cpu_milli,memory_mib,gpu,model\n", "{path}: no nodes"),
    ],
)
def test_bad_node_csv_names_file_line_and_column(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "nodes.csv", text)
    with pytest.raises(UserError) as caught:
        load_nodes(path)
    assert str(caught.value) == message.format(path=path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("p-0,1000,10,1,1001", "{path}:3: column gpu_milli: 1001 is out of range (0..1000)"),
        ("p-0,1000,10,2,0", "{path}:3: column gpu_milli: 0 for a task asking for 2 GPUs"),
        ("p-0,1000,10,0,500", "{path}:3: column num_gpu: 0 for a task asking for 500 gpu_milli"),
        ("p-0,1000,10,1.5,500", "{path}:3: column num_gpu: '1.5' is not a whole number"),
    ],
)
def test_bad_pod_csv_names_file_line_and_column(tmp_path: Path, row: str, message: str) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-ok,1,1,1,1000\n" + row + "\n"
    path = write(tmp_path, "pods.csv", text)
    with pytest.raises(UserError) as caught:
        load_pods(path)
    assert str(caught.value) == message.format(path=path)


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nope\.csv: cannot read: No such file or directory"):
        load_pods(tmp_path / "nope.csv")


def test_whole_numbers_written_as_floats_are_accepted(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np-0,1000.0,10,1,500\n"
    assert load_pods(write(tmp_path, "pods.csv", text))[0].cpu_milli == 1000
