"""The gpulease service's REST API (docs/rest-api.yml): one module per resource."""
