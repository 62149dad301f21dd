"""Policy rules: what a researcher may ask for (the spawn options, checked against the
profiles) and, as they move here, the limits on it."""
