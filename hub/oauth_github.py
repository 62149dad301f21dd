"""Kept so that configurations naming
`gpulease.hub.oauth_github.GPULeaseGitHubAuthenticator` keep working: the authenticator lives in
gpulease.hub.auth.github, where the entry point (the short name) points."""

from gpulease.hub.auth.github import GPULeaseGitHubAuthenticator

__all__ = ["GPULeaseGitHubAuthenticator"]
