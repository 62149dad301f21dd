"""gpulease.singleuser: what runs inside every notebook server.

A jupyter-server extension (enabled by the `jupyter_server_config.d/gpulease.json`
file that installing gpulease puts in the environment) that counts only real
use as activity (activity.py) and serves `GET {base_url}gpulease/notices` and, for the idle culler,
`GET {base_url}gpulease/activity` (kernels and terminals in one read),
accepts `?token=` on websocket handshakes from non-browser clients such as
VS Code (ws_token.py),
and the prebuilt JupyterLab extension
`gpulease-notices` that shows those notices in JupyterLab.

Importing this package must stay cheap and must not import the hub side.
"""

from pathlib import Path

LABEXTENSION_NAME = "gpulease-notices"
LABEXTENSION_DIR = Path(__file__).parent / "labextension" / "prebuilt"


def _jupyter_server_extension_points():
    return [{"module": "gpulease.singleuser"}]


def _jupyter_labextension_paths():
    # Used by `jupyter labextension develop`; installs get the same files from
    # share/jupyter/labextensions/gpulease-notices (pyproject data-files).
    return [{"src": "labextension/prebuilt", "dest": LABEXTENSION_NAME}]


def _load_jupyter_server_extension(serverapp):
    from . import activity_state, notices, ws_token
    from .activity import install

    install()  # activity = use, not an open tab's polling (see activity.py)
    ws_token.install(serverapp)  # ?token= on non-browser websockets: VS Code (see ws_token.py)
    notices.setup_handlers(serverapp)
    activity_state.setup_handlers(serverapp)  # kernels + terminals in one read, for the culler
