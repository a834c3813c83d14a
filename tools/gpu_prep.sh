#!/usr/bin/env bash
# Run on a machine with network (here, before tools/gpu_run.sh): fetches what the GPU image lacks.
#   .whl/    the wheels named in tools/gpu_wheels.txt, for Python 3.12 on manylinux x86_64; a bare
#            name takes its pin from requirements.txt
#   .redis/  redis-server from Debian's package, with the shared libraries it needs that a
#            CUDA image usually lacks (gpu_run.sh puts .redis on LD_LIBRARY_PATH)
#   .peer/   ../shared/bench/peer_hf.py, the Hugging Face peer, when it sits beside the clone
# All three are git-ignored; carry them to the GPU machine with the working tree.
# Usage: bash tools/gpu_prep.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Libraries redis-server links against that are not in a CUDA base image; libssl, libsystemd
# and the C and C++ runtimes are, and copies of those would also shadow the image's own for
# every process that gets .redis on its library path.
REDIS_LIB_PACKAGES="libjemalloc2 liblzf1 libatomic1"

pin() {  # NAME -> NAME==VERSION as requirements.txt pins it (names compared as pip does)
  local want
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  awk -F'==' -v want="$want" '
    /^[[:space:]]*(#|$)/ { next }
    { name = tolower($1); gsub(/[_.]/, "-", name); if (name == want) { print $1 "==" $2; found = 1; exit } }
    END { if (!found) exit 1 }' requirements.txt || { echo "$1 is not pinned in requirements.txt" >&2; exit 1; }
}

specs=()
while read -r line; do
  line=${line%%#*}; line=$(echo "$line" | tr -d '[:space:]')
  [ -z "$line" ] && continue
  case $line in *==*) specs+=("$line") ;; *) specs+=("$(pin "$line")") ;; esac
done < tools/gpu_wheels.txt

rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "${specs[@]}"
echo "wheels: $(ls .whl | wc -l) in .whl/"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root redis-server redis-tools $REDIS_LIB_PACKAGES >/dev/null)
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/root"; done
rm -rf .redis && mkdir -p .redis
cp -L "$tmp/root/usr/bin/redis-server" .redis/redis-server  # a link to redis-check-rdb in the package
find "$tmp/root" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} .redis/ \;
missing=$(LD_LIBRARY_PATH="$PWD/.redis" ldd .redis/redis-server | grep "not found" || true)
[ -z "$missing" ] || { echo "redis-server still lacks: $missing" >&2; exit 1; }
echo "redis: $(.redis/redis-server --version | cut -d' ' -f1-3), libraries: $(cd .redis && ls -- *.so* | tr '\n' ' ')"

if [ -f ../shared/bench/peer_hf.py ]; then
  mkdir -p .peer && cp ../shared/bench/peer_hf.py .peer/
  echo "peer: .peer/peer_hf.py"
fi
