# shellcheck shell=bash
# Shared by scripts/*.sh: install missing Debian packages, build with meson.
# Source it; it defines functions only.

# Packages every build and test needs (Debian 12 names).
# shellcheck disable=SC2034  # used by the scripts that source this file
SHMCACHE_BUILD_PACKAGES=(
  meson ninja-build pkg-config g++ libboost-dev librocksdb-dev libfmt-dev
  libnuma-dev libgtest-dev libgmock-dev pybind11-dev libdlpack-dev python3-dev
  python3-numpy python3-pytest python3-torch python3-pil python3-tqdm
  python3-torchvision libsystemd-dev systemd python3-prometheus-client
  python3-yaml libcli11-dev nlohmann-json3-dev mypy procps python3-mesonpy python3-venv
  patchelf
)

# ensure_packages PKG...: installs those not installed, with apt-get (sudo
# when not root). Prints what it installs; quiet when nothing is missing.
ensure_packages() {
  local missing=()
  local p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "Installing missing packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then sudo=(sudo); else
      echo "error: need root or sudo to install: ${missing[*]}" >&2
      return 1
    fi
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq || return 1
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" || return 1
}

# build_project [BUILD_DIR]: configures and builds, with the tests and the
# Python extension on (an existing build dir is reconfigured to match).
# Uses /usr/bin/python3, where Debian's numpy, pybind11 and torch live.
# build_demo [BUILD_DIR]: configures like build_project, then builds only
# what the demo runs: the admin, the daemon, the C++ example worker and the
# Python extension (not the test suites).
build_demo() {
  local dir=${1:-build}
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dtests=true -Dpython=enabled >/dev/null || return 1
  fi
  # The Python package: the extension (its file name carries the
  # interpreter's ABI tag) and the sources copied into the build tree.
  # build.ninja first: `-t targets` reads it as it is, and one older than
  # the meson.build files lacks the sources added (or, from a build made
  # before they were build targets, all of them).
  local -a pkg
  ninja -C "$dir" build.ninja >/dev/null || return 1
  mapfile -t pkg < <(ninja -C "$dir" -t targets all |
        sed -n -E 's#^(clients/python/shmcache/[^:]*): (cpp_LINKER[A-Z_]*|CUSTOM_COMMAND)$#\1#p')
  ninja -C "$dir" clients/admin/shmcache daemon/shmcached examples/shard_worker \
    "${pkg[@]}" || return 1
}

build_project() {
  local dir=${1:-build}
  local opts=(-Dtests=true -Dpython=enabled)
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "${opts[@]}" >/dev/null || return 1
  else
    meson configure "$dir" "${opts[@]}" >/dev/null || return 1
  fi
  ninja -C "$dir" || return 1
}
