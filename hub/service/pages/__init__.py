"""The gpulease service's pages: a researcher's usage, and the admin pages."""
