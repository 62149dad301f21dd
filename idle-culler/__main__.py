"""Entry point of the gpulease idle culler, started by the hub as a managed service."""

from gpulease.idle_culler.app import main

main()
