"""The gpulease hub service at /services/gpulease/: its REST API (api/) and pages (pages/)."""
