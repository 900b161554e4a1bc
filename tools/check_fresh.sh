#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The README's two commands on a fresh machine: builds a fresh Debian or Ubuntu root with
# debootstrap, copies a fresh clone of this repository (its committed HEAD) into it, and runs
#   tools/quickstart.sh && tools/test.sh
# there as root, exactly as written (each timed; the second runs only when the first passed), in a chroot with /proc, /sys and /dev mounted (unmounted on
# exit, also on failure or Ctrl-C) and an empty environment but HOME, PATH and LANG. Prints the
# time of each step and of each stage of test.sh, and exits non-zero when anything fails.
#
#   sudo tools/check_fresh.sh [ROOT...]        ROOT: debian12 (default), ubuntu24.04, ubuntu22.04
#   sudo nice -n 19 tools/check_fresh.sh debian12 ubuntu24.04     # on a shared machine
#
# Needs root (debootstrap, chroot, mount), network access to the distribution's archive and to
# PyPI (test.sh's PyTorch stage downloads torch, ~530 MB, and the Python packages it needs),
# about 8 GB of disk per root, and about 25 minutes per root on 2 cores to itself with an empty
# compiler cache, over an hour beside another root (README.md has the times of each stage).
# debootstrap is installed with apt-get when missing.
#
# Mirrors come from the host's apt sources (/etc/apt/sources.list and sources.list.d, one-line and
# deb822 formats): the first URI ending in /debian (and /debian-security) for Debian, in /ubuntu
# for Ubuntu; otherwise the distribution's own archive. The root gets the sources a fresh install
# has: Debian 12: main of bookworm, bookworm-updates and bookworm-security; Ubuntu: main,
# restricted, universe and multiverse of the release, -updates and -security.
# Ubuntu's archive key: the host's ubuntu-archive-keyring.gpg (package ubuntu-keyring) when it has
# one; otherwise it is taken from the ubuntu-keyring package of the archive itself, and the output
# says that the archive's signature was then checked against a key fetched from that same archive
# (consistency, not authenticity).
#
# Variables:
#   NF4_FRESH_DIR=/var/tmp/nf4-fresh   where the roots are made (ROOT/ under it, made anew) and
#                                      the logs kept (ROOT.log)
#   NF4_FRESH_CCACHE=DIR               share this host ccache directory with the root (bound at
#                                      /root/.cache/ccache): a second run compiles almost nothing.
#                                      Default: none, the cold build a new user has
#   NF4_FRESH_WHEELS=DIR               share a torch wheel cache (bound at
#                                      /root/.cache/nf4/ci-wheels; bindings/torch/ci_test.sh).
#                                      Default: none, torch is downloaded
#   NF4_FRESH_COMMAND                  one command to run in the clone instead of the README's two
#                                      (e.g. "tools/quickstart.sh" for a quick look)
#   NF4_FRESH_KEEP=1                   keep each root afterwards (default: removed when it passed)
#   NF4_DEBIAN_MIRROR, NF4_DEBIAN_SECURITY_MIRROR, NF4_UBUNTU_MIRROR   override the mirrors
#
# A network that needs more than a fresh machine has (a proxy, a certificate authority of its own)
# is the host's, not the root's: the host's proxy variables (http_proxy, https_proxy, no_proxy,
# upper case too) and CA-bundle variables (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, PIP_CERT, naming
# /etc/ssl/certs/ca-certificates.crt) are passed into the root when set, and the certificate
# authorities added locally on the host (/usr/local/share/ca-certificates) are copied there and
# added to the root's bundle (now, or by its ca-certificates package when install-deps.sh installs it).
# The output says which were passed.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${NF4_FRESH_DIR:-/var/tmp/nf4-fresh}"
commands=(tools/quickstart.sh tools/test.sh)
[ -z "${NF4_FRESH_COMMAND:-}" ] || commands=("$NF4_FRESH_COMMAND")
roots=("$@")
((${#roots[@]})) || roots=(debian12)
fail() { echo "check_fresh: FAILED: $*" >&2; exit 1; }
now() { date +%s; }

[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, chroot, mount): sudo $0 $*"
for r in "${roots[@]}"; do
  case "$r" in debian12 | ubuntu24.04 | ubuntu22.04) ;; *) fail "unknown root '$r' (debian12, ubuntu24.04, ubuntu22.04)" ;; esac
done
if ! command -v debootstrap >/dev/null 2>&1; then
  echo "check_fresh: installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  echo "check_fresh: note: uncommitted changes in $repo are not tested (the clone is of HEAD)"
fi
commit="$(git -C "$repo" rev-parse HEAD)"

# The URIs of the host's apt sources, one a line.
host_uris() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' "$f"
  done
  return 0
}
host_mirror() {  # PATH_SUFFIX DEFAULT: the first host URI ending in PATH_SUFFIX, else DEFAULT
  local u
  # Every line read (no early exit): under pipefail, a reader that stops early fails the pipe.
  u="$(host_uris | sed 's:/*$::' | awk -v s="$1" 'u == "" && substr($0, length($0) - length(s) + 1) == s { u = $0 } END { print u }')"
  echo "${u:-$2}"
}

