"""Entry point of the gpulease hub service, started by the hub as a managed service."""

from gpulease.hub.service.app import main

main()
