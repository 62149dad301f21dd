"""The hub's side of users' servers: its periodic beats, queued starts carried over
a restart, starts interrupted by a stop, and notifications sent outside the hub."""
