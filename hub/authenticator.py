"""Kept so that configurations naming
`gpulease.hub.authenticator.LocalAccountsAuthenticator` keep working: the authenticator lives in
gpulease.hub.auth.local, where the entry point (the short name) points."""

from gpulease.hub.auth.local import LocalAccountsAuthenticator

__all__ = ["LocalAccountsAuthenticator"]
