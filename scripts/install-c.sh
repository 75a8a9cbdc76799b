#!/bin/sh
# Install cuhook's C library the standard way: a versioned shared object with its soname link
# (libcuhook.so.X.Y.Z, libcuhook.so.X -> it, libcuhook.so -> libcuhook.so.X), the header and a
# pkg-config file. The layout cargo-c's `cargo cinstall` produces, without building cargo-c.
#
# Usage: scripts/install-c.sh [--prefix DIR] [--libdir DIR] [--includedir DIR] [--destdir DIR]
#                             [--lib PATH]
#   --prefix      where the library will live (default /usr/local); written into cuhook.pc
#   --libdir      default PREFIX/lib;  --includedir  default PREFIX/include
#   --destdir     stage everything under DIR (packaging); cuhook.pc still names PREFIX
#   --lib         the libcuhook.so to install (default: target/release/libcuhook.so, built with
#                 `cargo build --release --lib` if it is missing)
# Then: cc app.c $(pkg-config --cflags --libs cuhook)
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=/usr/local
libdir=
includedir=
destdir=
lib=
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=$2 ;;
        --libdir) libdir=$2 ;;
        --includedir) includedir=$2 ;;
        --destdir) destdir=$2 ;;
        --lib) lib=$2 ;;
        -h | --help)
            sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "install-c.sh: unknown argument '$1' (try --help)" >&2
            exit 2
            ;;
    esac
    [ $# -ge 2 ] || { echo "install-c.sh: $1 needs a value" >&2; exit 2; }
    shift 2
done
libdir=${libdir:-$prefix/lib}
includedir=${includedir:-$prefix/include}

if [ -z "$lib" ]; then
    lib=$root/target/release/libcuhook.so
    [ -f "$lib" ] || (cd "$root" && cargo build --release --lib)
fi
[ -f "$lib" ] || { echo "install-c.sh: $lib does not exist" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
major=${version%%.*}
soname=libcuhook.so.$major
if command -v readelf >/dev/null 2>&1; then
    found=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
    if [ "$found" != "$soname" ]; then
        echo "install-c.sh: $lib has soname '$found', expected $soname (stale build?)" >&2
        exit 1
    fi
fi

mkdir -p "$destdir$libdir/pkgconfig" "$destdir$includedir"
cp "$lib" "$destdir$libdir/libcuhook.so.$version"
chmod 755 "$destdir$libdir/libcuhook.so.$version"
ln -sf "libcuhook.so.$version" "$destdir$libdir/$soname"
ln -sf "$soname" "$destdir$libdir/libcuhook.so"
cp "$root/include/cuhook.h" "$destdir$includedir/cuhook.h"
chmod 644 "$destdir$includedir/cuhook.h"
cat >"$destdir$libdir/pkgconfig/cuhook.pc" <<PC
prefix=$prefix
libdir=$libdir
includedir=$includedir

Name: cuhook
Description: Sees every CUDA allocation and free; address-range registry and event subscribers
Version: $version
Cflags: -I\${includedir}
Libs: -L\${libdir} -lcuhook
PC
echo "installed cuhook $version: $destdir$libdir/libcuhook.so.$version ($soname), $destdir$includedir/cuhook.h, $destdir$libdir/pkgconfig/cuhook.pc"