# The debootstrap arguments and the sources.list of a root.
setup_root_kind() {
  case "$1" in
    debian12)
      suite=bookworm
      mirror="${NF4_DEBIAN_MIRROR:-$(host_mirror /debian http://deb.debian.org/debian)}"
      security="${NF4_DEBIAN_SECURITY_MIRROR:-$(host_mirror /debian-security http://deb.debian.org/debian-security)}"
      keyring=/usr/share/keyrings/debian-archive-keyring.gpg
      [ -f "$keyring" ] || fail "no $keyring (apt-get install debian-archive-keyring)"
      sources="deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main"
      ;;
    ubuntu24.04 | ubuntu22.04)
      suite=noble
      [ "$1" = ubuntu22.04 ] && suite=jammy
      mirror="${NF4_UBUNTU_MIRROR:-$(host_mirror /ubuntu http://archive.ubuntu.com/ubuntu)}"
      local c="main restricted universe multiverse"
      sources="deb $mirror $suite $c
deb $mirror $suite-updates $c
deb $mirror $suite-security $c"
      ubuntu_keyring
      ;;
  esac
  # Every Ubuntu release since 7.10 uses debootstrap's gutsy script; an older debootstrap may not
  # know the release's name yet.
  script=""
  if [ ! -e "/usr/share/debootstrap/scripts/$suite" ]; then
    case "$1" in
      ubuntu*) script=/usr/share/debootstrap/scripts/gutsy ;;
      *) fail "this debootstrap does not know $suite" ;;
    esac
    echo "check_fresh: this debootstrap has no script for $suite: using $script"
  fi
}

ubuntu_keyring() {
  keyring=/usr/share/keyrings/ubuntu-archive-keyring.gpg
  [ -f "$keyring" ] && return 0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ubuntu-keyring >/dev/null 2>&1 || true
  [ -f "$keyring" ] && return 0
  local kdir="$dir/ubuntu-keyring" file
  rm -rf "$kdir" && mkdir -p "$kdir"
  command -v curl >/dev/null 2>&1 || fail "curl is needed to fetch Ubuntu's keyring (apt-get install curl)"
  if ! curl -fsS --max-time 120 "$mirror/dists/$suite/main/binary-amd64/Packages.gz" -o "$kdir/Packages.gz"; then
    fail "Ubuntu's archive ($mirror) is not reachable from this machine: no Ubuntu root can be made here"
  fi
  file="$(zcat "$kdir/Packages.gz" | awk '/^Package: /{p = ($2 == "ubuntu-keyring")} p && /^Filename: / && f == "" {f = $2} END {print f}')"
  [ -n "$file" ] || fail "no ubuntu-keyring package in $mirror $suite"
  curl -fsS --max-time 120 "$mirror/$file" -o "$kdir/ubuntu-keyring.deb" || fail "cannot download $mirror/$file"
  dpkg-deb -x "$kdir/ubuntu-keyring.deb" "$kdir/x"
  keyring="$kdir/x/usr/share/keyrings/ubuntu-archive-keyring.gpg"
  [ -f "$keyring" ] || fail "$file holds no ubuntu-archive-keyring.gpg"
  echo "check_fresh: WARNING: this host has no Ubuntu archive key; using the one in $file from the"
  echo "check_fresh:          archive itself (the archive's signature is checked against a key from"
  echo "check_fresh:          that same archive: consistency, not authenticity)"
}

mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" 2>/dev/null || true
  done
  mounted=()
}
trap unmount_all EXIT
trap 'exit 130' INT TERM
bind() {  # HOST_PATH ROOT_PATH: bind mount, made a slave so that unmounting it leaves the host's
  mkdir -p "$2"
  mount --rbind "$1" "$2"
  mount --make-rslave "$2"
  mounted+=("$2")
}

