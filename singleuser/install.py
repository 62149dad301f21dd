"""Put gpulease's Jupyter files into an environment: `python -m gpulease.singleuser.install`.

A normal install (`pip install .`, a wheel) already puts them there through the
`data-files` of pyproject.toml. An editable install (`pip install -e .`, what
`make install` does) does not: setuptools skips data files in editable wheels
(pypa/setuptools#3399), so the Makefile runs this afterwards. It copies, into
`--prefix` (default: this interpreter's sys.prefix):

- `etc/jupyter/jupyter_server_config.d/gpulease.json`, which enables the
  `gpulease.singleuser` server extension in every Jupyter server of that
  environment, including `jupyterhub-singleuser`;
- `share/jupyter/labextensions/gpulease-notices/`, the prebuilt JupyterLab extension.

Idempotent; run it again after rebuilding the labextension.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from gpulease.singleuser import LABEXTENSION_DIR, LABEXTENSION_NAME

HERE = Path(__file__).parent
SERVER_CONFIG = HERE / "jupyter-config" / "jupyter_server_config.d" / "gpulease.json"
INSTALL_JSON = HERE / "labextension" / "install.json"


def install(prefix: Path) -> list[Path]:
    if not (LABEXTENSION_DIR / "package.json").exists():
        raise SystemExit(f"gpulease: no built labextension in {LABEXTENSION_DIR}")
    config_dir = prefix / "etc" / "jupyter" / "jupyter_server_config.d"
    config_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SERVER_CONFIG, config_dir / SERVER_CONFIG.name)

    target = prefix / "share" / "jupyter" / "labextensions" / LABEXTENSION_NAME
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)  # drop the old hashed bundles of an earlier build
    shutil.copytree(LABEXTENSION_DIR, target)
    shutil.copyfile(INSTALL_JSON, target / INSTALL_JSON.name)
    return [config_dir / SERVER_CONFIG.name, target]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpulease.singleuser.install",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=Path, default=Path(sys.prefix),
                        help="environment to install into (default: %(default)s)")
    args = parser.parse_args(argv)
    for path in install(args.prefix):
        print(f"gpulease: installed {path}")


if __name__ == "__main__":
    main()
