# Sourced by .ci/run and .ci/aarch64.sh. `bounded MINUTES COMMAND...` runs COMMAND and fails
# with what is still running when it takes longer: a hung test then fails its stage with the
# processes to blame named, instead of running the whole CI into its time limit unexplained.
bounded() {
    local minutes=$1 status=0
    shift
    timeout -k 60 "${minutes}m" "$@" || status=$?
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        echo "FAILED: still running after ${minutes} minutes, stopped: $*" >&2
        echo "processes left then (longest-running last):" >&2
        ps -eo pid,ppid,etime,args --sort=-etime 2>/dev/null | cut -c1-240 | tail -n 40 >&2 || true
    fi
    return "$status"
}
