#!/usr/bin/env bash
# Installs the Debian packages the test suite starts as real components, only when they are missing.
# Each entry is "check package": the check is a command name or a glob of an executable path.
set -euo pipefail

needed=(
    "chromium chromium"                                  # the console's end-to-end test
    "/usr/lib/postgresql/*/bin/pg_ctl postgresql"        # the store on PostgreSQL
    "promtool prometheus"                                # alert rules: promtool tests, a real Prometheus
    "prometheus-alertmanager prometheus-alertmanager"    # alert routing to the control plane
    "haproxy haproxy"                                    # zero-drop restarts behind a real load balancer
    "prometheus-node-exporter prometheus-node-exporter"  # the agent's CPU cost measured beside node_exporter's
    "podman podman"                                      # engines in containers, through the Docker API
    "runc runc"                                          # podman's runtime in the tests (tests/containers)
)

have() {
    local check=$1 path
    command -v "$check" >/dev/null 2>&1 && return 0
    for path in $check; do [ -x "$path" ] && return 0; done
    return 1
}

missing=()
for entry in "${needed[@]}"; do
    entry=${entry%%#*}
    read -r check pkg <<<"$entry"
    have "$check" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
