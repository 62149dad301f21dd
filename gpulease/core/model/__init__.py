"""The model of what gpulease rents: GPU models and MIG profiles, drivers, a host's
inventory, the image catalog and the profiles admins define. Plain data and their
parsers; the shipped samples (a demo inventory, the default profiles) sit in samples/."""
