# shellcheck shell=bash
# Helpers shared by scripts/bootstrap.sh and scripts/services.sh (sourced, not run).

# shellcheck disable=SC2034  # used by the scripts that source this file
SLUICE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

log() { printf '[%s] %s\n' "${SLUICE_LOG_TAG:-sluice}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Run a command as root: directly when we are root, else through sudo.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

# True when the Debian package is installed (not merely known or half-removed).
pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# apt-get update at most once per process, and only when something is missing.
# Skipped when the package lists were refreshed in the last 30 minutes (another
# script of this project just did it).
_SLUICE_APT_UPDATED=0
_apt_update_once() {
    [ "$_SLUICE_APT_UPDATED" -eq 1 ] && return 0
    _SLUICE_APT_UPDATED=1
    if [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -30 -print -quit 2>/dev/null)" ]; then
        return 0
    fi
    log "apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq -o DPkg::Lock::Timeout=300
}

# apt_install PKG...: install the packages that are not installed yet; no-op otherwise.
apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        pkg_installed "$pkg" || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get to install them"
    _apt_update_once
    log "apt-get install ${missing[*]}"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            -o DPkg::Lock::Timeout=300 "${missing[@]}"; then
        # Stale lists (e.g. a mirror moved on since the last update): refresh and retry once.
        log "apt-get install failed; refreshing package lists and retrying"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq -o DPkg::Lock::Timeout=300
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            -o DPkg::Lock::Timeout=300 "${missing[@]}"
    fi
}
