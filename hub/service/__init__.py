"""The gpulease hub service: REST API (and, later, pages) at /services/gpulease/."""
