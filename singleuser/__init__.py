"""gpulease.singleuser: what runs inside every notebook server.

A jupyter-server extension (enabled by the `jupyter_server_config.d/gpulease.json`
file that installing gpulease puts in the environment) that counts only real
use as activity (activity.py), serves `GET {base_url}gpulease/notices` and
`GET {base_url}gpulease/gpu` (this server's GPU and cost: gpu_status.py), pushes
its kernel and terminal state to the gpulease service with its own token for
the idle culler, which never contacts a server (activity_push.py),
accepts `?token=` on websocket handshakes from non-browser clients such as
VS Code (ws_token.py),
answers a failed sign-in (`oauth_callback`) or logout with a page that says what to
do and links to the hub's home page (error_page.py),
starts a kernel with the server for the first notebook (kernel_pool.py; its
kernel manager, set as the extension is linked), and the prebuilt JupyterLab extension
`gpulease-notices` that shows those notices, and the GPU and cost in the status bar,
in JupyterLab.

Importing this package must stay cheap and must not import the hub side.
"""

from pathlib import Path

LABEXTENSION_NAME = "gpulease-notices"
# The script every server runs: jupyterhub-singleuser's server, started faster
# (gpulease.singleuser.launch; a console script of pyproject.toml).
SERVER_SCRIPT = "gpulease-singleuser"
LABEXTENSION_DIR = Path(__file__).parent / "labextension" / "prebuilt"


def _jupyter_server_extension_points():
    return [{"module": "gpulease.singleuser"}]


def _jupyter_labextension_paths():
    # Used by `jupyter labextension develop`; installs get the same files from
    # share/jupyter/labextensions/gpulease-notices (pyproject data-files).
    return [{"src": "labextension/prebuilt", "dest": LABEXTENSION_NAME}]


def _link_jupyter_server_extension(serverapp):
    # Linked before the server makes its kernel manager: the one with a kernel
    # started with the server (kernel_pool.py), unless a config chose another.
    if "kernel_manager_class" not in serverapp.config.get("ServerApp", {}):
        from .kernel_pool import PooledKernelManager

        serverapp.kernel_manager_class = PooledKernelManager


def _load_jupyter_server_extension(serverapp):
    from . import error_page, gpu_status, notices, proxied_apps, ws_token
    from .activity import install
    from .activity_push import ActivityPusher

    install()  # activity = use, not an open tab's polling (see activity.py)
    ws_token.install(serverapp)  # ?token= on non-browser websockets: VS Code (see ws_token.py)
    error_page.install(serverapp)  # a failed sign-in or logout: a page, not tornado's bare text
    proxied_apps.install()  # a researcher's own web apps: forms from her origin only
    notices.setup_handlers(serverapp)
    gpu_status.setup_handlers(serverapp)  # the status bar's GPU and cost (gpu_status.py)
    fill_pool = getattr(serverapp.kernel_manager, "fill_pool", None)
    if fill_pool is not None:  # a kernel ready before the first notebook asks (kernel_pool.py)
        fill_pool()
    # kernels + terminals pushed to the gpulease service, for the culler
    serverapp.web_app.settings["gpulease_pusher"] = ActivityPusher(serverapp)


async def _start_jupyter_server_extension(serverapp):
    # Called once the server's event loop runs (jupyter_server's extension start hook).
    pusher = serverapp.web_app.settings.get("gpulease_pusher")
    if pusher is not None:
        pusher.start()

