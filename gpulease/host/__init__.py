"""gpulease.host: this machine (issue "One way down").

What belongs here: the state folder (state.py), Unix accounts (unix_accounts.py),
NVML (nvml.py: loading pynvml, reading the GPUs; gpus.py: the declared file or
NVML) and scripts' interpreters (scripts.py).

What it may import: gpulease.core, the standard library and the packages that
reach this machine (pynvml, psutil). Never gpulease.store, gpulease.spawners
or gpulease.hub (the "one way" layers hub -> spawners -> store -> host -> core
in pyproject.toml).
"""
