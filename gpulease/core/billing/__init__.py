"""Billing rules: what a start must hold back, when a balance stops a server, and, as
they move here, billed time and sessions. Integer micro-credits, UTC."""
