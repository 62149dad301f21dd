"""The hub's side of billing: the meter and its heartbeat, stopping servers, the
reservations' ends and the Prometheus metrics."""
