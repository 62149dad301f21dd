"""Sign-in and who may do what: local accounts, OpenID Connect and GitHub through
oauthenticator, the hub's login throttle and client addresses, and the callers' rights."""
