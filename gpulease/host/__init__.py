"""gpulease.host: this machine (issue "One way down").

What belongs here: the state folder, Unix accounts, NVML (loading pynvml, GPU
discovery and the demo inventory, GPU metrics) and process exit.

What it may import: gpulease.core, the standard library and the packages that
reach this machine (pynvml, psutil). Never gpulease.store, gpulease.spawners
or gpulease.hub (the "one way" layers hub -> spawners -> store -> host -> core
in pyproject.toml).
"""
