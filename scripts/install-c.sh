#!/bin/sh
# Install cuhook: the `cuhook` command, and the C library the standard way — a versioned
# shared object with its soname link (libcuhook.so.X.Y.Z, libcuhook.so.X -> it,
# libcuhook.so -> libcuhook.so.X), the header and a pkg-config file (the layout cargo-c's
# `cargo cinstall` produces, without building cargo-c). The library and the command are
# installed stripped; --debug-info keeps their debug information in separate files.
#
# Usage: scripts/install-c.sh [--prefix DIR] [--destdir DIR] [--libdir DIR] [--bindir DIR]
#                             [--includedir DIR] [--lib PATH] [--bin PATH] [--no-cli]
#                             [--debug-info | --no-strip]
#   --prefix      where cuhook will live (default /usr/local); written into cuhook.pc
#   --libdir      default PREFIX/lib;  --bindir  default PREFIX/bin;
#   --includedir  default PREFIX/include
#   --destdir     stage everything under DIR (packaging); cuhook.pc still names PREFIX
#   --lib, --bin  the libcuhook.so and cuhook to install (default: target/release/, after a
#                 `cargo build --release`; with CUHOOK_PREBUILT=DIR, a cargo profile directory
#                 already built, nothing is built: DIR/cuhook and the newer of DIR/libcuhook.so
#                 and DIR/deps/libcuhook.so)
#   --no-cli      install the C library only
#   --debug-info  also install the debug information, as LIBDIR/.debug/*.debug and
#                 BINDIR/.debug/cuhook.debug (gdb finds them through a .gnu_debuglink)
#   --no-strip    install the files as built (with their debug information, ~20 MB each)
# The strip and objcopy used are $STRIP and $OBJCOPY, by default the host's, or those of the
# cross toolchain (aarch64-linux-gnu-strip, ...) for a library built for another machine.
# Then: PREFIX/bin/cuhook run -- COMMAND, and cc app.c $(pkg-config --cflags --libs cuhook).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=/usr/local
libdir=
bindir=
includedir=
destdir=
lib=
bin=
cli=yes
strip_mode=strip
while [ $# -gt 0 ]; do
    case $1 in
        --no-cli) cli=no; shift; continue ;;
        --debug-info) strip_mode=debug; shift; continue ;;
        --no-strip) strip_mode=none; shift; continue ;;
        -h | --help)
            awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
            exit 0
            ;;
        --*=*)
            # --opt=value: the same as --opt value.
            opt=${1%%=*}
            val=${1#*=}
            shift
            set -- "$opt" "$val" "$@"
            continue
            ;;
    esac
    [ $# -ge 2 ] || { echo "install-c.sh: $1 needs a value (try --help)" >&2; exit 2; }
    case $1 in
        --prefix) prefix=$2 ;;
        --libdir) libdir=$2 ;;
        --bindir) bindir=$2 ;;
        --includedir) includedir=$2 ;;
        --destdir) destdir=$2 ;;
        --lib) lib=$2 ;;
        --bin) bin=$2 ;;
        *)
            echo "install-c.sh: unknown argument '$1' (try --help)" >&2
            exit 2
            ;;
    esac
    shift 2
done
libdir=${libdir:-$prefix/lib}
bindir=${bindir:-$prefix/bin}
includedir=${includedir:-$prefix/include}

if [ -z "$lib" ] || { [ "$cli" = yes ] && [ -z "$bin" ]; }; then
    if [ -n "${CUHOOK_PREBUILT:-}" ]; then
        profile=$CUHOOK_PREBUILT
    else
        command -v cargo >/dev/null 2>&1 || {
            echo "install-c.sh: cargo not found: install Rust, or name what to install with --lib and --bin" >&2
            exit 1
        }
        echo "install-c.sh: cargo build --release" >&2
        (cd "$root" && cargo build --release)
        profile=$root/target/release
    fi
    if [ -z "$lib" ]; then
        # cargo test refreshes only deps/libcuhook.so: the newer one is the last build's.
        lib=$profile/libcuhook.so
        if [ -f "$profile/deps/libcuhook.so" ] && { [ ! -f "$lib" ] || [ "$profile/deps/libcuhook.so" -nt "$lib" ]; }; then
            lib=$profile/deps/libcuhook.so
        fi
    fi
    if [ "$cli" = yes ] && [ -z "$bin" ]; then
        bin=$profile/cuhook
    fi
