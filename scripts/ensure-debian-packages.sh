#!/usr/bin/env bash
# Installs the Debian packages the test suite starts as real components, only when they are missing.
# The list grows with the suite; each entry is "command-to-check package".
set -euo pipefail

needed=(
    "chromium chromium"
)

missing=()
for entry in "${needed[@]}"; do
    cmd=${entry%% *}
    pkg=${entry##* }
    command -v "$cmd" >/dev/null 2>&1 || [ -x "$cmd" ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing Debian packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
