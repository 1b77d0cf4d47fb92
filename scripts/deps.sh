#!/usr/bin/env bash
# Installs the Debian 12 packages dsflash needs to build and test, if any are missing.
# Uses apt-get directly as root, or through sudo otherwise.
set -euo pipefail
pkgs=(make gcc clang libclang-rt-14-dev libpcre2-dev libjansson-dev libutf8proc-dev libmicrohttpd-dev libpng-dev libjpeg62-turbo-dev libopenmpi-dev openmpi-bin python3)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# The tokenizer tests compare against npm packages (tests/npm): they need node and npm.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
# The chat page's browser test (tests/e2e/webui.c) drives Debian's chromium headless.
[ -x /usr/bin/chromium ] || missing+=(chromium)
((${#missing[@]})) || exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}"
