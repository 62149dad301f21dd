"""The queue, the same in both shapes: its machinery (base.py), admission in the hub
process (runner.py), preempting spot servers (spot_preemption.py) and how long
admitted spawns have been pending (pending.py)."""
