"""A JupyterHub single-user server built in-process, as JupyterHub would start ada's.

With gpulease's server extension loaded and JupyterHub's identity provider,
from the environment JupyterHub gives a server (its hub on `hub_host`, under
`base`), and no process started: no pooled kernel, no HTTP server (a test that
needs one serves `app.web_app` itself).
"""

from __future__ import annotations

from pathlib import Path


def hub_server_app(tmp_path: Path, monkeypatch, *, base: str = "/", hub_host: str = ""):
    from jupyter_server.serverapp import ServerApp
    from jupyterhub.singleuser.extension import JupyterHubIdentityProvider

    prefix = f"{base}user/ada/"
    for name, value in {
        "JUPYTERHUB_API_TOKEN": "t" * 32, "JUPYTERHUB_API_URL": f"http://127.0.0.1:9{base}hub/api",
        "JUPYTERHUB_CLIENT_ID": "jupyterhub-user-ada", "JUPYTERHUB_USER": "ada",
        "JUPYTERHUB_SERVICE_PREFIX": prefix, "JUPYTERHUB_BASE_URL": base,
        "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{prefix}oauth_callback", "JUPYTERHUB_HOST": hub_host,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
    }.items():
        monkeypatch.setenv(name, value)
    app = ServerApp(identity_provider_class=JupyterHubIdentityProvider, base_url=prefix,
                    jpserver_extensions={"gpulease.singleuser": True}, root_dir=str(tmp_path))
    app.config.ServerApp.kernel_manager_class = (  # no pooled kernel: no process started
        "jupyter_server.services.kernels.kernelmanager.AsyncMappingKernelManager")
    app.initialize(argv=[], find_extensions=False, new_httpserver=False)
    return app
