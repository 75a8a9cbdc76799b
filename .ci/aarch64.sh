#!/usr/bin/env bash
# CI, aarch64 (Grace Hopper): the whole test suite cross-built for aarch64-unknown-linux-gnu and
# run under qemu-user, once with 4 KiB pages and once with 64 KiB pages (the page size of many
# GH200 kernels). Called by .ci/run after the x86-64 tests; runs by hand the same way (root, Debian).
#
# The test binaries start the fixture programs themselves, so aarch64 executables must run
# directly: qemu-user-static is registered with binfmt_misc. If that cannot be set up (a container
# without the privilege to mount binfmt_misc), this fails unless CUHOOK_AARCH64_SKIP_NO_BINFMT=1
# says to skip, and then it says loudly that nothing was tested.
set -euo pipefail
cd "$(dirname "$0")/.."

target=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu

need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-ld.gold >/dev/null 2>&1 || need+=(binutils-aarch64-linux-gnu)
[ -e "$sysroot/lib/libc.so.6" ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || need+=(binfmt-support)
if ((${#need[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

# binfmt_misc: mounted, and qemu-aarch64 registered and enabled.
if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
fi
if [ -e /proc/sys/fs/binfmt_misc/status ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    update-binfmts --import qemu-aarch64 2>/dev/null || true
fi
update-binfmts --enable qemu-aarch64 2>/dev/null || true

# Proof that an aarch64 program runs as itself (what the tests need), not just under qemu.
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <stdio.h>\nint main(void) { puts("aarch64 ok"); return 0; }\n' >"$probe_dir/p.c"
aarch64-linux-gnu-gcc -o "$probe_dir/p" "$probe_dir/p.c"
if [ "$(QEMU_LD_PREFIX=$sysroot "$probe_dir/p" 2>&1)" != "aarch64 ok" ]; then
    echo "aarch64: binfmt_misc cannot run aarch64 programs here (mount binfmt_misc and" >&2
    echo "  'update-binfmts --enable qemu-aarch64' need a privileged container)." >&2
    if [ "${CUHOOK_AARCH64_SKIP_NO_BINFMT:-}" = 1 ]; then
        echo "aarch64: SKIPPED (CUHOOK_AARCH64_SKIP_NO_BINFMT=1): NOTHING WAS TESTED ON AARCH64" >&2
        exit 0
    fi
    exit 1
fi

# .cargo/config.toml names the linker and QEMU_LD_PREFIX; set here too for a caller's own config.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export QEMU_LD_PREFIX=$sysroot

# shellcheck source=.ci/bounded.sh
. .ci/bounded.sh
echo "== aarch64, 4 KiB pages"
SECONDS=0
bounded 45 cargo test --release --target "$target"
echo "== aarch64, 4 KiB pages: ${SECONDS}s"

# 64 KiB pages, as many GH200 kernels have. qemu 7.2's 64 KiB guest pages on a 4 KiB host break
# the part of a file mapping past the end of the file inside a guest page (docs/architecture.md,
# "aarch64"): SVE loads fault there (sve=off), system calls get EFAULT there (so no LD_PRELOAD
# test: ld.so's copy of the path can land there), /proc/self/maps omits it (the engine tests
# whose GOT slots lie there, and the unit test comparing protections with the maps text). The
# rest of the engine matrix, the BTI control and the unit tests run.
echo "== aarch64, 64 KiB pages (QEMU_PAGESIZE=65536, QEMU_CPU=max,sve=off)"
SECONDS=0
QEMU_PAGESIZE=65536 QEMU_CPU=max,sve=off CUHOOK_EXPECT_PAGE_SIZE=65536 \
    bounded 20 cargo test --release --target "$target" --lib --test relocs --test bti --test engine -- \
    --skip paths_lazy_binding --skip paths_non_pie --skip paths_branch_protected \
    --skip install_twice_and_reinstall --skip page_protected_by_the_program_is_seen_and_kept \
    --skip kernel_query_agrees_with_the_maps_text
echo "== aarch64, 64 KiB pages: ${SECONDS}s"
