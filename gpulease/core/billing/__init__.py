"""Billing rules: accounts and billed time (rules.py), sessions (sessions.py), what a
start must hold back (holds.py), when a balance or a cap stops a server
(enforcement.py), what the home page shows of a researcher's servers (my_servers.py,
suspended.py), and the meter the spawners use (ports.py). Integer micro-credits, UTC."""
