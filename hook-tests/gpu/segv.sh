# Shared by the crash scripts (sourced): the SIGSEGV shim of segv_shim.c, which the GPU machine
# needs because it has no gdb. `segv_shim DIR` builds it into DIR and prints its path (nothing
# when no C compiler could); `segv_frame LOG` prints the frame it wrote into a run's output.
segv_shim() {
    cc -O1 -shared -fPIC -o "$1/segv_shim.so" "$(dirname "${BASH_SOURCE[0]}")/segv_shim.c" -ldl && echo "$1/segv_shim.so"
}
segv_frame() {
    grep -A40 "SEGV_SHIM sig" "$1" | grep -v '^  stk.* ?$' | head -40
}
