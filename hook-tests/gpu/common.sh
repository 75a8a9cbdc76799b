# Shared by the GPU scripts: resolve the repository, the library (argument 1, exported as
# CUHOOK_LIB) and the output folder (argument 2, or a temporary one).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CUHOOK_LIB="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
inc=(-I "$root/include" -I "$root/fixtures/engine")
