"""Policy rules: what a researcher may ask for (options: the spawn options checked
against the profiles) and the limits on it (limits, cpu_totals), and what a user name
may be (user_names)."""
