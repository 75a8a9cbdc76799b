#!/bin/sh
# Instructions cuhook's loader path costs, counted with callgrind (deterministic, so it can be
# re-checked on any machine; the timed figures come from `cargo bench --bench dlopen|install`):
#
#  - `dlopen`+`dlclose` of a library not loaded yet (alone, k = 1, or bringing k - 1 new
#    dependencies, for each k of NEW, default "1 2 10"), and of one already loaded: instructions
#    counted inside the fixture's dlcaller_open/dlcaller_close (so the real loader's work is in
#    both sides), hooked minus plain, per pair. Each figure is a slope between two numbers of
#    pairs per round, so start-up, the install of the set and the warm-up rounds cancel.
#  - the first install of the set into N loaded libraries, and its uninstall (one run each).
#
#   benches/callgrind_loader.sh [N...]   dlopen with N loaded libraries (default 50), install at
#                                        each N of INSTALL_N (default "300 1000")
# Environment: NEW (the k values), BENCH_SET (default cuda: the ~80 names a preloaded libcuhook.so installs; "bench"
# for the two-hook set), DLOPEN_BIN / INSTALL_BIN (bench binaries to count, e.g. built from an
# older commit; default: built here), INSTALL_N.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
newest() { ls -t "$root"/target/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
if [ -z "${DLOPEN_BIN:-}" ] || [ -z "${INSTALL_BIN:-}" ]; then
    (cd "$root" && cargo bench --no-run --bench dlopen --bench install >/dev/null 2>&1)
fi
dl=${DLOPEN_BIN:-$(newest dlopen)}
inst=${INSTALL_BIN:-$(newest install)}
set_name=${BENCH_SET:-cuda}
[ "$set_name" = bench ] && set_name=""
rounds=4
[ $# -gt 0 ] || set -- 50

# Instructions callgrind collects in one run of a command (with its own toggle options).
# total CALLGRIND_OPTION... COMMAND...
total() {
    f=$(mktemp)
    valgrind --tool=callgrind --callgrind-out-file="$f" "$@" >/dev/null 2>&1
    sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$f"
    rm -f "$f"
}
# Instructions inside the fixture's open/close wrappers in one dlopen bench run.
# count SIDE ONLY VAR VALUE OBJECTS [K]
count() {
    (
        export BENCH_SET="$set_name" BENCH_SIDE="$1" BENCH_ONLY="$2" "$3=$4"
        total --toggle-collect=dlcaller_open --toggle-collect=dlcaller_close \
            "$dl" --objects "$5" --maps 0 --new "${6:-1}" --rounds "$rounds"
    )
}
# Hooked minus plain per pair. Both runs make the same pairs (a plain and a hooked warm-up round,
# then `rounds` of their own side), so their difference is rounds x pairs x (hooked - plain).
# added ONLY VAR A B OBJECTS [K]
added() {
    ha=$(count hooked "$1" "$2" "$3" "$5" "${6:-1}"); hb=$(count hooked "$1" "$2" "$4" "$5" "${6:-1}")
    pa=$(count plain "$1" "$2" "$3" "$5" "${6:-1}"); pb=$(count plain "$1" "$2" "$4" "$5" "${6:-1}")
    echo $(( ((hb - ha) - (pb - pa)) / (($4 - $3) * rounds) ))
}
# Instructions of one install child's install (or uninstall).
# once FUNCTION OBJECTS
once() {
    (
        export BENCH_SET="$set_name"
        total --toggle-collect="$1" "$inst" --child --objects "$2" --maps 0
    )
}

echo "instructions cuhook adds per dlopen+dlclose pair (set: ${BENCH_SET:-cuda}); new library bringing k objects"
printf '%-16s' "loaded objects"
for k in ${NEW-1 2 10}; do printf '%16s' "new, k=$k"; done
printf '%16s\n' "loaded library"
for n in "$@"; do
    printf '%-16s' "$n"
    for k in ${NEW-1 2 10}; do printf '%16s' "$(added new BENCH_PAIRS 10 30 "$n" "$k")"; done
    printf '%16s\n' "$(added loaded BENCH_LOADED_PAIRS 1000 3000 "$n")"
done
echo "instructions of the first install of the set, and of its uninstall"
printf '%-16s %16s %16s\n' "libraries" "install" "uninstall"
for n in ${INSTALL_N-300 1000}; do
    printf '%-16s %16s %16s\n' "$n" "$(once 'cuhook::hooks::install*' "$n")" \
        "$(once 'cuhook::hooks::Installation::uninstall' "$n")"
done
