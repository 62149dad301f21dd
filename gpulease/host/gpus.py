"""This host's GPUs, as the embedded shape sees them: a declared file, or NVML.

The inventory's model and its file format are rules (gpulease/core/model/inventory.py);
which source a host uses, and asking NVML, are this machine's business.
"""

from __future__ import annotations

import logging
import os

from gpulease.core.model.inventory import Inventory, load_declared_inventory
from gpulease.host import nvml

log = logging.getLogger(__name__)


def discover_inventory(declared_path: str | os.PathLike | None, node_name: str) -> Inventory:
    """This host's inventory: the declared file if given, else NVML, else none."""
    if declared_path:
        inventory = load_declared_inventory(declared_path)
        log.info("GPU inventory: declared file %s (%d devices, no physical GPU)",
                 declared_path, len(inventory.device_uuids()))
        seen = nvml.read_nvml_inventory(node_name)
        if seen is not None:
            log.warning("NVML sees %d GPU(s) on this host, but the declared inventory %s is in "
                        "use: servers get its synthetic devices, not the real ones",
                        sum(len(n.gpus) for n in seen.nodes), declared_path)
        return inventory
    inventory = nvml.read_nvml_inventory(node_name)
    if inventory is not None:
        log.info("GPU inventory: %s, %d devices", inventory.label, len(inventory.device_uuids()))
        return inventory
    log.info("GPU inventory: no GPU (NVML found none and no declared file was given)")
    return Inventory((), "none", "NVML found no GPU and no declared inventory was given")
