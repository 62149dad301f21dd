"""Misuse (issue 49): the pure rules that tell crypto-mining and similar abuse from
research, and what to do about it.

Each signal is a plain function over frozen dataclasses, its thresholds documented
fields with defaults; none reads /proc, a socket or the database (the scan that feeds
them, the incidents store and the actions are the hub's, around them):

- `processes`: a server's processes against the admin's deny list (executables'
  SHA-256 hashes and command-line patterns), signal (a);
- `network`: its connections against the admin's list of addresses, networks and
  ports, and `stratum`: the plain Stratum V1 handshake in a connection's first bytes,
  signal (b);
- `gpu`: the GPU held at full while, as the proxy saw from outside, no client used the
  server, signal (c), which only ever warns;
- `decision`: the signals combined into one action by the policy (nothing, warn,
  suspend with end reason `abuse`, lock the account), with the evidence it used.

`evidence.Signal` is what each rule returns. It names a deny-list entry by its id
only: an entry's description is for admins, and nothing a researcher is shown
(`decision.RESEARCHER_MESSAGE`) says which entry, signal or pattern matched.

Times are seconds since the epoch (float, as `time.time()`), so that a week of scans
replays fast (bench/misuse.py); the store writes them as naive UTC like every other time.
"""
