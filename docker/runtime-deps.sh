#!/bin/sh
# Prints the Debian packages that own the shared libraries the given binaries load (ldd, then
# dpkg -S), one per line: what the runtime stage installs, derived from what was really linked.
# The NVIDIA driver's libraries (libcuda, libnvidia-*) are skipped: the NVIDIA Container Toolkit
# mounts the host's at run time.
set -eu
driver='^(libcuda\.so|libnvidia-)'
linked=$(ldd "$@" | awk '$2 == "=>" { print $1, $3 }' | grep -Ev "$driver" || true)
if echo "$linked" | grep -q ' not$'; then
  ldd "$@" >&2
  echo "runtime-deps.sh: a library is missing" >&2
  exit 1
fi
libs=$(echo "$linked" | awk '$2 ~ /^\// { print $2 }' | sort -u)
for lib in $libs; do
  real=$(readlink -f "$lib")
  owner=""
  # Merged /usr: ldd may report /lib/... for a file the package lists under /usr/lib/... (or
  # the reverse), and a symlink's target may be the listed name.
  for candidate in "$lib" "$real" "/usr$lib" "/usr$real" "${lib#/usr}" "${real#/usr}"; do
    owner=$(dpkg -S "$candidate" 2>/dev/null | head -n 1 | cut -d: -f1) || owner=""
    [ -n "$owner" ] && break
  done
  if [ -z "$owner" ]; then
    echo "runtime-deps.sh: no package owns $lib" >&2
    exit 1
  fi
  echo "$owner"
done | sort -u