# One line per root and per timed step, printed on exit whatever happened.
summary_file=""
print_summary() {
  [ -s "$summary_file" ] || return 0
  echo "== check_fresh summary"
  cat "$summary_file"
}
# run_root relies on set -e: it is never called where a failure is tested (`|| ...`, `if`), which
# would switch errexit off inside it.
run_root() {
  local kind=$1 rootfs="$dir/$1" log="$dir/$1.log" t0 t rc
  setup_root_kind "$kind"
  echo "== $kind: debootstrap $suite from $mirror into $rootfs"
  # A root left mounted by an interrupted run is not removed (rm would go into the host's /dev).
  if grep -q " $rootfs/" /proc/mounts; then
    fail "$rootfs still has file systems mounted (an interrupted run?): umount -R -l them first"
  fi
  rm -rf --one-file-system "$rootfs"
  mkdir -p "$rootfs"
  t0=$(now)
  if ! debootstrap --arch=amd64 --keyring="$keyring" "$suite" "$rootfs" "$mirror" $script >"$dir/$kind.debootstrap.log" 2>&1; then
    tail -20 "$dir/$kind.debootstrap.log" >&2
    fail "$kind: debootstrap failed ($dir/$kind.debootstrap.log)"
  fi
  local t_boot=$(($(now) - t0))
  echo "check_fresh: $kind: debootstrap: $t_boot s"
  printf '%s\n' "$sources" >"$rootfs/etc/apt/sources.list"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"

  git clone -q --no-local --no-hardlinks "$repo" "$rootfs/root/nf4"
  git -C "$rootfs/root/nf4" checkout -q "$commit"
  rm -rf "$rootfs/root/nf4/.git"  # a copy of the sources, as a downloaded tarball would be

  mount -t proc proc "$rootfs/proc" && mounted+=("$rootfs/proc")
  bind /sys "$rootfs/sys"
  bind /dev "$rootfs/dev"
  if [ -n "${NF4_FRESH_CCACHE:-}" ]; then
    mkdir -p "$NF4_FRESH_CCACHE"
    bind "$NF4_FRESH_CCACHE" "$rootfs/root/.cache/ccache"
    echo "check_fresh: sharing the compiler cache $NF4_FRESH_CCACHE"
  fi
  if [ -n "${NF4_FRESH_WHEELS:-}" ]; then
    mkdir -p "$NF4_FRESH_WHEELS"
    bind "$NF4_FRESH_WHEELS" "$rootfs/root/.cache/nf4/ci-wheels"
    echo "check_fresh: sharing the torch wheel cache $NF4_FRESH_WHEELS"
  fi

  # The commands one after the other, each timed, stopping at the first that fails (as `a && b`).
  cat >"$rootfs/root/check-fresh-run.sh" <<'EOF'
cd /root/nf4 || exit 1
for c in "$@"; do
  s=$(date +%s); bash -c "$c"; rc=$?
  echo "check_fresh: command $c: $(($(date +%s) - s)) s, exit $rc"
  [ "$rc" -eq 0 ] || exit "$rc"
done
EOF
  local net_env=() v
  for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY SSL_CERT_FILE REQUESTS_CA_BUNDLE PIP_CERT; do
    if [ -n "${!v:-}" ]; then net_env+=("$v=${!v}"); fi
  done
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$rootfs/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    # A root that has ca-certificates already (Ubuntu's) adds them now; others when it is installed.
    if [ -x "$rootfs/usr/sbin/update-ca-certificates" ]; then
      chroot "$rootfs" /usr/sbin/update-ca-certificates >/dev/null
    fi
    echo "check_fresh: the host's local certificate authorities copied in: $(cd /usr/local/share/ca-certificates && echo *.crt)"
  fi
  if ((${#net_env[@]})); then
    echo "check_fresh: the host's network settings passed in: ${net_env[*]%%=*}"
  fi
  echo "== $kind: in /root/nf4: ${commands[*]}   (each after the one before passed; log: $log)"
  t0=$(now)
  set +e
  chroot "$rootfs" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb "${net_env[@]}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash /root/check-fresh-run.sh "${commands[@]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  t=$(($(now) - t0))
  unmount_all
  local stages
  stages="$(grep -E '^(check_fresh: command|test.sh: stage [a-z-]+:)' "$log" | grep -v '^test.sh: stage times:' | sed 's/^/  /' || true)"
  printf '%s\n%s\n' "$kind ($suite, commit ${commit:0:12}): exit $rc, debootstrap $t_boot s, commands $t s" "$stages" >>"$summary_file"
  [ "$rc" -eq 0 ] || fail "$kind: exit $rc (log: $log; root kept in $rootfs)"
  [ "${NF4_FRESH_KEEP:-0}" = 1 ] || grep -q " $rootfs/" /proc/mounts || rm -rf --one-file-system "$rootfs"
}

mkdir -p "$dir"
summary_file="$(mktemp "$dir/summary.XXXXXX")"
trap 'unmount_all; print_summary; rm -f "$summary_file"' EXIT
for r in "${roots[@]}"; do
  run_root "$r"
done
echo "check_fresh: all passed"
