"""Capacity rules: where a server's devices come from (placement) and, as they move
here, who waits, who makes way and what is held for whom."""
