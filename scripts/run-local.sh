#!/usr/bin/env bash
# The main job on an embedded default: installs what is missing, builds, starts its own ZooKeeper
# and runs rtable over it. Arguments go to rtable-local (e.g. --keep-running).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh release >/dev/null
exec build/bin/rtable-local "$@"
