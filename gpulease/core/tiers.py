"""The tiers a server runs on, named once.

- on-demand: the profile's price; runs until its user, the culler or credit stops it.
- spot: the profile's lower spot price; preempted, with notice, for an on-demand start.
- reserved: a holder's start on a reservation's unit, at the reserved price; the hub
  chooses it, never a request.

Sessions record the tier, pods carry it as a label, the queue and preemption order by
it. (One Tier record holding each tier's price field, preemptibility, queue rank and
PriorityClass, used by all of those, is the open part of the issue "One way down".)
"""

from __future__ import annotations

ON_DEMAND = "on-demand"
SPOT = "spot"
RESERVED = "reserved"
# Every tier a session or a pod may carry.
ALL_TIERS = (ON_DEMAND, SPOT, RESERVED)
# What a request may choose (user_options' "tier"): reserved is the hub's choice.
REQUESTABLE = (ON_DEMAND, SPOT)

# Every server's pod says its tier; believed in the servers' namespace only, as the user
# label is (gpulease/core/capacity/cluster_inventory.py, hold_from_pod).
TIER_LABEL = "gpulease.io/tier"
# A pod on a reservation's unit (tier reserved) says which (the cluster queue counts the
# units in use by it); believed where the tier label is.
RESERVATION_LABEL = "gpulease.io/reservation"
