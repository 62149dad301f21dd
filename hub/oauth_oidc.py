"""Kept so that configurations naming
`gpulease.hub.oauth_oidc.GPULeaseOIDCAuthenticator` keep working: the authenticator lives in
gpulease.hub.auth.oidc, where the entry point (the short name) points."""

from gpulease.hub.auth.oidc import GPULeaseOIDCAuthenticator

__all__ = ["GPULeaseOIDCAuthenticator"]
