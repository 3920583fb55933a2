#!/usr/bin/env bash
# Tests start their own redis-server on a free loopback port; make sure the Debian package is there.
set -euo pipefail
command -v redis-server >/dev/null && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "redis-server is missing: install the Debian package redis-server (apt-get install redis-server)" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
