"""gpulease.core: the pure rules, shared by every other layer (issue "One way down").

What belongs here: the model (catalog, profiles, GPU models, drivers, the
declared inventory, device requests), policy (options, limits, user names),
capacity (placement, queue, preemption, reserved pool, the cluster's
availability and queue), billing rules (billed time, sessions, enforcement,
holds), and the small shared pieces: the clock (utcnow), tiers, notices,
refusals (without their HTTP form), units and how values are shown.

What it may import: the standard library, PyYAML (the format of the files
admins declare: profiles, inventory, catalog) and itself, nothing else. No
database, web framework, process, socket, NVML or Kubernetes (the "core is
plain Python" contract in pyproject.toml; the bottom of the "one way" layers
hub -> spawners -> store -> host -> core). Code that needs any of those is a
store, a host adapter or a spawner, not a rule.
"""
