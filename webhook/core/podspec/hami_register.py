"""The devices HAMi's device plugins register on a Node, read as the node's GPUs.

HAMi's Hygon DCU plugin writes `hami.io/node-dcu-register` in the form HAMi's `DecodeNodeDevices` reads:
one `id,count,devmem,devcore,type,numa,health[,index,mode]` entry per device, each ended by ":". The
id is the DCU's UUID and the type its model, which is what `hygon.com/use-gpuuuid` and
`hygon.com/use-dcutype` are matched against in HAMi; a node known only by its allocatable has neither.
"""

from __future__ import annotations

from webhook.core.domain.model import Gpu

# Which annotation each vendor's plugin writes is the vendor table's (`Vendor.register`).
from .vendor_table import REGISTER_ANNOTATIONS as REGISTER_ANNOTATIONS


class RegisterError(ValueError):
    """A register annotation HAMi itself could not read; the message names the entry."""


def devices_of(text: str, field: str) -> tuple[Gpu, ...]:
    """The GPUs of a register annotation, in its order; RegisterError naming `field` and the entry."""
    if ":" not in text:
        raise RegisterError(f"{field}: expected entries ended by ':' (id,count,devmem,devcore,type,numa,health)")
    gpus: list[Gpu] = []
    for position, entry in enumerate(e for e in text.split(":") if e):
        items = entry.split(",")
        where = f"{field}: entry {position} ({entry[:60]!r})"
        if len(items) not in (7, 9):
            raise RegisterError(f"{where}: expected 7 or 9 comma-separated fields, got {len(items)}")
        try:
            memory, numa = int(items[2]), int(items[5])
            index = int(items[7]) if len(items) == 9 else position
        except ValueError:
            raise RegisterError(f"{where}: devmem, numa and index must be whole numbers") from None
        if items[6].strip().lower() not in ("true", "false", "1", "0", "t", "f"):
            raise RegisterError(f"{where}: health must be true or false, got {items[6]!r}")
        if not items[0] or memory <= 0 or numa < 0 or index < 0:
            raise RegisterError(f"{where}: needs an id, devmem above 0 and numa, index of at least 0")
        healthy = items[6].strip().lower() in ("true", "1", "t")
        gpus.append(Gpu(index, items[0], items[4] or "DCU", memory, numa, healthy))
    return tuple(gpus)
