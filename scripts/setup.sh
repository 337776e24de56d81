#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for geryon: Debian packages, then the venv in .venv.
# The venv is made from Debian's /usr/bin/python3 with --system-site-packages so that Mininet (a Debian
# package) imports in the same interpreter as geryon, torch and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(mininet bridge-utils iperf iperf3 openssh-server ethtool tcpdump iproute2 procps psmisc
              python3-venv python3-dev libyang2-tools)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    /usr/bin/python3 -m venv --system-site-packages .venv
fi
# The CPU wheel of torch (version in constraints.txt) lies in /opt/wheels on these machines; elsewhere pip
# fetches it.
PIP_ARGS=(-q)
[ -d /opt/wheels ] && PIP_ARGS+=(--find-links /opt/wheels)
stamp=.venv/.geryon-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    echo "setup: installing geryon and its Python dependencies into .venv (pinned by constraints.txt)"
    .venv/bin/python -m pip install "${PIP_ARGS[@]}" --upgrade pip >/dev/null
    .venv/bin/python -m pip install "${PIP_ARGS[@]}" -c constraints.txt -e '.[test]'
    touch "$stamp"
fi
echo "setup: ready (.venv/bin/geryon)"
