"""Capacity rules: where a server's devices come from (placement), who waits and in
what order (queue), who makes way (preemption, displacement), what is held for whom
(reserved_pool, reservation_rules), and the cluster's inventory, queue and
availability (cluster_*)."""
