"""tests/support/hubproc.py's free_port: a port is never handed out twice in one run (a
hub's ports are all chosen before any is bound; two once came out the same and the hub
could not start)."""

from tests.support.hubproc import free_port


def test_no_port_is_handed_out_twice():
    ports = [free_port() for _ in range(2000)]  # ~1 in 9 of the range: twice, surely, by chance
    assert len(set(ports)) == len(ports)