fi
[ -f "$lib" ] || { echo "install-c.sh: $lib does not exist" >&2; exit 1; }
if [ "$cli" = yes ]; then
    [ -f "$bin" ] || { echo "install-c.sh: $bin does not exist" >&2; exit 1; }
fi

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

# The binutils that understand the library: the host's, or the cross toolchain's.
tools=
if [ "$strip_mode" != none ] && command -v readelf >/dev/null 2>&1; then
    machine=$(readelf -h "$lib" | sed -n 's/^ *Machine: *//p')
    case $machine:$(uname -m) in
        AArch64:aarch64 | *X86-64:x86_64) ;;
        AArch64:*) tools=aarch64-linux-gnu- ;;
        *X86-64:*) tools=x86_64-linux-gnu- ;;
    esac
fi
STRIP=${STRIP:-${tools}strip}
OBJCOPY=${OBJCOPY:-${tools}objcopy}
if [ "$strip_mode" != none ]; then
    command -v "$STRIP" >/dev/null 2>&1 || {
        echo "install-c.sh: $STRIP not found: install binutils (or set STRIP), or pass --no-strip" >&2
        exit 1
    }
fi

# install_elf SOURCE DIR NAME MODE [--strip-unneeded]: copy an executable or library into
# DIR as NAME, stripped as asked.
install_elf() {
    src=$1 dir=$2 name=$3 mode=$4 how=${5:-}
    case $strip_mode in
        none) cp "$src" "$dir/$name" ;;
        strip) "$STRIP" $how -o "$dir/$name" "$src" ;;
        debug)
            mkdir -p "$dir/.debug"
            "$OBJCOPY" --only-keep-debug "$src" "$dir/.debug/$name.debug"
            chmod 644 "$dir/.debug/$name.debug"
            "$STRIP" $how -o "$dir/$name" "$src"
            # The link names the debug file; gdb looks for it in DIR and DIR/.debug.
            (cd "$dir/.debug" && "$OBJCOPY" --add-gnu-debuglink="$name.debug" "../$name")
            ;;
    esac
    chmod "$mode" "$dir/$name"
}

mkdir -p "$destdir$libdir/pkgconfig" "$destdir$includedir"
rm -f "$destdir$libdir/libcuhook.so.$version"
install_elf "$lib" "$destdir$libdir" "libcuhook.so.$version" 755 --strip-unneeded
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
if [ "$cli" = yes ]; then
    mkdir -p "$destdir$bindir"
    rm -f "$destdir$bindir/cuhook"
    install_elf "$bin" "$destdir$bindir" cuhook 755
    echo "installed $destdir$bindir/cuhook"
fi

# What the loader and `cuhook run` need to find the library.
if [ -n "$destdir" ]; then
    echo "staged under $destdir: once installed, run ldconfig (a package does it after installing)."
    exit 0
fi
in_loader_path=no
known=$( (ldconfig -v -N 2>/dev/null || true) | sed -n 's/^\(\/[^:]*\):.*/\1/p')
for d in /lib /usr/lib /lib64 /usr/lib64 $known; do
    [ "$(cd "$libdir" && pwd -P)" = "$(cd "$d" 2>/dev/null && pwd -P)" ] && in_loader_path=yes
done
if [ "$in_loader_path" = yes ]; then
    echo "$libdir is in the loader's search path: run ldconfig (as root) so that programs linked with -lcuhook find $soname."
else
    echo "$libdir is not in the loader's search path. A program linked with -lcuhook finds $soname if it is linked with -Wl,-rpath,$libdir, or run with LD_LIBRARY_PATH=$libdir, or after $libdir is added to /etc/ld.so.conf.d/ and ldconfig is run (as root)."
fi
if [ "$cli" = yes ]; then
    arch_dir=lib/$(uname -m)-linux-gnu
    case $(cd "$libdir" && pwd -P) in
        "$(cd "$bindir/.." && pwd -P)"/lib | "$(cd "$bindir/.." && pwd -P)"/lib64 | "$(cd "$bindir/.." && pwd -P)/$arch_dir")
            echo "$bindir/cuhook run finds $libdir/$soname by itself (no loader setting needed for it)." ;;
        *)
            echo "$bindir/cuhook run looks for the library in ../lib beside its directory, not in $libdir: set CUHOOK_LIB=$libdir/$soname (or pass --lib)." ;;
    esac
    case ":$PATH:" in
        *":$bindir:"*) ;;
        *) echo "$bindir is not on PATH: add it (export PATH=$bindir:\$PATH) to run cuhook by name." ;;
    esac
fi
