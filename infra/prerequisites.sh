# Sourced by infra/test.sh (and .ci/run through it): the system packages the suite drives, which
# pip cannot install. The browser tests run Debian's Chromium (never a downloaded browser), the
# multi-replica tests balance with Debian's nginx. `ensure_prerequisites` installs the missing ones
# when it can (root, with apt-get), otherwise stops at once naming them: a run that would fail or
# skip half an hour later is no run. CHROMIUM and NGINX name other locations.
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
NGINX="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"

missing_prerequisites() {
  local missing=""
  [ -x "$CHROMIUM" ] || missing="$missing chromium"
  [ -x "$NGINX" ] || missing="$missing nginx"
  printf '%s' "${missing# }"
}

ensure_prerequisites() {
  local missing
  missing="$(missing_prerequisites)"
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "== installing the system packages the tests need: $missing"
    # shellcheck disable=SC2086  # one word per package
    if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing) >/dev/null; then
      missing="$(missing_prerequisites)"
      [ -z "$missing" ] && return 0
    fi
    echo "could not install the system packages the tests need: $missing" >&2
    return 1
  fi
  echo "make test needs these system packages, which are not installed: $missing" >&2
  echo "install them as root (apt-get install $missing), or run make test as root where apt-get works" >&2
  return 1
}
