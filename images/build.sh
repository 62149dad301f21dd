#!/bin/sh
# Build and tag every gpulease image in dependency order (see images/build.py).
exec "${PYTHON:-python3}" "$(dirname "$0")/build.py" "$@"
